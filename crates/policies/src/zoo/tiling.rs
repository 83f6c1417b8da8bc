//! The memory map every zoo policy keeps: device segments, each tiled without gaps by chunks
//! that are either a live block (owned by an [`AllocId`]) or free.
//!
//! Policies keep their own indexes (bins, free lists, bitmaps) on top and tell the tiling
//! about every split, merge, hand-out and release. In return the tiling gives each policy the
//! same snapshot, the same `inactive_split` accounting (free chunks of segments cut in two or
//! more pieces, counted by the chunk's own size class) and the physical neighbours of a chunk.
//! A per-chunk `tag` carries what a policy needs to remember about a chunk (which free list it
//! is on, which layer owns it).
//!
//! Segments are device segments, or for a policy on address reservations (VMM) maximal mapped
//! ranges: those grow by [`Tiling::join`] and shrink by [`Tiling::cut_out`].
//!
//! **Architecture Invariant:** chunks never cross a segment boundary: merges are refused across
//! segments, so returning a segment to the device never cuts a chunk.

use super::common::Books;
use allocsim_core::{
    AllocId, BlockState, FreeSpace, Pool, SnapshotBlock, SnapshotSegment, StreamId,
};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, Copy)]
pub struct Chunk<T> {
    pub size: u64,
    /// Base of the segment holding the chunk (kept up to date by `join` and `cut_out`).
    seg: u64,
    pub owner: Option<AllocId>,
    pub tag: T,
}

