//! allocsim's own format: everything a `Trace` holds, losslessly, two ways.
//!
//! - `.allocsim`: `b"ALLOCSIM"`, a little-endian `u32` version, then the trace. Version 2
//!   (written) is a header and chunks (`chunked`): compact, fast, and streamed, so a trace
//!   of any length replays in bounded memory ([`read_native_ops`]). Version 1 (still read) is
//!   bincode 2 (standard config) of [`NativeFile`] in one piece.
//! - `.allocsim.json`: [`NativeFile`] as JSON (schema [`VERSION`]), for people and other
//!   tools.
//!
//! Core types are deliberately not serde (so a file format can change without touching the
//! vocabulary every policy is written in): the schema is this module's mirror structs, and the
//! version number changes when they do. The stored `meta.source_format` is kept as written, so
//! a snapshot converted to native still says where it came from.

use crate::built::Built;
use crate::error::TraceError;
use allocsim_core::{
    AllocId, MemPoolId, Op, PoolAction, RecordedEvent, RecordedKind, Stack, StackFrame, StreamId,
    Trace, TraceMeta,
};
use serde::{Deserialize, Serialize};
use std::io::{BufReader, Read, Write};
use std::path::Path;

mod chunked;

pub use chunked::{NativeHeader, NativeOps, NativeWriter, PlainOps, BINARY_VERSION};

pub const MAGIC: &[u8; 8] = b"ALLOCSIM";
/// The version of the [`NativeFile`] schema: of the JSON form and of binary version 1.
pub const VERSION: u32 = 1;
pub const FORMAT_NAME: &str = "allocsim";
/// `source_format` of a native file that does not name its origin.
pub const SOURCE_FORMAT: &str = "allocsim-native";

/// Strings in a binary file may claim at most this many bytes in all, so a corrupt length
/// cannot make bincode allocate without bound.
const MAX_STRING_BYTES: usize = 1 << 30;

pub(crate) fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_STRING_BYTES>()
}

/// A bincode decoding error in words (bincode's own `Display` is its `Debug`).
pub(crate) fn decode_message(e: &bincode::error::DecodeError) -> String {
    use bincode::error::DecodeError as E;
    match e {
        E::UnexpectedEnd { .. } => "the data ends early (truncated?)".into(),
        E::LimitExceeded => {
            format!("a length claims more than {MAX_STRING_BYTES} bytes")
        }
        E::UnexpectedVariant { found, type_name, .. } => {
            format!("unknown tag {found} for a {type_name}")
        }
        E::Utf8 { .. } => "a string that is not UTF-8".into(),
        E::InvalidBooleanValue(b) => format!("byte {b} where a bool (0 or 1) belongs"),
        E::OutsideUsizeRange(n) => format!("a length of {n}, more than this machine can hold"),
        E::InvalidIntegerType { .. } => "a malformed integer".into(),
        E::Io { inner, .. } => format!("read error: {inner}"),
        other => format!("{other}"),
    }
}

