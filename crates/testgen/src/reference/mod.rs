//! A deliberately simple model of PyTorch's caching allocator (spec §1-§5, §7), the oracle the
//! `pytorch` policy is compared with event for event.
//!
//! Where the policy uses clever structures (a slab of linked blocks, ordered free sets per
//! pool), this keeps one plain `Vec` of every block sorted by address and finds everything by
//! scanning it: best fit is "the smallest `(size, address)` among free blocks of the pool and
//! stream", a block's neighbours are the entries beside it in the same segment, a pool's
//! comparator order is a sort by `(stream, size, address)`. Slow (O(blocks) per call) and
//! obviously right, which is the point: the two implementations share no code and no data
//! structure, so a bug in one shows up as a difference.
//!
//! Follows: rounding (with `roundup_power2_divisions`), the small/large pools, segment sizes,
//! best fit, the split rules, merging with prev then next, `max_split_size` and
//! `max_non_split_rounding`, memory fractions, garbage collection, the retry chain
//! (`release_available_cached_blocks`, `release_cached_blocks`), pending frees, OOM, every
//! statistic, and snapshots (with PyTorch's stale `requested_size` on inactive blocks).
//! Not followed: expandable segments (programs for this oracle leave them off).

mod settings;

pub use settings::Settings;

use allocsim_core::{
    AllocId, Allocator, BlockState, ConfigError, Env, Event, Granted, MemoryStats, OomInfo, Pool,
    SnapshotBlock, SnapshotSegment, StreamId, MIB,
};
use std::cell::RefCell;
use std::rc::Rc;

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = MIB;
const SMALL_BUFFER: u64 = 2 * MIB;
const LARGE_BUFFER: u64 = 20 * MIB;
const MIN_LARGE_ALLOC: u64 = 10 * MIB;
const ROUND_LARGE: u64 = 2 * MIB;
/// `NativeCachingAllocator::allocate` refuses 1 EiB and more before anything else.
const MAX_REQUEST: u64 = 1 << 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Allocated,
    /// Freed by the program, waiting for other streams.
    Pending,
}

#[derive(Debug, Clone)]
struct Block {
    addr: u64,
    size: u64,
    /// The last request this block object served; kept after a free, as PyTorch does.
    requested: u64,
    /// The segment's address.
    segment: u64,
    stream: StreamId,
    pool: Pool,
    state: State,
    id: Option<AllocId>,
    used_elsewhere: bool,
    gc_base: u64,
}

#[derive(Debug, Clone, Copy)]
struct Segment {
    addr: u64,
    size: u64,
    stream: StreamId,
    pool: Pool,
}

/// The reference model. See the module doc.
#[derive(Debug)]
pub struct Reference {
    settings: Settings,
    /// Every block of every segment, sorted by address.
    blocks: Vec<Block>,
    segments: Vec<Segment>,
    /// Pending frees in the order of their frees.
    pending: Vec<AllocId>,
    stats: MemoryStats,
    total_allocated: u64,
    allowed: Option<u64>,
    /// `get_free_blocks_call_count` of the small and the large pool.
    free_calls: [u64; 2],
    /// Set when the program reached a case where PyTorch itself goes wrong; what happened.
    /// Shared, so a caller can watch it while an engine holds the model.
    beyond: Rc<RefCell<Option<String>>>,
}

/// `round_size` (spec §1.1).
pub fn round_size(settings: &Settings, size: u64) -> u64 {
    if size < MIN_BLOCK {
        return MIN_BLOCK;
    }
    let div = settings.divisions_for(size);
    if div > 1 && size > MIN_BLOCK * div {
        if size.is_power_of_two() {
            return size;
        }
        let p = 1u64 << (63 - size.leading_zeros());
        let step = p / div;
        let floor = size & !(step - 1);
        return if floor == size { size } else { floor + step };
    }
    size.div_ceil(MIN_BLOCK) * MIN_BLOCK
}

/// `get_allocation_size` (spec §1.2).
pub fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

fn pool_index(pool: Pool) -> usize {
    match pool {
        Pool::Small => 0,
        Pool::Large => 1,
    }
}