impl<T> Chunk<T> {
    pub fn is_free(&self) -> bool {
        self.owner.is_none()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Seg {
    pub size: u64,
    pub stream: StreamId,
    pub pool: Pool,
    pub expandable: bool,
    /// Reserved for one block, and returned when it is freed ([`crate::kit::Rules::dedicated`]).
    pub dedicated: bool,
    pieces: u64,
    /// Free chunks and their bytes, by the chunk's size class (small, large).
    free: [(u64, u64); 2],
}

impl Seg {
    /// The segment is one free chunk: it can go back to the device.
    pub fn is_wholly_free(&self) -> bool {
        self.pieces == 1 && self.free[0].0 + self.free[1].0 == 1
    }
}

/// The pool class a chunk of `size` bytes counts in for `inactive_split`.
fn class(size: u64) -> usize {
    pool_index(Pool::for_size(size))
}

#[derive(Debug, Clone)]
pub struct Tiling<T> {
    segs: BTreeMap<u64, Seg>,
    chunks: BTreeMap<u64, Chunk<T>>,
    /// Σ over segments of two or more pieces of their free chunks: `inactive_split`.
    split: [(u64, u64); 2],
    /// How many free chunks of each size, in small and in large segments: the largest free
    /// chunk in O(log n), which every OOM asks for (a scan made replay quadratic under OOMs).
    free_sizes: [BTreeMap<u64, u64>; 2],
    /// The segments that are one free chunk, by base: what can go back to the device, found
    /// without a walk over every segment on each refused reservation.
    wholly_free: BTreeSet<u64>,
}

impl<T> Default for Tiling<T> {
    fn default() -> Self {
        Tiling {
            segs: BTreeMap::new(),
            chunks: BTreeMap::new(),
            split: [(0, 0); 2],
            free_sizes: [BTreeMap::new(), BTreeMap::new()],
            wholly_free: BTreeSet::new(),
        }
    }
}

/// The index of `pool` in per-pool arrays (small, large).
fn pool_index(pool: Pool) -> usize {
    match pool {
        Pool::Small => 0,
        Pool::Large => 1,
    }
}

impl<T: Copy> Tiling<T> {
    /// A new segment from the device, as one free chunk tagged `tag`.
    pub fn add_segment(&mut self, base: u64, size: u64, stream: StreamId, tag: T) {
        self.add_segment_in(base, size, stream, Pool::for_size(size), false, tag);
    }

    /// A new segment counted in `pool`; `expandable` for mapped ranges of a reservation.
    pub fn add_segment_in(
        &mut self,
        base: u64,
        size: u64,
        stream: StreamId,
        pool: Pool,
        expandable: bool,
        tag: T,
    ) {
        let mut free = [(0, 0); 2];
        free[class(size)] = (1, size);
        let seg = Seg { size, stream, pool, expandable, dedicated: false, pieces: 1, free };
        self.segs.insert(base, seg);
        self.chunks.insert(base, Chunk { size, seg: base, owner: None, tag });
        self.index(pool, size, 1);
        self.wholly_free.insert(base);
    }

    /// The segment at `base` is reserved for the one block it holds.
    pub fn dedicate(&mut self, base: u64) {
        if let Some(seg) = self.segs.get_mut(&base) {
            seg.dedicated = true;
        }
    }

    /// Put `base` in `wholly_free` or take it out, as its segment now is (or is gone).
    fn refresh(&mut self, base: u64) {
        if self.segs.get(&base).is_some_and(Seg::is_wholly_free) {
            self.wholly_free.insert(base);
        } else {
            self.wholly_free.remove(&base);
        }
    }

    /// The bases of the segments that are one free chunk, in address order.
    pub fn wholly_free_segments(&self) -> impl Iterator<Item = u64> + '_ {
        self.wholly_free.iter().copied()
    }

    /// One more (`sign` 1) or one fewer (-1) free chunk of `size` bytes in a `pool` segment.
    fn index(&mut self, pool: Pool, size: u64, sign: i64) {
        let sizes = &mut self.free_sizes[pool_index(pool)];
        if sign > 0 {
            *sizes.entry(size).or_insert(0) += 1;
        } else if let Some(n) = sizes.get_mut(&size) {
            *n -= 1;
            if *n == 0 {
                sizes.remove(&size);
            }
        }
    }

    /// The base of the segment holding `addr`.
    pub fn seg_of(&self, addr: u64) -> Option<u64> {
        let (&base, seg) = self.segs.range(..=addr).next_back()?;
        (addr < base + seg.size).then_some(base)
    }

    /// Make the segment at `right`, which starts where the one at `left` ends, part of it.
    /// Their chunks stay as they are (the caller merges free neighbours if it wants).
    pub fn join(&mut self, left: u64, right: u64) -> bool {
        let (Some(&l), Some(&r)) = (self.segs.get(&left), self.segs.get(&right)) else {
            return false;
        };
        if left + l.size != right {
            return false;
        }
        self.uncount(left);
        self.uncount(right);
        self.segs.remove(&right);
        let mut moved = Vec::new();
        for (_, c) in self.chunks.range_mut(right..right + r.size) {
            c.seg = left;
            if c.is_free() && r.pool != l.pool {
                moved.push(c.size);
            }
        }
        for size in moved {
            self.index(r.pool, size, -1);
            self.index(l.pool, size, 1);
        }
        if let Some(l) = self.segs.get_mut(&left) {
            l.size += r.size;
            l.pieces += r.pieces;
            for (a, b) in l.free.iter_mut().zip(r.free) {
                a.0 += b.0;
                a.1 += b.1;
            }
        }
        self.count(left);
        self.refresh(left);
        self.refresh(right);
        true
    }

    /// Remove the free chunk at `addr` from its segment, which splits around it (or goes when
    /// nothing is left). Returns the chunk's size. Costs a walk over the chunks after it.
    pub fn cut_out(&mut self, addr: u64) -> Option<u64> {
        let c = *self.chunks.get(&addr).filter(|c| c.is_free())?;
        let base = c.seg;
        let seg = *self.segs.get(&base)?;
        self.uncount(base);
        self.chunks.remove(&addr);
        self.index(seg.pool, c.size, -1);
        let (end, right) = (base + seg.size, addr + c.size);
        let mut r = Seg { size: end - right, pieces: 0, free: [(0, 0); 2], ..seg };
        for (_, chunk) in self.chunks.range_mut(right..end) {
            chunk.seg = right;
            r.pieces += 1;
            if chunk.is_free() {
                r.free[class(chunk.size)].0 += 1;
                r.free[class(chunk.size)].1 += chunk.size;
            }
        }
        let mut l = Seg { size: addr - base, pieces: seg.pieces - 1 - r.pieces, ..seg };
        l.free[class(c.size)].0 -= 1;
        l.free[class(c.size)].1 -= c.size;
        for (a, b) in l.free.iter_mut().zip(r.free) {
            a.0 -= b.0;
            a.1 -= b.1;
        }
        self.segs.remove(&base);
        if l.size > 0 {
            self.segs.insert(base, l);
            self.count(base);
        }
        if r.size > 0 {
            self.segs.insert(right, r);
            self.count(right);
        }
        self.refresh(base);
        self.refresh(right);
        Some(c.size)
    }

    /// Forget a wholly free segment (the caller returns it to the device).
    pub fn remove_segment(&mut self, base: u64) -> Option<Seg> {
        let seg = *self.segs.get(&base)?;
        if !seg.is_wholly_free() {
            return None;
        }
        self.segs.remove(&base);
        self.chunks.remove(&base);
        self.index(seg.pool, seg.size, -1);
        self.wholly_free.remove(&base);
        Some(seg)
    }

    pub fn seg(&self, base: u64) -> Option<&Seg> {
        self.segs.get(&base)
    }

    pub fn segments(&self) -> impl Iterator<Item = (u64, &Seg)> + '_ {
        self.segs.iter().map(|(&b, s)| (b, s))
    }

