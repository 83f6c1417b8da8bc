//! RAPIDS RMM `logging_resource_adaptor` logs (CSV).
//!
//! Header `Thread,Time,Action,Pointer,Size,Stream`; rows `allocate`, `free` and
//! `allocate failure` (pointer `(nil)`); pointers are `%p` hex (`0x7f...`), streams are hex
//! without a prefix (`0` is the default stream). Columns are found by header name. `Thread`
//! and `Time` are not used: the log is already in the order things happened, which is all
//! the replay needs (RMM's own replay benchmark ignores `Time` for the same reason).
//!
//! Mapping: `allocate` -> `Op::Alloc` (fresh id) and a recorded `Alloc` at the pointer;
//! `free` -> `Op::FreeRequested` of the id live at the pointer, recorded as `FreeRequested`
//! and `FreeCompleted` (RMM frees complete at once); `allocate failure` -> `Op::Alloc` with a
//! fresh id that never becomes live, recorded as `Oom` (address 0: RMM logs no free memory).
//! A free of a pointer the log never allocated (logging attached late) gets a synthetic
//! `Op::Alloc` at the beginning, with a warning, as for PyTorch snapshots.

use crate::addr_map::AddrMap;
use crate::error::{quoted, TraceError};
use allocsim_core::{AllocId, Op, RecordedEvent, RecordedKind, StreamId, Trace, TraceMeta};
use std::io::{BufReader, Read, Write};
use std::path::Path;

/// The `source_format` of traces read from an RMM log.
pub const SOURCE_FORMAT: &str = "rmm-log";
pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";
const MAX_SIZE_BYTES: u64 = 1 << 62;

struct Row {
    line: u64,
    action: RowAction,
    pointer: u64,
    size: u64,
    stream: StreamId,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RowAction {
    Allocate,
    Free,
    AllocateFailure,
}

/// Read an RMM log file.
pub fn read_rmm(path: &Path) -> Result<Trace, TraceError> {
    let file = crate::error::open_regular(path)?;
    read_rmm_from(BufReader::new(file), path)
}

/// Read an RMM log from any reader; `path` names it in errors.
pub fn read_rmm_from<R: Read>(input: R, path: &Path) -> Result<Trace, TraceError> {
    let rows = parse(input, path)?;
    Ok(convert(rows))
}

fn csv_err(path: &Path, line: u64, column: &str, message: impl Into<String>) -> TraceError {
    TraceError::Csv {
        path: path.to_path_buf(),
        line,
        column: column.to_string(),
        message: message.into(),
    }
}

/// The longest line read: RMM writes lines of under 100 bytes, and the CSV reader holds a
/// whole record, so a file of one endless line must not become one endless record.
const MAX_LINE_BYTES: usize = 64 << 10;

/// `inner`, failing once a line runs past [`MAX_LINE_BYTES`].
struct LineLimit<R> {
    inner: R,
    /// Bytes since the last newline.
    line: usize,
    /// Newlines read.
    newlines: u64,
}

impl<R: Read> Read for LineLimit<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        // The first piece continues the line the last read ended in; the last piece goes on.
        let mut pieces = buf[..n].split(|&b| b == b'\n').map(<[u8]>::len);
        let first = self.line + pieces.next().unwrap_or(0);
        let (mut longest, mut last) = (first, first);
        for len in pieces {
            (longest, last) = (longest.max(len), len);
            self.newlines += 1;
        }
        self.line = last;
        if longest > MAX_LINE_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a line longer than {MAX_LINE_BYTES} bytes (RMM writes lines of under 100)"
                ),
            ));
        }
        Ok(n)
    }
}

