//! The faithful clone of PyTorch 2.11's native CUDA caching allocator
//! (`c10/cuda/CUDACachingAllocator.cpp`, `DeviceCachingAllocator`).
//!
//! Goal: replaying a recorded program under the recorded settings on a device that follows
//! the recording gives every `torch.cuda.memory_stats()` key and every segment event that real
//! PyTorch gave. So the code mirrors PyTorch function by function, in PyTorch's order, and
//! each stat moves exactly where PyTorch moves it; the module split follows PyTorch's concerns:
//! - [`config`]: `PYTORCH_CUDA_ALLOC_CONF` parsing;
//! - [`versions`]: the release the clone follows ([`versions::CLONE_VERSION`]) and what later
//!   releases changed;
//! - `rounding`: request → block size → segment size;
//! - `block`: blocks (slab + index links) and pools;
//! - `freeset`: the (stream, size, address)-ordered free sets, as a size-class index;
//! - `malloc`: the allocation path with its retry chain and OOM;
//! - `release`: giving memory back (`release_*`, garbage collection, `empty_cache`);
//! - `free`: frees, stream uses, merging;
//! - `expandable`: expandable segments (map/unmap pages in a reserved range);
//! - `snapshot`: `torch.cuda.memory._snapshot()` segments and cheap free-space figures.
//!
//! - `pools`: private pools (`torch.cuda.MemPool`, CUDA graph pools).
//!
//! Not simulated: IPC, multiple devices, and of private pools what `pools` lists.
//!
//! Where PyTorch throws, the clone reports instead, because a replay must go on: a request of
//! 1 EiB or more and a device error other than out-of-memory become an `Oom` outcome (the
//! former touching no stat but `num_ooms`, as PyTorch's check comes first); a zero-byte request is a
//! null pointer with no event. `free_completed` completes a pending free at once, with
//! `process_events` semantics (the recording puts it where PyTorch polled the event);
//! pending frees still outstanding complete in `synchronize_and_free_events`, in the order of
//! their frees (PyTorch's order there is a hash map's). And `release_available_cached_blocks`
//! never frees a block that is part of a split segment, which PyTorch would hand to
//! `cudaFree` if `max_split_size` were lowered at run time below a live split segment's size.

/// The free sets of pool `slot` (0 the default pools) and size class, mutably, naming the
/// pool fields only, so that the arena can still be read while it is held.
macro_rules! pool_mut {
    ($this:expr, $slot:expr, $small:expr) => {
        match ($slot, $small) {
            (0, true) => &mut $this.small_pool,
            (0, false) => &mut $this.large_pool,
            (s, true) => &mut $this.private[usize::from(s) - 1].small,
            (s, false) => &mut $this.private[usize::from(s) - 1].large,
        }
    };
}

mod block;
pub mod config;
mod expandable;
mod free;
mod freeset;
mod malloc;
mod pools;
mod release;
mod rounding;
mod seed;
mod snapshot;
mod stats;
pub mod versions;

pub use config::Config;
pub use rounding::{get_allocation_size, round_size};

use allocsim_core::{
    AllocId, Allocator, ConfigError, Device, Emit, Env, FreeSpace, Granted, IdTable, MemPoolId,
    MemoryStats, OomInfo, PoolAction, SnapshotSegment, StartState, StatArray, StreamId,
};
use block::{Arena, BlockPool, PrivatePool, NIL};
use expandable::ExpandableSegment;

/// PyTorch's `DeviceCachingAllocator` for one device, default pools only.
#[derive(Debug)]
pub struct PyTorchAllocator {
    config: Config,
    arena: Arena,
    small_pool: BlockPool,
    large_pool: BlockPool,
    /// `graph_pools`, by slot (a block's `slot` - 1); deleted pools keep their slot.
    private: Vec<PrivatePool>,
    /// `captures_underway`: slots of the private pools being allocated to, the latest last
    /// (PyTorch 2.11 scans them last first; the recording does not show their filters, so a
    /// context takes every allocation).
    contexts: Vec<u16>,
    /// `allocated_blocks` / `active_blocks`: allocations by id, while allocated or pending.
    ids: IdTable<u32>,
    /// Blocks freed while in use on other streams (`cuda_events`), in the order of their frees.
    pending: Vec<u32>,
    /// `stream_uses` of allocated blocks: (block, stream) pairs; `record_stream` is rare.
    stream_uses: Vec<(u32, StreamId)>,
    /// `expandable_segments_`; a released one leaves a dead slot so indices stay valid.
    segments: Vec<ExpandableSegment>,
    stats: MemoryStats,
    /// True until the first free that waits on other streams. Until then every free completes
    /// in the op that requests it, so `active` and `active_bytes` move exactly as `allocation`
    /// and `allocated_bytes` do (the same amounts, in the same ops; resets treat them alike),
    /// and are not updated: [`Self::stats_view`] copies them. Two of the five statistics an
    /// allocation moves, and two of the seven a free moves.
    active_is_allocation: bool,
    /// Bytes of cudaMalloc'ed segments plus mapped expandable pages.
    total_allocated_memory: u64,
    /// `allowed_memory_maximum`: the cap from a memory fraction below 1.
    allowed_memory_maximum: Option<u64>,
    /// The config's `per_process_memory_fraction` waits for the first call that sees the device.
    initial_fraction_pending: bool,
    /// Reused between calls so the slow paths do not allocate either.
    scratch: Vec<u32>,
}