    pub fn get(&self, addr: u64) -> Option<&Chunk<T>> {
        self.chunks.get(&addr)
    }

    pub fn set_tag(&mut self, addr: u64, tag: T) {
        if let Some(c) = self.chunks.get_mut(&addr) {
            c.tag = tag;
        }
    }

    /// The chunk that holds `addr`, if any segment does.
    pub fn chunk_at(&self, addr: u64) -> Option<(u64, Chunk<T>)> {
        self.seg_of(addr)?;
        self.chunks.range(..=addr).next_back().map(|(&a, &c)| (a, c))
    }

    /// The segments overlapping `[start, end)`, highest first: (base, size).
    pub fn segments_in_rev(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.segs
            .range(..end)
            .rev()
            .map(|(&b, s)| (b, s.size))
            .take_while(move |&(b, s)| b + s > start)
    }

    /// Where the first segment at or after `addr` starts.
    pub fn next_segment_from(&self, addr: u64) -> Option<u64> {
        self.segs.range(addr..).next().map(|(&b, _)| b)
    }

    /// The chunk before `addr` in the same segment.
    pub fn prev(&self, addr: u64) -> Option<(u64, Chunk<T>)> {
        if addr == self.chunks.get(&addr)?.seg {
            return None;
        }
        self.chunks.range(..addr).next_back().map(|(&a, &p)| (a, p))
    }

    /// The chunk after `addr` in the same segment.
    pub fn next(&self, addr: u64) -> Option<(u64, Chunk<T>)> {
        let c = self.chunks.get(&addr)?;
        let end = addr + c.size;
        let n = self.chunks.get(&end)?;
        (n.seg == c.seg).then_some((end, *n))
    }

