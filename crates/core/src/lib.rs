//! allocsim's vocabulary: what a workload asks ([`Op`]), what an allocator did ([`Event`]),
//! the two pluggable concepts ([`Allocator`], the policy, and [`Device`], the memory it carves),
//! and the statistics under PyTorch's names ([`MemoryStats`]).
//!
//! **Architecture Invariant:** this crate does no IO, has no dependencies and cannot fail on
//! bad input: formats convert *into* these types (in `allocsim-trace`), the binary prints them.
//! Core types are deliberately not serializable, so a file format can change without touching
//! the vocabulary every policy is written in.

mod allocator;
mod device;
mod event;
mod ids;
mod idtable;
mod op;
pub mod packed;
mod snapshot;
mod start;
mod stats;
pub mod text;
mod trace;
pub mod varint;

pub use allocator::{Allocator, ConfigError, DynAllocator, Emit, Env, FreeSpace, Granted, OomInfo};
pub use device::{CallKind, CallStats, Device, DeviceCalls, DeviceError, DynDevice, MemInfo};
pub use event::Event;
pub use ids::{AllocId, MemPoolId, Pool, StreamId, GIB, KIB, MIB};
pub use idtable::IdTable;
pub use op::{Op, OpSource, PoolAction};
pub use packed::PackedOps;
pub use snapshot::{BlockState, SnapshotBlock, SnapshotSegment};
pub use start::{StartState, UNKNOWN_STREAM};
pub use stats::{raise_peak, MemoryStats, Stat, StatArray};
pub use trace::{Annotation, RecordedEvent, RecordedKind, Stack, StackFrame, Trace, TraceMeta};
