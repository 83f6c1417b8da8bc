//! The policy: how requests become blocks inside device segments.
//!
//! One trait for PyTorch's caching allocator, TF's BFC, RMM's pool and arena, a
//! cudaMallocAsync-like pool and the uncached baseline. Its shape is the union of what those
//! need from a caller, and nothing policy-specific:
//! - `malloc` takes a stream because every stream-ordered allocator segregates or orders reuse
//!   by stream; policies without streams ignore it.
//! - freeing has two steps (`free` now, `free_completed` later) because PyTorch and
//!   cudaMallocAsync both let memory used on another stream be reclaimed only once that
//!   stream's work is done; a policy without stream semantics completes at `free`.
//! - OOM is an outcome (`Err(OomInfo)`), never a panic or an error type: the engine records it
//!   with its explanation and goes on, as a training script that catches OOM does.
//! - Every call receives an [`Env`] (the device and an event sink, [`Emit`]) instead of owning
//!   them, so the engine can swap the device (simulated, recorded, CUDA) and observe every
//!   event without the policy knowing.
//! - Statistics come back under PyTorch's names ([`crate::MemoryStats`]) for every policy.
//!
//! **API Boundary:** the replay engine guarantees that every id passed to `free`,
//! `record_stream` and `free_completed` names a live allocation of this allocator, and that ids
//! are never reused; policies may rely on it.

use crate::{
    AllocId, Device, Event, MemPoolId, MemoryStats, PoolAction, SnapshotSegment, StartState,
    StreamId,
};
use std::fmt;

/// Where a policy reports what it did, one event at a time, in order.
///
/// A trait rather than a `Vec<Event>` so that a caller can act on each event as it happens
/// instead of collecting the events and walking them afterwards: the replay engine's hot loop
/// passes a sink of a known type, which the PyTorch policy's generic entry points
/// ([`Allocator::malloc_to`]) inline, so that an event's observers run where the policy
/// builds it, with its kind known. Tests and tools that want the events keep a `Vec<Event>`.
pub trait Emit {
    fn emit(&mut self, event: Event);
}

impl Emit for Vec<Event> {
    #[inline]
    fn emit(&mut self, event: Event) {
        self.push(event);
    }
}

/// What a policy works with during one call: the device it carves and the sink it reports to.
/// `E` is the sink's type where the caller knows it ([`Allocator::malloc_to`]); the trait's
/// own methods take any sink, `dyn Emit`.
pub struct Env<'a, E: ?Sized = dyn Emit + 'a> {
    pub device: &'a mut dyn Device,
    pub events: &'a mut E,
}

impl<'a> Env<'a> {
    pub fn new(device: &'a mut dyn Device, events: &'a mut dyn Emit) -> Self {
        Env { device, events }
    }
}

impl<E: Emit> Env<'_, E> {
    /// The same device and sink, as the trait's methods take them.
    pub fn as_dyn(&mut self) -> Env<'_> {
        Env { device: &mut *self.device, events: &mut *self.events }
    }
}

impl<E: ?Sized> fmt::Debug for Env<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env").finish_non_exhaustive()
    }
}

/// A successful allocation: where the block is and how big it is after rounding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub addr: u64,
    pub size: u64,
}

/// The figures that explain an OOM, as PyTorch's message gives them and a bit more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OomInfo {
    /// The request after the policy's rounding.
    pub rounded_bytes: u64,
    /// `cudaMemGetInfo` free at the moment of failure (PyTorch records it as `device_free`).
    pub device_free_bytes: u64,
    pub device_total_bytes: u64,
    /// The cap from a memory fraction, if one is set.
    pub allowed_bytes: Option<u64>,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// Largest free cached block in the small and the large pool.
    pub largest_free_small_bytes: u64,
    pub largest_free_large_bytes: u64,
}

impl OomInfo {
    /// PyTorch's "reserved by PyTorch but unallocated".
    pub fn cached_bytes(&self) -> u64 {
        self.reserved_bytes.saturating_sub(self.allocated_bytes)
    }
}

/// A configuration string or value the policy refuses, with the policy's own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Free space inside the allocator's reservations: how much is cached and how it is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FreeSpace {
    pub cached_bytes: u64,
    pub largest_free_block_bytes: u64,
}

