//! TensorFlow/XLA's BFC allocator ("best-fit with coalescing", `xla/tsl/framework/
//! bfc_allocator.cc`), classic non-partitioned mode.
//!
//! - Requests round up to 256 B (`RoundedBytes`); chunks tile regions (device segments).
//! - Free chunks live in 21 bins of `256 << i` bytes, each ordered by (size, address); a search
//!   starts at the request's bin and takes the first chunk that fits. Since bins partition
//!   sizes in increasing order, that is the smallest fitting chunk, ties to the lowest address,
//!   which is what one (size, address) ordered set gives; that is how it is kept here.
//! - A found chunk is split (`ShouldSplitChunk`) iff `chunk >= 2 * rounded` or
//!   `chunk - rounded >= max_internal_fragmentation` (128 MiB by default, else
//!   `fragmentation_fraction * memory_limit`); otherwise the whole chunk is handed out.
//! - Frees coalesce at once with both free neighbours (`TryToCoalesce`).
//! - Growth (`Extend`): with `allow_growth` the first region is `min(limit, 2 MiB)`; a request
//!   bigger than the current region size doubles it until it fits; the region is
//!   `min(curr, limit - reserved)`; on a device refusal it backs off by 0.9 (rounded to 256 B,
//!   strictly decreasing) until it would not fit the request. An extension that did not need to
//!   grow doubles the next region size. Without `allow_growth` the first region is the whole
//!   `memory_limit`.
//! - Before giving up, regions that are wholly free go back to the device
//!   (`DeallocateFreeRegions`, when `garbage_collection` is on and it can help) and `Extend` is
//!   tried once more; then OOM.
//! - `memory_limit` is the device's free memory at the first request (TF computes it at start),
//!   or the `memory_limit` setting, capped by the memory fraction.
//!
//! Not modelled: timestamped (stream-safe) chunk merging, the retry-for-10-seconds wrapper,
//! alignment beyond 256 B, and region extension in place (the CUDA sub-allocator does not
//! coalesce regions). There is no `empty_cache` in TF; here it releases wholly free regions,
//! as the garbage collection does.
//!
//! Settings (`key:value,...`):
//! - `allow_growth` (bool, default `true`; TF's own default is `false`),
//! - `memory_limit` (bytes, default: device free memory at the first request),
//! - `garbage_collection` (bool, default `true`, as GPU TF),
//! - `fragmentation_fraction` (float in [0, 1], default 0 = use 128 MiB).

use super::common::{
    books_glue, parse_bool, parse_bytes, parse_conf, parse_f64, round_up, rounded_request,
    unknown_key, Books, Live, ALIGN_256,
};
use super::tiling::Tiling;
use allocsim_core::{
    AllocId, Allocator, ConfigError, Env, FreeSpace, Granted, OomInfo, SnapshotSegment, StreamId,
    MIB,
};
use std::collections::BTreeSet;

const NAME: &str = "bfc";
const KEYS: &[&str] =
    &["allow_growth", "memory_limit", "garbage_collection", "fragmentation_fraction"];
/// `kMaxInternalFragmentation` when no fraction is set.
const DEFAULT_MAX_INTERNAL_FRAGMENTATION_BYTES: u64 = 128 * MIB;
const BACKPEDAL_FACTOR: f64 = 0.9;

#[derive(Debug, Clone, Copy)]
struct BfcConf {
    allow_growth: bool,
    memory_limit: Option<u64>,
    garbage_collection: bool,
    fragmentation_fraction: f64,
}

#[derive(Debug)]
pub struct Bfc {
    books: Books,
    tiling: Tiling<()>,
    /// Free chunks by (size, address): the 21 bins in one ordered set.
    free: BTreeSet<(u64, u64)>,
    conf: BfcConf,
    /// `memory_limit_`, fixed at the first request.
    limit: Option<u64>,
    /// `curr_region_allocation_bytes_`.
    curr_region_bytes: u64,
}

