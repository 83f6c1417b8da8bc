//! Giving memory back to the device (spec 4.2–4.4): `release_available_cached_blocks` (oversize
//! segments, on a miss), `release_cached_blocks` (every whole free segment: the last resort
//! before OOM, and `empty_cache`), and `garbage_collect_cached_blocks` (old segments, under a
//! memory fraction).
//!
//! PyTorch walks its `std::set` while erasing from it. Here each walk first collects the keys
//! it will act on into a reused scratch vector, then acts: equivalent, because releasing a
//! whole segment removes only that block, and the decisions do not depend on earlier releases
//! in the same walk except through the counters we carry along.

use super::block::SizeKey;
use super::malloc::{pool_of, Params};
use super::PyTorchAllocator;
use allocsim_core::{Env, Event};

impl PyTorchAllocator {
    /// `release_available_cached_blocks`: free one cached oversize block big enough for `p`,
    /// or else several of the largest, until their sizes add up to the request. Blocks freed
    /// stay freed even when the sum falls short.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        env: &mut Env<'_>,
        p: &Params,
    ) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key_size = p.size.max(max_split);
        let key = SizeKey::search(p.stream, key_size);
        if let Some(first) = self.pool(p.small).blocks.range(key..).next().copied() {
            let b = &self.arena[first.index];
            // PyTorch would hand a split block to cudaFree here (impossible unless
            // max_split_size changed at run time); we never release part of a segment.
            if first.stream == p.stream.0 && !b.is_expandable() && !b.is_split() {
                let index = first.index;
                self.release_block(env, index);
                return true;
            }
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let mut released = 0u64;
        for k in self.pool(p.small).blocks.range(..key).rev() {
            if released >= key_size || k.size < max_split || k.stream != p.stream.0 {
                break;
            }
            let b = &self.arena[k.index];
            if !b.is_expandable() && !b.is_split() {
                released += k.size;
                scratch.push(k.index);
            }
        }
        for &index in &scratch {
            self.release_block(env, index);
        }
        self.scratch = scratch;
        released >= key_size
    }

    /// `release_cached_blocks` for the default pools: wait for every stream (completing
    /// pending frees), then free whole cached segments, large pool first.
    pub(super) fn release_cached_blocks(&mut self, env: &mut Env<'_>) -> bool {
        self.synchronize_and_free_events(env);
        self.release_blocks(env, false);
        self.release_blocks(env, true);
        true
    }

    /// `synchronize_and_free_events`: every outstanding stream use completes now.
    fn synchronize_and_free_events(&mut self, env: &mut Env<'_>) {
        self.stats.num_sync_all_streams += 1;
        let mut pending = std::mem::take(&mut self.pending);
        for &index in &pending {
            self.arena[index].pending = false;
            self.free_block(env, index);
        }
        pending.clear();
        self.pending = pending;
    }

    /// `release_blocks`: in (stream, size, address) order, free every unsplit segment and
    /// unmap the whole free pages of expandable blocks.
    fn release_blocks(&mut self, env: &mut Env<'_>, small: bool) {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend(self.pool(small).blocks.iter().map(|k| k.index));
        let mut to_unmap = 0;
        for i in 0..scratch.len() {
            let index = scratch[i];
            let b = &self.arena[index];
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
    pub(super) fn release_block(&mut self, env: &mut Env<'_>, index: u32) {
        let b = self.arena[index];
        let pool = pool_of(b.small);
        self.stats.num_device_free += 1;
        env.events.push(Event::SegmentFree { addr: b.addr, size: b.size, stream: b.stream, pool });
        env.device.free(b.addr, b.size);
        self.total_allocated_memory -= b.size;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, b.size);
        if b.size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.erase_from_blocks(index);
        self.arena.remove(index);
    }

    /// `garbage_collect_cached_blocks`: above `threshold * allowed`, free unsplit large cached
    /// segments at least as old as the average, pass after pass, without stopping at the
    /// target inside a pass (fidelity-notes 4).
    pub(super) fn garbage_collect_cached_blocks(&mut self, env: &mut Env<'_>) {
        let Some(allowed) = self.allowed_memory_maximum else { return };
        let gc_threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated_memory <= gc_threshold {
            return;
        }
        let target = self.total_allocated_memory - gc_threshold;
        let clock = self.large_pool.get_free_blocks_call_count;
        let (mut total_age, mut count) = (0u64, 0u64);
        for k in &self.large_pool.blocks {
            let b = &self.arena[k.index];
            if !b.is_split() && !b.is_expandable() {
                total_age += clock - b.gc_count_base;
                count += 1;
            }
        }
        let (mut reclaimed, mut freed) = (0u64, true);
        let mut scratch = std::mem::take(&mut self.scratch);
        while reclaimed < target && freed && count > 0 {
            let age_threshold = total_age as f64 / count as f64;
            scratch.clear();
            for k in &self.large_pool.blocks {
                let b = &self.arena[k.index];
                if !b.is_split()
                    && !b.is_expandable()
                    && (clock - b.gc_count_base) as f64 >= age_threshold
                {
                    scratch.push(k.index);
                }
            }
            freed = !scratch.is_empty();
            for &index in &scratch {
                let b = &self.arena[index];
                reclaimed += b.size;
                total_age -= clock - b.gc_count_base;
                count -= 1;
                self.release_block(env, index);
            }
        }
        self.scratch = scratch;
    }
}
