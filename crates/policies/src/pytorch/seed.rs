//! Starting from a recording's state at its first entry ([`allocsim_core::StartState`]), for
//! a history that begins mid-run: the segments become blocks linked as PyTorch links them
//! (an expandable segment's mapped ranges one chain across its reservation, unmapped between;
//! one reservation per stream, size class and pool),
//! free blocks enter their pool's free set, active ones are found by their allocation ids, and
//! the statistics start at the state's `current` values.

use super::block::{Block, PrivatePool, NIL};
use super::expandable::ExpandableSegment;
use super::rounding::{K_LARGE_BUFFER, K_SMALL_BUFFER};
use super::PyTorchAllocator;
use allocsim_core::{
    BlockState, Env, MemPoolId, MemoryStats, Pool, SnapshotBlock, SnapshotSegment, StartState,
    StatArray, StreamId,
};
use std::collections::BTreeMap;

/// Where the state's segments go on the device: whole segments, and for each (stream, size
/// class, pool) the expandable segment whose mapped ranges the state shows, reserved from the first
/// of them as far as PyTorch reserves (the device's memory and an eighth, in whole pages).
struct Placement<'s> {
    whole: Vec<&'s SnapshotSegment>,
    expandable: Vec<Expandable<'s>>,
}

struct Expandable<'s> {
    stream: StreamId,
    small: bool,
    pool_id: MemPoolId,
    reserve: u64,
    page: u64,
    /// The mapped ranges, in address order, all inside `[ranges[0].address, + reserve)`.
    ranges: Vec<&'s SnapshotSegment>,
}

fn placement(start: &StartState, total_bytes: u64) -> Result<Placement<'_>, String> {
    let mut whole = Vec::new();
    let mut by_kind: BTreeMap<(StreamId, bool, MemPoolId), Vec<&SnapshotSegment>> = BTreeMap::new();
    for seg in &start.segments {
        if seg.is_expandable {
            let kind = (seg.stream, seg.pool == Pool::Small, seg.pool_id);
            by_kind.entry(kind).or_default().push(seg);
        } else {
            whole.push(seg);
        }
    }
    let mut expandable = Vec::new();
    for ((stream, small, pool_id), ranges) in by_kind {
        let page = if small { K_SMALL_BUFFER } else { K_LARGE_BUFFER };
        let reserve = total_bytes.saturating_add(total_bytes / 8).div_ceil(page).max(1) * page;
        expandable.push(Expandable { stream, small, pool_id, reserve, page, ranges });
    }
    // Nothing may overlap: the whole segments and the reservations.
    let mut spans: Vec<(u64, u64)> =
        whole.iter().map(|s| (s.address, s.address + s.total_size)).collect();
    for e in &expandable {
        let base = e.ranges[0].address;
        let last = e.ranges[e.ranges.len() - 1];
        let Some(end) = base.checked_add(e.reserve) else {
            return Err(format!("the reservation at {base:#x} ends past the address space"));
        };
        if last.address + last.total_size > end {
            return Err(format!("expandable ranges from {base:#x} exceed one reservation"));
        }
        // Whole pages at whole-page addresses, as the driver maps them (checked here, so that
        // the device cannot refuse a reservation after other segments were adopted).
        if e.ranges.iter().any(|r| r.address % e.page != 0 || r.total_size % e.page != 0) {
            return Err(format!("expandable ranges from {base:#x} are not whole pages"));
        }
        spans.push((base, end));
    }
    spans.sort_unstable();
    if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(format!("the reservation at {:#x} would overlap another", w[0].0));
    }
    Ok(Placement { whole, expandable })
}

