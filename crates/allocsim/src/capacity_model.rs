//! What the capacity search models besides the run: the memory taken outside the allocator
//! and the placements the band is taken over. Shared by `capacity`, `diff` and `report`.

use allocsim_core::Trace;
use allocsim_run::{Capacity, CapacityOptions, RunOptions, OUTSIDE_ALLOCATOR_BYTES};
use serde_json::json;

/// Seeded jittered placements the band is taken over, besides the driver placement.
pub(crate) const JITTERS: u32 = 16;

pub(crate) fn options(
    policy: &str,
    alloc_conf: Option<String>,
    outside: u64,
    trace: &Trace,
) -> CapacityOptions {
    CapacityOptions {
        run: RunOptions { policy: policy.to_string(), alloc_conf, ..RunOptions::default() },
        outside_bytes: outside,
        floor_bytes: floor_bytes(trace),
        jitters: JITTERS,
    }
}

/// Free memory the driver never hands out on the recording's device, where it was measured.
pub(crate) fn floor_bytes(trace: &Trace) -> u64 {
    allocsim_run::driver_floor_bytes(trace.meta.device_total_bytes)
}

/// The memory the run takes outside the allocator, and where the figure comes from: the flag,
/// the recording's sidecar, or the model.
pub fn outside_bytes(flag: Option<u64>, trace: &Trace) -> (u64, &'static str) {
    match (flag, trace.meta.outside_allocator_bytes) {
        (Some(b), _) => (b, "--outside"),
        (None, Some(b)) => (b, "measured in the recording (sidecar)"),
        (None, None) => (OUTSIDE_ALLOCATOR_BYTES, "the H100 / PyTorch 2.11 model"),
    }
}

/// A capacity's figures as `capacity --json` and `diff --json` give them.
pub(crate) fn capacity_json(c: &Capacity) -> serde_json::Value {
    json!({
        "capacity_bytes": c.capacity_bytes,
        "capacity_low_bytes": c.low_bytes,
        "capacity_high_bytes": c.high_bytes,
        "outside_allocator_bytes": c.outside_bytes,
        "driver_floor_bytes": c.floor_bytes,
        "unconstrained_bytes": c.unconstrained_bytes,
        "outside_profiled": c.outside_profiled,
        "searched_up_to_bytes": c.searched_up_to_bytes,
        "per_placement": c.placements.iter().map(|p| json!({
            "placement": p.placement.to_string(),
            "capacity_bytes": p.capacity_bytes,
        })).collect::<Vec<_>>(),
    })
}
