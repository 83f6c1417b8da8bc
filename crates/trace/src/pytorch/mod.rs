//! PyTorch memory snapshots (`torch.cuda.memory._snapshot()` as `_dump_snapshot` pickles it).
//!
//! Reading goes file -> (gunzip) -> safe pickle VM -> `Value` tree -> checked entries
//! (`entries`) -> ops and recorded events (`convert`) -> `Trace`, plus the optional sidecar
//! JSON (`sidecar`). The stages are separate so each has one kind of error: the pickle names a
//! byte offset, the entries a Python path such as `device_traces[0][17].size`.

mod convert;
mod entries;
mod sidecar;
mod stacks;
mod write;

pub use convert::UNKNOWN_STREAM;
pub use sidecar::sidecar_path;
pub use write::trace_to_snapshot;

use crate::error::TraceError;
use crate::pickle::{self, Value};
use crate::ReadOptions;
use allocsim_core::{Trace, TraceMeta};
use entries::Ctx;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

/// The `source_format` of traces read from a snapshot.
pub const SOURCE_FORMAT: &str = "pytorch-snapshot";

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Read a snapshot file, gzipped or not (told by its first bytes, whatever its name), and its
/// sidecar JSON if `opts.sidecar`.
///
/// With `opts.streaming` the entries are first read by the record streamer
/// ([`pickle::read_records`]) without building them as values; anything it does not expect,
/// including every error, makes the file be read again the generic way, which gives the same
/// trace or the same error.
pub fn read_snapshot(path: &Path, opts: &ReadOptions) -> Result<Trace, TraceError> {
    let streamed = if opts.streaming { read_snapshot_streaming(path, opts)? } else { None };
    let mut trace = match streamed {
        Some(trace) => trace,
        None => {
            let root = parse(open(path)?, path, opts)?;
            snapshot_to_trace(&root, path, opts.stacks)?
        }
    };
    if opts.sidecar {
        sidecar::apply(path, &mut trace.meta)?;
    }
    Ok(trace)
}

/// The decompressed pickle stream of a snapshot file.
enum Source {
    Plain(BufReader<File>),
    Gzip(Box<flate2::bufread::MultiGzDecoder<BufReader<File>>>),
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::Plain(r) => r.read(buf),
            Source::Gzip(r) => r.read(buf),
        }
    }
}

fn open(path: &Path) -> Result<Source, TraceError> {
    let file = File::open(path).map_err(|e| TraceError::io(path, e))?;
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let head = reader.fill_buf().map_err(|e| TraceError::io(path, e))?;
    if head.is_empty() {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    Ok(if head.starts_with(&GZIP_MAGIC) {
        Source::Gzip(Box::new(flate2::bufread::MultiGzDecoder::new(reader)))
    } else {
        Source::Plain(reader)
    })
}

fn parse<R: Read>(reader: R, path: &Path, opts: &ReadOptions) -> Result<Value, TraceError> {
    pickle::from_reader_with(reader, &opts.limits)
        .map_err(|error| TraceError::Pickle { path: path.to_path_buf(), error })
}

/// The trace by way of the record streamer alone, or `None` where [`read_snapshot`] would
/// fall back to the generic reader (without the sidecar; for tests and benchmarks).
pub fn read_snapshot_streaming(
    path: &Path,
    opts: &ReadOptions,
) -> Result<Option<Trace>, TraceError> {
    let source = open(path)?;
    let ctx = Ctx { path };
    let mut entries = entries::Entries::default();
    let spec = pickle::RecordSpec { top_key: "device_traces", fields: &entries::ENTRY_FIELDS };
    let records = pickle::read_records(source, &opts.limits, spec, |fields| {
        let [a, b, c, d, e, f] = fields else { return false };
        let fields = [a.as_ref(), b.as_ref(), c.as_ref(), d.as_ref(), e.as_ref(), f.as_ref()];
        if let Some(entry) = entries::entry_plain(&fields) {
            entries.list.push(entry);
            return true;
        }
        match entries::entry_from_fields(ctx, entries.list.len(), &fields) {
            Ok((entry, frames)) => {
                entries.push(entry, frames);
                true
            }
            Err(_) => false,
        }
    });
    let Some(records) = records else { return Ok(None) };
    let streamed = records.streamed.then_some(entries);
    // An error here is left to the generic reader too, so every message comes from one place.
    Ok(convert_root(&records.root, path, opts.stacks, streamed).ok())
}

/// Convert an unpickled snapshot. `path` only names the source in errors.
pub fn snapshot_to_trace(
    root: &Value,
    path: &Path,
    with_stacks: bool,
) -> Result<Trace, TraceError> {
    convert_root(root, path, with_stacks, None)
}

fn convert_root(
    root: &Value,
    path: &Path,
    with_stacks: bool,
    streamed: Option<entries::Entries>,
) -> Result<Trace, TraceError> {
    let ctx = Ctx { path };
    let (entries, other_devices) = entries::device_trace(ctx, root, streamed)?;
    let alive = entries::alive_blocks(ctx, root)?;
    let alloc_conf = entries::alloc_conf(ctx, root)?;
    let converted = convert::convert(ctx, &entries, &alive, with_stacks)?;
    let mut warnings = Vec::new();
    if !other_devices.is_empty() {
        warnings.push(format!(
            "device_traces has entries for devices {other_devices:?} too; only device 0 is read"
        ));
    }
    warnings.extend(converted.warnings);
    Ok(Trace {
        meta: TraceMeta {
            source_format: SOURCE_FORMAT.to_string(),
            alloc_conf,
            ..TraceMeta::default()
        },
        ops: converted.ops,
        recorded: converted.recorded,
        stacks: converted.stacks,
        op_stacks: converted.op_stacks,
        warnings,
    })
}

/// Write `trace` as a snapshot pickle (gzipped if `gzip`). See [`trace_to_snapshot`].
pub fn write_snapshot<W: Write>(
    trace: &Trace,
    out: W,
    gzip: bool,
    path: &Path,
) -> Result<(), TraceError> {
    let value = trace_to_snapshot(trace)
        .map_err(|message| TraceError::Unwritable { path: path.to_path_buf(), message })?;
    let pickle_err = |error| TraceError::Pickle { path: path.to_path_buf(), error };
    if gzip {
        let mut enc = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        pickle::write(&value, &mut enc).map_err(pickle_err)?;
        enc.finish().map_err(|e| TraceError::io(path, e))?;
        Ok(())
    } else {
        pickle::write(&value, out).map_err(pickle_err)
    }
}
