//! The mapped ranges of expandable segments at the first entry of a history that starts
//! mid-run.
//!
//! A snapshot shows each contiguous mapped range of an expandable segment as a segment of its
//! own, and `segment_map`/`segment_unmap` entries cut and join those ranges at page
//! boundaries: an unmap need not start or end where a final segment does, and a range that
//! held a live block all along shows in neither. So the ranges at the start are rebuilt by
//! walking the history back from the final ones: a map's pages were unmapped before it, an
//! unmap's were mapped. What is left, joined where ranges touch, is what was mapped at the
//! first entry; a block alive then lies inside one of those ranges, across page boundaries if
//! it was so placed.

use allocsim_core::{MemPoolId, Pool, SnapshotSegment, StreamId, MIB};
use std::collections::BTreeMap;

/// A large pool's page (`kLargeBuffer`): its maps and unmaps are whole multiples of it, a
/// small pool's (2 MiB pages, one a map) mostly not.
const LARGE_PAGE: u64 = 20 * MIB;

/// One `segment_map` or `segment_unmap` of the history, in order.
#[derive(Debug, Clone, Copy)]
pub struct MapEvent {
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    pub map: bool,
}

/// A mapped range, keyed by its start: where it ends, and what is known of its segment (only
/// a final segment says its size class and pool).
#[derive(Debug, Clone, Copy)]
struct Range {
    end: u64,
    stream: StreamId,
    known: Option<(Pool, MemPoolId)>,
}

/// The expandable segments mapped at the history's first entry, in address order, without
/// blocks: `last`'s expandable ranges with the history's maps and unmaps undone.
pub fn ranges_at_start(last: &[SnapshotSegment], events: &[MapEvent]) -> Vec<SnapshotSegment> {
    let mut mapped: BTreeMap<u64, Range> = BTreeMap::new();
    for seg in last.iter().filter(|s| s.is_expandable && s.total_size > 0) {
        let end = seg.address.saturating_add(seg.total_size);
        let known = Some((seg.pool, seg.pool_id));
        cut(&mut mapped, seg.address, end);
        mapped.insert(seg.address, Range { end, stream: seg.stream, known });
    }
    for e in events.iter().rev() {
        let end = e.addr.saturating_add(e.size);
        cut(&mut mapped, e.addr, end);
        if !e.map && e.size > 0 {
            mapped.insert(e.addr, Range { end, stream: e.stream, known: None });
        }
    }
    join(mapped)
}

/// Take `[start, end)` out of the ranges, cutting those that reach into it.
fn cut(mapped: &mut BTreeMap<u64, Range>, start: u64, end: u64) {
    let first = mapped.range(..start).next_back().map(|(&s, _)| s);
    let hit: Vec<u64> =
        first.into_iter().chain(mapped.range(start..end).map(|(&s, _)| s)).collect();
    for s in hit {
        let r = mapped[&s];
        if r.end <= start {
            continue;
        }
        mapped.remove(&s);
        if s < start {
            mapped.insert(s, Range { end: start, ..r });
        }
        if r.end > end {
            mapped.insert(end, r);
        }
    }
}