impl Reference {
    /// The model as a process with `PYTORCH_CUDA_ALLOC_CONF=conf` constructs it.
    pub fn new(conf: &str) -> Result<Self, ConfigError> {
        let settings = Settings::default().apply(conf)?;
        if settings.expandable_segments {
            return Err(ConfigError(
                "the reference model does not follow expandable segments".into(),
            ));
        }
        let max_split_stat =
            if settings.max_split_size == u64::MAX { -1 } else { settings.max_split_size as i64 };
        Ok(Reference {
            settings,
            blocks: Vec::new(),
            segments: Vec::new(),
            pending: Vec::new(),
            stats: MemoryStats { max_split_size: max_split_stat, ..MemoryStats::default() },
            total_allocated: 0,
            allowed: None,
            free_calls: [0; 2],
            beyond: Rc::default(),
        })
    }

    /// Filled once the program reaches a case PyTorch itself gets wrong (the model stops
    /// following it there): what happened. A handle, to watch while an engine holds the model.
    pub fn beyond_model(&self) -> Rc<RefCell<Option<String>>> {
        Rc::clone(&self.beyond)
    }

    fn index_of(&self, addr: u64) -> usize {
        self.blocks.iter().position(|b| b.addr == addr).expect("reference: no block at address")
    }

    fn index_of_id(&self, id: AllocId) -> Option<usize> {
        self.blocks.iter().position(|b| b.id == Some(id))
    }

    /// Whether the block shares its segment with others (PyTorch's `is_split`).
    fn is_split(&self, i: usize) -> bool {
        let b = &self.blocks[i];
        self.segments.iter().any(|s| s.addr == b.segment && s.size != b.size)
    }

    /// The pool's free blocks in comparator order: `(stream, size, address)`.
    fn free_in_order(&self, pool: Pool) -> Vec<(StreamId, u64, u64)> {
        let mut v: Vec<(StreamId, u64, u64)> = self
            .blocks
            .iter()
            .filter(|b| b.pool == pool && b.state == State::Free)
            .map(|b| (b.stream, b.size, b.addr))
            .collect();
        v.sort();
        v
    }

    fn gc_enabled(&self) -> bool {
        self.allowed.is_some() && self.settings.gc_threshold > 0.0
    }

    /// `get_free_block` (spec §3.1): best fit, then the `max_split_size` refusals.
    fn get_free_block(&mut self, pool: Pool, stream: StreamId, size: u64) -> Option<u64> {
        if self.gc_enabled() {
            self.free_calls[pool_index(pool)] += 1;
        }
        let (_, found, addr) = self
            .free_in_order(pool)
            .into_iter()
            .find(|&(s, bsize, _)| s == stream && bsize >= size)?;
        let max_split = self.settings.max_split_size;
        if size < max_split && found >= max_split {
            return None;
        }
        if size >= max_split && found >= size.saturating_add(self.settings.max_non_split_rounding) {
            return None;
        }
        Some(addr)
    }

