//! `allocsim`: our own policy, built to need less memory than the others on real traces
//! without many more device calls.
//!
//! The idea: place blocks in virtual address space, pay for physical pages only where live
//! blocks are, and keep freed pages mapped only within a small, bounded slack.
//!
//! - **Address space is free, pages are not.** Each lane (a stream, and small (<= 1 MiB) or
//!   large blocks, as PyTorch separates them) has its own address reservations
//!   (`cuMemAddressReserve`, sized like the device). A block goes at the start of a hole (a
//!   maximal free address range), so it shares its first page with the live block before it;
//!   holes coalesce at once. Fragmentation of the address space costs nothing: what counts is
//!   the 2 MiB pages that live blocks touch, the *need*.
//! - **Map on demand** (`cuMemMap`, as PyTorch's expandable segments do), only the pages of the
//!   block that are not mapped yet. Among the best-fitting holes (`candidates`, and always the
//!   lane's frontier) the one needing the fewest new pages wins, then the smallest.
//! - **Cache within a bounded slack.** Pages wholly inside holes stay mapped after a free
//!   (*cached*), so a repeating workload reuses them without device calls. But reserved memory
//!   may exceed the peak need by at most `headroom`: when a request's new pages would pass
//!   that line, cached pages are unmapped first (largest holes first, from their high end,
//!   at least `reclaim_min` at a time, after a device synchronize, counted in
//!   `num_sync_all_streams`). So peak reserved stays within `headroom` (plus one `grow_step`
//!   per lane) of the peak of pages touched by live blocks, the least any policy that does not
//!   move blocks can reach with this placement.
//! - At a lane's frontier growth maps ahead to `grow_step` boundaries, when the slack allows,
//!   so a growing workload maps in few, larger calls; those pages are kept when reclaiming.
//! - Before OOM every cached page is unmapped and mapping retried; `empty_cache` unmaps every
//!   cached page. Blocks freed with uses on other streams come back only at `FreeCompleted`,
//!   and a lane's holes are reused only by its stream, as in PyTorch.
//!
//! Compared with PyTorch's expandable segments, which also map on demand: those grow one range
//! per pool and stream at its end and keep every freed page until `empty_cache` or OOM; here
//! holes anywhere give their pages back when the alternative is a new peak.
//!
//! Measured on the bundled PyTorch 2.11 H100 recordings (modelled H100; `allocsim compare`
//! reports both figures per policy under each trace's own settings), in
//! GiB: peak reserved under each trace's own settings, and the least free memory (2 MiB steps)
//! that runs the trace without OOM, against the best of every other policy (PyTorch's clone with
//! and without expandable segments, uncached, and the whole zoo). The last three traces were
//! recorded after these settings were chosen:
//!
//! | trace | live peak | peak: allocsim | best other | capacity: allocsim | best other |
//! |---|---|---|---|---|---|
//! | gpt2_train | 7.172 | **7.293** | 7.455 tlsf | **7.250** | 7.330 pytorch+expandable |
//! | resnet50_train | 2.973 | **3.012** | 3.023 pytorch+expandable | **2.986** | 3.018 same |
//! | varlen_train | 8.279 | **8.354** | 8.502 pytorch+expandable | **8.318** | 8.393 same |
//! | synthetic_maxsplit | 61.812 | **62.025** | 62.252 uncached | **61.979** | 62.252 uncached |
//! | synthetic_multistream | 55.793 | **55.979** | 56.162 uncached | **55.932** | 56.162 uncached |
//! | synthetic_roundup | 62.975 | **63.166** | 63.449 uncached | **63.119** | 63.449 uncached |
//! | llama_generate_varlen | 0.564 | **0.594** | 0.604 pytorch+expandable | **0.572** | 0.590 same |
//! | varlen_train_tuned | 8.279 | **8.354** | 8.502 pytorch+expandable | **8.318** | 8.393 same |
//! | synthetic_expandable | 68.464 | **68.664** | 68.936 uncached | **68.617** | 68.936 uncached |
//!
//! The price is device calls where the footprint is tight: modelled device time 16 / 5 / 22 ms
//! on gpt2 / resnet50 / varlen against PyTorch's 7 / 5 / 11 ms, and 200-520 ms on the random
//! synthetic programs against 18-890 ms for PyTorch, 1230-1310 ms for TLSF and 2270-2350 ms for
//! uncached, the two others that come close in memory. `headroom` trades one for the other.
//! Policy CPU time (whole replay on an idle machine, with the simulated device) is about 1 us
//! per op, within the zoo's range (BFC 0.5, TLSF 1.0), against 0.1 us for the PyTorch clone.
//!
//! Settings (`key:value,...`):
//! - `headroom` (bytes or `max`, default 48 MiB): how far reserved may exceed the peak need
//!   (`max`: cache until OOM, as expandable segments do; 0: the least memory, more calls);
//! - `grow_step` (bytes, default 48 MiB): map-ahead granularity at a lane's frontier;
//! - `reclaim_min` (bytes, default 256 MiB): the least to unmap once unmapping;
//! - `candidates` (default 8): best-fit holes weighed by the pages they would need;
//! - `small_max` (bytes, default 1 MiB): the largest block of the small lanes (0: one lane per
//!   stream);
//! - `reserve_size` (bytes, default: the device's total memory): address space per
//!   reservation, rounded up to 2 MiB.

