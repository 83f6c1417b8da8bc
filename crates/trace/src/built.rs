//! A bound on the trace a reader builds, as `pickle::budget` bounds what the pickle reader
//! holds itself: a 5 MB gzip of 45 million identical entries, or a native file of 64 MiB of
//! one-byte ops or empty warnings, builds gigabytes of ops, events and strings while the
//! reader holds almost nothing.
//!
//! The limit is the larger of two thirds of the reader's (`pickle::Limits::max_held_bytes`:
//! 512 MiB by default, raised with it) and a multiple of the file's size: 64 bytes a byte of a
//! gzip file, 16 otherwise. Real files stay far under it: the bundled snapshots build 60 to
//! 120 bytes an entry from 5 to 10 gzipped bytes (a 50-million-entry snapshot is a file of
//! 250 MB or more, allowed 16 GB), and a native file about 10 bytes a byte. What is counted
//! is what the trace keeps: ops, recorded events, their stacks, times and annotations, and
//! strings by their length.

use crate::error::TraceError;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Bytes of trace allowed for each byte of a gzip file.
pub const PER_GZIP_BYTE: u64 = 64;
/// Bytes of trace allowed for each byte of any other file.
pub const PER_FILE_BYTE: u64 = 16;

/// The memory a string kept in a trace takes.
pub fn string_bytes(s: &str) -> u64 {
    (size_of::<String>() + s.len()) as u64
}

/// The bound for one file.
#[derive(Debug, Clone)]
pub struct Built {
    path: PathBuf,
    limit: u64,
}

impl Built {
    /// The bound on what may be built from `path` under `opts`.
    pub fn for_file(path: &Path, opts: &crate::ReadOptions) -> Built {
        let base = opts.limits.max_held_bytes / 3 * 2;
        let len = std::fs::metadata(path).map_or(0, |m| m.len());
        let mut magic = [0u8; 2];
        let gzip = std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok_and(|()| magic == [0x1f, 0x8b]);
        let per_byte = if gzip { PER_GZIP_BYTE } else { PER_FILE_BYTE };
        Built { path: path.to_path_buf(), limit: base.max(len.saturating_mul(per_byte)) }
    }

    /// A bound of `limit` bytes for the trace of `path`.
    pub fn with_limit(path: &Path, limit: u64) -> Built {
        Built { path: path.to_path_buf(), limit }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Fail if `bytes`, what the trace holds so far (`what` says of what), is over the bound.
    pub fn check(&self, bytes: u64, what: impl FnOnce() -> String) -> Result<(), TraceError> {
        if bytes <= self.limit {
            return Ok(());
        }
        Err(TraceError::TooBig {
            path: self.path.clone(),
            message: format!(
                "the trace built from it would take more than {} bytes of memory ({}); a file \
                 builds at most {PER_GZIP_BYTE} bytes for each of its bytes gzipped, \
                 {PER_FILE_BYTE} otherwise, or two thirds of the reader's memory limit",
                self.limit,
                what()
            ),
        })
    }
}
