//! The replay engine: drives a workload's ops through an [`Allocator`] on a [`Device`] and
//! hands every event to [`Observer`]s (the checker, metrics, an event log, the fidelity
//! comparison), in the style of ripgrep's `Sink`: the engine pushes, observers look, and any
//! observer can stop the run.
//!
//! **Architecture Invariant:** the engine is the only caller of an allocator. It guarantees the
//! allocator's API boundary: frees, stream uses and completions name live allocations. Ops that
//! break it (a free of an allocation that failed with OOM, a double free in a hand-written
//! trace) are skipped and counted, never passed on.

mod engine;
mod explain;
mod fidelity;
mod metrics;
mod observers;
mod state_at;

pub use engine::{Engine, OpOutcome, Skipped};
pub use explain::{Fence, FreeRegion, OomExplainer, OomExplanation};
pub use fidelity::{Divergence, Fidelity};
pub use metrics::{Metrics, MetricsReport, OomRecord, TimelinePoint};
pub use observers::{format_event, CheckObserver, EventLog, Observer, RecordedTo, Recorder};
pub use state_at::{LiveAllocation, State, StateAt};

use allocsim_core::{Allocator, Device, DynAllocator, DynDevice, OpSource};

/// Replay `ops` (their indices are their positions) through `allocator` on `device`,
/// notifying `observers`. Returns the number of ops run (fewer if an observer stopped the run).
/// `ops` may borrow from a trace in memory or stream owned ops from a file.
pub fn replay(
    ops: impl OpSource,
    allocator: &mut dyn Allocator,
    device: &mut dyn Device,
    observers: &mut [&mut dyn Observer],
    progress: impl FnMut(u64),
) -> (u64, Skipped) {
    replay_with(ops, &mut DynAllocator(allocator), &mut DynDevice(device), observers, progress)
}

/// [`replay`] with one observer, an allocator and a device of known types (see
/// [`Engine::step_with`]).
pub fn replay_with<B, A, D>(
    ops: impl OpSource,
    allocator: &mut A,
    device: &mut D,
    observer: &mut B,
    progress: impl FnMut(u64),
) -> (u64, Skipped)
where
    B: Observer + ?Sized,
    A: Allocator,
    D: Device,
{
    let mut engine = Engine::new(allocator, device);
    let ran = engine.run(ops, observer, progress);
    (ran, engine.skipped())
}
