//! Freeing (docs/pytorch-caching-allocator.md §5): `free` stops a block counting as allocated at once; `free_block`
//! makes it reusable, merging it with free neighbours, either at once or, for a block recorded
//! on other streams, when that work completes (`free_completed` here, `process_events` or
//! `synchronize_and_free_events` in PyTorch).

use super::block::NIL;
use super::stats::{StatArrayExt, StatExt};
use super::PyTorchAllocator;
use allocsim_core::{AllocId, Emit, Env, Event, StreamId};

impl PyTorchAllocator {
    /// `DeviceCachingAllocator::free`. Inlined into the replay loop, which calls it for half
    /// of all ops (-0.8 % instructions).
    #[inline(always)]
    pub(super) fn free_impl<E: Emit + ?Sized>(&mut self, env: &mut Env<'_, E>, id: AllocId) {
        let Some(index) = self.block_of(id) else { return };
        let b = &mut self.arena[index];
        if !b.allocated {
            return;
        }
        b.allocated = false;
        let b = *b;
        if b.stream_uses > 0 {
            // Before `allocation` moves: `active` stays up until the free completes.
            self.stop_mirroring_active();
        }
        let pool = b.pool();
        self.stats.allocation.dec(pool, 1);
        self.stats.allocated_bytes.dec(pool, b.size);
        env.events.emit(Event::FreeRequested {
            id,
            addr: b.addr,
            size: b.size,
            requested: b.requested,
        });
        if b.size >= self.config.max_split_size {
            self.stats.oversize_allocations.dec(1);
        }
        if b.stream_uses > 0 {
            // insert_events: one CUDA event per recorded stream; the free waits for them.
            self.stream_uses.retain(|&(block, _)| block != index);
            let blk = &mut self.arena[index];
            blk.stream_uses = 0;
            blk.pending = true;
            self.pending.push(index);
        } else {
            self.free_block(env, index);
        }
    }

    /// `recordStream`: the block is also used on `stream`.
    pub(super) fn record_stream_impl(&mut self, id: AllocId, stream: StreamId) {
        let Some(index) = self.block_of(id) else { return };
        let b = &self.arena[index];
        if !b.allocated || b.stream == stream || self.stream_uses.contains(&(index, stream)) {
            return;
        }
        self.stream_uses.push((index, stream));
        self.arena[index].stream_uses += 1;
    }

    /// The other streams' work on `id` finished: `process_events` completes its free.
    pub(super) fn free_completed_impl<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        id: AllocId,
    ) {
        let Some(index) = self.block_of(id) else { return };
        if !self.arena[index].pending {
            return;
        }
        self.arena[index].pending = false;
        if let Some(pos) = self.pending.iter().position(|&i| i == index) {
            self.pending.remove(pos);
        }
        self.free_block(env, index);
    }

    /// `free_block`: trace `free_completed`, merge with the previous then the next block, back
    /// into the free set, and account the change in inactive split blocks (docs/pytorch-caching-allocator.md §7.2).
    #[inline(always)]
    pub(super) fn free_block<E: Emit + ?Sized>(&mut self, env: &mut Env<'_, E>, index: u32) {
        let b = self.arena[index];
        env.events.emit(Event::FreeCompleted {
            id: b.id,
            addr: b.addr,
            size: b.size,
            requested: b.requested,
        });
        self.ids.set(b.id, NIL);
        let (mut net_blocks, mut net_bytes) = (0i64, 0i64);
        let mut size = b.size;
        for candidate in [b.prev, b.next] {
            let subsumed = self.try_merge_blocks(index, candidate);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
                size += subsumed;
            }
        }
        let addr = self.arena[index].addr;
        self.insert_free(index, addr, size);
        if self.arena[index].is_split() {
            net_blocks += 1;
            net_bytes += size as i64;
        }
        let pool = b.pool();
        let s = &mut self.stats;
        if !b.is_expandable() {
            s.inactive_split.add(pool, net_blocks);
            s.inactive_split_bytes.add(pool, net_bytes);
        }
        if !self.active_is_allocation {
            s.active.dec(pool, 1);
            s.active_bytes.dec(pool, b.size);
        }
        s.requested_bytes.dec(pool, b.requested);
    }

    /// `try_merge_blocks`: `dst` absorbs `src` if `src` is free with nothing outstanding and in
    /// the same mapped state. `dst` is never in a free set while this runs. Returns the bytes
    /// absorbed.
    #[inline(always)]
    pub(super) fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let s = self.arena[src];
        if !s.is_allocatable() || s.mapped != self.arena[dst].mapped {
            return 0;
        }
        if s.mapped {
            self.erase_from_blocks(src);
        } else {
            let key = s.addr_key(src);
            self.pool_mut(s.slot, s.small).unmapped.remove(&key);
        }
        let d = &mut self.arena[dst];
        if d.prev == src {
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.arena[s.prev].next = dst;
            }
        } else {
            d.next = s.next;
            if s.next != NIL {
                self.arena[s.next].prev = dst;
            }
        }
        self.arena[dst].size += s.size;
        self.arena.remove(src);
        s.size
    }
}
