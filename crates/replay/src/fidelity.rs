//! Lockstep comparison of a simulated run with the recording it replays.
//!
//! Each simulated event is compared with the next recorded one: the action, the size the
//! recording carries for it (the unrounded request for `alloc` and frees, the rounded request
//! for `oom`, the segment size for segment events) and, for blocks, which segment they lie in
//! and at what offset. Segments are told by the order in which each side reserved them (those
//! alive at the start first, by address), and blocks by their offset, rather than by address,
//! because a run on the modelled device gets other addresses than the driver gave, while a
//! faithful policy still places every block in the same segment at the same offset.

use crate::Observer;
use allocsim_core::{Allocator, Event, RecordedEvent, RecordedKind, StartState};
use std::collections::BTreeMap;

/// The first place where simulation and recording part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// Index into the recorded events (and the simulated ones: they agree up to here).
    pub event_index: u64,
    /// The op during which the simulated event happened (or the recorded one, if the
    /// simulation ran out of events).
    pub op_index: u64,
    pub expected: Option<String>,
    pub simulated: Option<String>,
}

/// Address ranges of one side's segments, to turn addresses into (segment, offset): start ->
/// (end, made by mapping, the segment's number in the order this side reserved them).
#[derive(Debug, Default)]
struct Regions {
    ranges: BTreeMap<u64, (u64, bool, u64)>,
    reserved: u64,
}

impl Regions {
    /// A segment (`mapped` false) is a region of its own, even when the driver placed it right
    /// after another one; mapped pages (`mapped` true) extend the mapped region they touch,
    /// since expandable segments grow by mapping pages next to mapped ones.
    fn add(&mut self, addr: u64, size: u64, mapped: bool) {
        let end = addr + size;
        if mapped {
            if let Some((_, (region_end, true, _))) = self.ranges.range_mut(..=addr).next_back() {
                if *region_end >= addr {
                    *region_end = (*region_end).max(end);
                    return;
                }
            }
        }
        self.ranges.insert(addr, (end, mapped, self.reserved));
        self.reserved += 1;
    }

    fn remove(&mut self, addr: u64) {
        self.ranges.remove(&addr);
    }

    /// The segment `addr` lies in (its number) and the offset there; the address itself
    /// outside every segment.
    fn place(&self, addr: u64) -> (Option<u64>, u64) {
        match self.ranges.range(..=addr).next_back() {
            Some((&start, &(end, _, n))) if addr < end => (Some(n), addr - start),
            _ => (None, addr),
        }
    }
}

/// What one side says happened, reduced to what both sides can be compared on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Comparable {
    action: &'static str,
    size: u64,
    /// A block's segment number and offset.
    place: Option<(Option<u64>, u64)>,
}

impl std::fmt::Display for Comparable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} size {}", self.action, self.size)?;
        match self.place {
            Some((Some(segment), o)) => write!(f, " at offset {o} of segment #{segment}"),
            Some((None, addr)) => write!(f, " at {addr:#x}, in no segment"),
            None => Ok(()),
        }
    }
}

/// The fidelity observer: remembers the first divergence and lets the run go on.
#[derive(Debug)]
pub struct Fidelity<'r> {
    recorded: &'r [RecordedEvent],
    next: usize,
    recorded_regions: Regions,
    simulated_regions: Regions,
    divergence: Option<Divergence>,
}

impl<'r> Fidelity<'r> {
    pub fn new(recorded: &'r [RecordedEvent]) -> Self {
        Fidelity {
            recorded,
            next: 0,
            recorded_regions: Regions::default(),
            simulated_regions: Regions::default(),
            divergence: None,
        }
    }

    /// `Ok(events compared)` when the run matched the whole recording.
    pub fn finish(self) -> Result<u64, Divergence> {
        if let Some(d) = self.divergence {
            return Err(d);
        }
        if let Some(extra) = self.recorded.get(self.next) {
            let mut regions = self.recorded_regions;
            return Err(Divergence {
                event_index: self.next as u64,
                op_index: extra.op,
                expected: Some(recorded_comparable(extra, &mut regions).to_string()),
                simulated: None,
            });
        }
        Ok(self.next as u64)
    }
}

fn recorded_comparable(e: &RecordedEvent, regions: &mut Regions) -> Comparable {
    let block = |regions: &Regions| Some(regions.place(e.addr));
    let place = match e.kind {
        RecordedKind::SegmentAlloc | RecordedKind::SegmentMap => {
            regions.add(e.addr, e.size, e.kind == RecordedKind::SegmentMap);
            None
        }
        RecordedKind::SegmentFree => {
            regions.remove(e.addr);
            None
        }
        RecordedKind::SegmentUnmap | RecordedKind::Oom => None,
        RecordedKind::Alloc | RecordedKind::FreeRequested | RecordedKind::FreeCompleted => {
            block(regions)
        }
    };
    Comparable { action: e.kind.action(), size: e.size, place }
}

fn simulated_comparable(e: &Event, regions: &mut Regions) -> Comparable {
    let (size, place) = match *e {
        Event::SegmentAlloc { addr, size, .. } => {
            regions.add(addr, size, false);
            (size, None)
        }
        Event::SegmentMap { addr, size, .. } => {
            regions.add(addr, size, true);
            (size, None)
        }
        Event::SegmentFree { addr, size, .. } => {
            regions.remove(addr);
            (size, None)
        }
        Event::SegmentUnmap { size, .. } | Event::Oom { size, .. } => (size, None),
        Event::Alloc { addr, requested, .. }
        | Event::FreeRequested { addr, requested, .. }
        | Event::FreeCompleted { addr, requested, .. } => (requested, Some(regions.place(addr))),
    };
    Comparable { action: e.action(), size, place }
}

impl Observer for Fidelity<'_> {
    /// Both sides start with the recording's segments at the recorded addresses.
    fn on_start(&mut self, start: &StartState, _allocator: &dyn Allocator) {
        for seg in &start.segments {
            let mapped = seg.is_expandable;
            self.recorded_regions.add(seg.address, seg.total_size, mapped);
            self.simulated_regions.add(seg.address, seg.total_size, mapped);
        }
    }

    fn on_event(&mut self, event_index: u64, op_index: u64, event: &Event) -> bool {
        if self.divergence.is_some() {
            return true;
        }
        let simulated = simulated_comparable(event, &mut self.simulated_regions);
        let expected = self
            .recorded
            .get(self.next)
            .map(|r| recorded_comparable(r, &mut self.recorded_regions));
        if expected == Some(simulated) {
            self.next += 1;
            return true;
        }
        self.divergence = Some(Divergence {
            event_index,
            op_index,
            expected: expected.map(|e| e.to_string()),
            simulated: Some(simulated.to_string()),
        });
        // Keep running: the statistics at the end are still worth comparing.
        true
    }
}
