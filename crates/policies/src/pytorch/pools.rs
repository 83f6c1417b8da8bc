//! Private pools (`torch.cuda.MemPool`, CUDA graph pools; spec 1.3 and 4.3): allocations made
//! while a pool is being allocated to come from its own free sets and segments, a block always
//! returns to its own pool, and a pool's segments go back to the device only once nothing
//! holds the pool (`use_count` 0) and a release of cached blocks finds them wholly free.
//!
//! Not modelled: a context's filter (PyTorch's stream or thread test; the recording does not
//! show it, so a context takes every allocation until it ends), expandable segments in private
//! pools (their allocations take whole segments), `no_split` and `use_on_oom` pools, and the
//! deferral of frees during a graph capture.

use super::PyTorchAllocator;
use allocsim_core::{Emit, Env, MemPoolId, PoolAction};

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

    fn decref_pool(&mut self, slot: u16) {
        let p = &mut self.private[usize::from(slot) - 1];
        p.use_count = p.use_count.saturating_sub(1);
    }
}