    /// Every free chunk in address order, with its segment.
    pub fn free_chunks(&self) -> impl Iterator<Item = (u64, &Chunk<T>, &Seg)> + '_ {
        self.chunks
            .iter()
            .filter(|(_, c)| c.is_free())
            .filter_map(|(&a, c)| Some((a, c, self.segs.get(&c.seg)?)))
    }

    /// The chunks of the segment at `base`, in address order.
    pub fn chunks_of(&self, base: u64) -> impl Iterator<Item = (u64, &Chunk<T>)> + '_ {
        let end = self.segs.get(&base).map_or(base, |s| base + s.size);
        self.chunks.range(base..end).map(|(&a, c)| (a, c))
    }

    /// Cut the free chunk at `addr` after `first` bytes; the rest is a new free chunk tagged
    /// `rest_tag`. Returns the rest's address, or `None` when there is nothing to cut.
    pub fn split(&mut self, addr: u64, first: u64, rest_tag: T) -> Option<u64> {
        let c = *self.chunks.get(&addr)?;
        if first == 0 || first >= c.size || !c.is_free() {
            return None;
        }
        let rest = addr + first;
        if let Some(head) = self.chunks.get_mut(&addr) {
            head.size = first;
        }
        let tail = Chunk { size: c.size - first, seg: c.seg, owner: None, tag: rest_tag };
        self.chunks.insert(rest, tail);
        self.adjust(c.seg, 1, &[(c.size, -1), (first, 1), (c.size - first, 1)]);
        Some(rest)
    }

    /// Merge the free chunk at `addr` with the free chunks beside it in its segment that
    /// `alike` accepts, the next one first; `unindex` hears of each just before it merges (a
    /// policy's index drops it). Returns the merged chunk's address.
    pub fn coalesce(
        &mut self,
        addr: u64,
        alike: impl Fn(&Chunk<T>) -> bool,
        mut unindex: impl FnMut(&mut Self, u64, Chunk<T>),
    ) -> u64 {
        let mut at = addr;
        if let Some((next, c)) = self.next(at).filter(|(_, c)| c.is_free() && alike(c)) {
            unindex(self, next, c);
            self.merge_next(at);
        }
        if let Some((prev, c)) = self.prev(at).filter(|(_, c)| c.is_free() && alike(c)) {
            unindex(self, prev, c);
            self.merge_next(prev);
            at = prev;
        }
        at
    }

    /// Merge the free chunk after `addr` (same segment) into the free chunk at `addr`.
    pub fn merge_next(&mut self, addr: u64) -> bool {
        let Some((next_addr, next)) = self.next(addr) else { return false };
        let Some(&c) = self.chunks.get(&addr) else { return false };
        if !c.is_free() || !next.is_free() {
            return false;
        }
        self.chunks.remove(&next_addr);
        if let Some(head) = self.chunks.get_mut(&addr) {
            head.size = c.size + next.size;
        }
        self.adjust(c.seg, -1, &[(c.size, -1), (next.size, -1), (c.size + next.size, 1)]);
        true
    }

    /// The free chunk at `addr` is handed out to `id`.
    pub fn take(&mut self, addr: u64, id: AllocId) {
        let Some(c) = self.chunks.get_mut(&addr).filter(|c| c.is_free()) else { return };
        c.owner = Some(id);
        let (seg, size) = (c.seg, c.size);
        self.adjust(seg, 0, &[(size, -1)]);
    }

    /// The chunk at `addr` is free again, tagged `tag`.
    pub fn release(&mut self, addr: u64, tag: T) {
        let Some(c) = self.chunks.get_mut(&addr).filter(|c| !c.is_free()) else { return };
        c.owner = None;
        c.tag = tag;
        let (seg, size) = (c.seg, c.size);
        self.adjust(seg, 0, &[(size, 1)]);
    }

    /// `inactive_split` and `inactive_split_bytes` now, per pool (small, large).
    pub fn inactive_split(&self) -> [(u64, u64); 2] {
        self.split
    }

    /// The largest free chunk in small and in large segments.
    pub fn largest_free(&self) -> (u64, u64) {
        let largest = |sizes: &BTreeMap<u64, u64>| sizes.keys().next_back().copied().unwrap_or(0);
        (largest(&self.free_sizes[0]), largest(&self.free_sizes[1]))
    }

    /// The largest free chunk of any segment.
    pub fn largest_free_chunk(&self) -> u64 {
        let (small, large) = self.largest_free();
        small.max(large)
    }

    /// Cached free memory (from `books`' statistics: reserved but not active) and its
    /// largest piece, without a walk over the chunks.
    pub fn free_space(&self, books: &Books) -> FreeSpace {
        let stats = &books.stats;
        let cached = stats.reserved_bytes.all.current - stats.active_bytes.all.current;
        FreeSpace {
            cached_bytes: cached.max(0) as u64,
            largest_free_block_bytes: self.largest_free_chunk(),
        }
    }

    /// Segments with their blocks, states and requested sizes from `books`.
    pub fn snapshot(&self, books: &Books) -> Vec<SnapshotSegment> {
        self.segs
            .iter()
            .map(|(&base, seg)| SnapshotSegment {
                pool_id: allocsim_core::MemPoolId::DEFAULT,
                address: base,
                total_size: seg.size,
                stream: seg.stream,
                pool: seg.pool,
                is_expandable: seg.expandable,
                blocks: self
                    .chunks_of(base)
                    .map(|(addr, c)| snapshot_block(books, addr, c.size, c.owner))
                    .collect(),
            })
            .collect()
    }

    /// One segment's pieces change by `pieces` and its free chunks by `changes` (size, +1/-1):
    /// update it and its share of `inactive_split` in one look-up.
    fn adjust(&mut self, base: u64, pieces: i64, changes: &[(u64, i64)]) {
        let Some(pool) = self.segs.get(&base).map(|s| s.pool) else { return };
        for &(size, sign) in changes {
            self.index(pool, size, sign);
        }
        let Some(s) = self.segs.get_mut(&base) else { return };
        let before = (s.pieces >= 2).then_some(s.free);
        s.pieces = s.pieces.saturating_add_signed(pieces);
        for &(size, sign) in changes {
            let f = &mut s.free[class(size)];
            if sign > 0 {
                f.0 += 1;
                f.1 += size;
            } else {
                f.0 -= 1;
                f.1 -= size;
            }
        }
        let after = (s.pieces >= 2).then_some(s.free);
        for (t, (b, a)) in self
            .split
            .iter_mut()
            .zip(before.unwrap_or([(0, 0); 2]).into_iter().zip(after.unwrap_or([(0, 0); 2])))
        {
            t.0 = t.0 + a.0 - b.0;
            t.1 = t.1 + a.1 - b.1;
        }
        self.refresh(base);
    }

    fn uncount(&mut self, base: u64) {
        if let Some(s) = self.segs.get(&base).filter(|s| s.pieces >= 2) {
            for (t, f) in self.split.iter_mut().zip(s.free) {
                t.0 -= f.0;
                t.1 -= f.1;
            }
        }
    }

    fn count(&mut self, base: u64) {
        if let Some(s) = self.segs.get(&base).filter(|s| s.pieces >= 2) {
            for (t, f) in self.split.iter_mut().zip(s.free) {
                t.0 += f.0;
                t.1 += f.1;
            }
        }
    }
}