    /// `alloc_block` (spec §4.1) for a non-expandable segment; the new segment's address.
    fn alloc_block(
        &mut self,
        env: &mut Env<'_>,
        pool: Pool,
        stream: StreamId,
        alloc_size: u64,
        retry: bool,
    ) -> Option<u64> {
        if retry {
            self.stats.num_alloc_retries += 1;
        }
        if self.allowed.is_some_and(|a| self.total_allocated.saturating_add(alloc_size) > a) {
            return None;
        }
        let addr = env.device.malloc(alloc_size).ok()?;
        self.total_allocated += alloc_size;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, alloc_size);
        if alloc_size >= self.settings.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        env.events.emit(Event::SegmentAlloc { addr, size: alloc_size, stream, pool });
        let at = self.blocks.partition_point(|b| b.addr < addr);
        let block = Block {
            addr,
            size: alloc_size,
            requested: 0,
            segment: addr,
            stream,
            pool,
            state: State::Free,
            id: None,
            used_elsewhere: false,
            gc_base: 0,
        };
        self.blocks.insert(at, block);
        let at = self.segments.partition_point(|s| s.addr < addr);
        self.segments.insert(at, Segment { addr, size: alloc_size, stream, pool });
        Some(addr)
    }

    /// `release_block`: a whole free segment goes back to the device.
    fn release_block(&mut self, env: &mut Env<'_>, addr: u64) {
        let i = self.index_of(addr);
        if self.is_split(i) {
            // PyTorch would cudaFree a pointer into a segment that still holds other blocks.
            let b = &self.blocks[i];
            self.beyond.borrow_mut().get_or_insert(format!(
                "release_block of the {} B free block at {:#x}, which is not a whole segment \
                 (an oversize block split before max_split_size was lowered at run time)",
                b.size, b.addr
            ));
            return;
        }
        let b = self.blocks.remove(i);
        self.segments.retain(|s| s.addr != b.segment);
        env.device.free(b.addr, b.size);
        self.total_allocated -= b.size;
        self.stats.segment.decrease(b.pool, 1);
        self.stats.reserved_bytes.decrease(b.pool, b.size);
        if b.size >= self.settings.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.num_device_free += 1;
        env.events.emit(Event::SegmentFree {
            addr: b.addr,
            size: b.size,
            stream: b.stream,
            pool: b.pool,
        });
    }

    /// `release_available_cached_blocks` (spec §4.2): oversize cached segments only.
    fn release_available(
        &mut self,
        env: &mut Env<'_>,
        pool: Pool,
        stream: StreamId,
        size: u64,
    ) -> bool {
        let max_split = self.settings.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key = size.max(max_split);
        let order = self.free_in_order(pool);
        // A split block can only be oversize after max_split_size was lowered at run time;
        // PyTorch would cudaFree a pointer into a live segment there. Such blocks are skipped
        // (the policy's documented choice): never release part of a segment.
        let whole = |r: &Self, addr: u64| !r.is_split(r.index_of(addr));
        let pos = order.partition_point(|&e| e < (stream, key, 0));
        if pos < order.len() && order[pos].0 == stream && whole(self, order[pos].2) {
            self.release_block(env, order[pos].2);
            return true;
        }
        if pos == 0 {
            return false;
        }
        let mut released = 0u64;
        let mut j = pos - 1;
        while released < key && order[j].1 >= max_split && order[j].0 == stream {
            if whole(self, order[j].2) {
                self.release_block(env, order[j].2);
                released += order[j].1;
            }
            if j == 0 {
                break;
            }
            j -= 1;
        }
        released >= key
    }

    /// `release_cached_blocks` (spec §4.3): complete every pending free, then give back every
    /// whole free segment, large pool first, each in comparator order.
    fn release_cached(&mut self, env: &mut Env<'_>) {
        self.stats.num_sync_all_streams += 1;
        for id in std::mem::take(&mut self.pending) {
            if let Some(i) = self.index_of_id(id) {
                self.free_block(env, i);
            }
        }
        for pool in [Pool::Large, Pool::Small] {
            for (_, _, addr) in self.free_in_order(pool) {
                if !self.is_split(self.index_of(addr)) {
                    self.release_block(env, addr);
                }
            }
        }
    }

    /// `garbage_collect_cached_blocks` (docs/pytorch-caching-allocator.md §4.4, docs/fidelity-notes.md §4).
    fn garbage_collect(&mut self, env: &mut Env<'_>) {
        let Some(allowed) = self.allowed else { return };
        let threshold = (self.settings.gc_threshold * allowed as f64) as u64;
        if self.total_allocated <= threshold {
            return;
        }
        let target = self.total_allocated - threshold;
        let clock = self.free_calls[pool_index(Pool::Large)];
        let age = |b: &Block| clock - b.gc_base;
        let freeable: Vec<u64> = self
            .blocks
            .iter()
            .enumerate()
            .filter(|(i, b)| b.pool == Pool::Large && b.state == State::Free && !self.is_split(*i))
            .map(|(_, b)| age(b))
            .collect();
        let mut total_age: u64 = freeable.iter().sum();
        let mut count = freeable.len() as u64;
        let (mut reclaimed, mut freed) = (0u64, true);
        while reclaimed < target && freed && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed = false;
            for (_, size, addr) in self.free_in_order(Pool::Large) {
                let i = self.index_of(addr);
                let a = age(&self.blocks[i]);
                if !self.is_split(i) && a as f64 >= threshold_age {
                    freed = true;
                    reclaimed += size;
                    total_age -= a;
                    count -= 1;
                    self.release_block(env, addr);
                }
            }
        }
    }

    /// `alloc_found_block` (spec §3.2, §3.3, §7.2).
    fn alloc_found_block(&mut self, addr: u64, size: u64, orig: u64, id: AllocId) -> Granted {
        let i = self.index_of(addr);
        let already_split = self.is_split(i);
        let pool = self.blocks[i].pool;
        let remaining = self.blocks[i].size - size;
        let split = match pool {
            Pool::Small => remaining >= MIN_BLOCK,
            Pool::Large => size < self.settings.max_split_size && remaining > MIB,
        };
        if split {
            // The found block object becomes the high remainder and keeps its stale request.
            let mut front = self.blocks[i].clone();
            front.size = size;
            let rest = &mut self.blocks[i];
            rest.addr += size;
            rest.size -= size;
            rest.gc_base = self.free_calls[pool_index(pool)];
            self.blocks.insert(i, front);
            if already_split {
                self.stats.inactive_split_bytes.decrease(pool, size);
            } else {
                self.stats.inactive_split_bytes.increase(pool, remaining);
                self.stats.inactive_split.increase(pool, 1);
            }
        } else if already_split {
            let s = self.blocks[i].size;
            self.stats.inactive_split_bytes.decrease(pool, s);
            self.stats.inactive_split.decrease(pool, 1);
        }
        let b = &mut self.blocks[i];
        b.state = State::Allocated;
        b.requested = orig;
        b.id = Some(id);
        b.used_elsewhere = false;
        let (bsize, baddr) = (b.size, b.addr);
        let s = &mut self.stats;
        s.allocation.increase(pool, 1);
        s.allocated_bytes.increase(pool, bsize);
        s.active.increase(pool, 1);
        s.active_bytes.increase(pool, bsize);
        s.requested_bytes.increase(pool, orig);
        if bsize >= self.settings.max_split_size {
            s.oversize_allocations.increase(1);
        }
        Granted { addr: baddr, size: bsize }
    }

    /// `free_block` (spec §5): the free completes; merge with prev, then next.
    fn free_block(&mut self, env: &mut Env<'_>, mut i: usize) {
        let b = &mut self.blocks[i];
        let id = b.id.take().expect("reference: free_block of a block without an id");
        env.events.emit(Event::FreeCompleted {
            id,
            addr: b.addr,
            size: b.size,
            requested: b.requested,
        });
        b.state = State::Free;
        b.used_elsewhere = false;
        let (original, requested, pool, segment) = (b.size, b.requested, b.pool, b.segment);
        let mergeable = |b: &Block| b.segment == segment && b.state == State::Free;
        let (mut net_blocks, mut net_bytes) = (0i64, 0i64);
        if i > 0 && mergeable(&self.blocks[i - 1]) {
            let prev = self.blocks.remove(i - 1);
            i -= 1;
            self.blocks[i].addr = prev.addr;
            self.blocks[i].size += prev.size;
            net_blocks -= 1;
            net_bytes -= prev.size as i64;
        }
        if i + 1 < self.blocks.len() && mergeable(&self.blocks[i + 1]) {
            let next = self.blocks.remove(i + 1);
            self.blocks[i].size += next.size;
            net_blocks -= 1;
            net_bytes -= next.size as i64;
        }
        self.blocks[i].gc_base = self.free_calls[pool_index(pool)];
        if self.is_split(i) {
            net_blocks += 1;
            net_bytes += self.blocks[i].size as i64;
        }
        let s = &mut self.stats;
        s.inactive_split.apply(pool, net_blocks);
        s.inactive_split_bytes.apply(pool, net_bytes);
        s.active.decrease(pool, 1);
        s.active_bytes.decrease(pool, original);
        s.requested_bytes.decrease(pool, requested);
    }

    /// The OOM outcome (spec §4.5): `size` is the rounded request.
    fn oom(&mut self, env: &mut Env<'_>, id: AllocId, size: u64, stream: StreamId) -> OomInfo {
        let mem = env.device.mem_info();
        let info = OomInfo {
            rounded_bytes: size,
            device_free_bytes: mem.free_bytes,
            device_total_bytes: mem.total_bytes,
            allowed_bytes: self.allowed,
            allocated_bytes: self.stats.allocated_bytes.all.current as u64,
            reserved_bytes: self.stats.reserved_bytes.all.current as u64,
            largest_free_small_bytes: self.largest_free(Pool::Small),
            largest_free_large_bytes: self.largest_free(Pool::Large),
        };
        self.stats.num_ooms += 1;
        env.events.emit(Event::Oom { id, size, stream, info });
        info
    }

    fn largest_free(&self, pool: Pool) -> u64 {
        self.free_in_order(pool).iter().map(|e| e.1).max().unwrap_or(0)
    }
}

