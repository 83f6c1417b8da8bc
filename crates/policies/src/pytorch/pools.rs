//! Private pools (`torch.cuda.MemPool`, CUDA graph pools; docs/pytorch-caching-allocator.md §1.3 and §4.3): allocations made
//! while a pool is being allocated to come from its own free sets and segments, a block always
//! returns to its own pool, and a pool's segments go back to the device only once nothing
//! holds the pool (`use_count` 0) and a release of cached blocks finds them wholly free.
//!
//! Not modelled: a context's filter (PyTorch's stream or thread test; the recording does not
//! show it, so a context takes every allocation until it ends), `no_split` and `use_on_oom`
//! pools, and the deferral of frees during a graph capture. Under `expandable_segments:True` a
//! private pool grows expandable segments of its own, as the default pools do.

use super::block::Block;
use super::malloc::Params;
use super::PyTorchAllocator;
use allocsim_core::{AllocId, Emit, Env, Granted, MemPoolId, OomInfo, PoolAction, StreamId};

impl PyTorchAllocator {
    pub(super) fn pool_action_impl<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        pool: MemPoolId,
        action: PoolAction,
    ) {
        if pool.is_default() {
            return;
        }
        match action {
            // `beginAllocateToPool`: a pool seen for the first time was made by its owner (a
            // `MemPool`, a graph), which holds it too.
            PoolAction::BeginAllocate => {
                let slot = self.create_or_incref_pool(pool, 2);
                if !self.contexts.contains(&slot) {
                    self.contexts.push(slot);
                }
            }
            // `endAllocateToPool`, then the context's `releasePool`.
            PoolAction::EndAllocate => {
                let Some(slot) = self.slot_of(pool) else { return };
                self.contexts.retain(|&s| s != slot);
                self.decref_pool(slot);
            }
            // `~MemPool`: `releasePool`, then `emptyCache` of that pool.
            PoolAction::Release => {
                let Some(slot) = self.slot_of(pool) else { return };
                self.decref_pool(slot);
                self.release_cached_blocks(env, Some(slot));
            }
        }
    }

    /// `setSegmentStateToCheckpoint`'s allocation of one block of a checkpointed segment: the
    /// free block that starts at `addr` is handed out in place, at exactly `size`, split when it
    /// is bigger. Without such a block, an ordinary `malloc`.
    pub(super) fn malloc_at_impl<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        id: AllocId,
        size: u64,
        stream: StreamId,
        addr: u64,
    ) -> Result<Granted, OomInfo> {
        let free_here = |b: &Block| {
            b.addr == addr && b.size >= size && b.mapped && b.is_allocatable() && size > 0
        };
        let Some(index) = self.arena.iter_live().find(|(_, b)| free_here(b)).map(|(i, _)| i) else {
            return self.malloc_impl(env, id, size, stream);
        };
        self.erase_from_blocks(index);
        let b = self.arena[index];
        let p =
            Params { size, alloc_size: size, stream, small: b.small, slot: b.slot, block: index };
        Ok(self.alloc_found_block(env, id, &p, size, b.size > size))
    }

    fn decref_pool(&mut self, slot: u16) {
        let p = &mut self.private[usize::from(slot) - 1];
        p.use_count = p.use_count.saturating_sub(1);
    }
}
