//! The memory map the events imply, rebuilt without the policy, and the rules it must keep.
//!
//! Three interval maps keyed by start address: whole segments, mapped pages (merged, since
//! adjacent mappings of an expandable segment are one range to a block, and an unmap may cut
//! across several maps), and live blocks. Each keeps its entries disjoint, so "what overlaps
//! `[start, end)`" is one `range(..end).next_back()` lookup, O(log n): the checker runs on
//! every event of traces with millions of them.
//!
//! An entry that would break disjointness (an overlapping segment or block) is reported and
//! kept out of the address map, but remembered, so its later free is not reported again.

use crate::Sink;
use crate::ViolationKind as K;
use allocsim_core::{AllocId, Pool};
use std::collections::{BTreeMap, HashMap};

/// A live allocation as its `Alloc` described it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Live {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub pool: Pool,
    /// `FreeRequested` seen.
    pub freed: bool,
    /// In the block address map (false if it overlapped another block or had no size).
    placed: bool,
}

#[derive(Debug, Default)]
pub(crate) struct MemoryMap {
    alignment_bytes: u64,
    total_bytes: u64,
    /// Whole segments: start -> end.
    segments: BTreeMap<u64, u64>,
    /// Segments reported as overlapping, kept out of `segments`: start -> size.
    rejected_segments: BTreeMap<u64, u64>,
    /// Mapped pages, merged: start -> end.
    mapped: BTreeMap<u64, u64>,
    /// Live blocks: start -> (end, id).
    blocks: BTreeMap<u64, (u64, AllocId)>,
    /// HashMap for O(1) lookups only; never iterated, so order cannot leak into results.
    live: HashMap<AllocId, Live>,
    reserved_bytes: u64,
}

/// The entry of `map` overlapping `[start, end)`, if any; entries must be disjoint.
fn overlapping<V>(
    map: &BTreeMap<u64, V>,
    start: u64,
    end: u64,
    end_of: fn(&V) -> u64,
) -> Option<(u64, u64)> {
    let (&s, v) = map.range(..end).next_back()?;
    (end_of(v) > start).then(|| (s, end_of(v)))
}

/// The entry of `map` wholly holding `[start, end)`, if any.
fn holding(map: &BTreeMap<u64, u64>, start: u64, end: u64) -> Option<(u64, u64)> {
    let (&s, &e) = map.range(..=start).next_back()?;
    (end <= e).then_some((s, e))
}

fn block_end(v: &(u64, AllocId)) -> u64 {
    v.0
}

fn end_of(v: &u64) -> u64 {
    *v
}

fn range_end(addr: u64, size: u64) -> u64 {
    addr.saturating_add(size)
}

impl MemoryMap {
    pub(crate) fn new(total_bytes: u64, alignment_bytes: u64) -> Self {
        MemoryMap { total_bytes, alignment_bytes: alignment_bytes.max(1), ..Default::default() }
    }

    /// `Alloc`; false (and nothing changes) if `id` is already live.
    pub(crate) fn alloc(
        &mut self,
        sink: &mut Sink,
        id: AllocId,
        addr: u64,
        size: u64,
        requested: u64,
        pool: Pool,
    ) -> bool {
        let end = range_end(addr, size);
        let what = || format!("block of id {} at {addr:#x}..{end:#x}", id.0);
        if let Some(old) = self.live.get(&id) {
            let msg = format!("{}: id {} is still live at {:#x}", what(), id.0, old.addr);
            sink.report(K::DuplicateAllocId, msg);
            return false;
        }
        if size < requested {
            sink.report(
                K::BlockTooSmall,
                format!("{}: {size} bytes, {requested} requested", what()),
            );
        }
        if !addr.is_multiple_of(self.alignment_bytes) {
            let msg = format!("{}: expected alignment to {} bytes", what(), self.alignment_bytes);
            sink.report(K::Misaligned, msg);
        }
        let placed = size > 0 && self.place_block(sink, &what, id, addr, end);
        if size == 0 {
            sink.report(K::ZeroSize, format!("{}: a block of 0 bytes", what()));
        }
        self.live.insert(id, Live { addr, size, requested, pool, freed: false, placed });
        true
    }