impl Allocator for Reference {
    fn name(&self) -> &str {
        "pytorch-reference"
    }

    fn malloc(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        orig: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo> {
        if orig == 0 {
            // `NativeCachingAllocator::allocate(0)`: a null pointer, no stats, no trace.
            return Ok(Granted { addr: 0, size: 0 });
        }
        if orig >= MAX_REQUEST {
            // PyTorch throws before rounding ("more than 1EB"); reported as a counted OOM.
            return Err(self.oom(env, id, orig, stream));
        }
        let size = round_size(&self.settings, orig);
        let pool = Pool::for_size(size);
        let alloc_size = allocation_size(size);
        let mut found = self.get_free_block(pool, stream, size);
        if found.is_none() {
            if self.gc_enabled() {
                self.garbage_collect(env);
            }
            found = self.alloc_block(env, pool, stream, alloc_size, false);
            if found.is_none() && self.release_available(env, pool, stream, size) {
                found = self.alloc_block(env, pool, stream, alloc_size, false);
            }
            if found.is_none() {
                self.release_cached(env);
                found = self.alloc_block(env, pool, stream, alloc_size, true);
            }
        }
        let Some(addr) = found else {
            return Err(self.oom(env, id, size, stream));
        };
        let granted = self.alloc_found_block(addr, size, orig, id);
        env.events.emit(Event::Alloc {
            id,
            addr: granted.addr,
            size: granted.size,
            requested: orig,
            stream,
            pool,
        });
        Ok(granted)
    }

    fn free(&mut self, env: &mut Env<'_>, id: AllocId) {
        let Some(i) = self.index_of_id(id) else { return };
        let b = &mut self.blocks[i];
        b.state = State::Pending;
        let (addr, size, requested, pool, elsewhere) =
            (b.addr, b.size, b.requested, b.pool, b.used_elsewhere);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        env.events.emit(Event::FreeRequested { id, addr, size, requested });
        if size >= self.settings.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        if elsewhere {
            self.pending.push(id);
        } else {
            self.free_block(env, i);
        }
    }

    fn record_stream(&mut self, id: AllocId, stream: StreamId) {
        if let Some(i) = self.index_of_id(id) {
            let b = &mut self.blocks[i];
            b.used_elsewhere |= b.stream != stream;
        }
    }

    fn free_completed(&mut self, env: &mut Env<'_>, id: AllocId) {
        if let Some(at) = self.pending.iter().position(|&p| p == id) {
            self.pending.remove(at);
            let i = self.index_of_id(id).expect("reference: pending free without a block");
            self.free_block(env, i);
        }
    }

    fn empty_cache(&mut self, env: &mut Env<'_>) {
        self.release_cached(env);
    }

    fn set_memory_fraction(&mut self, env: &mut Env<'_>, fraction: f64) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(ConfigError(format!("memory fraction {fraction} is not in [0, 1]")));
        }
        let total = env.device.mem_info().total_bytes;
        self.allowed = (fraction < 1.0).then_some((fraction * total as f64) as u64);
        Ok(())
    }

    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        let next = self.settings.apply(conf)?;
        if next.expandable_segments {
            return Err(ConfigError(
                "the reference model does not follow expandable segments".into(),
            ));
        }
        self.settings = next;
        Ok(())
    }

    fn stats(&self) -> MemoryStats {
        self.stats.clone()
    }

    fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    fn snapshot(&self) -> Vec<SnapshotSegment> {
        self.segments
            .iter()
            .map(|s| SnapshotSegment {
                pool_id: allocsim_core::MemPoolId::DEFAULT,
                address: s.addr,
                total_size: s.size,
                stream: s.stream,
                pool: s.pool,
                is_expandable: false,
                blocks: self
                    .blocks
                    .iter()
                    .filter(|b| b.segment == s.addr)
                    .map(|b| SnapshotBlock {
                        address: b.addr,
                        size: b.size,
                        requested_size: b.requested,
                        state: match b.state {
                            State::Free => BlockState::Inactive,
                            State::Allocated => BlockState::ActiveAllocated,
                            State::Pending => BlockState::ActivePendingFree,
                        },
                    })
                    .collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
