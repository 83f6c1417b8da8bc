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

use super::common::{
    books_glue, parse_bool, parse_bytes, parse_conf, round_up, rounded_request, unknown_key, Books,
    Live, PAGE_2MIB,
};
use super::tiling::Tiling;
use allocsim_core::{
    AllocId, Allocator, ConfigError, Env, FreeSpace, Granted, OomInfo, SnapshotSegment, StreamId,
};
use std::collections::{BTreeMap, BTreeSet};

const NAME: &str = "async_pool";
const KEYS: &[&str] =
    &["release_threshold", "granularity", "internal_dependencies", "trim_on_empty_cache"];
const ALIGN_512: u64 = 512;

/// Who may reuse a free block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Avail {
    /// The free has completed: any stream.
    Any,
    /// Freed on this stream and not known to be complete: this stream only.
    Stream(StreamId),
}

#[derive(Debug, Clone, Copy)]
struct AsyncConf {
    release_threshold: u64,
    granularity: u64,
    internal_dependencies: bool,
    trim_on_empty_cache: bool,
}

#[derive(Debug)]
pub struct AsyncPool {
    books: Books,
    tiling: Tiling<Avail>,
    /// Free blocks by availability, each by (size, address).
    free: BTreeMap<Avail, BTreeSet<(u64, u64)>>,
    conf: AsyncConf,
}

impl AsyncPool {
    pub fn from_conf(conf: &str) -> Result<Self, ConfigError> {
        let mut me = AsyncPool {
            books: Books::default(),
            tiling: Tiling::default(),
            free: BTreeMap::new(),
            conf: AsyncConf {
                release_threshold: u64::MAX,
                granularity: PAGE_2MIB,
                internal_dependencies: true,
                trim_on_empty_cache: true,
            },
        };
        me.set_settings(conf)?;
        Ok(me)
    }

    /// The best fit among the lists `stream` may use: `(size, addr, list)`.
    fn best_fit(
        &self,
        rounded: u64,
        stream: StreamId,
        any_stream: bool,
    ) -> Option<(u64, u64, Avail)> {
        self.free
            .iter()
            .filter(|(&avail, _)| {
                any_stream || avail == Avail::Any || avail == Avail::Stream(stream)
            })
            .filter_map(|(&avail, set)| {
                set.range((rounded, 0)..).next().map(|&(s, a)| (s, a, avail))
            })
            .min()
    }

    fn take(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        rounded: u64,
        size: u64,
        stream: StreamId,
        fit: (u64, u64, Avail),
    ) -> Granted {
        let (chunk, addr, avail) = fit;
        let set = self.free.entry(avail).or_default();
        set.remove(&(chunk, addr));
        if let Some(rest) = self.tiling.split(addr, rounded, avail) {
            set.insert((chunk - rounded, rest));
        }
        self.tiling.take(addr, id);
        self.books.grant(env, id, (addr, rounded), size, stream)
    }

    fn grow(&mut self, env: &mut Env<'_>, rounded: u64, stream: StreamId) -> bool {
        let size = round_up(rounded, self.conf.granularity);
        let Some(addr) = self.books.device_malloc(env, size, stream) else { return false };
        self.tiling.add_segment(addr, size, stream, Avail::Any);
        self.free.entry(Avail::Any).or_default().insert((size, addr));
        true
    }

    /// The free chunk at `addr`, tagged `avail`, joins its list, coalescing with contiguous
    /// free chunks of the same list.
    fn insert(&mut self, addr: u64, avail: Avail) {
        let set = self.free.entry(avail).or_default();
        let mut at = addr;
        if let Some((next, c)) = self.tiling.next(at).filter(|(_, c)| c.is_free() && c.tag == avail)
        {
            set.remove(&(c.size, next));
            self.tiling.merge_next(at);
        }
        if let Some((prev, c)) = self.tiling.prev(at).filter(|(_, c)| c.is_free() && c.tag == avail)
        {
            set.remove(&(c.size, prev));
            self.tiling.merge_next(prev);
            at = prev;
        }
        if let Some(c) = self.tiling.get(at) {
            set.insert((c.size, at));
        }
    }

