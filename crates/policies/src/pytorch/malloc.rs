//! The allocation path, `DeviceCachingAllocator::malloc` (docs/pytorch-caching-allocator.md §4), in PyTorch's order:
//! best fit from the cache, then GC, a new segment, freeing oversize cached segments, freeing
//! every whole cached segment, and only then OOM. The order decides which device calls happen
//! and so which segment events a recording shows; it must not be "simplified".

use super::block::{Block, NIL};
use super::freeset::SizeKey;
use super::rounding::{get_allocation_size, is_small, round_size, K_MIN_BLOCK_SIZE, K_SMALL_SIZE};
use super::stats::{StatArrayExt, StatExt};
use super::PyTorchAllocator;
use allocsim_core::{AllocId, Device, Emit, Env, Event, Granted, OomInfo, Pool, StreamId};

/// Requests of at least 1 EiB are refused before anything else ("Tried to allocate more than
/// 1EB memory").
const MAX_REQUEST_BYTES: u64 = 1 << 60;

/// `AllocParams`: one request as the miss path sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Params {
    /// Rounded size.
    pub size: u64,
    /// Segment size a new segment would get (`get_allocation_size`).
    pub alloc_size: u64,
    pub stream: StreamId,
    pub small: bool,
    /// The pool the request is served from: 0 the default pools, else a private pool's slot.
    pub slot: u16,
    /// The block found or made; `NIL` until then.
    pub block: u32,
}

pub(super) fn pool_of(small: bool) -> Pool {
    if small {
        Pool::Small
    } else {
        Pool::Large
    }
}

impl PyTorchAllocator {
    /// `DeviceCachingAllocator::malloc`.
    pub(super) fn malloc_impl<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        id: AllocId,
        orig_size: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo> {
        self.apply_initial_fraction(env.device);
        if orig_size == 0 {
            // NativeCachingAllocator::allocate(0) returns nullptr: no stats, no trace.
            return Ok(Granted { addr: 0, size: 0 });
        }
        if orig_size >= MAX_REQUEST_BYTES {
            // NativeCachingAllocator::allocate throws before rounding or touching any state.
            // We report the refusal as an OOM and count it, so that every `Oom` event is in
            // `num_ooms` (PyTorch's RuntimeError here is not an OOM and counts nowhere; no
            // recording can hold such a request, since it never reaches the trace).
            let (size, alloc_size) = (orig_size, orig_size);
            let p = Params { size, alloc_size, stream, small: false, slot: 0, block: NIL };
            self.stats.num_ooms += 1;
            let info = self.oom_info(env.device, &p);
            env.events.emit(Event::Oom { id, size: orig_size, stream, info });
            return Err(info);
        }
        let size = round_size(&self.config, orig_size);
        let small = is_small(size);
        let alloc_size = get_allocation_size(size);
        let slot = self.contexts.last().copied().unwrap_or(0);
        let mut p = Params { size, alloc_size, stream, small, slot, block: NIL };
        if !self.get_free_block(&mut p) && !self.malloc_miss(env, &mut p) {
            return Err(self.oom(env, id, &p));
        }
        let split = self.should_split(p.block, size);
        Ok(self.alloc_found_block(env, id, &p, orig_size, split))
    }

    /// The cache had no block: GC, a new segment, and the release-and-retry chain. Out of
    /// line, so that the hit path stays small.
    #[inline(never)]
    fn malloc_miss<E: Emit + ?Sized>(&mut self, env: &mut Env<'_, E>, p: &mut Params) -> bool {
        // trigger_free_memory_callbacks only has the CUDA-IPC collector, false in one process.
        if self.gc_enabled() {
            self.garbage_collect_cached_blocks(env);
        }
        self.alloc_block(env, p, false)
            || (self.release_available_cached_blocks(env, p) && self.alloc_block(env, p, false))
            || (self.contexts.is_empty()
                && self.release_cached_blocks(env, None)
                && self.alloc_block(env, p, true))
    }

