//! `DeviceCachingAllocator::snapshot` (docs/pytorch-caching-allocator.md §8.3): segments in PyTorch's layout, where an
//! expandable segment shows as one segment per contiguous mapped range; and the cheap
//! free-space figures the engine asks for after every OOM.

use super::block::NIL;
use super::PyTorchAllocator;
use allocsim_core::{BlockState, FreeSpace, SnapshotBlock, SnapshotSegment};

impl PyTorchAllocator {
    /// Every mapped block whose predecessor is absent or unmapped starts a segment; its blocks
    /// follow `next` while mapped. Sorted by address, as PyTorch sorts them.
    pub(super) fn snapshot_impl(&self) -> Vec<SnapshotSegment> {
        let mut segments = Vec::new();
        for (index, head) in self.arena.iter_live() {
            if !head.mapped || (head.prev != NIL && self.arena[head.prev].mapped) {
                continue;
            }
            let mut segment = SnapshotSegment {
                pool_id: self.pool_id(head.slot),
                address: head.addr,
                total_size: 0,
                stream: head.stream,
                pool: head.pool(),
                is_expandable: head.is_expandable(),
                blocks: Vec::new(),
            };
            let mut cursor = index;
            while cursor != NIL && self.arena[cursor].mapped {
                let b = &self.arena[cursor];
                let state = if b.allocated {
                    BlockState::ActiveAllocated
                } else if b.pending || b.stream_uses > 0 {
                    BlockState::ActivePendingFree
                } else {
                    BlockState::Inactive
                };
                segment.blocks.push(SnapshotBlock {
                    address: b.addr,
                    size: b.size,
                    requested_size: b.requested,
                    state,
                });
                segment.total_size += b.size;
                cursor = b.next;
            }
            segments.push(segment);
        }
        segments.sort_by_key(|s| s.address);
        segments
    }

    /// Inactive bytes are reserved minus active; the largest piece comes from the free sets.
    pub(super) fn free_space_impl(&self) -> FreeSpace {
        let reserved = self.stats.reserved_bytes.all.current;
        let active = self.active_bytes().all.current;
        FreeSpace {
            cached_bytes: (reserved - active).max(0) as u64,
            largest_free_block_bytes: (self.private.iter().flat_map(|p| [&p.small, &p.large]))
                .chain([&self.small_pool, &self.large_pool])
                .map(|pool| pool.largest_free())
                .max()
                .unwrap_or(0),
        }
    }
}