    /// Synchronize: every free has completed, so every free block is usable by any stream;
    /// then release down to the threshold.
    fn synchronize(&mut self, env: &mut Env<'_>) {
        self.books.stats.num_sync_all_streams += 1;
        let mut pending: Vec<u64> = self
            .free
            .iter()
            .filter(|(&avail, _)| avail != Avail::Any)
            .flat_map(|(_, set)| set.iter().map(|&(_, a)| a))
            .collect();
        self.free.retain(|&avail, _| avail == Avail::Any);
        pending.sort_unstable();
        for addr in pending {
            self.tiling.set_tag(addr, Avail::Any);
            self.insert(addr, Avail::Any);
        }
        self.trim_to(env, self.conf.release_threshold);
    }

    /// `cuMemPoolTrimTo`: release wholly free segments while more than `keep` is reserved.
    fn trim_to(&mut self, env: &mut Env<'_>, keep: u64) {
        let free: Vec<(u64, u64)> = (self.tiling.wholly_free_segments())
            .filter_map(|b| self.tiling.seg(b).map(|s| (b, s.size)))
            .collect();
        for (base, size) in free {
            if self.books.reserved() <= keep {
                break;
            }
            let tag = self.tiling.get(base).map_or(Avail::Any, |c| c.tag);
            if let Some(seg) = self.tiling.remove_segment(base) {
                if let Some(set) = self.free.get_mut(&tag) {
                    set.remove(&(size, base));
                }
                self.books.device_free(env, base, size, seg.stream);
            }
        }
    }

    fn release(&mut self, addr: u64, avail: Avail) {
        self.tiling.release(addr, avail);
        self.insert(addr, avail);
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }

    fn try_paths(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        rounded: u64,
        size: u64,
        stream: StreamId,
    ) -> Option<Granted> {
        if let Some(fit) = self.best_fit(rounded, stream, false) {
            return Some(self.take(env, id, rounded, size, stream, fit));
        }
        if self.conf.internal_dependencies {
            if let Some(fit) = self.best_fit(rounded, stream, true) {
                return Some(self.take(env, id, rounded, size, stream, fit));
            }
        }
        if self.grow(env, rounded, stream) {
            let fit = self.best_fit(rounded, stream, false)?;
            return Some(self.take(env, id, rounded, size, stream, fit));
        }
        self.synchronize(env);
        if let Some(fit) = self.best_fit(rounded, stream, false) {
            return Some(self.take(env, id, rounded, size, stream, fit));
        }
        self.books.stats.num_alloc_retries += 1;
        self.trim_to(env, 0);
        if self.grow(env, rounded, stream) {
            let fit = self.best_fit(rounded, stream, false)?;
            return Some(self.take(env, id, rounded, size, stream, fit));
        }
        None
    }
}

impl AsyncPool {
    /// The block of a completed free is the policy's again (see `books_glue!`).
    fn take_back(&mut self, _env: &mut Env<'_>, b: Live, deferred: bool) {
        let avail = if deferred { Avail::Any } else { Avail::Stream(b.stream) };
        self.release(b.addr, avail);
    }
}

impl Allocator for AsyncPool {
    fn name(&self) -> &str {
        NAME
    }

    fn malloc(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        size: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo> {
        let rounded = rounded_request(size, ALIGN_512);
        let found = self.try_paths(env, id, rounded, size, stream);
        self.books.sync_inactive_split(self.tiling.inactive_split());
        found.ok_or_else(|| self.books.oom(env, id, rounded, stream, self.tiling.largest_free()))
    }

    books_glue!();

    fn empty_cache(&mut self, env: &mut Env<'_>) {
        self.synchronize(env);
        if self.conf.trim_on_empty_cache {
            self.trim_to(env, 0);
        }
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }

    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        let mut c = self.conf;
        for (key, value) in parse_conf(NAME, conf)? {
            match key.as_str() {
                "release_threshold" => c.release_threshold = parse_bytes(NAME, &key, &value)?,
                "granularity" => {
                    let g = parse_bytes(NAME, &key, &value)?;
                    if !g.is_power_of_two() || g < ALIGN_512 {
                        return Err(ConfigError(format!(
                            "policy {NAME}: granularity {g} is not a power of two >= 512"
                        )));
                    }
                    c.granularity = g;
                }
                "internal_dependencies" => {
                    c.internal_dependencies = parse_bool(NAME, &key, &value)?
                }
                "trim_on_empty_cache" => c.trim_on_empty_cache = parse_bool(NAME, &key, &value)?,
                _ => return Err(unknown_key(NAME, &key, KEYS)),
            }
        }
        self.conf = c;
        Ok(())
    }

