//! A stream-ordered pool in the manner of `cudaMallocAsync` on the device's default memory pool,
//! as PyTorch's `backend:cudaMallocAsync` uses it (CUDA Programming Guide, stream-ordered
//! allocator; `c10/cuda/CUDAMallocAsyncAllocator.cpp`). The driver's internals are not public;
//! this is a model of its documented behaviour, and the guesses are marked as such.
//!
//! - No size classes: a request rounds up to 512 B only (guess: the driver's granularity for
//!   sub-allocation is not documented; PyTorch adds no rounding of its own).
//! - Best fit (smallest, then lowest address) over the free blocks the stream may use, with
//!   coalescing of contiguous free blocks that are usable by the same streams.
//! - A block freed on stream S (`cudaFreeAsync`) is reusable by S at once (stream order); by
//!   another stream only after the free has completed. There is no GPU clock here, so "completed"
//!   means: at the next synchronization (`empty_cache`, the OOM path) or, for a block that had
//!   uses on other streams, at its `FreeCompleted` (PyTorch frees those on a side stream after
//!   all uses). With `internal_dependencies` (CUDA's `REUSE_ALLOW_INTERNAL_DEPENDENCIES`, which
//!   PyTorch enables) a stream takes an uncompleted block of another stream before growing.
//! - Growth: one segment of the request rounded up to `granularity` (2 MiB pages, guess).
//! - Release: at every synchronization, wholly free segments go back to the device while the
//!   pool holds more than `release_threshold` (CUDA's `RELEASE_THRESHOLD`; default `u64::MAX`,
//!   as PyTorch sets it: keep everything). `empty_cache` synchronizes and, like PyTorch's
//!   `emptyCache` (`cudaMemPoolTrimTo(pool, 0)`), trims every wholly free segment.
//! - Before OOM: synchronize, retry, then trim wholly free segments and try growing again
//!   (guess: the driver can release unused pool memory when the device is full).
//!
//! Settings (`key:value,...`):
//! - `release_threshold` (bytes or `max`, default `max`),
//! - `granularity` (bytes, a power of two >= 512, default 2 MiB),
//! - `internal_dependencies` (bool, default `true`),
//! - `trim_on_empty_cache` (bool, default `true`).

use crate::kit::{round_up, Cx, FreeLists, Kit, Live, Rules, Setting, Tiling, PAGE_2MIB};
use crate::settings;
use allocsim_core::StreamId;

const ALIGN_512: u64 = 512;

/// Who may reuse a free block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Avail {
    /// The free has completed: any stream.
    #[default]
    Any,
    /// Freed on this stream and not known to be complete: this stream only.
    Stream(StreamId),
}

/// A `cudaMallocAsync`-style stream-ordered pool.
pub type AsyncPool = Kit<Async>;

#[derive(Debug, Clone)]
pub struct Async {
    /// Free blocks by availability.
    free: FreeLists<Avail>,
    release_threshold: u64,
    granularity: u64,
    internal_dependencies: bool,
    trim_on_empty_cache: bool,
}

impl Default for Async {
    fn default() -> Self {
        Async {
            free: FreeLists::default(),
            release_threshold: u64::MAX,
            granularity: PAGE_2MIB,
            internal_dependencies: true,
            trim_on_empty_cache: true,
        }
    }
}

impl Async {
    /// The best fit among the lists `stream` may use, cut to `block`: its address.
    fn take_best_fit(
        &mut self,
        tiling: &mut Tiling<Avail>,
        block: u64,
        stream: StreamId,
        any_stream: bool,
    ) -> Option<u64> {
        let usable = |avail| any_stream || avail == Avail::Any || avail == Avail::Stream(stream);
        let (chunk, addr, avail) = self.free.best_fit(block, usable)?;
        self.free.remove(avail, (chunk, addr));
        if let Some(rest) = tiling.split(addr, block, avail) {
            self.free.insert(avail, (chunk - block, rest));
        }
        Some(addr)
    }