impl Bfc {
    pub fn from_conf(conf: &str) -> Result<Self, ConfigError> {
        let mut me = Bfc {
            books: Books::default(),
            tiling: Tiling::default(),
            free: BTreeSet::new(),
            conf: BfcConf {
                allow_growth: true,
                memory_limit: None,
                garbage_collection: true,
                fragmentation_fraction: 0.0,
            },
            limit: None,
            curr_region_bytes: 0,
        };
        me.set_settings(conf)?;
        Ok(me)
    }

    /// TF's `GetFragmentation()`: `(free - largest free chunk) / free`, 0 when nothing is free.
    pub fn fragmentation(&self) -> f64 {
        let free = self.books.reserved() - self.books.stats.active_bytes.all.current as u64;
        let largest = self.free.last().map_or(0, |&(s, _)| s);
        if free == 0 {
            0.0
        } else {
            (free - largest) as f64 / free as f64
        }
    }

    /// The limit in force now: the one fixed at the first request, capped by the fraction.
    fn memory_limit(&mut self, env: &mut Env<'_>) -> u64 {
        let limit = *self.limit.get_or_insert_with(|| {
            let limit = self.conf.memory_limit.unwrap_or_else(|| env.device.mem_info().free_bytes);
            self.curr_region_bytes = if self.conf.allow_growth {
                round_up(limit.min(2 * MIB), ALIGN_256)
            } else {
                round_up(limit, ALIGN_256)
            };
            limit
        });
        limit.min(self.books.allowed_bytes.unwrap_or(u64::MAX))
    }

    fn max_internal_fragmentation(&self) -> u64 {
        match self.limit {
            Some(limit) if self.conf.fragmentation_fraction > 0.0 => {
                (self.conf.fragmentation_fraction * limit as f64) as u64
            }
            _ => DEFAULT_MAX_INTERNAL_FRAGMENTATION_BYTES,
        }
    }

    /// `FindChunkPtr`: best fit, split per `ShouldSplitChunk`, hand out.
    fn find_chunk(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        rounded: u64,
        size: u64,
        stream: StreamId,
    ) -> Option<Granted> {
        let &(chunk, addr) = self.free.range((rounded, 0)..).next()?;
        self.free.remove(&(chunk, addr));
        if chunk >= rounded.saturating_mul(2)
            || chunk - rounded >= self.max_internal_fragmentation()
        {
            if let Some(rest) = self.tiling.split(addr, rounded, ()) {
                self.free.insert((chunk - rounded, rest));
            }
        }
        self.tiling.take(addr, id);
        let block = self.tiling.get(addr).map_or(rounded, |c| c.size);
        Some(self.books.grant(env, id, (addr, block), size, stream))
    }

    /// `Extend`: reserve a new region able to hold `rounded` bytes.
    fn extend(&mut self, env: &mut Env<'_>, rounded: u64, stream: StreamId) -> bool {
        let limit = self.memory_limit(env);
        let available = limit.saturating_sub(self.books.reserved()) / ALIGN_256 * ALIGN_256;
        if rounded > available {
            return false;
        }
        let mut increased = false;
        while rounded > self.curr_region_bytes {
            self.curr_region_bytes = self.curr_region_bytes.saturating_mul(2).max(ALIGN_256);
            increased = true;
        }
        let mut bytes = self.curr_region_bytes.min(available);
        let addr = loop {
            if let Some(addr) = self.books.device_malloc(env, bytes, stream) {
                break addr;
            }
            let smaller = round_up((bytes as f64 * BACKPEDAL_FACTOR) as u64, ALIGN_256);
            bytes = if smaller < bytes { smaller } else { bytes - ALIGN_256 };
            if bytes < rounded {
                return false;
            }
        };
        if !increased {
            self.curr_region_bytes = self.curr_region_bytes.saturating_mul(2);
        }
        self.tiling.add_segment(addr, bytes, stream, ());
        self.free.insert((bytes, addr));
        true
    }

