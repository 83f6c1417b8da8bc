//! The allocator's state when a recording starts mid-run.
//!
//! A history switched on late, or a ring buffer that wrapped (PyTorch's tutorial recipe), begins
//! with segments and blocks already alive: its first entries free blocks it never saw
//! allocated, inside segments it never saw reserved. The trace reader reconstructs that state
//! (`allocsim-trace`). A policy that can take a state as it is starts from it
//! ([`crate::Allocator::seed`]), so that a replay is exact from the first recorded entry on;
//! any other run lays the live blocks out by allocating them first ([`StartState::prologue`]),
//! each policy its own way.

use crate::{AllocId, BlockState, Op, SnapshotSegment, StreamId};

/// The stream of a `RecordStream` the recording implies but does not name: a free that waits
/// for another stream's work says only that some stream used the block.
pub const UNKNOWN_STREAM: StreamId = StreamId(u64::MAX);

/// Segments and blocks alive at a recording's first entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartState {
    /// Sorted by address, each tiled by its blocks: active ones (allocated, or freed and
    /// waiting for another stream) and the free gaps between them, one free block per gap.
    pub segments: Vec<SnapshotSegment>,
    /// The allocation each active block serves, by block address (sorted).
    pub ids: Vec<(u64, AllocId)>,
}

impl StartState {
    /// The id of the active block at `addr`.
    pub fn id_at(&self, addr: u64) -> Option<AllocId> {
        self.ids.binary_search_by_key(&addr, |&(a, _)| a).ok().map(|i| self.ids[i].1)
    }

    /// The allocation of each active block with its state (allocated, or freed and waiting
    /// for another stream), in address order.
    pub fn active_ids(&self) -> impl Iterator<Item = (AllocId, BlockState)> + '_ {
        let blocks = self.segments.iter().flat_map(|seg| &seg.blocks);
        blocks
            .filter(|b| b.state.is_active())
            .filter_map(|b| Some((self.id_at(b.address)?, b.state)))
    }

    /// Bytes of the segments.
    pub fn reserved_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.total_size).sum()
    }

    /// What makes this no state an allocator could be in, if anything: segments that overlap,
    /// blocks that do not tile their segment, a block not aligned to 512 B or smaller than its
    /// request, an active block without an id or an id without one. A state reconstructed
    /// from a real recording has none of these; a corrupt or hand-made file may.
    pub fn problem(&self) -> Option<String> {
        self.check().err()
    }

    fn check(&self) -> Result<(), String> {
        let overflow =
            || "a segment or block reaches past the end of the address space".to_string();
        let mut end = 0u64;
        let mut active = 0;
        for seg in &self.segments {
            if seg.address < end {
                return Err(format!("the segment at 0x{:x} overlaps the one before", seg.address));
            }
            end = seg.address.checked_add(seg.total_size).ok_or_else(overflow)?;
            let mut at = seg.address;
            for b in &seg.blocks {
                let here = format!("the block at 0x{:x}", b.address);
                if b.address != at || b.size == 0 {
                    return Err(format!("{here} does not follow the one before it in its segment"));
                }
                if b.address % 512 != 0 || b.size % 512 != 0 {
                    return Err(format!("{here} ({} bytes) is not aligned to 512 bytes", b.size));
                }
                if b.state.is_active() {
                    if b.requested_size > b.size {
                        let (size, request) = (b.size, b.requested_size);
                        return Err(format!("{here} is {size} bytes for a request of {request}"));
                    }
                    if self.id_at(b.address).is_none() {
                        return Err(format!("{here} is active but serves no allocation"));
                    }
                    active += 1;
                }
                at = at.checked_add(b.size).ok_or_else(overflow)?;
            }
            if at != end {
                let msg =
                    format!("the blocks of the segment at 0x{:x} do not fill it", seg.address);
                return Err(msg);
            }
        }
        let mut ids: Vec<AllocId> = self.ids.iter().map(|&(_, id)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != active || self.ids.len() != active {
            return Err("the ids do not name the active blocks one to one".to_string());
        }
        Ok(())
    }

    /// The live blocks as ops that allocate them, in address order, for a policy that lays
    /// them out itself: an `Alloc` of the requested size on the segment's stream, and for a
    /// block whose free waits on another stream, a `RecordStream` and its `FreeRequested`.
    pub fn prologue(&self) -> Vec<Op> {
        let mut ops = Vec::new();
        for seg in &self.segments {
            for b in seg.blocks.iter().filter(|b| b.state.is_active()) {
                let Some(id) = self.id_at(b.address) else { continue };
                ops.push(Op::Alloc { id, size: b.requested_size, stream: seg.stream });
                if b.state == BlockState::ActivePendingFree {
                    ops.push(Op::RecordStream { id, stream: UNKNOWN_STREAM });
                    ops.push(Op::FreeRequested { id });
                }
            }
        }
        ops
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemPoolId, Pool, SnapshotBlock};

    fn block(address: u64, size: u64, requested_size: u64, state: BlockState) -> SnapshotBlock {
        SnapshotBlock { address, size, requested_size, state }
    }

    fn segment(address: u64, blocks: Vec<SnapshotBlock>) -> SnapshotSegment {
        SnapshotSegment {
            address,
            total_size: blocks.iter().map(|b| b.size).sum(),
            stream: StreamId(0),
            pool: Pool::Large,
            pool_id: MemPoolId::DEFAULT,
            is_expandable: false,
            blocks,
        }
    }

    #[test]
    fn a_state_no_allocator_could_be_in_is_named() {
        let live = |a, size, req| block(a, size, req, BlockState::ActiveAllocated);
        let free = |a, size| block(a, size, 0, BlockState::Inactive);
        let good = StartState {
            segments: vec![segment(0x1000, vec![live(0x1000, 1024, 1000), free(0x1400, 512)])],
            ids: vec![(0x1000, AllocId(7))],
        };
        assert_eq!(good.problem(), None);
        let mut small = good.clone();
        small.segments[0].blocks[0].requested_size = 2048;
        assert!(small.problem().unwrap().contains("1024 bytes for a request of 2048"));
        let mut overlap = good.clone();
        overlap.segments.push(segment(0x1200, vec![free(0x1200, 512)]));
        assert!(overlap.problem().unwrap().contains("overlaps"));
        let mut odd = good.clone();
        odd.segments[0].blocks[1] = free(0x1400, 100);
        odd.segments[0].total_size = 1124;
        assert!(odd.problem().unwrap().contains("aligned"));
        let mut gap = good.clone();
        gap.segments[0].total_size += 512;
        assert!(gap.problem().unwrap().contains("do not fill"));
        let unnamed = StartState { ids: Vec::new(), ..good };
        assert!(unnamed.problem().unwrap().contains("serves no allocation"));
    }
}
