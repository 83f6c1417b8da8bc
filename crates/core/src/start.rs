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

    /// Bytes of the segments.
    pub fn reserved_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.total_size).sum()
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