    /// Return every wholly free region to the device; the bytes returned.
    fn release_free_regions(&mut self, env: &mut Env<'_>) -> u64 {
        let free: Vec<u64> =
            self.tiling.segments().filter(|(_, s)| s.is_wholly_free()).map(|(b, _)| b).collect();
        let mut released = 0;
        for base in free {
            if let Some(seg) = self.tiling.remove_segment(base) {
                self.free.remove(&(seg.size, base));
                self.books.device_free(env, base, seg.size, seg.stream);
                released += seg.size;
            }
        }
        released
    }

    /// `DeallocateFreeRegions`: only when on and when it can make room for `rounded`.
    fn deallocate_free_regions(&mut self, env: &mut Env<'_>, rounded: u64) -> bool {
        if !self.conf.garbage_collection {
            return false;
        }
        let free_bytes: u64 =
            self.tiling.segments().filter(|(_, s)| s.is_wholly_free()).map(|(_, s)| s.size).sum();
        let limit = self.memory_limit(env);
        if free_bytes == 0 || rounded > limit.saturating_sub(self.books.reserved()) + free_bytes {
            return false;
        }
        self.books.stats.num_alloc_retries += 1;
        self.release_free_regions(env) > 0
    }

    /// `MarkFree` + `TryToCoalesce` + `InsertFreeChunk`.
    fn release_chunk(&mut self, addr: u64) {
        self.tiling.release(addr, ());
        let mut at = addr;
        if let Some((next, c)) = self.tiling.next(at).filter(|(_, c)| c.is_free()) {
            self.free.remove(&(c.size, next));
            self.tiling.merge_next(at);
        }
        if let Some((prev, c)) = self.tiling.prev(at).filter(|(_, c)| c.is_free()) {
            self.free.remove(&(c.size, prev));
            self.tiling.merge_next(prev);
            at = prev;
        }
        if let Some(c) = self.tiling.get(at) {
            self.free.insert((c.size, at));
        }
    }

    fn sync(&mut self) {
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }
}

impl Bfc {
    /// The block of a completed free is the policy's again (see `books_glue!`).
    fn take_back(&mut self, _env: &mut Env<'_>, b: Live, _deferred: bool) {
        self.release_chunk(b.addr);
        self.sync();
    }
}

