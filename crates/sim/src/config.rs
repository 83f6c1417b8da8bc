//! What a simulated device is: its memory, what others hold, its costs and its faults.

use crate::{CostModel, Fault, Placement};

/// `totalGlobalMem` of the H100 80GB HBM3 the bundled traces were recorded on.
pub const H100_TOTAL_BYTES: u64 = 85_017_493_504;
/// `cudaMemGetInfo` free at the start of those recordings: other contexts (the CUDA context
/// itself, cuBLAS workspaces) hold the rest.
pub const H100_FREE_AT_START_BYTES: u64 = 84_465_090_560;

/// The configuration of a [`crate::SimDevice`]. `Default` is the recorded H100.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub total_bytes: u64,
    /// Free memory when the run starts; clamped to `total_bytes`.
    pub free_bytes: u64,
    pub cost: CostModel,
    pub faults: Vec<Fault>,
    /// Seeds every random choice the device makes (today: `Fault::FailRandom`).
    pub seed: u64,
    /// How addresses are chosen (they break ties between equal free blocks).
    pub placement: Placement,
    /// Under [`Placement::Recorded`]: the recording's segments, `(start, size)` in its order.
    pub recorded_segments: Vec<(u64, u64)>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            total_bytes: H100_TOTAL_BYTES,
            free_bytes: H100_FREE_AT_START_BYTES,
            cost: CostModel::h100(),
            faults: Vec::new(),
            seed: 0,
            placement: Placement::default(),
            recorded_segments: Vec::new(),
        }
    }
}

impl SimConfig {
    /// A device of `total_bytes` with all of it free at the start.
    pub fn with_total_bytes(total_bytes: u64) -> Self {
        SimConfig { total_bytes, free_bytes: total_bytes, ..SimConfig::default() }
    }
}
