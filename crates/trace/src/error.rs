//! One error type for every format, each variant naming the file and the place in it: a byte
//! offset in a pickle, an entry and field in a snapshot, a line and column in a CSV log.

use crate::pickle::PickleError;
use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
/// The underlying error is part of each message rather than a `source()`, so that every
/// message stands on its own and printing the chain never repeats it.
pub enum TraceError {
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },

    #[error("{}: empty file", path.display())]
    Empty { path: PathBuf },

    /// A FIFO, a device, a socket or a folder: opening a FIFO would wait for a writer forever.
    #[error("{}: not a regular file ({kind}); allocsim reads traces from files", path.display())]
    NotAFile { path: PathBuf, kind: &'static str },

    #[error(
        "{}: unknown trace format (expected .pickle, .pickle.gz, .csv, .allocsim or \
         .allocsim.json)",
        path.display()
    )]
    UnknownFormat { path: PathBuf },

    /// The pickle itself is bad: truncated, corrupt, or it tries to run code.
    #[error("{}: pickle {error}", path.display())]
    Pickle { path: PathBuf, error: PickleError },

    /// The pickle is fine but is not a snapshot we understand. `place` is a Python-like path
    /// such as `device_traces[0][17].size`.
    #[error("{}: {place}: {message}", path.display())]
    Snapshot { path: PathBuf, place: String, message: String },

    /// A sidecar `.json` next to a snapshot has a field of the wrong type.
    #[error("{}: {place}: {message}", path.display())]
    Sidecar { path: PathBuf, place: String, message: String },

    /// `column` is the header name, empty when the whole record is malformed.
    #[error(
        "{}: line {line}{}: {message}",
        path.display(),
        if column.is_empty() { String::new() } else { format!(", column {column}") }
    )]
    Csv { path: PathBuf, line: u64, column: String, message: String },

    #[error("{}: {message}", path.display())]
    Native { path: PathBuf, message: String },

    #[error("{}: JSON: {error}", path.display())]
    Json { path: PathBuf, error: serde_json::Error },

    /// The trace built from the file would take more memory than its size allows
    /// (`crate::built`).
    #[error("{}: {message}", path.display())]
    TooBig { path: PathBuf, message: String },

    /// The trace cannot be expressed in the format asked for.
    #[error("{}: cannot write: {message}", path.display())]
    Unwritable { path: PathBuf, message: String },
}

impl TraceError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        TraceError::Io { path: path.into(), error: source }
    }
}

/// Open `path` for reading if it is a regular file (links followed). Anything else is refused
/// by name before it is opened: a FIFO's `open` blocks until something writes to it.
pub(crate) fn open_regular(path: &std::path::Path) -> Result<std::fs::File, TraceError> {
    let kind = std::fs::metadata(path).map_err(|e| TraceError::io(path, e))?.file_type();
    if !kind.is_file() {
        let kind = if kind.is_dir() { "a directory" } else { special_kind(kind) };
        return Err(TraceError::NotAFile { path: path.into(), kind });
    }
    std::fs::File::open(path).map_err(|e| TraceError::io(path, e))
}

#[cfg(unix)]
fn special_kind(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else {
        "not a file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: std::fs::FileType) -> &'static str {
    "not a file"
}

pub use allocsim_core::text::{quoted, QUOTED_CHARS};