    fn snapshot(&self) -> Vec<SnapshotSegment> {
        self.tiling.snapshot(&self.books)
    }

    fn free_space(&self) -> FreeSpace {
        let mut space = FreeSpace::default();
        for &(size, _) in self.free.values().flatten() {
            space.cached_bytes += size;
            space.largest_free_block_bytes = space.largest_free_block_bytes.max(size);
        }
        space
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Rig;
    use allocsim_core::{GIB, MIB};

    #[test]
    fn same_stream_reuses_at_once_other_stream_after_sync() {
        let mut rig = Rig::new("async_pool", Some("internal_dependencies:false"), GIB);
        let a = rig.malloc(1, 3 * MIB, 0).unwrap();
        assert_eq!(a.size, 3 * MIB, "512 B rounding only");
        assert_eq!(rig.reserved(), 4 * MIB, "one 2 MiB-granular segment");
        rig.free(1);
        let b = rig.malloc(2, MIB, 7).unwrap();
        assert_ne!(b.addr, a.addr, "stream 7 cannot use stream 0's uncompleted free");
        let c = rig.malloc(3, MIB, 0).unwrap();
        assert_eq!(c.addr, a.addr, "stream 0 can");
        rig.free(2);
        rig.free(3);
        rig.empty_cache();
        assert_eq!(rig.reserved(), 0, "empty_cache trims to 0 like PyTorch's emptyCache");
    }

    #[test]
    fn internal_dependencies_let_other_streams_reuse_before_growing() {
        let mut rig = Rig::new("async_pool", None, GIB);
        let a = rig.malloc(1, 3 * MIB, 0).unwrap();
        rig.free(1);
        let b = rig.malloc(2, 3 * MIB, 7).unwrap();
        assert_eq!(b.addr, a.addr);
        assert_eq!(rig.reserved(), 4 * MIB);
    }

    #[test]
    fn coalesces_and_keeps_memory_by_default() {
        let mut rig = Rig::new("async_pool", Some("trim_on_empty_cache:false"), GIB);
        for i in 0..4 {
            rig.malloc(i, 512 << 10, 0).unwrap();
        }
        for i in 0..4 {
            rig.free(i);
        }
        assert_eq!(rig.policy.snapshot()[0].blocks.len(), 1, "coalesced");
        rig.empty_cache();
        assert_eq!(rig.reserved(), 2 * MIB, "threshold u64::MAX keeps memory");
    }

    #[test]
    fn release_threshold_applies_at_sync() {
        let mut rig =
            Rig::new("async_pool", Some("release_threshold:4MiB,trim_on_empty_cache:false"), GIB);
        for i in 0..4 {
            rig.malloc(i, 2 * MIB, 0).unwrap();
        }
        for i in 0..4 {
            rig.free(i);
        }
        rig.empty_cache();
        assert_eq!(rig.reserved(), 4 * MIB);
    }

    #[test]
    fn trims_before_oom() {
        let mut rig = Rig::new("async_pool", Some("internal_dependencies:false"), 8 * MIB);
        rig.malloc(1, 4 * MIB, 0).unwrap();
        rig.free(1);
        // Stream 7 cannot reuse it and the device is too full to grow: synchronize (4 MiB is
        // not enough), trim the free segment, grow.
        rig.malloc(2, 6 * MIB, 7).unwrap();
        let s = rig.policy.stats();
        assert_eq!((s.num_sync_all_streams, s.num_alloc_retries, s.num_device_free), (1, 1, 1));
        assert!(rig.malloc(3, 4 * MIB, 7).is_err());
        assert_eq!(rig.policy.stats().num_ooms, 1);
    }
}
