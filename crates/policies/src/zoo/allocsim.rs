//! `allocsim`: our own policy, built to need less memory than the others on real traces
//! without more device calls.
//!
//! The idea: place blocks in virtual address space, pay for physical pages only where live
//! blocks are, and keep freed pages mapped only while that costs no new peak.
//!
//! - **Address space is free, pages are not.** Each lane (a stream, and small (<= 1 MiB) or
//!   large blocks, as PyTorch separates them) has its own address reservations
//!   (`cuMemAddressReserve`, sized like the device). Blocks are placed by best fit (smallest
//!   hole, then lowest address) at the start of a hole, with immediate coalescing, so a block
//!   shares its first page with the live block before it. Fragmentation of the address space
//!   costs nothing; what counts is the 2 MiB pages that live blocks touch.
//! - **Map on demand** (`cuMemMap`, as PyTorch's expandable segments do), only the pages of the
//!   block's range that are not mapped yet, one call per missing run.
//! - **Cache below the high-water mark, never above it.** Pages wholly inside holes stay mapped
//!   after a free, so a repeating workload (a training step) reuses them with no device call.
//!   But when a request needs new pages and mapping them would raise reserved memory above its
//!   high-water mark, cached pages are unmapped first (largest holes first, after a device
//!   synchronize, counted in `num_sync_all_streams`). So peak reserved is the peak of pages
//!   touched by live blocks, which no placement-based policy without moving blocks can beat by
//!   more than its partial pages, and device calls happen only while the footprint grows.
//! - Before OOM every cached page is unmapped and mapping retried. `empty_cache` unmaps every
//!   cached page. Blocks freed with uses on other streams come back only at `FreeCompleted`,
//!   and a lane's holes are reused only by its stream, as in PyTorch.
//!
//! Compared with PyTorch's expandable segments, which also map on demand: those grow one
//! range per pool and stream at its end and keep every freed page until `empty_cache` or OOM;
//! here holes anywhere give their pages back when the alternative is a new peak.
//!
//! Settings (`key:value,...`):
//! - `small_max` (bytes, default 1 MiB): the largest block of the small lanes; 0 puts all
//!   blocks of a stream in one lane;
//! - `reserve_size` (bytes, default: the device's total memory): address space per
//!   reservation, rounded up to 2 MiB;
//! - `headroom` (bytes or `max`, default 0): how far reserved may exceed its high-water mark
//!   before cached pages are unmapped (`max`: cache until OOM, as expandable segments do).

use super::common::{
    parse_bytes, parse_conf, round_up, rounded_request, unknown_key, Books, PAGE_2MIB,
};
use super::tiling::Tiling;
use allocsim_core::{
    AllocId, Allocator, ConfigError, Env, Granted, MemoryStats, OomInfo, Pool, SnapshotSegment,
    StreamId, MIB,
};
use std::collections::{BTreeMap, BTreeSet};

const NAME: &str = "allocsim";
const KEYS: &[&str] = &["small_max", "reserve_size", "headroom"];
const PAGE: u64 = PAGE_2MIB;
/// Block granularity and alignment, as PyTorch's.
const ALIGN: u64 = 512;
const MAX_REQUEST_BYTES: u64 = 1 << 50;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct LaneKey {
    stream: StreamId,
    small: bool,
}

impl LaneKey {
    fn pool(self) -> Pool {
        if self.small {
            Pool::Small
        } else {
            Pool::Large
        }
    }
}

/// The address space of one lane.
#[derive(Debug, Default)]
struct Lane {
    /// Address reservations: base -> size.
    ranges: BTreeMap<u64, u64>,
    /// Free address ranges, mapped or not, maximal within a reservation: start -> end.
    holes: BTreeMap<u64, u64>,
    /// The holes by (length, start), for best fit.
    by_size: BTreeSet<(u64, u64)>,
}

impl Lane {
    fn add_hole(&mut self, start: u64, end: u64) {
        self.holes.insert(start, end);
        self.by_size.insert((end - start, start));
    }

    fn remove_hole(&mut self, start: u64) -> Option<u64> {
        let end = self.holes.remove(&start)?;
        self.by_size.remove(&(end - start, start));
        Some(end)
    }

    /// The reservation holding `addr`: (base, end).
    fn range_of(&self, addr: u64) -> Option<(u64, u64)> {
        let (&base, &size) = self.ranges.range(..=addr).next_back()?;
        (addr < base + size).then_some((base, base + size))
    }