/// A memory allocation policy. See the module doc for why it has this shape.
pub trait Allocator {
    /// The policy's name as the CLI knows it (`pytorch`, `bfc`, `uncached`, ...).
    fn name(&self) -> &str;

    /// The alignment every block address this policy hands out is a multiple of; the checker
    /// verifies it. Default: 256 B, what `cudaMalloc` and RMM guarantee.
    fn block_alignment(&self) -> u64 {
        256
    }

    /// Serve `size` bytes on `stream`, or explain why not. Emits the events it causes,
    /// ending with `Event::Alloc` on success or `Event::Oom` on failure.
    fn malloc(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        size: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo>;

    /// [`Allocator::malloc`] of the free block that starts at `addr` ([`crate::Op::AllocAt`]).
    /// Default: a plain `malloc`, for policies that do not place blocks on request.
    fn malloc_at(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        size: u64,
        stream: StreamId,
        addr: u64,
    ) -> Result<Granted, OomInfo> {
        let _ = addr;
        self.malloc(env, id, size, stream)
    }

    /// The program frees `id`. Emits `FreeRequested`, and `FreeCompleted` too unless the block
    /// has stream uses that must finish first.
    fn free(&mut self, env: &mut Env<'_>, id: AllocId);

    /// `id` is also used on `stream`. Default: ignored (no stream-ordered reuse).
    fn record_stream(&mut self, id: AllocId, stream: StreamId) {
        let _ = (id, stream);
    }

    /// The work on other streams recorded for `id` has completed. Default: nothing pending.
    fn free_completed(&mut self, env: &mut Env<'_>, id: AllocId) {
        let _ = (env, id);
    }

    /// [`Allocator::malloc`] with a sink of a type the caller knows, for a caller that also
    /// knows `Self` (the replay engine's hot loop). A policy whose hot path is generic over its
    /// sink overrides it, so that each event's handling is inlined where the event is made;
    /// the default passes the sink on as `dyn Emit`. Must behave exactly as `malloc`.
    #[inline]
    fn malloc_to<E: Emit>(
        &mut self,
        env: &mut Env<'_, E>,
        id: AllocId,
        size: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo>
    where
        Self: Sized,
    {
        self.malloc(&mut env.as_dyn(), id, size, stream)
    }

    /// [`Allocator::free`] with a sink of a known type (see [`Allocator::malloc_to`]).
    #[inline]
    fn free_to<E: Emit>(&mut self, env: &mut Env<'_, E>, id: AllocId)
    where
        Self: Sized,
    {
        self.free(&mut env.as_dyn(), id);
    }

    /// [`Allocator::free_completed`] with a sink of a known type (see
    /// [`Allocator::malloc_to`]).
    #[inline]
    fn free_completed_to<E: Emit>(&mut self, env: &mut Env<'_, E>, id: AllocId)
    where
        Self: Sized,
    {
        self.free_completed(&mut env.as_dyn(), id);
    }

    /// Start from `start` instead of empty: the segments and blocks a recording that begins
    /// mid-run shows alive at its first entry. Called once, before any other call; adopts the
    /// segments on the device ([`Device::adopt_segment`]) and emits no events, since nothing
    /// happens. `stats` is `memory_stats()` at that moment when the recording says; without
    /// it, cumulative statistics count from here and peaks start at the current values.
    ///
    /// A policy that cannot take a state as it is returns why, and the caller lays the live
    /// blocks out by allocating them instead ([`StartState::prologue`]). Only the PyTorch
    /// clone takes one: the state is PyTorch's block layout, which another policy would not
    /// have made. Default: refused.
    fn seed(
        &mut self,
        env: &mut Env<'_>,
        start: &StartState,
        stats: Option<&MemoryStats>,
    ) -> Result<(), String> {
        let _ = (env, start, stats);
        Err(format!("policy {} lays out a recording's live blocks itself", self.name()))
    }

    /// A private pool is entered, left or dropped ([`PoolAction`]). Default: ignored, so a
    /// policy without private pools serves their allocations from its common pool.
    fn pool_action(&mut self, env: &mut Env<'_>, pool: MemPoolId, action: PoolAction) {
        let _ = (env, pool, action);
    }

    /// Whether [`Allocator::pool_action`] keeps a private pool's blocks apart from the common
    /// pool's. A replay may serve a pool from the common pool (default: false); a live CUDA
    /// graph may not, since its replays write to the blocks it allocated after the capture.
    fn has_private_pools(&self) -> bool {
        false
    }

    /// Give cached memory back to the device, as `torch.cuda.empty_cache()`.
    fn empty_cache(&mut self, env: &mut Env<'_>);

    /// Cap reserved memory at `fraction` of the device total. `fraction >= 1` lifts the cap.
    fn set_memory_fraction(&mut self, env: &mut Env<'_>, fraction: f64) -> Result<(), ConfigError>;

    /// Apply a settings string at run time. Default: only the empty string is accepted.
    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        if conf.trim().is_empty() {
            Ok(())
        } else {
            Err(ConfigError(format!(
                "policy {} takes no settings (got {})",
                self.name(),
                crate::text::quoted(conf)
            )))
        }
    }

    /// What the run should know of the allocator's settings that no result shows (settings it
    /// reads but does not model). Default: nothing.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// Current statistics under PyTorch's names.
    fn stats(&self) -> MemoryStats;

    /// `torch.cuda.reset_peak_memory_stats()`: every peak in [`Allocator::stats`] becomes its
    /// current value.
    fn reset_peak_stats(&mut self);

    /// Every segment with its blocks, sorted by address.
    fn snapshot(&self) -> Vec<SnapshotSegment>;

    /// Cached free memory and its largest piece. Default: computed from the snapshot.
    fn free_space(&self) -> FreeSpace {
        let mut space = FreeSpace::default();
        for seg in self.snapshot() {
            for b in seg.blocks.iter().filter(|b| b.state == crate::BlockState::Inactive) {
                space.cached_bytes += b.size;
                space.largest_free_block_bytes = space.largest_free_block_bytes.max(b.size);
            }
        }
        space
    }
}

/// A trait object as an [`Allocator`] of a known type, for code generic over its allocator
/// (the replay engine) handed a `&mut dyn Allocator`: every call goes on to the object, and
/// the sink-generic entry points take their defaults (the sink passed on as `dyn Emit`).
pub struct DynAllocator<'a>(pub &'a mut dyn Allocator);

impl fmt::Debug for DynAllocator<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DynAllocator").field(&self.0.name()).finish()
    }
}

impl Allocator for DynAllocator<'_> {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn block_alignment(&self) -> u64 {
        self.0.block_alignment()
    }
    fn malloc(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        size: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo> {
        self.0.malloc(env, id, size, stream)
    }
    fn malloc_at(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        size: u64,
        stream: StreamId,
        addr: u64,
    ) -> Result<Granted, OomInfo> {
        self.0.malloc_at(env, id, size, stream, addr)
    }
    fn free(&mut self, env: &mut Env<'_>, id: AllocId) {
        self.0.free(env, id)
    }
    fn record_stream(&mut self, id: AllocId, stream: StreamId) {
        self.0.record_stream(id, stream)
    }
    fn free_completed(&mut self, env: &mut Env<'_>, id: AllocId) {
        self.0.free_completed(env, id)
    }
    fn seed(
        &mut self,
        env: &mut Env<'_>,
        start: &StartState,
        stats: Option<&MemoryStats>,
    ) -> Result<(), String> {
        self.0.seed(env, start, stats)
    }
    fn pool_action(&mut self, env: &mut Env<'_>, pool: MemPoolId, action: PoolAction) {
        self.0.pool_action(env, pool, action)
    }
    fn has_private_pools(&self) -> bool {
        self.0.has_private_pools()
    }
    fn empty_cache(&mut self, env: &mut Env<'_>) {
        self.0.empty_cache(env)
    }
    fn set_memory_fraction(&mut self, env: &mut Env<'_>, fraction: f64) -> Result<(), ConfigError> {
        self.0.set_memory_fraction(env, fraction)
    }
    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        self.0.set_settings(conf)
    }
    fn notes(&self) -> Vec<String> {
        self.0.notes()
    }
    fn stats(&self) -> MemoryStats {
        self.0.stats()
    }
    fn reset_peak_stats(&mut self) {
        self.0.reset_peak_stats();
    }
    fn snapshot(&self) -> Vec<SnapshotSegment> {
        self.0.snapshot()
    }
    fn free_space(&self) -> FreeSpace {
        self.0.free_space()
    }
}