impl<T: Copy + PartialEq> Tiling<T> {
    /// Merge the free chunk at `addr` with the free chunks beside it that carry its tag (a
    /// coalescing free list: one list per tag), keeping `index` (that list's chunks by
    /// (size, address)) in step; the merged chunk joins it.
    pub fn merge_alike(&mut self, addr: u64, index: &mut BTreeSet<(u64, u64)>) {
        let Some(tag) = self.get(addr).map(|c| c.tag) else { return };
        let at = self.coalesce(
            addr,
            |c| c.tag == tag,
            |_, a, c| {
                index.remove(&(c.size, a));
            },
        );
        if let Some(c) = self.get(at) {
            index.insert((c.size, at));
        }
    }
}

/// A snapshot block for the chunk at `addr`, its state taken from the books.
pub(crate) fn snapshot_block(
    books: &Books,
    addr: u64,
    size: u64,
    owner: Option<AllocId>,
) -> SnapshotBlock {
    let live = owner.and_then(|id| books.live.get(&id));
    SnapshotBlock {
        address: addr,
        size,
        requested_size: live.map_or(0, |l| l.requested),
        state: match live {
            Some(l) if l.pending => BlockState::ActivePendingFree,
            Some(_) => BlockState::ActiveAllocated,
            None => BlockState::Inactive,
        },
    }
}