    /// `[start, end)` is free again: merge it with the holes beside it in its reservation.
    fn free_range(&mut self, start: u64, end: u64) {
        let Some((base, limit)) = self.range_of(start) else { return };
        let (mut s, mut e) = (start, end);
        if let Some((&ps, &pe)) = self.holes.range(..start).next_back() {
            if pe == start && ps >= base {
                self.remove_hole(ps);
                s = ps;
            }
        }
        if end < limit {
            if let Some(ne) = self.remove_hole(end) {
                e = ne;
            }
        }
        self.add_hole(s, e);
    }
}

#[derive(Debug, Clone, Copy)]
struct Conf {
    small_max: u64,
    reserve_size: Option<u64>,
    headroom: u64,
}

#[derive(Debug)]
pub struct Allocsim {
    books: Books,
    tiling: Tiling<()>,
    lanes: BTreeMap<LaneKey, Lane>,
    /// The most memory ever reserved: the line cached pages may not push past.
    high_water: u64,
    conf: Conf,
}

/// `[start, end)` rounded out to whole pages.
fn page_span(start: u64, end: u64) -> (u64, u64) {
    (start / PAGE * PAGE, round_up(end, PAGE))
}

impl Allocsim {
    pub fn from_conf(conf: &str) -> Result<Self, ConfigError> {
        let mut me = Allocsim {
            books: Books::default(),
            tiling: Tiling::default(),
            lanes: BTreeMap::new(),
            high_water: 0,
            conf: Conf { small_max: MIB, reserve_size: None, headroom: 0 },
        };
        me.set_settings(conf)?;
        Ok(me)
    }

    /// The best-fitting hole of the lane for `size` bytes, reserving more address space when
    /// none fits: (start, end).
    fn find_hole(&mut self, env: &mut Env<'_>, key: LaneKey, size: u64) -> Option<(u64, u64)> {
        let lane = self.lanes.entry(key).or_default();
        if let Some(&(len, start)) = lane.by_size.range((size, 0)..).next() {
            return Some((start, start + len));
        }
        let wanted = self.conf.reserve_size.unwrap_or_else(|| env.device.mem_info().total_bytes);
        let bytes = round_up(wanted.max(size), PAGE);
        let base = env.device.reserve_address(bytes, PAGE).ok()?;
        lane.ranges.insert(base, bytes);
        lane.add_hole(base, base + bytes);
        Some((base, base + bytes))
    }

