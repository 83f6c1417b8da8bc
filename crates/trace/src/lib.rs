//! Every trace format: PyTorch snapshots (safe pickle reader), RMM logs, allocsim's native format.
//!
//! Each format is a module that converts into and out of `allocsim_core::Trace`; this file
//! only picks the module by file name ([`Format`]) and does what all writers share: writing to
//! a temporary file renamed into place, so a failed write never destroys an existing file.
//!
//! | extension | format | reads | writes |
//! |---|---|---|---|
//! | `.pickle`, `.pickle.gz` | PyTorch snapshot ([`pytorch`]) | ops, recorded, stacks, settings, sidecar | from `recorded`, else from ops |
//! | `.csv` (`.rmm.csv`) | RMM `logging_resource_adaptor` log ([`rmm`]) | ops, recorded | ops |
//! | `.allocsim` | native binary ([`native`]) | everything | everything |
//! | `.allocsim.json` | native JSON ([`native`]) | everything | everything |
//!
//! A file whose name fits none of these is recognized by its first bytes when it can be.

mod addr_map;
pub mod atomic;
pub mod built;
pub mod error;
mod inflate;
pub mod native;
pub mod pickle;
pub mod pytorch;
pub mod rmm;

pub use error::TraceError;

use allocsim_core::Trace;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// A trace file format, chosen by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.pickle` (read: gzipped or not, told by content).
    PytorchSnapshot,
    /// `.pickle.gz`.
    PytorchSnapshotGz,
    /// `.csv`, `.rmm.csv`.
    RmmCsv,
    /// `.allocsim`.
    Native,
    /// `.allocsim.json`.
    NativeJson,
}

impl Format {
    /// The format a file name asks for, if any.
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let format = if name.ends_with(".allocsim.json") {
            Format::NativeJson
        } else if name.ends_with(".allocsim") {
            Format::Native
        } else if name.ends_with(".pickle.gz") {
            Format::PytorchSnapshotGz
        } else if name.ends_with(".pickle") || name.ends_with(".pkl") {
            Format::PytorchSnapshot
        } else if name.ends_with(".csv") {
            Format::RmmCsv
        } else {
            return None;
        };
        Some(format)
    }

    /// The format a file's first bytes show, for names that say nothing.
    pub fn sniff(head: &[u8]) -> Option<Format> {
        if head.starts_with(native::MAGIC) {
            Some(Format::Native)
        } else if head.starts_with(&[0x1f, 0x8b]) {
            Some(Format::PytorchSnapshotGz)
        } else if head.len() >= 2 && head[0] == 0x80 && (2..=5).contains(&head[1]) {
            Some(Format::PytorchSnapshot)
        } else if head.starts_with(b"Thread,") {
            Some(Format::RmmCsv)
        } else if head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
            Some(Format::NativeJson)
        } else {
            None
        }
    }
}

/// How to read a trace.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// Read `X.json` next to `X.pickle(.gz)` for settings and expected statistics.
    pub sidecar: bool,
    /// Keep call stacks (`frames`); skipping them saves time on traces recorded with stacks.
    pub stacks: bool,
    /// With `stacks`, keep which op each came from (`Trace::op_stacks`, 16 bytes an op); off,
    /// `Trace::stacks` still lists the distinct stacks.
    pub op_stacks: bool,
    /// Keep each op's recorded time (`Trace::op_times`), which reports and written snapshots
    /// show; a replay reads none, and skipping them saves 16 bytes an op.
    pub times: bool,
    /// Keep every recorded event in `Trace::recorded`. Off, a snapshot's trace keeps only what
    /// a replay without the fidelity comparison reads (the device events, OOMs and deferred
    /// completions: a few hundred of hundreds of thousands) and saves 40 bytes an entry; its
    /// reader tells how many events the recording has (`pytorch::Replayed::recorded_len`).
    pub events: bool,
    /// Hold a snapshot's ops packed while converting, once there are more than this many
    /// ([`PACK_OPS_FROM`] for the commands): a few bytes each instead of an `Op`'s 40
    /// ([`allocsim_core::PackedOps`]). [`pytorch::read_snapshot_packed`] and
    /// [`pytorch::read_snapshot_replaying`] then hand them over packed, and leave
    /// `Trace::ops` empty; every other reader unpacks them at the end. `None`: never.
    pub packed_ops: Option<usize>,
    /// Bounds for the pickle reader.
    pub limits: pickle::Limits,
    /// Read a snapshot's entries straight from the pickle stream (the fast path; the result
    /// is the same). False always builds the whole pickle as values first: for comparisons.
    pub streaming: bool,
    /// Which GPU's trace to read from a snapshot of several (`device_traces[N]`). `None`: the
    /// one that has entries; a snapshot where several have entries is refused.
    pub cuda_device: Option<usize>,
    /// The bytes of a snapshot file read so far are added here as they are read, for a
    /// progress bar (a file read a second time, by the generic reader, counts again).
    pub bytes_read: Option<Arc<AtomicU64>>,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            sidecar: true,
            stacks: true,
            op_stacks: true,
            times: true,
            events: true,
            packed_ops: None,
            limits: pickle::Limits::default(),
            streaming: true,
            cuda_device: None,
            bytes_read: None,
        }
    }
}