fn parse<R: Read>(input: R, path: &Path) -> Result<Vec<Row>, TraceError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .flexible(false)
        .from_reader(LineLimit { inner: input, line: 0, newlines: 0 });
    // A read error has no position: the line is the one being read.
    let bad_csv = |e: csv::Error, reader: &csv::Reader<LineLimit<R>>| {
        let line = e.position().map_or(reader.get_ref().newlines + 1, |p| p.line());
        csv_err(path, line, "", format!("malformed CSV: {e}"))
    };
    let headers = match reader.headers() {
        Ok(headers) => headers.clone(),
        Err(e) => return Err(bad_csv(e, &reader)),
    };
    if headers.is_empty() || headers.iter().all(str::is_empty) {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    let column = |name: &str| {
        headers.iter().position(|h| h == name).ok_or_else(|| {
            csv_err(path, 1, name, format!("no {name} column (expected the header {HEADER})"))
        })
    };
    let (action_c, pointer_c, size_c, stream_c) =
        (column("Action")?, column("Pointer")?, column("Size")?, column("Stream")?);
    let mut rows = Vec::new();
    let mut record = csv::StringRecord::new();
    loop {
        match reader.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(bad_csv(e, &reader)),
        }
        let line = record.position().map_or(0, |p| p.line());
        let field = |c: usize| record.get(c).unwrap_or("");
        let action = match field(action_c) {
            "allocate" => RowAction::Allocate,
            "free" => RowAction::Free,
            "allocate failure" => RowAction::AllocateFailure,
            other => {
                let msg =
                    format!("unknown action {} (allocate, free, allocate failure)", quoted(other));
                return Err(csv_err(path, line, "Action", msg));
            }
        };
        let pointer = parse_pointer(field(pointer_c)).ok_or_else(|| {
            csv_err(path, line, "Pointer", format!("bad pointer {}", quoted(field(pointer_c))))
        })?;
        let size = parse_size(field(size_c)).ok_or_else(|| {
            csv_err(path, line, "Size", format!("bad size {}", quoted(field(size_c))))
        })?;
        let stream = parse_hex(field(stream_c)).ok_or_else(|| {
            csv_err(path, line, "Stream", format!("bad stream {}", quoted(field(stream_c))))
        })?;
        rows.push(Row { line, action, pointer, size, stream: StreamId(stream) });
    }
    Ok(rows)
}

/// `%p`: `0x7f8a2c000000`, or `(nil)` for a null pointer.
fn parse_pointer(s: &str) -> Option<u64> {
    if s == "(nil)" {
        return Some(0);
    }
    parse_hex(s)
}