impl PyTorchAllocator {
    /// The statistics, with `active` filled in while it mirrors `allocation`.
    fn stats_view(&self) -> MemoryStats {
        let mut s = self.stats.clone();
        if self.active_is_allocation {
            s.active = s.allocation;
            s.active_bytes = s.allocated_bytes;
        }
        s
    }

    /// The block serving `id` while it is allocated or pending.
    #[inline]
    fn block_of(&self, id: AllocId) -> Option<u32> {
        Some(self.ids.get(id)).filter(|&index| index != NIL)
    }

    /// `active_bytes`, wherever it is kept.
    fn active_bytes(&self) -> &StatArray {
        if self.active_is_allocation {
            &self.stats.allocated_bytes
        } else {
            &self.stats.active_bytes
        }
    }

    /// The first free that waits on other streams: from here on `active` is kept on its own.
    fn stop_mirroring_active(&mut self) {
        if self.active_is_allocation {
            self.stats = self.stats_view();
            self.active_is_allocation = false;
        }
    }

    /// The allocator as a process with `PYTORCH_CUDA_ALLOC_CONF=conf` constructs it.
    pub fn new(config: Config) -> Self {
        let stats =
            MemoryStats { max_split_size: config.max_split_size_stat(), ..MemoryStats::default() };
        PyTorchAllocator {
            initial_fraction_pending: config.per_process_memory_fraction < 1.0,
            config,
            arena: Arena::default(),
            small_pool: BlockPool::new(),
            large_pool: BlockPool::new(),
            private: Vec::new(),
            contexts: Vec::new(),
            ids: IdTable::new(NIL),
            pending: Vec::new(),
            stream_uses: Vec::new(),
            segments: Vec::new(),
            stats,
            active_is_allocation: true,
            total_allocated_memory: 0,
            allowed_memory_maximum: None,
            scratch: Vec::new(),
        }
    }

