//! The oracles: what must hold for every policy on every program, shared by the property
//! tests, the fuzz targets and `allocsim fuzz`. Each returns the first failure it finds as a
//! [`Failure`] naming the oracle, the policy and the op.
//!
//! - [`checked_run`]: `allocsim-check` over every event, plus the op contract (`contract`):
//!   events fit their ops, `_check_memory_stat_consistency` after every op, nothing counted
//!   once nothing is live.
//! - [`determinism`]: the same trace, policy and seed give a byte-identical event log.
//! - [`compare_with_reference`]: the PyTorch policy against the reference model, event for
//!   event.
//! - [`formats`]: the trace formats give back what they were given, and decoders never panic.
//! - [`writers`]: every file writer read back; the settings parsers' messages.
//! - [`capture_replays_exactly`]: a PyTorch run written as `allocsim.capture` writes a
//!   recording (snapshot and sidecar) converts back to ops that replay it exactly.
//! - [`seeded_matches_full`]: the PyTorch policy seeded with a run's state at op `k` goes on as
//!   the run did.

mod capture;
mod consistency;
mod contract;
mod differential;
mod failure;
pub mod formats;
mod run;
mod seed;
pub mod writers;

pub use capture::capture_replays_exactly;
pub use consistency::{implied_free_space, stat_consistency, PYTORCH_ACCOUNTING};
pub use contract::Contract;
pub use differential::{compare_with_reference, reference_applies};
pub use failure::{Failure, Oracle};
pub use run::{
    check_trace, check_trace_catching, checked_run, determinism, observed_run, run_options,
};
pub use seed::{seed_applies, seeded_matches_full};