    /// A new segment of whole `granularity` units, all free to any stream, then the best fit.
    fn grow(&mut self, cx: &mut Cx<'_, '_, Avail>, block: u64, stream: StreamId) -> Option<u64> {
        let size = round_up(block, self.granularity);
        let addr = cx.reserve(size, stream, Avail::Any)?;
        self.free.insert(Avail::Any, (size, addr));
        self.take_best_fit(cx.tiling, block, stream, false)
    }

    /// Synchronize: every free has completed, so every free block is usable by any stream;
    /// then release down to the threshold.
    fn synchronize(&mut self, cx: &mut Cx<'_, '_, Avail>) {
        cx.synced();
        let streams: Vec<Avail> = self.free.keys().filter(|&a| a != Avail::Any).collect();
        let mut pending: Vec<u64> =
            streams.into_iter().flat_map(|a| self.free.remove_list(a)).flatten().collect();
        pending.sort_unstable();
        for addr in pending {
            cx.tiling.set_tag(addr, Avail::Any);
            self.free.merge_in(cx.tiling, addr, Avail::Any);
        }
        self.trim_to(cx, self.release_threshold);
    }

    /// `cuMemPoolTrimTo`: release wholly free segments while more than `keep` is reserved.
    fn trim_to(&mut self, cx: &mut Cx<'_, '_, Avail>, keep: u64) {
        let free: Vec<u64> = cx.tiling.wholly_free_segments().collect();
        for base in free {
            if cx.reserved() <= keep {
                break;
            }
            let Some(c) = cx.tiling.get(base).copied() else { continue };
            self.free.remove(c.tag, (c.size, base));
            cx.unreserve(base);
        }
    }
}

impl Rules for Async {
    const NAME: &'static str = "async_pool";
    const SETTINGS: &'static [Setting<Self>] = &settings![
        /// bytes the pool keeps at a synchronization (max: everything)
        release_threshold: Bytes,
        /// segments are whole units of this many bytes, a power of two >= 512
        granularity: Bytes,
        /// a stream takes another stream's uncompleted free before growing
        internal_dependencies: Bool,
        /// empty_cache gives every wholly free segment back
        trim_on_empty_cache: Bool,
    ];
    type Tag = Avail;

    fn find(&mut self, cx: &mut Cx<'_, '_, Avail>, block: u64, stream: StreamId) -> Option<u64> {
        if let Some(addr) = self.take_best_fit(cx.tiling, block, stream, false) {
            return Some(addr);
        }
        if self.internal_dependencies {
            if let Some(addr) = self.take_best_fit(cx.tiling, block, stream, true) {
                return Some(addr);
            }
        }
        if let Some(addr) = self.grow(cx, block, stream) {
            return Some(addr);
        }
        self.synchronize(cx);
        if let Some(addr) = self.take_best_fit(cx.tiling, block, stream, false) {
            return Some(addr);
        }
        cx.retried();
        self.trim_to(cx, 0);
        self.grow(cx, block, stream)
    }

    fn give_back(&mut self, tiling: &mut Tiling<Avail>, block: &Live, deferred: bool) {
        let avail = if deferred { Avail::Any } else { Avail::Stream(block.stream) };
        tiling.release(block.addr, avail);
        self.free.merge_in(tiling, block.addr, avail);
    }

    /// Synchronizes and, like PyTorch's `emptyCache` (`cudaMemPoolTrimTo(pool, 0)`), trims
    /// every wholly free segment.
    fn empty_cache(&mut self, cx: &mut Cx<'_, '_, Avail>) {
        self.synchronize(cx);
        if self.trim_on_empty_cache {
            self.trim_to(cx, 0);
        }
    }

    fn check(&mut self, _: &Self, _: bool) -> Result<(), String> {
        let g = self.granularity;
        if !g.is_power_of_two() || g < ALIGN_512 {
            return Err(format!("granularity {g} is not a power of two >= 512"));
        }
        Ok(())
    }
}
