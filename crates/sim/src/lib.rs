//! The simulated device: capacity, address space, VMM pages, a calibrated cost model, fault
//! injection, and a device that follows a recording.
//!
//! Two devices implement [`allocsim_core::Device`] here, because a user needs two answers
//! (docs/fidelity-notes.md §3):
//! - [`SimDevice`], the model: free memory from the total, what others hold at the start and
//!   what is reserved; addresses from a model of the driver's address space; virtual time from
//!   costs measured on an H100; faults injected from a seed. Every what-if runs on it.
//! - [`RecordedDevice`], which answers each reservation as a recording shows the driver did,
//!   at the recorded address, while the policy makes the recorded device calls, and hands over
//!   to its `SimDevice` from the first call where it does not, saying where ([`Divergence`]).
//! - [`ReplayCallsDevice`], which answers every call exactly as a device we drove ourselves
//!   did (a GPU, logged by [`CallLogger`]): addresses, refusals and `mem_info`, then its model
//!   from the first call the policy makes differently ([`CallDivergence`]).
//!
//! **Architecture Invariant:** all three are deterministic: the same config, seed and calls give
//! the same answers, addresses and costs. Nothing here reads a clock or iterates a hash map.

mod address;
mod calls;
mod config;
mod cost;
mod device;
mod faults;
mod recorded;

pub use address::{Placement, VA_BASE};
pub use calls::{
    CallDivergence, CallLog, CallLogger, FreeMemoryCheck, LoggedCall, LoggedMemInfo,
    ReplayCallsDevice,
};
pub use config::{SimConfig, H100_FREE_AT_START_BYTES, H100_TOTAL_BYTES};
pub use cost::{CostModel, CostPoint, ADDRESS_CALL_NS, H100_FREE_NS, H100_MALLOC_NS};
pub use device::{SimDevice, PAGE_BYTES};
pub use faults::Fault;
pub use recorded::{DeviceCall, Divergence, RecordedDevice, RecordedFeed};