    /// `get_free_block`: best fit on the same stream, with the expandable preference and the
    /// max_split rules. No fallback search: a rejected candidate means a miss.
    #[inline(always)]
    fn get_free_block(&mut self, p: &mut Params) -> bool {
        let gc = self.gc_enabled();
        let expandable_on = self.config.expandable_segments;
        let max_split = self.config.max_split_size;
        let non_split_rounding = self.config.max_non_split_rounding_size;
        let arena = &self.arena;
        let pool = pool_mut!(self, p.slot, p.small);
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        let stream = p.stream.0;
        let Some(mut found) = pool.blocks.lower_bound(stream, p.size) else { return false };
        if arena[found.key.index].is_expandable() {
            if expandable_on {
                // Best fit by the size a block can grow to: prefer a bigger block with less
                // unmapped room behind it.
                let growable = |k: &SizeKey| {
                    let b = &arena[k.index];
                    let unmapped_next = b.next != NIL && !arena[b.next].mapped;
                    b.size + if unmapped_next { arena[b.next].size } else { 0 }
                };
                while arena[found.key.index].is_expandable() {
                    match pool.blocks.next_in_stream(&found.key) {
                        Some(next) if growable(&next.key) < growable(&found.key) => found = next,
                        _ => break,
                    }
                }
            } else {
                // Expandable segments were turned off after use: skip their blocks.
                loop {
                    let Some(next) = pool.blocks.next_in_stream(&found.key) else { return false };
                    found = next;
                    if !arena[found.key.index].is_expandable() {
                        break;
                    }
                }
            }
        }
        let key = found.key;
        if p.size < max_split && key.size >= max_split {
            return false;
        }
        if p.size >= max_split && key.size >= p.size.saturating_add(non_split_rounding) {
            return false;
        }
        pool.blocks.remove_found(&found);
        if arena[key.index].releasable() {
            pool.releasable.remove(&key);
        }
        p.block = key.index;
        true
    }