/// Ranges that touch on one stream are one segment's: its size class and pool from a final
/// segment among them, else the class from the sizes (a large pool maps whole 20 MiB pages)
/// and the default pools.
fn join(mapped: BTreeMap<u64, Range>) -> Vec<SnapshotSegment> {
    // Each segment with whether all its pieces are whole large pages and whether a final
    // segment said its class.
    let mut out: Vec<(SnapshotSegment, bool, bool)> = Vec::new();
    for (start, r) in mapped {
        let size = r.end - start;
        let whole = size % LARGE_PAGE == 0;
        match out.last_mut() {
            Some((seg, whole_pages, known))
                if seg.address + seg.total_size == start && seg.stream == r.stream =>
            {
                seg.total_size += size;
                *whole_pages &= whole;
                if let Some((pool, pool_id)) = r.known {
                    (seg.pool, seg.pool_id, *known) = (pool, pool_id, true);
                }
            }
            _ => {
                let (pool, pool_id) = r.known.unwrap_or((Pool::Large, MemPoolId::DEFAULT));
                let seg = SnapshotSegment {
                    address: start,
                    total_size: size,
                    stream: r.stream,
                    pool,
                    pool_id,
                    is_expandable: true,
                    blocks: Vec::new(),
                };
                out.push((seg, whole, r.known.is_some()));
            }
        }
    }
    out.into_iter()
        .map(|(mut seg, whole_pages, known)| {
            if !known && !whole_pages {
                seg.pool = Pool::Small;
            }
            seg
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(address: u64, total_size: u64, pool: Pool) -> SnapshotSegment {
        SnapshotSegment {
            address,
            total_size,
            stream: StreamId(0),
            pool,
            pool_id: MemPoolId::DEFAULT,
            is_expandable: true,
            blocks: Vec::new(),
        }
    }

    fn ev(addr: u64, size: u64, map: bool) -> MapEvent {
        MapEvent { addr, size, stream: StreamId(0), map }
    }

    #[test]
    fn an_unmap_that_ends_where_a_final_range_starts_joins_it() {
        let p = LARGE_PAGE;
        // At the start [0, 5p) was mapped; the history unmapped [0, 2p) and mapped [0, p)
        // again, and unmapped [3p, 5p); [2p, 3p) held a block all along.
        let last = [seg(0, p, Pool::Large), seg(2 * p, p, Pool::Large)];
        let events = [ev(0, 2 * p, false), ev(3 * p, 2 * p, false), ev(0, p, true)];
        let start = ranges_at_start(&last, &events);
        assert_eq!(start.len(), 1);
        assert_eq!((start[0].address, start[0].total_size, start[0].pool), (0, 5 * p, Pool::Large));
    }

    #[test]
    fn ranges_mapped_during_the_history_were_not_there() {
        let p = LARGE_PAGE;
        let last = [seg(0, 3 * p, Pool::Large)];
        let start = ranges_at_start(&last, &[ev(p, 2 * p, true)]);
        assert_eq!(start.len(), 1);
        assert_eq!((start[0].address, start[0].total_size), (0, p));
        assert!(ranges_at_start(&last, &[ev(0, 3 * p, true)]).is_empty());
    }

    #[test]
    fn a_small_pools_unmapped_pages_are_small() {
        let start = ranges_at_start(&[], &[ev(1 << 40, 18 * MIB, false)]);
        assert_eq!(start[0].pool, Pool::Small);
    }

    /// The pages of `mapped` (one bit a page from `base`) as final expandable segments.
    fn segments_of(mapped: u32, base: u64, page: u64) -> Vec<SnapshotSegment> {
        let mut out: Vec<SnapshotSegment> = Vec::new();
        for k in (0..32).filter(|k| mapped >> k & 1 == 1) {
            let addr = base + k * page;
            match out.last_mut() {
                Some(s) if s.address + s.total_size == addr => s.total_size += page,
                _ => out.push(seg(addr, page, Pool::Large)),
            }
        }
        out
    }

    /// Generated histories: from a random set of mapped pages, random maps of unmapped runs
    /// and unmaps of mapped runs; undoing them from the final ranges gives the first set.
    #[test]
    fn undoing_generated_histories_gives_the_ranges_at_the_start() {
        let (base, page) = (1u64 << 40, LARGE_PAGE);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..500 {
            let at_start = next() as u32;
            let mut mapped = at_start;
            let mut events = Vec::new();
            for _ in 0..(next() % 40) {
                let (first, len) = (next() % 32, 1 + next() % 6);
                let run = ((1u64 << len.min(32 - first)) - 1) as u32;
                let pages = run << first;
                let map = mapped & pages == 0;
                if !map && mapped & pages != pages {
                    continue;
                }
                mapped ^= pages;
                let bytes = u64::from(pages.count_ones()) * page;
                events.push(MapEvent {
                    addr: base + first * page,
                    size: bytes,
                    stream: StreamId(0),
                    map,
                });
            }
            let got = ranges_at_start(&segments_of(mapped, base, page), &events);
            let want = segments_of(at_start, base, page);
            let spans = |v: &[SnapshotSegment]| -> Vec<(u64, u64)> {
                v.iter().map(|s| (s.address, s.total_size)).collect()
            };
            assert_eq!(spans(&got), spans(&want), "start {at_start:#x}, events {events:?}");
        }
    }
}