/// The on-disk schema, version 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NativeFile {
    pub format: String,
    pub version: u32,
    pub meta: NativeMeta,
    pub ops: Vec<NativeOp>,
    pub recorded: Vec<NativeRecorded>,
    pub stacks: Vec<Vec<NativeFrame>>,
    pub op_stacks: Vec<(u64, u32)>,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NativeMeta {
    pub source_format: String,
    pub alloc_conf: Option<String>,
    pub memory_fraction: Option<f64>,
    pub device_total_bytes: Option<u64>,
    pub device_free_bytes: Option<u64>,
    pub expected_stats: Option<Vec<(String, i64)>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NativeOp {
    Alloc {
        id: u64,
        size: u64,
        stream: u64,
    },
    FreeRequested {
        id: u64,
    },
    FreeCompleted {
        id: u64,
    },
    RecordStream {
        id: u64,
        stream: u64,
    },
    EmptyCache,
    SetMemoryFraction {
        fraction: f64,
    },
    SetAllocatorSettings {
        conf: String,
    },
    /// A private pool's `MempoolId` and what happens to it (`pool_action_tag`).
    Pool {
        pool: [u64; 2],
        action: u8,
    },
    AllocAt {
        id: u64,
        size: u64,
        stream: u64,
        addr: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NativeKind {
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Alloc,
    FreeRequested,
    FreeCompleted,
    Oom,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeRecorded {
    pub op: u64,
    pub kind: NativeKind,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeFrame {
    pub name: String,
    pub filename: String,
    pub line: u32,
}

impl NativeMeta {
    pub fn from_meta(m: &TraceMeta) -> NativeMeta {
        NativeMeta {
            source_format: m.source_format.clone(),
            alloc_conf: m.alloc_conf.clone(),
            memory_fraction: m.memory_fraction,
            device_total_bytes: m.device_total_bytes,
            device_free_bytes: m.device_free_bytes,
            expected_stats: m.expected_stats.clone(),
        }
    }

    /// The meta; an empty `source_format` becomes [`SOURCE_FORMAT`]. A memory fraction that
    /// is not a number is refused.
    pub fn into_meta(self) -> Result<TraceMeta, String> {
        if let Some(f) = self.memory_fraction.filter(|f| !f.is_finite()) {
            return Err(format!("meta.memory_fraction is {f}"));
        }
        let source_format = if self.source_format.is_empty() {
            SOURCE_FORMAT.to_string()
        } else {
            self.source_format
        };
        Ok(TraceMeta {
            source_format,
            alloc_conf: self.alloc_conf,
            memory_fraction: self.memory_fraction,
            device_total_bytes: self.device_total_bytes,
            device_free_bytes: self.device_free_bytes,
            expected_stats: self.expected_stats,
            stats_at_start: None,
            outside_allocator_bytes: None,
            outside_profile: Vec::new(),
            // The format has no place for it (bincode files are not self-describing).
            recorded_with: None,
            calls_recorded: false,
            rank: None,
            world_size: None,
        })
    }
}

impl NativeFile {
    pub fn from_trace(t: &Trace) -> NativeFile {
        NativeFile {
            format: FORMAT_NAME.to_string(),
            version: VERSION,
            meta: NativeMeta::from_meta(&t.meta),
            ops: t.ops.iter().map(op_out).collect(),
            recorded: t.recorded.iter().map(recorded_out).collect(),
            stacks: t.stacks.iter().map(|s| s.frames.iter().map(frame_out).collect()).collect(),
            op_stacks: t.op_stacks.clone(),
            warnings: t.warnings.clone(),
        }
    }

    /// The trace, after checking that every index points somewhere.
    pub fn into_trace(self) -> Result<Trace, String> {
        let ops = self.ops.len() as u64;
        if let Some((i, r)) = self.recorded.iter().enumerate().find(|(_, r)| r.op >= ops) {
            return Err(format!("recorded[{i}].op is {} but there are {ops} ops", r.op));
        }
        let stacks = self.stacks.len() as u64;
        for (i, &(op, s)) in self.op_stacks.iter().enumerate() {
            if op >= ops || u64::from(s) >= stacks {
                return Err(format!(
                    "op_stacks[{i}] = ({op}, {s}) but there are {ops} ops and {stacks} stacks"
                ));
            }
        }
        Ok(Trace {
            meta: self.meta.into_meta()?,
            start: None,
            ops: self.ops.into_iter().map(op_in).collect::<Result<_, _>>()?,
            recorded: self.recorded.into_iter().map(recorded_in).collect(),
            stacks: self
                .stacks
                .into_iter()
                .map(|frames| Stack { frames: frames.into_iter().map(frame_in).collect() })
                .collect(),
            op_stacks: self.op_stacks,
            op_times: Vec::new(),
            annotations: Vec::new(),
            op_annotations: Vec::new(),
            warnings: self.warnings,
        })
    }
}

fn op_out(op: &Op) -> NativeOp {
    match op {
        Op::Alloc { id, size, stream } => {
            NativeOp::Alloc { id: id.0, size: *size, stream: stream.0 }
        }
        Op::FreeRequested { id } => NativeOp::FreeRequested { id: id.0 },
        Op::FreeCompleted { id } => NativeOp::FreeCompleted { id: id.0 },
        Op::RecordStream { id, stream } => NativeOp::RecordStream { id: id.0, stream: stream.0 },
        Op::EmptyCache => NativeOp::EmptyCache,
        Op::SetMemoryFraction { fraction } => NativeOp::SetMemoryFraction { fraction: *fraction },
        Op::SetAllocatorSettings { conf } => NativeOp::SetAllocatorSettings { conf: conf.clone() },
        Op::Pool { pool, action } => {
            NativeOp::Pool { pool: [pool.0, pool.1], action: pool_action_tag(*action) }
        }
        Op::AllocAt { id, size, stream, addr } => {
            NativeOp::AllocAt { id: id.0, size: *size, stream: stream.0, addr: *addr }
        }
    }
}

fn op_in(op: NativeOp) -> Result<Op, String> {
    Ok(match op {
        NativeOp::Alloc { id, size, stream } => {
            Op::Alloc { id: AllocId(id), size, stream: StreamId(stream) }
        }
        NativeOp::FreeRequested { id } => Op::FreeRequested { id: AllocId(id) },
        NativeOp::FreeCompleted { id } => Op::FreeCompleted { id: AllocId(id) },
        NativeOp::RecordStream { id, stream } => {
            Op::RecordStream { id: AllocId(id), stream: StreamId(stream) }
        }
        NativeOp::EmptyCache => Op::EmptyCache,
        NativeOp::SetMemoryFraction { fraction } if !fraction.is_finite() => {
            return Err(format!("a memory fraction of {fraction}"))
        }
        NativeOp::SetMemoryFraction { fraction } => Op::SetMemoryFraction { fraction },
        NativeOp::SetAllocatorSettings { conf } => Op::SetAllocatorSettings { conf },
        NativeOp::AllocAt { id, size, stream, addr } => {
            Op::AllocAt { id: AllocId(id), size, stream: StreamId(stream), addr }
        }
        NativeOp::Pool { pool, action } => {
            let action = pool_action_of(action).ok_or(format!("unknown pool action {action}"))?;
            Op::Pool { pool: MemPoolId(pool[0], pool[1]), action }
        }
    })
}

/// The byte a pool action is stored as, in both native layouts.
pub(crate) fn pool_action_tag(action: PoolAction) -> u8 {
    match action {
        PoolAction::BeginAllocate => 0,
        PoolAction::EndAllocate => 1,
        PoolAction::Release => 2,
    }
}

pub(crate) fn pool_action_of(tag: u8) -> Option<PoolAction> {
    Some(match tag {
        0 => PoolAction::BeginAllocate,
        1 => PoolAction::EndAllocate,
        2 => PoolAction::Release,
        _ => return None,
    })
}

fn recorded_out(r: &RecordedEvent) -> NativeRecorded {
    let kind = match r.kind {
        RecordedKind::SegmentAlloc => NativeKind::SegmentAlloc,
        RecordedKind::SegmentFree => NativeKind::SegmentFree,
        RecordedKind::SegmentMap => NativeKind::SegmentMap,
        RecordedKind::SegmentUnmap => NativeKind::SegmentUnmap,
        RecordedKind::Alloc => NativeKind::Alloc,
        RecordedKind::FreeRequested => NativeKind::FreeRequested,
        RecordedKind::FreeCompleted => NativeKind::FreeCompleted,
        RecordedKind::Oom => NativeKind::Oom,
    };
    NativeRecorded { op: r.op, kind, addr: r.addr, size: r.size, stream: r.stream.0 }
}

fn recorded_in(r: NativeRecorded) -> RecordedEvent {
    let kind = match r.kind {
        NativeKind::SegmentAlloc => RecordedKind::SegmentAlloc,
        NativeKind::SegmentFree => RecordedKind::SegmentFree,
        NativeKind::SegmentMap => RecordedKind::SegmentMap,
        NativeKind::SegmentUnmap => RecordedKind::SegmentUnmap,
        NativeKind::Alloc => RecordedKind::Alloc,
        NativeKind::FreeRequested => RecordedKind::FreeRequested,
        NativeKind::FreeCompleted => RecordedKind::FreeCompleted,
        NativeKind::Oom => RecordedKind::Oom,
    };
    RecordedEvent { op: r.op, kind, addr: r.addr, size: r.size, stream: StreamId(r.stream) }
}

fn frame_out(f: &StackFrame) -> NativeFrame {
    NativeFrame { name: f.name.clone(), filename: f.filename.clone(), line: f.line }
}

fn frame_in(f: NativeFrame) -> StackFrame {
    StackFrame { name: f.name, filename: f.filename, line: f.line }
}

fn native_err(path: &Path, message: impl Into<String>) -> TraceError {
    TraceError::Native { path: path.to_path_buf(), message: message.into() }
}

/// Write the binary form (version 2).
pub fn write_native<W: Write>(trace: &Trace, out: W, path: &Path) -> Result<(), TraceError> {
    let mut w = NativeWriter::new(out, trace, trace.ops.len() as u64, path)?;
    for op in &trace.ops {
        w.op(op)?;
    }
    w.finish()?;
    Ok(())
}

/// Read the binary form.
pub fn read_native(path: &Path) -> Result<Trace, TraceError> {
    read_native_with(path, &crate::ReadOptions::default())
}

/// Read the binary form, building no more than `opts` allow ([`crate::built`]).
pub fn read_native_with(path: &Path, opts: &crate::ReadOptions) -> Result<Trace, TraceError> {
    let file = crate::error::open_regular(path)?;
    let built = Built::for_file(path, opts);
    read_native_bounded(BufReader::with_capacity(256 * 1024, file), path, &built)
}

/// The magic and the version, checked.
fn read_version<R: Read>(input: &mut R, path: &Path) -> Result<u32, TraceError> {
    let mut header = Vec::with_capacity(12);
    input.take(12).read_to_end(&mut header).map_err(|e| TraceError::io(path, e))?;
    if header.is_empty() {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    if header.len() < 12 || &header[..8] != MAGIC {
        return Err(native_err(path, "not an allocsim file (no ALLOCSIM magic at the start)"));
    }
    let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if version != VERSION && version != BINARY_VERSION {
        return Err(native_err(
            path,
            format!(
                "unsupported allocsim format version {version} (this build reads {VERSION} and \
                 {BINARY_VERSION})"
            ),
        ));
    }
    Ok(version)
}

/// Read the binary form (either version) from any reader; `path` names it in errors.
pub fn read_native_from<R: Read>(input: R, path: &Path) -> Result<Trace, TraceError> {
    read_native_bounded(input, path, &Built::with_limit(path, u64::MAX))
}

fn read_native_bounded<R: Read>(
    mut input: R,
    path: &Path,
    built: &Built,
) -> Result<Trace, TraceError> {
    if read_version(&mut input, path)? == VERSION {
        return read_v1(input, path);
    }
    let (header, mut trace, ops) =
        chunked::read_head(input, path, chunked::KeepRecorded::All, built)?;
    let held = trace_held_bytes(&trace);
    // The count is a claim until the ops arrive: reserve no more than a chunk's worth on it.
    trace.ops.reserve_exact(usize::try_from(header.ops).unwrap_or(0).min(1 << 16));
    let (mut strings, mut checked) = (0u64, 0usize);
    for op in ops {
        let op = op?;
        if let Op::SetAllocatorSettings { conf } = &op {
            strings += conf.len() as u64;
        }
        trace.ops.push(op);
        if trace.ops.len() - checked >= 1 << 16 || strings > 0 {
            checked = trace.ops.len();
            let bytes = held + (checked * size_of::<Op>()) as u64 + strings;
            built.check(bytes, || format!("{checked} ops"))?;
        }
    }
    Ok(trace)
}

/// What `read_head` left in a trace, as [`crate::built`] counts it.
fn trace_held_bytes(trace: &Trace) -> u64 {
    let warnings: u64 = trace.warnings.iter().map(|w| crate::built::string_bytes(w)).sum();
    let frames = trace.stacks.iter().flat_map(|s| &s.frames);
    let frames: u64 =
        frames.map(|f| (size_of::<StackFrame>() + f.name.len() + f.filename.len()) as u64).sum();
    warnings
        + frames
        + (trace.stacks.len() * size_of::<Stack>()) as u64
        + (trace.recorded.len() * size_of::<RecordedEvent>()) as u64
        + (trace.op_stacks.len() * size_of::<(u64, u32)>()) as u64
}

/// A native trace opened for streaming: everything but the ops in `head`, the ops in `ops`.
#[derive(Debug)]
pub struct NativeStream {
    /// The trace without its ops. Its `recorded` holds only the segment events and ooms (what
    /// a device following the recording needs), so memory stays bounded; [`read_native`]
    /// reads every recorded event.
    pub head: Trace,
    /// How many recorded events the file holds.
    pub recorded_len: u64,
    pub ops: NativeOps<Box<dyn Read>>,
}

/// Open a binary native trace for streaming its ops. A version 1 file (one piece, not
/// streamable) is read whole first; a version 2 file streams a chunk at a time.
pub fn read_native_ops(path: &Path) -> Result<NativeStream, TraceError> {
    read_native_ops_with(path, &crate::ReadOptions::default())
}

/// [`read_native_ops`], holding no more than `opts` allow ([`crate::built`]).
pub fn read_native_ops_with(
    path: &Path,
    opts: &crate::ReadOptions,
) -> Result<NativeStream, TraceError> {
    let built = Built::for_file(path, opts);
    let file = crate::error::open_regular(path)?;
    let mut input = BufReader::with_capacity(256 * 1024, file);
    if read_version(&mut input, path)? == VERSION {
        let mut trace = read_v1(input, path)?;
        let ops = std::mem::take(&mut trace.ops);
        // Re-encoded in memory, so both versions share one decoder.
        let mut bytes = Vec::new();
        let mut w = NativeWriter::new(&mut bytes, &trace, ops.len() as u64, path)?;
        ops.iter().try_for_each(|op| w.op(op))?;
        w.finish()?;
        let mut input: Box<dyn Read> = Box::new(std::io::Cursor::new(bytes));
        read_version(&mut input, path)?;
        let keep = chunked::KeepRecorded::DeviceEvents;
        let (_, head, ops) = chunked::read_head(input, path, keep, &built)?;
        return Ok(NativeStream { head, recorded_len: trace.recorded.len() as u64, ops });
    }
    let input: Box<dyn Read> = Box::new(input);
    let keep = chunked::KeepRecorded::DeviceEvents;
    let (header, head, ops) = chunked::read_head(input, path, keep, &built)?;
    Ok(NativeStream { head, recorded_len: header.recorded, ops })
}

/// Version 1 after its version: bincode of [`NativeFile`], decoded a field and a list item
/// at a time (bincode writes a struct as its fields in order, a list as its length and its
/// items), so the ops are held once, as ops, and a length is a claim until its items arrive.
fn read_v1<R: Read>(mut input: R, path: &Path) -> Result<Trace, TraceError> {
    fn next<T: serde::de::DeserializeOwned>(
        input: &mut impl Read,
        path: &Path,
        what: impl std::fmt::Display,
    ) -> Result<T, TraceError> {
        bincode::serde::decode_from_std_read(input, bincode_config()).map_err(|e| {
            native_err(path, format!("corrupt or truncated at {what}: {}", decode_message(&e)))
        })
    }
    fn list<T: serde::de::DeserializeOwned, U>(
        input: &mut impl Read,
        path: &Path,
        name: &str,
        mut each: impl FnMut(T) -> Result<U, String>,
    ) -> Result<Vec<U>, TraceError> {
        let n: u64 = next(input, path, format_args!("the length of {name}"))?;
        let mut items = Vec::with_capacity(usize::try_from(n).unwrap_or(0).min(1 << 16));
        for i in 0..n {
            let item = next(input, path, format_args!("{name}[{i}]"))?;
            items.push(each(item).map_err(|m| native_err(path, format!("{name}[{i}]: {m}")))?);
        }
        Ok(items)
    }
    let input = &mut input;
    let format: String = next(input, path, "format")?;
    let version: u32 = next(input, path, "version")?;
    if format != FORMAT_NAME || version != VERSION {
        return Err(native_err(path, "the file does not name allocsim version 1"));
    }
    let meta: NativeMeta = next(input, path, "meta")?;
    let ops = list(input, path, "ops", op_in)?;
    let n = ops.len() as u64;
    let recorded = list(input, path, "recorded", |r: NativeRecorded| match r.op < n {
        true => Ok(recorded_in(r)),
        false => Err(format!("op is {} but there are {n} ops", r.op)),
    })?;
    let stacks = list(input, path, "stacks", |frames: Vec<NativeFrame>| {
        Ok(Stack { frames: frames.into_iter().map(frame_in).collect() })
    })?;
    let m = stacks.len() as u64;
    let op_stacks = list(input, path, "op_stacks", |(op, s): (u64, u32)| {
        if op < n && u64::from(s) < m {
            Ok((op, s))
        } else {
            Err(format!("({op}, {s}) but there are {n} ops and {m} stacks"))
        }
    })?;
    let warnings = list(input, path, "warnings", Ok::<String, String>)?;
    Ok(Trace {
        meta: meta.into_meta().map_err(|m| native_err(path, m))?,
        ops,
        recorded,
        stacks,
        op_stacks,
        warnings,
        ..Trace::default()
    })
}

/// Write the JSON form.
pub fn write_native_json<W: Write>(trace: &Trace, out: W, path: &Path) -> Result<(), TraceError> {
    serde_json::to_writer_pretty(out, &NativeFile::from_trace(trace))
        .map_err(|error| TraceError::Json { path: path.to_path_buf(), error })
}

/// Just the header fields, read when the file is no [`NativeFile`], so that a file of
/// another kind or version gets a clear message.
#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    version: Option<u32>,
}

/// Read the JSON form: parsed once, as it is read, into the schema's structs.
pub fn read_native_json(path: &Path) -> Result<Trace, TraceError> {
    let open = || -> Result<_, TraceError> {
        let file = crate::error::open_regular(path)?;
        Ok(BufReader::with_capacity(256 * 1024, file))
    };
    let json_err = |error| TraceError::Json { path: path.to_path_buf(), error };
    match serde_json::from_reader::<_, NativeFile>(open()?) {
        Ok(file) if file.format == FORMAT_NAME && file.version == VERSION => {
            file.into_trace().map_err(|m| native_err(path, m))
        }
        Ok(_) => Err(json_header_error(path, serde_json::from_reader(open()?).map_err(json_err)?)),
        Err(e)
            if e.is_eof() && open()?.bytes().all(|b| b.is_ok_and(|b| b.is_ascii_whitespace())) =>
        {
            Err(TraceError::Empty { path: path.to_path_buf() })
        }
        // A file of another kind or version says so rather than naming a missing field.
        Err(e) => match serde_json::from_reader::<_, Header>(open()?) {
            Ok(header) if !is_v1(&header) => Err(json_header_error(path, header)),
            _ => Err(json_err(e)),
        },
    }
}

fn is_v1(header: &Header) -> bool {
    header.format.as_deref() == Some(FORMAT_NAME) && header.version == Some(VERSION)
}

fn json_header_error(path: &Path, header: Header) -> TraceError {
    if header.format.as_deref() != Some(FORMAT_NAME) {
        return native_err(path, "not an allocsim JSON trace (no \"format\": \"allocsim\")");
    }
    let v = header.version.map_or("none".to_string(), |v| v.to_string());
    native_err(
        path,
        format!("unsupported allocsim format version {v} (this build reads {VERSION})"),
    )
}