use crate::kit::{round_up, Cx, Kit, Live, Rules, Setting, Tiling, PAGE_2MIB};
use crate::settings;
use allocsim_core::{Pool, StreamId, MIB};
use std::collections::{BTreeMap, BTreeSet};

const PAGE: u64 = PAGE_2MIB;
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

/// A free address range: its end and the mapped bytes wholly inside it (its cached pages).
#[derive(Debug, Clone, Copy)]
struct Hole {
    end: u64,
    cached: u64,
}

/// The address space of one lane.
#[derive(Debug, Clone, Default)]
struct Lane {
    /// Address reservations: base -> size.
    ranges: BTreeMap<u64, u64>,
    /// Free address ranges, mapped or not, maximal within a reservation, by start.
    holes: BTreeMap<u64, Hole>,
    /// The holes by (length, start), for best fit.
    by_size: BTreeSet<(u64, u64)>,
}

impl Lane {
    /// The reservation holding `addr`: (base, end).
    fn range_of(&self, addr: u64) -> Option<(u64, u64)> {
        let (&base, &size) = self.ranges.range(..=addr).next_back()?;
        (addr < base + size).then_some((base, base + size))
    }

    /// The hole at the end of the last reservation: where growth happens.
    fn frontier(&self) -> Option<(u64, u64)> {
        let (&base, &size) = self.ranges.iter().next_back()?;
        let (&start, hole) = self.holes.range(..base + size).next_back()?;
        (hole.end == base + size).then_some((start, hole.end))
    }
}

#[derive(Debug, Clone, Copy)]
struct Conf {
    headroom: u64,
    grow_step: u64,
    reclaim_min: u64,
    candidates: u64,
    small_max: u64,
    reserve_size: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Lanes {
    lanes: BTreeMap<LaneKey, Lane>,
    /// Mapped bytes wholly inside holes: reserved minus what live blocks touch.
    cached: u64,
    /// The peak of reserved minus cached: the pages live blocks touched at most.
    need_peak: u64,
    conf: Conf,
}

/// `[start, end)` rounded out to whole pages.
fn page_span(start: u64, end: u64) -> (u64, u64) {
    (start / PAGE * PAGE, round_up(end, PAGE))
}

/// The whole pages inside `[start, end)`.
fn interior(start: u64, end: u64) -> (u64, u64) {
    let lo = round_up(start, PAGE);
    (lo, (end / PAGE * PAGE).max(lo))
}

/// Our own policy.
pub type Allocsim = Kit<Lanes>;

impl Default for Lanes {
    fn default() -> Self {
        Lanes {
            lanes: BTreeMap::new(),
            cached: 0,
            need_peak: 0,
            conf: Conf {
                headroom: 48 * MIB,
                grow_step: 48 * MIB,
                reclaim_min: 256 * MIB,
                candidates: 8,
                small_max: MIB,
                reserve_size: None,
            },
        }
    }
}

impl Lanes {
    fn need(&self, cx: &Cx<'_, '_, ()>) -> u64 {
        cx.reserved() - self.cached
    }

    /// Mapped bytes of `[start, end)`.
    fn mapped_in(tiling: &Tiling<()>, (start, end): (u64, u64)) -> u64 {
        tiling.segments_in_rev(start, end).map(|(b, s)| (b + s).min(end) - b.max(start)).sum()
    }

    fn add_hole(&mut self, tiling: &Tiling<()>, key: LaneKey, start: u64, end: u64) {
        let cached = Self::mapped_in(tiling, interior(start, end));
        self.cached += cached;
        let lane = self.lanes.entry(key).or_default();
        lane.holes.insert(start, Hole { end, cached });
        lane.by_size.insert((end - start, start));
    }

