//! A policy's memory map at one moment, in the shape of PyTorch's snapshot `segments` list.

use crate::{MemPoolId, Pool, StreamId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// Handed out and not freed.
    ActiveAllocated,
    /// Freed by the program, still in use on another stream.
    ActivePendingFree,
    /// Free, cached for reuse.
    Inactive,
}

impl BlockState {
    /// The string PyTorch writes in a snapshot.
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }

    pub fn is_active(self) -> bool {
        self != BlockState::Inactive
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotBlock {
    pub address: u64,
    pub size: u64,
    /// The last request this block object served (PyTorch keeps it after a free).
    pub requested_size: u64,
    pub state: BlockState,
}

/// One segment; for expandable segments, one contiguous mapped range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSegment {
    pub address: u64,
    pub total_size: u64,
    pub stream: StreamId,
    pub pool: Pool,
    /// The memory pool the segment belongs to (`segment_pool_id`).
    pub pool_id: MemPoolId,
    pub is_expandable: bool,
    /// In address order, tiling the segment.
    pub blocks: Vec<SnapshotBlock>,
}

impl SnapshotSegment {
    pub fn allocated_size(&self) -> u64 {
        self.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.size).sum()
    }

    pub fn active_size(&self) -> u64 {
        self.blocks.iter().filter(|b| b.state.is_active()).map(|b| b.size).sum()
    }

    pub fn requested_size(&self) -> u64 {
        self.blocks.iter().filter(|b| b.state.is_active()).map(|b| b.requested_size).sum()
    }
}