    /// `alloc_block`: a new segment (or expandable pages) for `p`. The fraction check comes
    /// before any device call; a retry is counted before any check.
    pub(super) fn alloc_block<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        p: &mut Params,
        is_retry: bool,
    ) -> bool {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(allowed) = self.allowed_memory_maximum {
            if self.total_allocated_memory.saturating_add(p.alloc_size) > allowed {
                return false;
            }
        }
        if self.config.expandable_segments {
            return match self.try_allocate_expandable_block(env, p.stream, p.slot, p.small, p.size)
            {
                Some(block) => {
                    p.block = block;
                    true
                }
                None => false,
            };
        }
        // cudaErrorMemoryAllocation is swallowed; PyTorch would throw on other driver errors,
        // which we can only report as a failed allocation.
        let Ok(addr) = env.device.malloc(p.alloc_size) else { return false };
        self.total_allocated_memory += p.alloc_size;
        let mut block = Block::new(addr, p.alloc_size, p.stream, p.small);
        block.slot = p.slot;
        p.block = self.arena.insert(block);
        if p.slot != 0 {
            self.private[usize::from(p.slot) - 1].segments += 1;
        }
        let pool = pool_of(p.small);
        self.stats.segment.inc(pool, 1);
        self.stats.reserved_bytes.inc(pool, p.alloc_size);
        if p.alloc_size >= self.config.max_split_size {
            self.stats.oversize_segments.inc(1);
        }
        self.stats.num_device_alloc += 1;
        env.events.emit(Event::SegmentAlloc { addr, size: p.alloc_size, stream: p.stream, pool });
        true
    }

    /// `should_split`: small pool and expandable mode split any remainder of 512 B or more;
    /// the large pool only below max_split_size and for remainders over 1 MiB.
    fn should_split(&self, block: u32, size: u64) -> bool {
        let b = &self.arena[block];
        let remaining = b.size - size;
        if b.small || self.config.expandable_segments {
            remaining >= K_MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size && remaining > K_SMALL_SIZE
        }
    }

    /// `alloc_found_block`: the low part becomes a new block handed out, the found block object
    /// becomes the high remainder (keeping its stale `requested_size`).
    pub(super) fn alloc_found_block<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        id: AllocId,
        p: &Params,
        orig_size: u64,
        split: bool,
    ) -> Granted {
        let pool = pool_of(p.small);
        let found = &self.arena[p.block];
        let already_split = found.is_split();
        let expandable = found.is_expandable();
        let (found_addr, found_size, found_prev, found_expandable) =
            (found.addr, found.size, found.prev, found.expandable);
        let mut block = p.block;
        if split {
            let remaining = p.block;
            let mut head = Block::new(found_addr, p.size, p.stream, p.small);
            head.expandable = found_expandable;
            head.slot = p.slot;
            head.prev = found_prev;
            head.next = remaining;
            block = self.arena.insert(head);
            if found_prev != NIL {
                self.arena[found_prev].next = block;
            }
            let (remaining_addr, remaining_size) = (found_addr + p.size, found_size - p.size);
            let r = &mut self.arena[remaining];
            r.prev = block;
            r.addr = remaining_addr;
            r.size = remaining_size;
            self.insert_free(remaining, remaining_addr, remaining_size);
            if !expandable {
                if already_split {
                    self.stats.inactive_split_bytes.dec(pool, p.size);
                } else {
                    self.stats.inactive_split_bytes.inc(pool, remaining_size);
                    self.stats.inactive_split.inc(pool, 1);
                }
            }
        } else if already_split && !expandable {
            self.stats.inactive_split_bytes.dec(pool, found_size);
            self.stats.inactive_split.dec(pool, 1);
        }
        let b = &mut self.arena[block];
        b.allocated = true;
        b.requested = orig_size;
        b.id = id;
        // From the locals, not read back from the block: a split has just written it with
        // narrow stores, and the two fields' read is one 16-byte load that waits for them.
        let (addr, size) = (found_addr, if split { p.size } else { found_size });
        debug_assert!(b.addr == addr && b.size == size);
        env.events.emit(Event::Alloc {
            id,
            addr,
            size,
            requested: orig_size,
            stream: p.stream,
            pool,
        });
        self.ids.set(id, block);
        let s = &mut self.stats;
        s.allocation.inc(pool, 1);
        s.allocated_bytes.inc(pool, size);
        if !self.active_is_allocation {
            s.active.inc(pool, 1);
            s.active_bytes.inc(pool, size);
        }
        s.requested_bytes.inc(pool, orig_size);
        if size >= self.config.max_split_size {
            s.oversize_allocations.inc(1);
        }
        Granted { addr, size }
    }

    /// The OOM branch of `malloc`: trace `oom` with the driver's free memory, count it.
    fn oom<E: Emit + ?Sized>(&mut self, env: &mut Env<'_, E>, id: AllocId, p: &Params) -> OomInfo {
        let info = self.oom_info(env.device, p);
        env.events.emit(Event::Oom { id, size: p.size, stream: p.stream, info });
        self.stats.num_ooms += 1;
        info
    }

    fn oom_info(&self, device: &dyn Device, p: &Params) -> OomInfo {
        let mem = device.mem_info();
        OomInfo {
            rounded_bytes: p.size,
            device_free_bytes: mem.free_bytes,
            device_total_bytes: mem.total_bytes,
            allowed_bytes: self.allowed_memory_maximum,
            allocated_bytes: self.stats.allocated_bytes.all.current.max(0) as u64,
            reserved_bytes: self.stats.reserved_bytes.all.current.max(0) as u64,
            largest_free_small_bytes: self.small_pool.largest_free(),
            largest_free_large_bytes: self.large_pool.largest_free(),
        }
    }

    /// `BlockPool::insert_into_blocks`: enter the free set, stamping the GC clock.
    #[inline(always)]
    pub(super) fn insert_into_blocks(&mut self, index: u32) {
        let b = &self.arena[index];
        self.insert_free(index, b.addr, b.size);
    }

    /// [`Self::insert_into_blocks`] of a block whose address and size the caller holds: the
    /// paths that have just written them pass them on, because reading them back (as one
    /// 16-byte load, LLVM merges the two) stalls on store forwarding (`perf annotate`).
    #[inline(always)]
    pub(super) fn insert_free(&mut self, index: u32, addr: u64, size: u64) {
        let b = &mut self.arena[index];
        let pool = pool_mut!(self, b.slot, b.small);
        debug_assert!(b.addr == addr && b.size == size);
        b.gc_count_base = pool.get_free_blocks_call_count;
        let key = SizeKey { stream: b.stream.0, size, addr, index };
        pool.blocks.insert(key);
        if b.releasable() {
            pool.releasable.insert(key);
        }
    }

    /// `pool.blocks.erase(block)`.
    #[inline(always)]
    pub(super) fn erase_from_blocks(&mut self, index: u32) {
        let b = &self.arena[index];
        let key = b.size_key(index);
        let pool = pool_mut!(self, b.slot, b.small);
        pool.blocks.remove(&key);
        if b.releasable() {
            pool.releasable.remove(&key);
        }
    }
}