    fn remove_hole(&mut self, key: LaneKey, start: u64) -> Option<u64> {
        let lane = self.lanes.get_mut(&key)?;
        let hole = lane.holes.remove(&start)?;
        lane.by_size.remove(&(hole.end - start, start));
        self.cached -= hole.cached;
        Some(hole.end)
    }

    /// `[start, end)` of `key` is free again: merge it with the holes beside it.
    fn free_range(&mut self, tiling: &Tiling<()>, key: LaneKey, start: u64, end: u64) {
        let Some(lane) = self.lanes.get(&key) else { return };
        let Some((base, limit)) = lane.range_of(start) else { return };
        let before = lane.holes.range(..start).next_back().map(|(&s, h)| (s, h.end));
        let after = (end < limit && lane.holes.contains_key(&end)).then_some(end);
        let mut s = start;
        let mut e = end;
        if let Some((ps, _)) = before.filter(|&(ps, pe)| pe == start && ps >= base) {
            self.remove_hole(key, ps);
            s = ps;
        }
        if let Some(next) = after {
            e = self.remove_hole(key, next).unwrap_or(end);
        }
        self.add_hole(tiling, key, s, e);
    }

    /// The hole for `size` bytes: among the best fits and the frontier, the one needing the
    /// fewest new pages, then the smallest; a new reservation when none fits.
    fn find_hole(
        &mut self,
        cx: &mut Cx<'_, '_, ()>,
        key: LaneKey,
        size: u64,
    ) -> Option<(u64, u64)> {
        let lane = self.lanes.entry(key).or_default();
        let mut fits: Vec<(u64, u64)> = lane
            .by_size
            .range((size, 0)..)
            .take(self.conf.candidates.max(1) as usize)
            .copied()
            .collect();
        if let Some((start, end)) = lane.frontier().filter(|&(s, e)| e - s >= size) {
            if !fits.contains(&(end - start, start)) {
                fits.push((end - start, start));
            }
        }
        let mut best: Option<(u64, u64, u64)> = None;
        for (len, start) in fits {
            let span = page_span(start, start + size);
            let new = span.1 - span.0 - Self::mapped_in(cx.tiling, span);
            if best.is_none_or(|(n, _, _)| new < n) {
                best = Some((new, len, start));
            }
            if new == 0 {
                break;
            }
        }
        if let Some((_, len, start)) = best {
            return Some((start, start + len));
        }
        let wanted = self.conf.reserve_size.unwrap_or_else(|| cx.room().device_total());
        let bytes = round_up(wanted.max(size), PAGE);
        let base = cx.reserve_address(bytes, PAGE)?;
        self.lanes.entry(key).or_default().ranges.insert(base, bytes);
        self.add_hole(cx.tiling, key, base, base + bytes);
        Some((base, base + bytes))
    }

    /// The parts of `[start, end)` that no mapped range covers.
    fn unmapped_gaps(tiling: &Tiling<()>, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut at = start;
        while at < end {
            if let Some(base) = tiling.seg_of(at) {
                at = base + tiling.seg(base).map_or(PAGE, |s| s.size);
                continue;
            }
            let next = tiling.next_segment_from(at).unwrap_or(end).min(end);
            gaps.push((at, next));
            at = next;
        }
        gaps
    }

    /// Map `gap` of `key`'s reservation `range` and join it with the mapped ranges beside it.
    fn map_gap(cx: &mut Cx<'_, '_, ()>, key: LaneKey, gap: (u64, u64), range: (u64, u64)) -> bool {
        let (start, end) = gap;
        if !cx.map((start, end - start), key.stream, key.pool(), ()) {
            return false;
        }
        let mut base = start;
        if start > range.0 {
            if let Some(left) = cx.tiling.seg_of(start - 1) {
                Self::join_runs(cx.tiling, left, start);
                base = left;
            }
        }
        if end < range.1 && cx.tiling.seg_of(end) == Some(end) {
            Self::join_runs(cx.tiling, base, end);
        }
        true
    }

    /// Join the mapped range at `right` onto the one at `left`, merging free chunks that meet.
    fn join_runs(tiling: &mut Tiling<()>, left: u64, right: u64) {
        if !tiling.join(left, right) {
            return;
        }
        let before = tiling.chunk_at(right - 1);
        let after = tiling.get(right);
        if let (Some((prev, p)), Some(n)) = (before, after) {
            if p.is_free() && n.is_free() {
                tiling.merge_next(prev);
            }
        }
    }

