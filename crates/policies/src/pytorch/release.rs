//! Giving memory back to the device (docs/pytorch-caching-allocator.md §4.2–4.4): `release_available_cached_blocks` (oversize
//! segments, on a miss), `release_cached_blocks` (every whole free segment: the last resort
//! before OOM, and `empty_cache`), and `garbage_collect_cached_blocks` (old segments, under a
//! memory fraction).
//!
//! PyTorch walks its `std::set` while erasing from it. Here each walk first collects the keys
//! it will act on into a reused scratch vector, then acts: equivalent, because releasing a
//! whole segment removes only that block, and the decisions do not depend on earlier releases
//! in the same walk except through the counters we carry along.

use super::malloc::{pool_of, Params};
use super::stats::{StatArrayExt, StatExt};
use super::PyTorchAllocator;
use allocsim_core::{Emit, Env, Event};

impl PyTorchAllocator {
    /// `release_available_cached_blocks`: free one cached oversize block big enough for `p`,
    /// or else several of the largest, until their sizes add up to the request. Blocks freed
    /// stay freed even when the sum falls short.
    pub(super) fn release_available_cached_blocks<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        p: &Params,
    ) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key_size = p.size.max(max_split);
        let stream = p.stream.0;
        if let Some(first) = self.pool(p.slot, p.small).blocks.lower_bound(stream, key_size) {
            let first = first.key;
            let b = &self.arena[first.index];
            // PyTorch would hand a split block to cudaFree here (impossible unless
            // max_split_size changed at run time); we never release part of a segment.
            if !b.is_expandable() && !b.is_split() {
                let index = first.index;
                self.release_block(env, index);
                return true;
            }
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let mut released = 0u64;
        let blocks = &self.pool(p.slot, p.small).blocks;
        let mut cursor = blocks.prev_in_stream(stream, key_size, 0);
        while let Some(k) = cursor {
            if released >= key_size || k.size < max_split {
                break;
            }
            let b = &self.arena[k.index];
            if !b.is_expandable() && !b.is_split() {
                released += k.size;
                scratch.push(k.index);
            }
            cursor = blocks.prev_in_stream(stream, k.size, k.addr);
        }
        for &index in &scratch {
            self.release_block(env, index);
        }
        self.scratch = scratch;
        released >= key_size
    }

    /// `release_cached_blocks`: for the default pools (`only` is `None`, and no context is
    /// allocating to a private pool) wait for every stream, completing pending frees, and free
    /// whole cached segments, large pool first; then the same for every freeable private pool
    /// (or only the pool in slot `only`), small pool first, deleting a pool left without
    /// segments.
    pub(super) fn release_cached_blocks<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        only: Option<u16>,
    ) -> bool {
        if only.is_none() && self.contexts.is_empty() {
            self.synchronize_and_free_events(env, None);
            self.release_blocks(env, 0, false);
            self.release_blocks(env, 0, true);
        } else if only.is_some() {
            self.synchronize_and_free_events(env, only);
        }
        for i in 0..self.private.len() {
            let slot = u16::try_from(i + 1).unwrap_or(u16::MAX);
            let pool = &self.private[i];
            if !pool.live || pool.use_count > 0 || only.is_some_and(|o| o != slot) {
                continue;
            }
            self.release_blocks(env, slot, true);
            self.release_blocks(env, slot, false);
            if self.private[i].segments == 0 {
                self.private[i].live = false;
            }
        }
        true
    }

    /// `synchronize_and_free_events`: every outstanding stream use completes now, or only
    /// those of blocks in the pool of slot `only`.
    fn synchronize_and_free_events<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        only: Option<u16>,
    ) {
        self.stats.num_sync_all_streams += 1;
        let mut pending = std::mem::take(&mut self.pending);
        let mut kept = 0;
        for i in 0..pending.len() {
            let index = pending[i];
            if only.is_some_and(|slot| self.arena[index].slot != slot) {
                pending[kept] = index;
                kept += 1;
                continue;
            }
            self.arena[index].pending = false;
            self.free_block(env, index);
        }
        pending.truncate(kept);
        self.pending = pending;
    }

    /// `release_blocks`: in (stream, size, address) order, free every unsplit segment and
    /// unmap the whole free pages of expandable blocks.
    fn release_blocks<E: Emit + ?Sized>(&mut self, env: &mut Env<'_, E>, slot: u16, small: bool) {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend(self.pool(slot, small).releasable.iter().map(|k| k.index));
        let mut to_unmap = 0;
        for i in 0..scratch.len() {
            let index = scratch[i];
            let b = &self.arena[index];
            debug_assert!(b.releasable(), "block {index} is listed as releasable");
            if b.is_expandable() {
                scratch[to_unmap] = index;
                to_unmap += 1;
            } else if !b.is_split() {
                self.release_block(env, index);
            }
        }
        for &index in &scratch[..to_unmap] {
            self.unmap_block(env, index);
            if !self.arena[index].is_split() && !self.arena[index].mapped {
                self.release_expandable_segment(env, index);
            }
        }
        self.scratch = scratch;
    }

    /// `release_block`: cudaFree a whole cached segment.
    pub(super) fn release_block<E: Emit + ?Sized>(&mut self, env: &mut Env<'_, E>, index: u32) {
        let b = self.arena[index];
        let pool = pool_of(b.small);
        self.stats.num_device_free += 1;
        env.events.emit(Event::SegmentFree { addr: b.addr, size: b.size, stream: b.stream, pool });
        env.device.free(b.addr, b.size);
        self.total_allocated_memory -= b.size;
        self.stats.segment.dec(pool, 1);
        self.stats.reserved_bytes.dec(pool, b.size);
        if b.size >= self.config.max_split_size {
            self.stats.oversize_segments.dec(1);
        }
        self.erase_from_blocks(index);
        self.arena.remove(index);
        if b.slot != 0 {
            self.private[usize::from(b.slot) - 1].segments -= 1;
        }
    }

    /// `garbage_collect_cached_blocks`: above `threshold * allowed`, free unsplit large cached
    /// segments at least as old as the average, pass after pass, without stopping at the
    /// target inside a pass (docs/fidelity-notes.md §4).
    pub(super) fn garbage_collect_cached_blocks<E: Emit + ?Sized>(&mut self, env: &mut Env<'_, E>) {
        let Some(allowed) = self.allowed_memory_maximum else { return };
        let gc_threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated_memory <= gc_threshold {
            return;
        }
        let target = self.total_allocated_memory - gc_threshold;
        let clock = self.large_pool.get_free_blocks_call_count;
        // The freeable blocks in comparator order; releasing one changes no other.
        let mut candidates = std::mem::take(&mut self.scratch);
        candidates.clear();
        candidates.extend(self.large_pool.releasable.iter().map(|k| k.index));
        candidates.retain(|&i| !self.arena[i].is_split() && !self.arena[i].is_expandable());
        let age = |b: &super::block::Block| clock - b.gc_count_base;
        let mut total_age: u64 = candidates.iter().map(|&i| age(&self.arena[i])).sum();
        let (mut reclaimed, mut freed) = (0u64, true);
        while reclaimed < target && freed && !candidates.is_empty() {
            let age_threshold = total_age as f64 / candidates.len() as f64;
            freed = false;
            for &index in &candidates {
                let b = self.arena[index];
                if age(&b) as f64 >= age_threshold {
                    freed = true;
                    reclaimed += b.size;
                    total_age -= age(&b);
                    self.release_block(env, index);
                }
            }
            candidates.retain(|&i| self.arena[i].live);
        }
        self.scratch = candidates;
    }
}