impl Allocator for Bfc {
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
        let rounded = rounded_request(size, ALIGN_256);
        let found = self.find_chunk(env, id, rounded, size, stream).or_else(|| {
            if self.extend(env, rounded, stream) {
                return self.find_chunk(env, id, rounded, size, stream);
            }
            if self.deallocate_free_regions(env, rounded) && self.extend(env, rounded, stream) {
                return self.find_chunk(env, id, rounded, size, stream);
            }
            None
        });
        self.sync();
        found.ok_or_else(|| self.books.oom(env, id, rounded, stream, self.tiling.largest_free()))
    }

    books_glue!();

    fn empty_cache(&mut self, env: &mut Env<'_>) {
        self.release_free_regions(env);
        self.sync();
    }

    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        let mut c = self.conf;
        for (key, value) in parse_conf(NAME, conf)? {
            match key.as_str() {
                "allow_growth" => c.allow_growth = parse_bool(NAME, &key, &value)?,
                "memory_limit" => c.memory_limit = Some(parse_bytes(NAME, &key, &value)?),
                "garbage_collection" => c.garbage_collection = parse_bool(NAME, &key, &value)?,
                "fragmentation_fraction" => {
                    let f = parse_f64(NAME, &key, &value)?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(ConfigError(format!(
                            "policy {NAME}: fragmentation_fraction {f} not in [0, 1]"
                        )));
                    }
                    c.fragmentation_fraction = f;
                }
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
        FreeSpace {
            cached_bytes: self.free.iter().map(|&(s, _)| s).sum(),
            largest_free_block_bytes: self.free.last().map_or(0, |&(s, _)| s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Rig;
    use allocsim_core::{GIB, MIB};

    #[test]
    fn reuses_freed_chunk_and_coalesces() {
        let mut rig = Rig::new("bfc", None, GIB);
        let a = rig.malloc(1, 1000, 0).unwrap();
        assert_eq!(a.size, 1024, "256 B rounding");
        let b = rig.malloc(2, 1000, 0).unwrap();
        assert_eq!(b.addr, a.addr + 1024, "split from the same 2 MiB region");
        rig.free(1);
        let c = rig.malloc(3, 600, 0).unwrap();
        assert_eq!(c.addr, a.addr, "best fit takes the freed 1 KiB chunk");
        // The 1 KiB chunk is not split for 600 B (1024 < 2 * 768), so it is handed out whole.
        assert_eq!(c.size, 1024);
        rig.free(3);
        rig.free(2);
        let snap = rig.policy.snapshot();
        assert_eq!(snap.len(), 1);
        assert_eq!(snap[0].blocks.len(), 1, "everything coalesced back into one chunk");
    }

    #[test]
    fn regions_double_and_back_off() {
        let mut rig = Rig::new("bfc", None, GIB);
        rig.malloc(1, MIB, 0).unwrap();
        assert_eq!(rig.reserved(), 2 * MIB, "first region 2 MiB");
        rig.malloc(2, 1536 * 1024, 0).unwrap();
        assert_eq!(rig.reserved(), 6 * MIB, "second region doubled to 4 MiB");
        rig.malloc(3, 5 * MIB, 0).unwrap();
        assert_eq!(rig.reserved(), 14 * MIB, "8 MiB region");
        // Only ~1010 MiB left: a 600 MiB request wants a 1 GiB region and backs off by 0.9.
        rig.malloc(4, 600 * MIB, 0).unwrap();
        let r = rig.reserved();
        assert!((14 * MIB + 600 * MIB..=GIB).contains(&r), "backed off to fit: {r}");
    }

    #[test]
    fn garbage_collects_free_regions_before_oom() {
        let mut rig = Rig::new("bfc", Some("memory_limit:64MiB"), GIB);
        for i in 0..4 {
            rig.malloc(i, 10 * MIB, 0).unwrap();
        }
        for i in 0..4 {
            rig.free(i);
        }
        let before = rig.reserved();
        // 60 MiB cannot fit the free regions nor the room left: GC frees them, then Extend.
        rig.malloc(10, 60 * MIB, 0).unwrap();
        let s = rig.policy.stats();
        assert!(s.num_device_free > 0 && s.num_alloc_retries == 1, "before {before}: {s:?}");
    }

    #[test]
    fn oom_when_the_device_refuses() {
        let mut rig = Rig::new("bfc", None, 16 * MIB);
        rig.malloc(1, 8 * MIB, 0).unwrap();
        let err = rig.malloc(2, 12 * MIB, 0).unwrap_err();
        assert_eq!(err.rounded_bytes, 12 * MIB);
        assert_eq!(rig.policy.stats().num_ooms, 1);
    }

    #[test]
    fn fragmentation_metric() {
        use super::super::testing::BumpDevice;
        use allocsim_core::{AllocId, Allocator, Env, StreamId};
        let mut bfc = super::Bfc::from_conf("allow_growth:false,memory_limit:16MiB").unwrap();
        let mut device = BumpDevice::new(GIB);
        let mut events = Vec::new();
        let mut env = Env::new(&mut device, &mut events);
        for i in 0..4 {
            bfc.malloc(&mut env, AllocId(i), 4 * MIB - 1024, StreamId(0)).unwrap();
        }
        assert_eq!(bfc.fragmentation(), 0.0);
        bfc.free(&mut env, AllocId(0));
        bfc.free(&mut env, AllocId(2));
        // Two free chunks of 4 MiB - 1 KiB: half the free memory is outside the largest.
        assert!((bfc.fragmentation() - 0.5).abs() < 1e-9, "{}", bfc.fragmentation());
        let s = bfc.stats();
        assert_eq!(s.reserved_bytes.all.current as u64, 16 * MIB, "one region of the whole limit");
        assert_eq!(s.inactive_split.all.current, 2);
    }
}