    /// The parts of `[start, end)` that no mapped range covers.
    fn unmapped_gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut at = start;
        while at < end {
            if let Some(base) = self.tiling.seg_of(at) {
                at = base + self.tiling.seg(base).map_or(PAGE, |s| s.size);
                continue;
            }
            let next = self.tiling.next_segment_from(at).unwrap_or(end).min(end);
            gaps.push((at, next));
            at = next;
        }
        gaps
    }

    /// Map `[start, end)` of `key`'s reservation `(base, limit)` and join it with the mapped
    /// ranges beside it.
    fn map_gap(
        &mut self,
        env: &mut Env<'_>,
        key: LaneKey,
        gap: (u64, u64),
        range: (u64, u64),
    ) -> bool {
        let (start, end) = gap;
        if !self.books.device_map(env, (start, end - start), key.stream, key.pool()) {
            return false;
        }
        self.tiling.add_segment_in(start, end - start, key.stream, key.pool(), true, ());
        let mut base = start;
        if start > range.0 {
            if let Some(left) = self.tiling.seg_of(start - 1) {
                self.join_runs(left, start);
                base = left;
            }
        }
        if end < range.1 && self.tiling.seg_of(end) == Some(end) {
            self.join_runs(base, end);
        }
        true
    }

    /// Join the mapped range at `right` onto the one at `left`, merging free chunks that meet.
    fn join_runs(&mut self, left: u64, right: u64) {
        if !self.tiling.join(left, right) {
            return;
        }
        let before = self.tiling.chunk_at(right - 1);
        let after = self.tiling.get(right);
        if let (Some((prev, p)), Some(n)) = (before, after) {
            if p.is_free() && n.is_free() {
                self.tiling.merge_next(prev);
            }
        }
    }

    /// Unmap the mapped pages of `[start, end)`, which lies inside a hole of `key`.
    fn unmap_range(&mut self, env: &mut Env<'_>, key: LaneKey, start: u64, end: u64) -> u64 {
        let mut released = 0;
        let mut at = start;
        while at < end {
            let Some(base) = self.tiling.seg_of(at) else {
                at = self.tiling.next_segment_from(at).unwrap_or(end).min(end);
                continue;
            };
            let stop = end.min(base + self.tiling.seg(base).map_or(0, |s| s.size));
            let Some((chunk, c)) = self.tiling.chunk_at(at).filter(|(_, c)| c.is_free()) else {
                return released;
            };
            if chunk + c.size < stop {
                return released;
            }
            if chunk < at {
                self.tiling.split(chunk, at - chunk, ());
            }
            self.tiling.split(at, stop - at, ());
            self.tiling.cut_out(at);
            self.books.device_unmap(env, (at, stop - at), key.stream, key.pool());
            released += stop - at;
            at = stop;
        }
        released
    }

    /// Unmap cached pages (wholly inside holes, outside `keep`), largest holes first, until
    /// `target` bytes are released; returns what was released.
    fn reclaim(&mut self, env: &mut Env<'_>, target: u64, keep: (u64, u64)) -> u64 {
        let mut holes: Vec<(u64, u64, u64, LaneKey)> = self
            .lanes
            .iter()
            .flat_map(|(&k, lane)| lane.holes.iter().map(move |(&s, &e)| (e - s, s, e, k)))
            .filter(|&(_, s, e, _)| round_up(s, PAGE) < e / PAGE * PAGE)
            .collect();
        holes.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut released = 0;
        for (_, start, end, key) in holes {
            if released >= target {
                break;
            }
            let (lo, hi) = (round_up(start, PAGE), end / PAGE * PAGE);
            for (a, b) in [(lo, hi.min(keep.0)), (lo.max(keep.1), hi)] {
                if a < b {
                    released += self.unmap_range(env, key, a, b);
                }
            }
        }
        if released > 0 {
            self.books.stats.num_sync_all_streams += 1;
        }
        released
    }

    /// Map every page of `span` in `key`'s reservation `range`, unmapping cached pages first
    /// when the new ones would pass the high-water mark.
    fn ensure_mapped(
        &mut self,
        env: &mut Env<'_>,
        key: LaneKey,
        span: (u64, u64),
        range: (u64, u64),
    ) -> bool {
        let gaps = self.unmapped_gaps(span.0, span.1);
        let need: u64 = gaps.iter().map(|&(a, b)| b - a).sum();
        if need == 0 {
            return true;
        }
        let line = self.high_water.saturating_add(self.conf.headroom);
        let after = self.books.reserved() + need;
        if after > line {
            self.reclaim(env, after - line, span);
        }
        for gap in gaps {
            if !self.map_gap(env, key, gap, range) {
                self.books.stats.num_alloc_retries += 1;
                if self.reclaim(env, u64::MAX, span) == 0 || !self.map_gap(env, key, gap, range) {
                    return false;
                }
            }
        }
        true
    }

    fn place(&mut self, env: &mut Env<'_>, key: LaneKey, size: u64) -> Option<u64> {
        let (start, end) = self.find_hole(env, key, size)?;
        let range = self.lanes.get(&key)?.range_of(start)?;
        let span = page_span(start, start + size);
        if !self.ensure_mapped(env, key, span, range) {
            return None;
        }
        self.tiling.split(start, size, ());
        let lane = self.lanes.get_mut(&key)?;
        lane.remove_hole(start);
        if end > start + size {
            lane.add_hole(start + size, end);
        }
        self.high_water = self.high_water.max(self.books.reserved());
        Some(start)
    }

    fn lane_key(&self, size: u64, stream: StreamId) -> LaneKey {
        LaneKey { stream, small: size <= self.conf.small_max }
    }

    /// The block at `addr` is free: coalesce its chunk and its hole; its pages stay cached.
    fn release(&mut self, addr: u64, size: u64, stream: StreamId) {
        self.tiling.release(addr, ());
        if self.tiling.next(addr).is_some_and(|(_, c)| c.is_free()) {
            self.tiling.merge_next(addr);
        }
        if let Some((prev, _)) = self.tiling.prev(addr).filter(|(_, c)| c.is_free()) {
            self.tiling.merge_next(prev);
        }
        let key = self.lane_key(size, stream);
        if let Some(lane) = self.lanes.get_mut(&key) {
            lane.free_range(addr, addr + size);
        }
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }
}