impl PyTorchAllocator {
    pub(super) fn seed_impl(
        &mut self,
        env: &mut Env<'_>,
        start: &StartState,
        stats: Option<&MemoryStats>,
    ) -> Result<(), String> {
        let fresh = self.total_allocated_memory == 0 && self.arena.iter_live().next().is_none();
        if !fresh {
            return Err("the allocator has already run".to_string());
        }
        if let Some(problem) = start.problem() {
            return Err(problem);
        }
        let placed = placement(start, env.device.mem_info().total_bytes)?;
        // Nothing has changed yet: a refusal from here on can only be the device's, at the
        // first segment or reservation (a real device adopts none).
        for seg in &placed.whole {
            env.device
                .adopt_segment(seg.address, seg.total_size)
                .map_err(|e| format!("segment at {:#x}: {e}", seg.address))?;
            self.seed_segment(seg, start);
        }
        for e in &placed.expandable {
            let mapped: Vec<(u64, u64)> =
                e.ranges.iter().map(|r| (r.address, r.total_size)).collect();
            let base = e.ranges[0].address;
            env.device
                .adopt_reservation(base, e.reserve, &mapped)
                .map_err(|err| format!("expandable segment at {base:#x}: {err}"))?;
            self.seed_expandable(e, start);
        }
        self.stats = self.seeded_stats(stats);
        self.active_is_allocation = false;
        self.recount_releasable();
        Ok(())
    }

    /// Seeding links a block to the next after it went into its free set, so whether it is
    /// releasable (`BlockPool::releasable`) is known only at the end: listed again here.
    fn recount_releasable(&mut self) {
        let mut indices = Vec::new();
        let pools = (self.private.iter_mut().flat_map(|p| [&mut p.small, &mut p.large]))
            .chain([&mut self.small_pool, &mut self.large_pool]);
        for pool in pools {
            indices.clear();
            pool.blocks.collect_indices(&mut indices);
            pool.releasable = (indices.iter())
                .filter(|&&i| self.arena[i].releasable())
                .map(|&i| self.arena[i].size_key(i))
                .collect();
        }
    }

    /// The blocks of one segment (checked by [`StartState::problem`]), linked in address order.
    fn seed_segment(&mut self, seg: &SnapshotSegment, start: &StartState) {
        let slot = self.seeded_slot(seg.pool_id);
        let small = seg.pool == Pool::Small;
        let mut prev = NIL;
        for b in &seg.blocks {
            let mut block = Block::new(b.address, b.size, seg.stream, small);
            block.slot = slot;
            prev = self.seed_block(block, b, start, prev);
        }
        self.total_allocated_memory += seg.total_size;
    }

    /// The slot of pool `id` for a segment alive at the start, counted as one of its segments:
    /// a private pool alive at the start is held by its owner.
    fn seeded_slot(&mut self, id: MemPoolId) -> u16 {
        if id.is_default() {
            return 0;
        }
        let slot = self.slot_of(id).unwrap_or_else(|| {
            self.private.push(PrivatePool::new(id, 1));
            u16::try_from(self.private.len()).unwrap_or(u16::MAX)
        });
        self.private[usize::from(slot) - 1].segments += 1;
        slot
    }

    /// An expandable segment: its reservation cut into the mapped ranges' blocks and unmapped
    /// blocks between and after them, all one chain, as PyTorch's blocks of one segment are.
    fn seed_expandable(&mut self, e: &Expandable<'_>, start: &StartState) {
        let base = e.ranges[0].address;
        let slot = self.seeded_slot(e.pool_id);
        let index = self.segments.len() as u32;
        self.segments.push(ExpandableSegment { base, size: e.reserve, page: e.page, live: true });
        let (mut prev, mut at) = (NIL, base);
        let unmapped = |this: &mut Self, addr: u64, size: u64, prev: u32| {
            let mut gap = Block::new(addr, size, e.stream, e.small);
            gap.mapped = false;
            gap.expandable = index;
            gap.slot = slot;
            gap.prev = prev;
            let i = this.arena.insert(gap);
            if prev != NIL {
                this.arena[prev].next = i;
            }
            this.pool_mut(slot, e.small).unmapped.insert(gap.addr_key(i));
            i
        };
        for range in &e.ranges {
            if range.address > at {
                prev = unmapped(self, at, range.address - at, prev);
            }
            for b in &range.blocks {
                let mut block = Block::new(b.address, b.size, e.stream, e.small);
                block.expandable = index;
                block.slot = slot;
                prev = self.seed_block(block, b, start, prev);
            }
            at = range.address + range.total_size;
            self.total_allocated_memory += range.total_size;
        }
        if at < base + e.reserve {
            unmapped(self, at, base + e.reserve - at, prev);
        }
    }