    /// Check containment and overlap, and enter the block in the address map if it overlaps
    /// nothing.
    fn place_block(
        &mut self,
        sink: &mut Sink,
        what: &dyn Fn() -> String,
        id: AllocId,
        addr: u64,
        end: u64,
    ) -> bool {
        let inside =
            holding(&self.segments, addr, end).or_else(|| holding(&self.mapped, addr, end));
        if inside.is_none() {
            let msg = format!(
                "{}: expected inside a live segment or mapped range, none holds it",
                what()
            );
            sink.report(K::BlockOutsideSegment, msg);
        }
        if let Some((s, e)) = overlapping(&self.blocks, addr, end, block_end) {
            let other = self.blocks.get(&s).map_or(0, |b| b.1 .0);
            let msg = format!("{}: overlaps live block of id {other} at {s:#x}..{e:#x}", what());
            sink.report(K::BlockOverlap, msg);
            return false;
        }
        self.blocks.insert(addr, (end, id));
        true
    }

    /// `FreeRequested`: the allocation as its `Alloc` described it, if it was live and not yet
    /// requested.
    pub(crate) fn free_requested(
        &mut self,
        sink: &mut Sink,
        id: AllocId,
        addr: u64,
        size: u64,
        requested: u64,
    ) -> Option<Live> {
        let Some(live) = self.live.get_mut(&id) else {
            sink.report(
                K::UnknownFree,
                format!("free_requested of id {}: no live allocation", id.0),
            );
            return None;
        };
        if live.freed {
            sink.report(K::DoubleFree, format!("free_requested of id {} a second time", id.0));
            return None;
        }
        live.freed = true;
        let live = *live;
        check_same(sink, "free_requested", id, &live, addr, size, requested);
        Some(live)
    }

    /// `FreeCompleted`: the allocation, now dead, and whether its free had been requested.
    pub(crate) fn free_completed(
        &mut self,
        sink: &mut Sink,
        id: AllocId,
        addr: u64,
        size: u64,
        requested: u64,
    ) -> Option<Live> {
        let Some(live) = self.live.remove(&id) else {
            sink.report(
                K::UnknownFree,
                format!("free_completed of id {}: no live allocation", id.0),
            );
            return None;
        };
        if !live.freed {
            let msg = format!("free_completed of id {}: expected free_requested first", id.0);
            sink.report(K::CompletedBeforeRequested, msg);
        }
        check_same(sink, "free_completed", id, &live, addr, size, requested);
        if live.placed {
            self.blocks.remove(&live.addr);
        }
        Some(live)
    }

    pub(crate) fn segment_alloc(&mut self, sink: &mut Sink, addr: u64, size: u64) {
        let end = range_end(addr, size);
        let what = || format!("segment_alloc {addr:#x}..{end:#x}");
        if size == 0 {
            return sink.report(K::ZeroSize, format!("{}: a segment of 0 bytes", what()));
        }
        if let Some(msg) = self.overlap_message(addr, end) {
            self.rejected_segments.insert(addr, size);
            return sink.report(K::SegmentOverlap, format!("{}: {msg}", what()));
        }
        self.segments.insert(addr, end);
        self.add_reserved(sink, &what, size);
    }

    pub(crate) fn segment_free(&mut self, sink: &mut Sink, addr: u64, size: u64) {
        let what = || format!("segment_free {addr:#x} of {size} bytes");
        if self.rejected_segments.get(&addr) == Some(&size) {
            self.rejected_segments.remove(&addr);
            return;
        }
        let Some(&end) = self.segments.get(&addr) else {
            return sink
                .report(K::UnknownSegment, format!("{}: no live segment starts there", what()));
        };
        if end - addr != size {
            let msg = format!("{}: expected {} bytes, as allocated", what(), end - addr);
            sink.report(K::UnknownSegment, msg);
        }
        self.check_no_live_block(sink, &what, addr, end);
        self.segments.remove(&addr);
        self.reserved_bytes -= end - addr;
    }