fn parse_hex(s: &str) -> Option<u64> {
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// Decimal `%zu`, at most 2^62 (a larger size is a corrupt log, not a request).
fn parse_size(s: &str) -> Option<u64> {
    s.parse::<u64>().ok().filter(|&n| n <= MAX_SIZE_BYTES)
}

fn convert(rows: Vec<Row>) -> Trace {
    // First pass: frees of pointers never allocated in the log need an alloc at the start.
    let mut live: AddrMap<u64, ()> = AddrMap::default();
    let mut synthetic: Vec<&Row> = Vec::new();
    for r in &rows {
        match r.action {
            RowAction::Allocate => {
                live.insert(r.pointer, ());
            }
            RowAction::Free => {
                if live.remove(&r.pointer).is_none() {
                    synthetic.push(r);
                }
            }
            RowAction::AllocateFailure => {}
        }
    }
    let mut ops = Vec::with_capacity(rows.len() + synthetic.len());
    let mut recorded = Vec::with_capacity(rows.len() * 3 / 2);
    let mut ids: AddrMap<u64, AllocId> = AddrMap::default();
    let mut synthetic_ids: AddrMap<u64, AllocId> = AddrMap::default();
    let mut next = 0u64;
    let mut fresh = || {
        next += 1;
        AllocId(next - 1)
    };
    for r in &synthetic {
        let id = fresh();
        ops.push(Op::Alloc { id, size: r.size, stream: r.stream });
        synthetic_ids.insert(r.line, id);
    }
    for r in &rows {
        let k = ops.len() as u64;
        let rec =
            |kind| RecordedEvent { op: k, kind, addr: r.pointer, size: r.size, stream: r.stream };
        match r.action {
            RowAction::Allocate | RowAction::AllocateFailure => {
                let id = fresh();
                ops.push(Op::Alloc { id, size: r.size, stream: r.stream });
                if r.action == RowAction::Allocate {
                    ids.insert(r.pointer, id);
                    recorded.push(rec(RecordedKind::Alloc));
                } else {
                    recorded.push(RecordedEvent { addr: 0, ..rec(RecordedKind::Oom) });
                }
            }
            RowAction::Free => {
                // The first pass made an id for every free without a live allocation.
                let Some(id) =
                    ids.remove(&r.pointer).or_else(|| synthetic_ids.get(&r.line).copied())
                else {
                    continue;
                };
                ops.push(Op::FreeRequested { id });
                recorded.push(rec(RecordedKind::FreeRequested));
                recorded.push(rec(RecordedKind::FreeCompleted));
            }
        }
    }
    let mut warnings = Vec::new();
    if !synthetic.is_empty() {
        warnings.push(format!(
            "the log starts mid-run: {} frees of pointers it never allocated got synthetic alloc \
             ops at the beginning",
            synthetic.len()
        ));
    }
    Trace {
        meta: TraceMeta { source_format: SOURCE_FORMAT.to_string(), ..TraceMeta::default() },
        ops,
        recorded,
        warnings,
        ..Trace::default()
    }
}

/// Write `trace`'s ops as an RMM log.
///
/// Pointers come from the recorded `Alloc` events when every alloc op has one (a trace read
/// from a recording); otherwise each allocation gets a made-up distinct pointer. An alloc op
/// recorded as `Oom` becomes `allocate failure`. Ops RMM's log cannot express are left out:
/// `RecordStream`/`FreeCompleted` (RMM frees complete at once), `EmptyCache` and settings.
pub fn write_rmm<W: Write>(trace: &Trace, out: W, path: &Path) -> Result<(), TraceError> {
    let mut alloc_addr: AddrMap<u64, u64> = AddrMap::default();
    let mut failed: AddrMap<u64, ()> = AddrMap::default();
    for r in &trace.recorded {
        match r.kind {
            RecordedKind::Alloc => {
                alloc_addr.insert(r.op, r.addr);
            }
            RecordedKind::Oom => {
                failed.insert(r.op, ());
            }
            _ => {}
        }
    }
    let allocs = trace.ops.iter().filter(|o| matches!(o, Op::Alloc { .. })).count();
    let use_recorded = alloc_addr.len() + failed.len() == allocs;
    let mut w = csv::WriterBuilder::new().has_headers(false).from_writer(out);
    let io = |e: csv::Error| TraceError::io(path, std::io::Error::other(e.to_string()));
    w.write_record(HEADER.split(',')).map_err(io)?;
    let mut blocks: AddrMap<AllocId, (u64, u64, StreamId)> = AddrMap::default();
    for (i, op) in trace.ops.iter().enumerate() {
        let i = i as u64;
        let row = |action: &str, ptr: &str, size: u64, stream: StreamId| {
            [
                "1".to_string(),
                "00:00:00.000000".into(),
                action.into(),
                ptr.into(),
                size.to_string(),
                format!("{:x}", stream.0),
            ]
        };
        let record = match op {
            Op::Alloc { size, stream, .. } | Op::AllocAt { size, stream, .. }
                if failed.contains_key(&i) =>
            {
                row("allocate failure", "(nil)", *size, *stream)
            }
            Op::Alloc { id, size, stream } | Op::AllocAt { id, size, stream, .. } => {
                // Made-up pointers: distinct per id, 256-aligned, never 0.
                let made_up = (id.0 + 1) << 8;
                let ptr = if use_recorded {
                    alloc_addr.get(&i).copied().unwrap_or(made_up)
                } else {
                    made_up
                };
                blocks.insert(*id, (ptr, *size, *stream));
                row("allocate", &format!("0x{ptr:x}"), *size, *stream)
            }
            Op::FreeRequested { id } => {
                let Some((ptr, size, stream)) = blocks.remove(id) else {
                    let message = format!("op {i} frees id {} that no alloc op introduced", id.0);
                    return Err(TraceError::Unwritable { path: path.to_path_buf(), message });
                };
                row("free", &format!("0x{ptr:x}"), size, stream)
            }
            _ => continue,
        };
        w.write_record(&record).map_err(io)?;
    }
    w.flush().map_err(|e| TraceError::io(path, e))?;
    Ok(())
}
