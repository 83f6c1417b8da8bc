//! Virtual time per device call, calibrated on a real H100.
//!
//! The measured medians are few (six sizes) and their curve is neither flat nor linear, so the
//! model interpolates piecewise-linearly between measured sizes rather than fitting a formula:
//! at a measured size it returns the measurement exactly. Below the smallest measured size the
//! cost is the smallest size's (driver overhead dominates there); above the largest it
//! continues the last segment's slope (page-table work grows with size).
//!
//! Assumptions, not measurements:
//! - `map` (cuMemCreate + cuMemMap + cuMemSetAccess) costs what `cudaMalloc` of the same size
//!   costs, and `unmap` what `cudaFree` costs: both do the same physical allocation work.
//! - `reserve_address` / `release_address` touch no memory; they cost a flat
//!   [`ADDRESS_CALL_NS`].
//! - A failed call costs what a successful one of the same size costs (the driver searches
//!   before it refuses).
//!
//! Integer arithmetic throughout, so costs are identical on every platform.

use allocsim_core::CallKind;

/// One measured point: a call of `size_bytes` took `time_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostPoint {
    pub size_bytes: u64,
    pub time_ns: u64,
}

const fn point(size_bytes: u64, time_ns: u64) -> CostPoint {
    CostPoint { size_bytes, time_ns }
}

/// Median `cudaMalloc` latency by size, from
/// `traces/pytorch-2.11-h100/h100_cuda_malloc_costs.json` (`malloc_us_median`, rounded to ns).
pub const H100_MALLOC_NS: [CostPoint; 6] = [
    point(524_288, 34_709),
    point(2_097_152, 32_076),
    point(20_971_520, 44_868),
    point(134_217_728, 56_813),
    point(1_073_741_824, 136_310),
    point(8_589_934_592, 1_007_912),
];

/// Median `cudaFree` latency by size, from the same file (`free_us_median`, rounded to ns).
pub const H100_FREE_NS: [CostPoint; 6] = [
    point(524_288, 29_949),
    point(2_097_152, 28_433),
    point(20_971_520, 52_340),
    point(134_217_728, 102_734),
    point(1_073_741_824, 623_251),
    point(8_589_934_592, 4_983_877),
];

/// Cost of `reserve_address` / `release_address`: an assumption (not measured).
pub const ADDRESS_CALL_NS: u64 = 5_000;

/// What each device call costs in virtual time. See the module doc for the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostModel {
    malloc_points: Vec<CostPoint>,
    free_points: Vec<CostPoint>,
    address_call_ns: u64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel::h100()
    }
}

impl CostModel {
    /// Calibrated on the H100 measurements.
    pub fn h100() -> Self {
        CostModel::new(H100_MALLOC_NS.to_vec(), H100_FREE_NS.to_vec(), ADDRESS_CALL_NS)
    }

    /// Every call is free: for tests and for comparisons where only memory matters.
    pub fn zero() -> Self {
        CostModel::new(Vec::new(), Vec::new(), 0)
    }

    /// A model from other measurements; points may come in any order.
    pub fn new(
        mut malloc_points: Vec<CostPoint>,
        mut free_points: Vec<CostPoint>,
        address_call_ns: u64,
    ) -> Self {
        malloc_points.sort_by_key(|p| p.size_bytes);
        malloc_points.dedup_by_key(|p| p.size_bytes);
        free_points.sort_by_key(|p| p.size_bytes);
        free_points.dedup_by_key(|p| p.size_bytes);
        CostModel { malloc_points, free_points, address_call_ns }
    }

    pub fn malloc_ns(&self, size_bytes: u64) -> u64 {
        interpolate_ns(&self.malloc_points, size_bytes)
    }

    pub fn free_ns(&self, size_bytes: u64) -> u64 {
        interpolate_ns(&self.free_points, size_bytes)
    }

    /// The cost of one call of `kind` on `size_bytes`.
    pub fn call_ns(&self, kind: CallKind, size_bytes: u64) -> u64 {
        match kind {
            CallKind::Malloc | CallKind::Map => self.malloc_ns(size_bytes),
            CallKind::Free | CallKind::Unmap => self.free_ns(size_bytes),
            CallKind::ReserveAddress | CallKind::ReleaseAddress => self.address_call_ns,
        }
    }
}

/// Piecewise-linear in size through sorted `points`; flat below the first, the last slope
/// beyond the last, never negative.
fn interpolate_ns(points: &[CostPoint], size_bytes: u64) -> u64 {
    let (Some(first), Some(last)) = (points.first(), points.last()) else { return 0 };
    if size_bytes <= first.size_bytes {
        return first.time_ns;
    }
    let upper = points.partition_point(|p| p.size_bytes < size_bytes);
    let (a, b) = match (upper.checked_sub(1), points.get(upper)) {
        (Some(lo), Some(hi)) => (points[lo], *hi),
        _ if points.len() >= 2 => (points[points.len() - 2], *last),
        _ => return last.time_ns,
    };
    let dx = i128::from(b.size_bytes) - i128::from(a.size_bytes);
    let dy = i128::from(b.time_ns) - i128::from(a.time_ns);
    let t = i128::from(a.time_ns) + dy * (i128::from(size_bytes) - i128::from(a.size_bytes)) / dx;
    u64::try_from(t.max(0)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_every_measured_point() {
        let m = CostModel::h100();
        for p in H100_MALLOC_NS {
            assert_eq!(m.malloc_ns(p.size_bytes), p.time_ns);
            assert_eq!(m.call_ns(CallKind::Map, p.size_bytes), p.time_ns);
        }
        for p in H100_FREE_NS {
            assert_eq!(m.free_ns(p.size_bytes), p.time_ns);
            assert_eq!(m.call_ns(CallKind::Unmap, p.size_bytes), p.time_ns);
        }
    }

    #[test]
    fn interpolates_between_and_extends_beyond() {
        let m = CostModel::h100();
        // Halfway between 2 MiB (32076) and 20 MiB (44868).
        assert_eq!(m.malloc_ns((2_097_152 + 20_971_520) / 2), (32_076 + 44_868) / 2);
        // Flat below the first point.
        assert_eq!(m.malloc_ns(512), 34_709);
        assert_eq!(m.free_ns(0), 29_949);
        // Beyond 8 GiB the last slope continues: 16 GiB costs about twice the last step more.
        let slope_end = 1_007_912 + (1_007_912 - 136_310) * (16 - 8) / 7;
        assert!(m.malloc_ns(16 << 30).abs_diff(slope_end) <= 1);
        assert_eq!(m.call_ns(CallKind::ReserveAddress, 1 << 40), ADDRESS_CALL_NS);
    }

    #[test]
    fn zero_model_costs_nothing() {
        let m = CostModel::zero();
        for kind in CallKind::ALL {
            assert_eq!(m.call_ns(kind, 20 << 20), 0);
        }
    }
}