    pub(crate) fn segment_map(&mut self, sink: &mut Sink, addr: u64, size: u64) {
        let end = range_end(addr, size);
        let what = || format!("segment_map {addr:#x}..{end:#x}");
        if size == 0 {
            return sink.report(K::ZeroSize, format!("{}: a mapping of 0 bytes", what()));
        }
        if let Some(msg) = self.overlap_message(addr, end) {
            return sink.report(K::SegmentOverlap, format!("{}: {msg}", what()));
        }
        let mut start = addr;
        let mut stop = end;
        if let Some((&s, &e)) = self.mapped.range(..addr).next_back() {
            if e == addr {
                start = s;
            }
        }
        if let Some(e) = self.mapped.remove(&end) {
            stop = e;
        }
        self.mapped.insert(start, stop);
        self.add_reserved(sink, &what, size);
    }

    pub(crate) fn segment_unmap(&mut self, sink: &mut Sink, addr: u64, size: u64) {
        let end = range_end(addr, size);
        let what = || format!("segment_unmap {addr:#x}..{end:#x}");
        let Some((s, e)) = holding(&self.mapped, addr, end).filter(|_| size > 0) else {
            return sink.report(
                K::UnknownSegment,
                format!("{}: expected mapped pages, not all are", what()),
            );
        };
        self.check_no_live_block(sink, &what, addr, end);
        self.mapped.remove(&s);
        if s < addr {
            self.mapped.insert(s, addr);
        }
        if end < e {
            self.mapped.insert(end, e);
        }
        self.reserved_bytes -= size;
    }

    /// Why `[start, end)` may not become a segment or mapping, if it may not.
    fn overlap_message(&self, start: u64, end: u64) -> Option<String> {
        if let Some((s, e)) = overlapping(&self.segments, start, end, end_of) {
            return Some(format!("overlaps live segment {s:#x}..{e:#x}"));
        }
        let (s, e) = overlapping(&self.mapped, start, end, end_of)?;
        Some(format!("overlaps mapped range {s:#x}..{e:#x}"))
    }

    fn check_no_live_block(
        &self,
        sink: &mut Sink,
        what: &dyn Fn() -> String,
        start: u64,
        end: u64,
    ) {
        if let Some((s, e)) = overlapping(&self.blocks, start, end, block_end) {
            let id = self.blocks.get(&s).map_or(0, |b| b.1 .0);
            let msg = format!("{}: live block of id {id} at {s:#x}..{e:#x} lies in it", what());
            sink.report(K::SegmentFreedWithLiveBlock, msg);
        }
    }

    fn add_reserved(&mut self, sink: &mut Sink, what: &dyn Fn() -> String, size: u64) {
        self.reserved_bytes += size;
        if self.reserved_bytes > self.total_bytes {
            let msg = format!(
                "{}: reserved {} bytes, expected at most the device total {}",
                what(),
                self.reserved_bytes,
                self.total_bytes
            );
            sink.report(K::ReservedExceedsDevice, msg);
        }
    }
}

/// A free must name the block its `Alloc` named.
fn check_same(
    sink: &mut Sink,
    action: &str,
    id: AllocId,
    live: &Live,
    addr: u64,
    size: u64,
    requested: u64,
) {
    if (live.addr, live.size, live.requested) != (addr, size, requested) {
        sink.report(
            K::FreeMismatch,
            format!(
                "{action} of id {}: expected addr {:#x} size {} requested {} as allocated, \
                 saw addr {addr:#x} size {size} requested {requested}",
                id.0, live.addr, live.size, live.requested
            ),
        );
    }
}