    /// Parse `conf` as `PYTORCH_CUDA_ALLOC_CONF` and construct the allocator.
    pub fn from_conf(conf: &str) -> Result<Self, ConfigError> {
        Ok(Self::new(Config::parse(conf)?))
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// `allowed_memory_maximum`, if a fraction below 1 is set.
    pub fn allowed_memory_maximum(&self) -> Option<u64> {
        self.allowed_memory_maximum
    }

    /// Bytes reserved from the device (segments plus mapped pages).
    pub fn total_allocated_memory(&self) -> u64 {
        self.total_allocated_memory
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// The free sets of pool `slot` (0 the default pools) and size class, mutably.
    fn pool_mut(&mut self, slot: u16, small: bool) -> &mut BlockPool {
        pool_mut!(self, slot, small)
    }

    /// The free sets of pool `slot` (0 the default pools) and size class.
    fn pool(&self, slot: u16, small: bool) -> &BlockPool {
        match (slot, small) {
            (0, true) => &self.small_pool,
            (0, false) => &self.large_pool,
            (s, true) => &self.private[usize::from(s) - 1].small,
            (s, false) => &self.private[usize::from(s) - 1].large,
        }
    }

    /// The pool id of `slot`.
    fn pool_id(&self, slot: u16) -> MemPoolId {
        match slot {
            0 => MemPoolId::DEFAULT,
            s => self.private[usize::from(s) - 1].id,
        }
    }

    /// The slot of the live private pool `id`, if there is one.
    fn slot_of(&self, id: MemPoolId) -> Option<u16> {
        let i = self.private.iter().position(|p| p.live && p.id == id)?;
        u16::try_from(i + 1).ok()
    }

    /// The slot of private pool `id`, made with `use_count` references if it does not exist.
    fn create_or_incref_pool(&mut self, id: MemPoolId, use_count: u32) -> u16 {
        if let Some(slot) = self.slot_of(id) {
            self.private[usize::from(slot) - 1].use_count += 1;
            return slot;
        }
        self.private.push(PrivatePool::new(id, use_count));
        u16::try_from(self.private.len()).unwrap_or(u16::MAX)
    }

    /// GC is armed only with a fraction below 1 and a positive threshold.
    fn gc_enabled(&self) -> bool {
        self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// `setMemoryFraction`: NEWEST semantics, a cap only below 1.0, of `totalGlobalMem`.
    fn apply_fraction(&mut self, device: &dyn Device, fraction: f64) {
        let total = device.mem_info().total_bytes;
        self.allowed_memory_maximum = (fraction < 1.0).then_some((fraction * total as f64) as u64);
    }

    /// The config's `per_process_memory_fraction`, applied on first sight of the device.
    #[inline(always)]
    fn apply_initial_fraction(&mut self, device: &dyn Device) {
        if self.initial_fraction_pending {
            self.initial_fraction_pending = false;
            let fraction = self.config.per_process_memory_fraction;
            self.apply_fraction(device, fraction);
        }
    }
}

impl Allocator for PyTorchAllocator {
    fn name(&self) -> &str {
        "pytorch"
    }

    /// The settings of later releases that the clone reads but does not model.
    fn notes(&self) -> Vec<String> {
        self.config.notes()
    }

    /// Every block is a multiple of `kMinBlockSize` from a 2 MiB-aligned segment or page.
    fn block_alignment(&self) -> u64 {
        rounding::K_MIN_BLOCK_SIZE
    }

    fn malloc(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        size: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo> {
        self.malloc_impl(env, id, size, stream)
    }

    fn free(&mut self, env: &mut Env<'_>, id: AllocId) {
        self.free_impl(env, id);
    }

    // The same three calls with the sink's type known: each event's handling is inlined where
    // the event is made (the replay engine's hot loop).
    #[inline]
    fn malloc_to<E: Emit>(
        &mut self,
        env: &mut Env<'_, E>,
        id: AllocId,
        size: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo> {
        self.malloc_impl(env, id, size, stream)
    }

    #[inline]
    fn free_to<E: Emit>(&mut self, env: &mut Env<'_, E>, id: AllocId) {
        self.free_impl(env, id);
    }

    #[inline]
    fn free_completed_to<E: Emit>(&mut self, env: &mut Env<'_, E>, id: AllocId) {
        self.free_completed_impl(env, id);
    }

    fn record_stream(&mut self, id: AllocId, stream: StreamId) {
        self.record_stream_impl(id, stream);
    }

    fn free_completed(&mut self, env: &mut Env<'_>, id: AllocId) {
        self.free_completed_impl(env, id);
    }

    fn seed(
        &mut self,
        env: &mut Env<'_>,
        start: &StartState,
        stats: Option<&MemoryStats>,
    ) -> Result<(), String> {
        self.seed_impl(env, start, stats)
    }

    fn empty_cache(&mut self, env: &mut Env<'_>) {
        self.release_cached_blocks(env, None);
    }

    fn malloc_at(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        size: u64,
        stream: StreamId,
        addr: u64,
    ) -> Result<Granted, OomInfo> {
        self.malloc_at_impl(env, id, size, stream, addr)
    }

    fn pool_action(&mut self, env: &mut Env<'_>, pool: MemPoolId, action: PoolAction) {
        self.pool_action_impl(env, pool, action);
    }

    fn has_private_pools(&self) -> bool {
        true
    }

    fn set_memory_fraction(&mut self, env: &mut Env<'_>, fraction: f64) -> Result<(), ConfigError> {
        // torch.cuda.set_per_process_memory_fraction checks the range in Python.
        if !(0.0..=1.0).contains(&fraction) {
            return Err(ConfigError(format!(
                "Invalid fraction value: {fraction}. Allowed range: 0~1"
            )));
        }
        self.initial_fraction_pending = false;
        self.apply_fraction(env.device, fraction);
        Ok(())
    }

    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        self.config.apply(conf)
    }

    fn stats(&self) -> MemoryStats {
        self.stats_view()
    }

    fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    fn snapshot(&self) -> Vec<SnapshotSegment> {
        self.snapshot_impl()
    }

    fn free_space(&self) -> FreeSpace {
        self.free_space_impl()
    }
}