impl Allocator for Allocsim {
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
        let rounded = rounded_request(size, ALIGN);
        let key = self.lane_key(rounded, stream);
        let found = if rounded <= MAX_REQUEST_BYTES { self.place(env, key, rounded) } else { None };
        let result = match found {
            Some(addr) => {
                self.tiling.take(addr, id);
                Ok(self.books.grant(env, id, (addr, rounded), size, stream))
            }
            None => Err(self.books.oom(env, id, rounded, stream, self.tiling.largest_free())),
        };
        self.books.sync_inactive_split(self.tiling.inactive_split());
        result
    }

    fn free(&mut self, env: &mut Env<'_>, id: AllocId) {
        if let Some(b) = self.books.free_requested(env, id) {
            self.release(b.addr, b.size, b.stream);
        }
    }

    fn record_stream(&mut self, id: AllocId, stream: StreamId) {
        self.books.record_stream(id, stream);
    }

    fn free_completed(&mut self, env: &mut Env<'_>, id: AllocId) {
        if let Some(b) = self.books.free_completed(env, id) {
            self.release(b.addr, b.size, b.stream);
        }
    }

    fn empty_cache(&mut self, env: &mut Env<'_>) {
        self.reclaim(env, u64::MAX, (0, 0));
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }

    fn set_memory_fraction(&mut self, env: &mut Env<'_>, fraction: f64) -> Result<(), ConfigError> {
        self.books.set_fraction(env, fraction)
    }

    /// `small_max` takes effect only before the first request.
    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        let mut c = self.conf;
        for (key, value) in parse_conf(NAME, conf)? {
            match key.as_str() {
                "small_max" => c.small_max = parse_bytes(NAME, &key, &value)?,
                "reserve_size" => c.reserve_size = Some(parse_bytes(NAME, &key, &value)?),
                "headroom" => c.headroom = parse_bytes(NAME, &key, &value)?,
                _ => return Err(unknown_key(NAME, &key, KEYS)),
            }
        }
        if c.reserve_size.is_some_and(|r| r == 0 || r > MAX_REQUEST_BYTES) {
            return Err(ConfigError(format!("policy {NAME}: reserve_size must be in 1..=2^50")));
        }
        if !self.lanes.is_empty() {
            c.small_max = self.conf.small_max;
        }
        self.conf = c;
        Ok(())
    }

    fn stats(&self) -> MemoryStats {
        self.books.stats.clone()
    }

    fn snapshot(&self) -> Vec<SnapshotSegment> {
        self.tiling.snapshot(&self.books)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Rig;
    use allocsim_core::{GIB, MIB};

    #[test]
    fn maps_only_touched_pages_and_packs_small_blocks() {
        let mut rig = Rig::new("allocsim", None, GIB);
        let a = rig.malloc(1, 1000, 0).unwrap();
        assert_eq!(a.size, 1024);
        assert_eq!(rig.reserved(), 2 * MIB, "one page for the small lane");
        let b = rig.malloc(2, 1000, 0).unwrap();
        assert_eq!(b.addr, a.addr + 1024);
        let c = rig.malloc(3, 3 * MIB, 0).unwrap();
        assert_eq!(c.size, 3 * MIB);
        assert_eq!(rig.reserved(), 6 * MIB, "and two pages for 3 MiB in the large lane");
        let d = rig.malloc(4, 3 * MIB, 0).unwrap();
        assert_eq!(d.addr, c.addr + 3 * MIB, "shares c's last page");
        assert_eq!(rig.reserved(), 8 * MIB);
    }

    #[test]
    fn reuses_cached_pages_without_device_calls() {
        let mut rig = Rig::new("allocsim", None, GIB);
        rig.malloc(1, 100 * MIB, 0).unwrap();
        rig.free(1);
        let calls = rig.policy.stats().num_device_alloc;
        rig.malloc(2, 100 * MIB, 0).unwrap();
        assert_eq!(rig.policy.stats().num_device_alloc, calls, "same hole, pages still mapped");
    }

    #[test]
    fn unmaps_cached_pages_rather_than_pass_the_high_water_mark() {
        let mut rig = Rig::new("allocsim", None, GIB);
        rig.malloc(1, 100 * MIB, 0).unwrap();
        rig.malloc(2, 100 * MIB, 0).unwrap();
        rig.free(1);
        // 150 MiB fits no hole but the tail; mapping it would make 250 MiB: unmap the cache.
        rig.malloc(3, 150 * MIB, 0).unwrap();
        let s = rig.policy.stats();
        assert_eq!(s.reserved_bytes.all.peak as u64, 250 * MIB);
        assert!(s.num_sync_all_streams == 1 && s.num_device_free >= 1, "{s:?}");
    }

    #[test]
    fn oom_after_releasing_everything() {
        let mut rig = Rig::new("allocsim", Some("headroom:max"), 64 * MIB);
        rig.malloc(1, 40 * MIB, 0).unwrap();
        rig.free(1);
        rig.malloc(2, 10 * MIB, 7).unwrap();
        // Stream 0's 40 MiB stay cached (headroom:max) until the device refuses stream 13.
        rig.malloc(3, 50 * MIB, 13).unwrap();
        assert_eq!(rig.policy.stats().num_alloc_retries, 1);
        assert_eq!(rig.reserved(), 60 * MIB);
        assert!(rig.malloc(4, 10 * MIB, 0).is_err());
        rig.empty_cache();
        assert_eq!(rig.reserved(), 60 * MIB, "nothing cached is left to unmap");
    }
}