    /// Link `block`, as the state shows it in `b`, after `prev`; enter it in its free set or
    /// its allocation's id. Returns its index.
    fn seed_block(
        &mut self,
        mut block: Block,
        b: &SnapshotBlock,
        start: &StartState,
        prev: u32,
    ) -> u32 {
        block.requested = b.requested_size;
        block.prev = prev;
        if let Some(id) = start.id_at(b.address).filter(|_| b.state.is_active()) {
            block.id = id;
            block.allocated = b.state == BlockState::ActiveAllocated;
            block.pending = b.state == BlockState::ActivePendingFree;
        }
        let index = self.arena.insert(block);
        if prev != NIL {
            self.arena[prev].next = index;
        }
        match b.state {
            BlockState::Inactive => self.insert_into_blocks(index),
            BlockState::ActiveAllocated => self.ids.set(block.id, index),
            BlockState::ActivePendingFree => {
                self.ids.set(block.id, index);
                self.pending.push(index);
            }
        }
        index
    }

    /// The statistics of the seeded blocks: `current` from the blocks, the rest from `at_start`
    /// when known; otherwise counting from here, the live blocks counted once as allocated
    /// (peaks at the current values).
    fn seeded_stats(&self, at_start: Option<&MemoryStats>) -> MemoryStats {
        let mut s = MemoryStats {
            max_split_size: self.config.max_split_size_stat(),
            ..MemoryStats::default()
        };
        let max_split = self.config.max_split_size;
        let add = |a: &mut StatArray, pool: Pool, n: u64| {
            a.all.current += n as i64;
            a.pool(pool).current += n as i64;
        };
        for (_, b) in self.arena.iter_live() {
            let pool = b.pool();
            // Mapped pages count as reserved, but an expandable segment is no `segment`.
            if b.is_expandable() {
                if b.mapped {
                    add(&mut s.reserved_bytes, pool, b.size);
                }
            } else if b.prev == NIL {
                let size = self.segment_size_from(b);
                add(&mut s.segment, pool, 1);
                add(&mut s.reserved_bytes, pool, size);
                if size >= max_split {
                    s.oversize_segments.current += 1;
                }
            }
            if b.allocated {
                add(&mut s.allocation, pool, 1);
                add(&mut s.allocated_bytes, pool, b.size);
                if b.size >= max_split {
                    s.oversize_allocations.current += 1;
                }
            }
            if b.allocated || b.pending {
                add(&mut s.active, pool, 1);
                add(&mut s.active_bytes, pool, b.size);
                add(&mut s.requested_bytes, pool, b.requested);
            } else if b.is_split() && !b.is_expandable() {
                add(&mut s.inactive_split, pool, 1);
                add(&mut s.inactive_split_bytes, pool, b.size);
            }
        }
        match at_start {
            None => {
                // The blocks alive at the start count as allocated once, so that
                // `allocated - freed == current` holds as in every PyTorch run.
                for (name, value) in s.flat() {
                    if let Some(stat) = name.strip_suffix(".current") {
                        s.set_flat(&format!("{stat}.allocated"), value);
                        s.set_flat(&format!("{stat}.peak"), value);
                    }
                }
                s
            }
            Some(given) => {
                let mut out = given.clone();
                for (name, value) in s.flat() {
                    if name.ends_with(".current") {
                        out.set_flat(&name, value);
                    }
                }
                out
            }
        }
    }

    /// The size of the segment whose first block is `first`.
    fn segment_size_from(&self, first: &Block) -> u64 {
        let (mut size, mut next) = (first.size, first.next);
        while next != NIL {
            size += self.arena[next].size;
            next = self.arena[next].next;
        }
        size
    }
}