    /// Unmap the mapped pages of `[start, end)`, which lies inside a hole.
    fn unmap_range(cx: &mut Cx<'_, '_, ()>, start: u64, end: u64) -> u64 {
        let mut released = 0;
        let mut at = start;
        while at < end {
            let Some(base) = cx.tiling.seg_of(at) else {
                at = cx.tiling.next_segment_from(at).unwrap_or(end).min(end);
                continue;
            };
            let stop = end.min(base + cx.tiling.seg(base).map_or(0, |s| s.size));
            let Some((chunk, c)) = cx.tiling.chunk_at(at).filter(|(_, c)| c.is_free()) else {
                return released;
            };
            if chunk + c.size < stop {
                return released;
            }
            if chunk < at {
                cx.tiling.split(chunk, at - chunk, ());
            }
            cx.tiling.split(at, stop - at, ());
            cx.unmap(at);
            released += stop - at;
            at = stop;
        }
        released
    }

    /// Unmap up to `budget` bytes of the mapped pages of `[a, b)` (inside a hole), the highest
    /// first.
    fn unmap_top(cx: &mut Cx<'_, '_, ()>, (a, b): (u64, u64), budget: u64) -> u64 {
        let pieces: Vec<(u64, u64)> = cx
            .tiling
            .segments_in_rev(a, b)
            .map(|(base, size)| (base.max(a), (base + size).min(b)))
            .collect();
        let mut released = 0;
        for (lo, hi) in pieces {
            if released >= budget {
                break;
            }
            let from = hi.saturating_sub(budget - released).max(lo);
            released += Self::unmap_range(cx, from, hi);
        }
        released
    }

    /// Unmap cached pages, largest holes first and from their high end, until `target` bytes
    /// (at least `reclaim_min`; `u64::MAX`: all) are released, never inside `keep` nor, unless
    /// releasing all, a frontier's pages mapped ahead. Returns what was released.
    fn reclaim(&mut self, cx: &mut Cx<'_, '_, ()>, target: u64, keep: (u64, u64)) -> u64 {
        let all = target == u64::MAX;
        let target = target.max(self.conf.reclaim_min);
        let mut holes: Vec<(u64, u64, u64, LaneKey)> = self
            .lanes
            .iter()
            .flat_map(|(&k, lane)| {
                lane.holes
                    .iter()
                    .filter(|(_, h)| h.cached > 0)
                    .map(move |(&s, h)| (h.end - s, s, h.end, k))
            })
            .collect();
        holes.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut released = 0;
        for (_, start, end, key) in holes {
            if released >= target {
                break;
            }
            let (mut lo, hi) = interior(start, end);
            let lane = self.lanes.get(&key);
            let frontier = lane.and_then(|l| l.frontier()) == Some((start, end));
            if let Some((base, _)) =
                lane.and_then(|l| l.range_of(start)).filter(|_| frontier && !all)
            {
                lo = lo.max(base + round_up(start - base, self.conf.grow_step)).min(hi);
            }
            let mut got = 0;
            for (a, b) in [(lo.max(keep.1), hi), (lo, hi.min(keep.0))] {
                if a < b && released + got < target {
                    got += Self::unmap_top(cx, (a, b), round_up(target - released - got, PAGE));
                }
            }
            if got > 0 {
                released += got;
                // Its cached bytes changed: re-enter the hole to recount them.
                self.remove_hole(key, start);
                self.add_hole(cx.tiling, key, start, end);
            }
        }
        if released > 0 {
            cx.synced();
        }
        released
    }

    /// Map the pages of `span` (and, at a frontier, ahead to `grow_step` within `hole`) in
    /// `key`'s reservation `range`, unmapping cached pages first when reserved memory would
    /// pass the peak need plus `headroom`.
    fn ensure_mapped(
        &mut self,
        cx: &mut Cx<'_, '_, ()>,
        key: LaneKey,
        span: (u64, u64),
        hole: (u64, u64),
        range: (u64, u64),
    ) -> bool {
        let gaps = Self::unmapped_gaps(cx.tiling, span.0, span.1);
        let new: u64 = gaps.iter().map(|&(a, b)| b - a).sum();
        let line = self.need_peak.max(self.need(cx) + new).saturating_add(self.conf.headroom);
        let mut gaps = gaps;
        if hole.1 == range.1 {
            let step_end = range.0 + round_up(span.1 - range.0, self.conf.grow_step);
            let ahead = (span.1, step_end.min(hole.1 / PAGE * PAGE));
            let extra = Self::unmapped_gaps(cx.tiling, ahead.0, ahead.1);
            let extra_bytes: u64 = extra.iter().map(|&(a, b)| b - a).sum();
            if cx.reserved() + new + extra_bytes <= line {
                gaps.extend(extra);
            }
        }
        let after = cx.reserved() + gaps.iter().map(|&(a, b)| b - a).sum::<u64>();
        if after > line {
            self.reclaim(cx, after - line, span);
        }
        for gap in gaps {
            if !Self::map_gap(cx, key, gap, range) {
                if gap.0 >= span.1 {
                    break; // mapping ahead is optional
                }
                cx.retried();
                if self.reclaim(cx, u64::MAX, span) == 0 || !Self::map_gap(cx, key, gap, range) {
                    return false;
                }
            }
        }
        true
    }

