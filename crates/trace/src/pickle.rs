//! A safe reader and a writer for Python pickles of plain data (protocols 2 to 5).
//!
//! PyTorch writes memory snapshots with `pickle.dump`, and a pickle is a program: loading one
//! with Python can import and call anything. This module is a pickle VM that only builds data
//! ([`Value`]) and refuses, with the byte offset, every opcode that would import or call code.
//! It reads from any `Read` (a gzip decoder, usually) through its own buffer, never trusts a
//! length field for an allocation, and bounds depth, memo size, the memory it holds and the
//! work that builds nothing ([`Limits`]), so a hostile or broken file gives an error, never a
//! crash or a machine out of memory.
//!
//! The writer is the other half: the CLI exports simulated runs as snapshots that PyTorch's own
//! tools (`torch.cuda._memory_viz`) open.

mod budget;
mod inplace;
mod input;
mod keys;
mod lists;
mod memo;
mod opcodes;
mod read;
mod step;
mod stream;
mod strings;
mod template;
mod value;
mod write;

pub use stream::{read_records, read_records_after, RecordSpec, Records};
pub use value::Value;
pub use write::{to_vec, write, Stream, BATCH};

use std::io::{self, Read};

/// Bounds on what one pickle may make the reader build.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Deepest nesting of containers (a snapshot needs about 6).
    pub max_depth: u32,
    /// Most memo entries (MEMOIZE/PUT), and most memoized containers.
    pub max_memo: usize,
    /// Most memory the reader may hold at once: its stack, marks, memo and buffers by their
    /// capacity, and the values it built and still holds (see `budget.rs`).
    pub max_held_bytes: u64,
    /// Most opcodes that leave nothing behind (`POP`, `POP_MARK`, `FRAME`, a `PROTO` after
    /// the first, a memo put over a key in use): the work a file can ask for without holding
    /// memory. A pickler writes one `FRAME` per 64 KiB and the others about never.
    pub max_idle_ops: u64,
}

/// [`Limits::max_held_bytes`] by default.
pub const DEFAULT_MAX_HELD_BYTES: u64 = 768 << 20;

impl Default for Limits {
    /// Room for real snapshots (the record streamer holds about 5 bytes per memoized entry;
    /// a 240k-event snapshot read generically holds about 100 MB), while a decompression bomb
    /// stays under 1 GB of memory and a second of idle work.
    fn default() -> Self {
        Limits {
            max_depth: 256,
            max_memo: 1 << 27,
            max_held_bytes: DEFAULT_MAX_HELD_BYTES,
            max_idle_ops: 1 << 24,
        }
    }
}

/// What went wrong, and at which byte of the (decompressed) pickle stream.
#[derive(Debug, thiserror::Error)]
#[error("byte {offset}: {kind}")]
pub struct PickleError {
    pub offset: u64,
    pub kind: PickleErrorKind,
}

#[derive(Debug, thiserror::Error)]
pub enum PickleErrorKind {
    #[error("empty input")]
    Empty,
    #[error("not a pickle: starts with byte 0x{0:02x}, expected PROTO (0x80) of protocol 2 to 5")]
    NotAPickle(u8),
    #[error("unsupported pickle protocol {0} (protocols 2 to 5 are read)")]
    Protocol(u8),
    #[error("the input ends inside {0} (truncated file?)")]
    Truncated(&'static str),
    #[error("the input ends without STOP (truncated file?)")]
    NoStop,
    #[error(
        "refused opcode {name} (0x{code:02x}): it would import or call Python code, \
         which this reader never does"
    )]
    Refused { name: &'static str, code: u8 },
    #[error("unsupported pickle content: {0}")]
    Unsupported(&'static str),
    #[error("unknown opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    #[error("{0} needs more items on the stack than there are")]
    StackUnderflow(&'static str),
    #[error("{0} without a MARK")]
    NoMark(&'static str),
    #[error("{op} on a {target}, expected a {expected}")]
    BadTarget { op: &'static str, target: &'static str, expected: &'static str },
    #[error("an integer of {0} bytes does not fit in 64 bits")]
    IntTooWide(u64),
    #[error("negative length {0}")]
    NegativeLength(i64),
    #[error("bad text argument for {0}: {quoted}", quoted = allocsim_core::text::quoted(.1))]
    BadText(&'static str, String),
    #[error("odd number of items for a dict")]
    OddItems,
    #[error("memo key {0} was never stored")]
    MemoMissing(u64),
    #[error("more than {0} memo entries")]
    MemoLimit(usize),
    #[error("nesting deeper than {0} levels")]
    TooDeep(u32),
    #[error("a container changed after it was shared (recursive structures are not supported)")]
    SharedMutation,
    #[error("reading it would hold more than {mib} MiB ({0} bytes) of memory", mib = .0 >> 20)]
    MemoryLimit(u64),
    #[error(
        "more than {0} opcodes that build nothing (POP, POP_MARK, FRAME, PROTO, a memo put \
         over a key in use): no pickler writes that"
    )]
    IdleLimit(u64),
    #[error("read error: {0}")]
    Io(io::Error),
    #[error("read error after STOP (corrupt compressed trailer?): {0}")]
    AfterStop(io::Error),
}

impl PickleErrorKind {
    /// A limit of [`Limits`] on memory or work was reached: reading the file again another
    /// way would reach it too.
    pub fn is_budget(&self) -> bool {
        matches!(self, PickleErrorKind::MemoryLimit(_) | PickleErrorKind::IdleLimit(_))
    }
}

/// Read one pickle from `reader` with the default [`Limits`]. Bytes after `STOP` are read and
/// ignored, so that a gzip decoder gets to check its trailer.
pub fn from_reader<R: Read>(reader: R) -> Result<Value, PickleError> {
    read::read(reader, &Limits::default())
}

/// [`from_reader`] with explicit limits.
pub fn from_reader_with<R: Read>(reader: R, limits: &Limits) -> Result<Value, PickleError> {
    read::read(reader, limits)
}

/// Read one pickle from memory.
pub fn from_slice(bytes: &[u8]) -> Result<Value, PickleError> {
    read::read(bytes, &Limits::default())
}
