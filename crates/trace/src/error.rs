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

/// How much of a string from the input an error quotes.
pub const QUOTED_CHARS: usize = 60;

/// `text` as an error quotes it: in Rust's debug quotes, cut after [`QUOTED_CHARS`] characters
/// with its length in bytes, so a hostile 100 MB field makes a one-line message.
pub fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}... ({} bytes)", &text[..end], text.len()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quotes_are_cut_on_a_character_boundary() {
        assert_eq!(super::quoted("allocate"), "\"allocate\"");
        let long = "é".repeat(1000);
        let q = super::quoted(&long);
        assert!(
            q.starts_with(&format!("{:?}", &long[..120])[..121]) && q.ends_with("... (2000 bytes)"),
            "{q}"
        );
    }
}