    fn place(&mut self, cx: &mut Cx<'_, '_, ()>, key: LaneKey, size: u64) -> Option<u64> {
        let reservations = self.lanes.get(&key).map_or(0, |lane| lane.ranges.len());
        let (start, end) = self.find_hole(cx, key, size)?;
        let range = self.lanes.get(&key)?.range_of(start)?;
        if !self.ensure_mapped(cx, key, page_span(start, start + size), (start, end), range) {
            // A reservation made for this request and left unmapped goes back: kept, it would
            // become the lane's frontier, and each failed request would add one more.
            let fresh = self.lanes.get(&key).map_or(0, |lane| lane.ranges.len()) > reservations;
            if fresh && Self::mapped_in(cx.tiling, range) == 0 {
                self.remove_hole(key, range.0);
                if let Some(lane) = self.lanes.get_mut(&key) {
                    lane.ranges.remove(&range.0);
                }
                cx.release_address(range.0, range.1 - range.0);
            }
            return None;
        }
        cx.tiling.split(start, size, ());
        self.remove_hole(key, start);
        if end > start + size {
            self.add_hole(cx.tiling, key, start + size, end);
        }
        self.need_peak = self.need_peak.max(self.need(cx));
        Some(start)
    }

    fn lane_key(&self, size: u64, stream: StreamId) -> LaneKey {
        LaneKey { stream, small: size <= self.conf.small_max }
    }

    /// The block at `addr` is free: coalesce its chunk and its hole; its pages stay cached.
    fn release(&mut self, tiling: &mut Tiling<()>, addr: u64, size: u64, stream: StreamId) {
        tiling.release(addr, ());
        tiling.coalesce(addr, |_| true, |_, _, _| {});
        self.free_range(tiling, self.lane_key(size, stream), addr, addr + size);
    }
}

impl Rules for Lanes {
    const NAME: &'static str = "allocsim";
    const SETTINGS: &'static [Setting<Self>] = &settings![
        /// how far reserved may exceed the peak need, in bytes (max: cache until OOM)
        headroom: Bytes => |r, v| r.conf.headroom = v,
        /// map-ahead granularity at a lane's frontier, in bytes
        grow_step: Bytes => |r, v| r.conf.grow_step = round_up(v.clamp(1, MAX_REQUEST_BYTES), PAGE),
        /// the least to unmap once unmapping, in bytes
        reclaim_min: Bytes => |r, v| r.conf.reclaim_min = v,
        /// best-fit holes weighed by the pages they would need
        candidates: Bytes => |r, v| r.conf.candidates = v.clamp(1, 1 << 20),
        /// the largest block of the small lanes, in bytes (0: one lane per stream)
        small_max: Bytes => |r, v| r.conf.small_max = v,
        /// address space per reservation, in bytes (default: the device's memory)
        reserve_size: Bytes => |r, v| r.conf.reserve_size = Some(v),
    ];
    type Tag = ();

    fn refuses(&self, block: u64) -> bool {
        block > MAX_REQUEST_BYTES
    }

    fn find(&mut self, cx: &mut Cx<'_, '_, ()>, block: u64, stream: StreamId) -> Option<u64> {
        self.place(cx, self.lane_key(block, stream), block)
    }

    fn give_back(&mut self, tiling: &mut Tiling<()>, block: &Live, _: bool) {
        self.release(tiling, block.addr, block.size, block.stream);
    }

    /// Every cached page is unmapped.
    fn empty_cache(&mut self, cx: &mut Cx<'_, '_, ()>) {
        self.reclaim(cx, u64::MAX, (0, 0));
    }

    /// `small_max` takes effect only before the first request.
    fn check(&mut self, previous: &Self, _: bool) -> Result<(), String> {
        if self.conf.reserve_size.is_some_and(|r| r == 0 || r > MAX_REQUEST_BYTES) {
            return Err("reserve_size must be in 1..=2^50".into());
        }
        if !self.lanes.is_empty() {
            self.conf.small_max = previous.conf.small_max;
        }
        Ok(())
    }
}
