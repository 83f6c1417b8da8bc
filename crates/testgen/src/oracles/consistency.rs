//! PyTorch's `_check_memory_stat_consistency` (test_cuda_multigpu.py, spec §7.2): what
//! `memory_stats()` must read given `memory_snapshot()`, per pool and for `all`. Stricter than
//! the Python test in one way: a key no segment contributes to must read 0, where the test
//! skips it.
//!
//! Plus what the snapshot itself promises (`allocsim_core::SnapshotSegment`): segments in
//! address order and disjoint, blocks in address order tiling their segment, and
//! `Allocator::free_space` agreeing with the inactive blocks.

use allocsim_core::{BlockState, FreeSpace, MemoryStats, Pool, SnapshotSegment, Stat, StatArray};

/// The `current` values the snapshot implies, per pool.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Implied {
    segment: i64,
    allocated_bytes: i64,
    reserved_bytes: i64,
    active_bytes: i64,
    requested_bytes: i64,
    allocation: i64,
    active: i64,
    inactive_split: i64,
    inactive_split_bytes: i64,
}

impl Implied {
    fn add(&mut self, seg: &SnapshotSegment, pytorch_rules: bool) {
        if !seg.is_expandable {
            self.segment += 1;
        }
        self.allocated_bytes += seg.allocated_size() as i64;
        self.reserved_bytes += seg.total_size as i64;
        self.active_bytes += seg.active_size() as i64;
        self.requested_bytes += seg.requested_size() as i64;
        let is_split = seg.blocks.len() > 1;
        for b in &seg.blocks {
            match b.state {
                BlockState::ActiveAllocated => {
                    self.allocation += 1;
                    self.active += 1;
                }
                BlockState::ActivePendingFree => self.active += 1,
                BlockState::Inactive if is_split && !(pytorch_rules && seg.is_expandable) => {
                    self.inactive_split += 1;
                    self.inactive_split_bytes += b.size as i64;
                }
                BlockState::Inactive => {}
            }
        }
    }

    fn compare(
        &self,
        stats: &MemoryStats,
        pick: fn(&StatArray) -> &Stat,
        pool: &str,
        out: &mut Vec<String>,
    ) {
        let pairs: [(&str, i64, &StatArray); 9] = [
            ("segment", self.segment, &stats.segment),
            ("allocated_bytes", self.allocated_bytes, &stats.allocated_bytes),
            ("reserved_bytes", self.reserved_bytes, &stats.reserved_bytes),
            ("active_bytes", self.active_bytes, &stats.active_bytes),
            ("requested_bytes", self.requested_bytes, &stats.requested_bytes),
            ("allocation", self.allocation, &stats.allocation),
            ("active", self.active, &stats.active),
            ("inactive_split", self.inactive_split, &stats.inactive_split),
            ("inactive_split_bytes", self.inactive_split_bytes, &stats.inactive_split_bytes),
        ];
        for (name, implied, array) in pairs {
            let reported = pick(array).current;
            if implied != reported {
                out.push(format!(
                    "{name}.{pool}.current is {reported}, the snapshot implies {implied}"
                ));
            }
        }
    }
}

/// Policies that keep PyTorch's own accounting: each segment belongs to one statistics pool, so
/// the identities hold per pool too, and expandable segments never count in `inactive_split`.
/// The zoo's policies (`zoo/tiling.rs`) carve blocks of both pools out of one segment, count
/// each block under the pool of its size, and count free chunks of split mapped ranges in
/// `inactive_split` as well: for them the identities are checked for `all`, by that rule.
pub const PYTORCH_ACCOUNTING: [&str; 2] = ["pytorch", "uncached"];

/// Every way `stats` disagrees with `snapshot`, and every way the snapshot breaks its own
/// shape; empty when consistent. `pytorch_rules`: see [`PYTORCH_ACCOUNTING`].
pub fn stat_consistency(
    snapshot: &[SnapshotSegment],
    stats: &MemoryStats,
    pytorch_rules: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    let (mut small, mut large, mut all) =
        (Implied::default(), Implied::default(), Implied::default());
    let mut prev_end = 0u64;
    for seg in snapshot {
        if seg.address < prev_end {
            out.push(format!("segment {:#x} overlaps or precedes the one before it", seg.address));
        }
        prev_end = seg.address.saturating_add(seg.total_size);
        let mut at = seg.address;
        for b in &seg.blocks {
            if b.address != at {
                out.push(format!(
                    "segment {:#x}: block at {:#x}, expected one at {at:#x} (blocks must tile the segment)",
                    seg.address, b.address
                ));
            }
            at = b.address.saturating_add(b.size);
        }
        if at != prev_end {
            out.push(format!(
                "segment {:#x}: blocks end at {at:#x}, the segment at {prev_end:#x}",
                seg.address
            ));
        }
        all.add(seg, pytorch_rules);
        match seg.pool {
            Pool::Small => small.add(seg, pytorch_rules),
            Pool::Large => large.add(seg, pytorch_rules),
        }
    }
    all.compare(stats, |a| &a.all, "all", &mut out);
    if pytorch_rules {
        small.compare(stats, |a| &a.small_pool, "small_pool", &mut out);
        large.compare(stats, |a| &a.large_pool, "large_pool", &mut out);
    }
    out
}

/// `free_space` as the snapshot implies it (the trait's default implementation).
pub fn implied_free_space(snapshot: &[SnapshotSegment]) -> FreeSpace {
    let mut space = FreeSpace::default();
    for b in snapshot.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::Inactive) {
        space.cached_bytes += b.size;
        space.largest_free_block_bytes = space.largest_free_block_bytes.max(b.size);
    }
    space
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocsim_core::{SnapshotBlock, StreamId};

    #[test]
    fn finds_a_stat_that_disagrees() {
        let seg = SnapshotSegment {
            pool_id: allocsim_core::MemPoolId::DEFAULT,
            address: 0x1000,
            total_size: 2048,
            stream: StreamId(0),
            pool: Pool::Small,
            is_expandable: false,
            blocks: vec![
                SnapshotBlock {
                    address: 0x1000,
                    size: 512,
                    requested_size: 100,
                    state: BlockState::ActiveAllocated,
                },
                SnapshotBlock {
                    address: 0x1200,
                    size: 1536,
                    requested_size: 0,
                    state: BlockState::Inactive,
                },
            ],
        };
        let mut stats = MemoryStats::default();
        stats.segment.increase(Pool::Small, 1);
        stats.reserved_bytes.increase(Pool::Small, 2048);
        stats.allocated_bytes.increase(Pool::Small, 512);
        stats.active_bytes.increase(Pool::Small, 512);
        stats.requested_bytes.increase(Pool::Small, 100);
        stats.allocation.increase(Pool::Small, 1);
        stats.active.increase(Pool::Small, 1);
        stats.inactive_split.increase(Pool::Small, 1);
        stats.inactive_split_bytes.increase(Pool::Small, 1536);
        assert!(stat_consistency(std::slice::from_ref(&seg), &stats, true).is_empty());
        stats.inactive_split_bytes.decrease(Pool::Small, 512);
        let problems = stat_consistency(&[seg], &stats, true);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with("inactive_split_bytes.all.current is 1024"),
            "{problems:?}"
        );
    }
}