/// The ops a snapshot's conversion holds as `Op`s before it packs them, where
/// [`ReadOptions::packed_ops`] asks (40 MB of them): packing and unpacking costs the reading of
/// a smaller snapshot about a twentieth more time, and saves memory only where it matters.
pub const PACK_OPS_FROM: usize = 1 << 20;

impl ReadOptions {
    /// Defaults without the sidecar: the file alone.
    pub fn without_sidecar() -> Self {
        ReadOptions { sidecar: false, ..ReadOptions::default() }
    }
}

/// Read a trace in the format its name (or else its content) shows, with a snapshot's sidecar.
pub fn read_trace(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
    read_trace_with(path, &ReadOptions::default())
}

/// [`read_trace`] with options.
pub fn read_trace_with(path: impl AsRef<Path>, opts: &ReadOptions) -> Result<Trace, TraceError> {
    let path = path.as_ref();
    let format = match Format::from_path(path) {
        Some(f) => f,
        None => sniff_file(path)?.ok_or_else(|| TraceError::UnknownFormat { path: path.into() })?,
    };
    match format {
        Format::PytorchSnapshot | Format::PytorchSnapshotGz => pytorch::read_snapshot(path, opts),
        Format::RmmCsv => rmm::read_rmm(path),
        Format::Native => native::read_native_with(path, opts),
        Format::NativeJson => native::read_native_json(path),
    }
}

fn sniff_file(path: &Path) -> Result<Option<Format>, TraceError> {
    let mut head = Vec::with_capacity(16);
    error::open_regular(path)?
        .take(16)
        .read_to_end(&mut head)
        .map_err(|e| TraceError::io(path, e))?;
    if head.is_empty() {
        return Err(TraceError::Empty { path: path.into() });
    }
    Ok(Format::sniff(&head))
}

/// Write `trace` in the format its name asks for, atomically (temporary file, then rename).
pub fn write_trace(trace: &Trace, path: impl AsRef<Path>) -> Result<(), TraceError> {
    let path = path.as_ref();
    let format =
        Format::from_path(path).ok_or_else(|| TraceError::UnknownFormat { path: path.into() })?;
    // No format but the snapshot itself holds a state at the start: lay it out as ops.
    let laid_out;
    let trace = if trace.start.is_some() {
        laid_out = trace.clone().with_start_as_ops();
        &laid_out
    } else {
        trace
    };
    write_atomically(path, |out| match format {
        Format::PytorchSnapshot => pytorch::write_snapshot(trace, out, false, path),
        Format::PytorchSnapshotGz => pytorch::write_snapshot(trace, out, true, path),
        Format::RmmCsv => rmm::write_rmm(trace, out, path),
        Format::Native => native::write_native(trace, out, path),
        Format::NativeJson => native::write_native_json(trace, out, path),
    })
}

/// Run `write` into an [`atomic::AtomicFile`]: `path` is replaced only when all of it was
/// written; on any error nothing is left behind.
fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut atomic::AtomicFile) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    let mut out = atomic::AtomicFile::create(path).map_err(|e| TraceError::io(path, e))?;
    write(&mut out)?;
    out.commit().map_err(|e| TraceError::io(path, e))
}
