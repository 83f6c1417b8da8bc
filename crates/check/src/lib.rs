//! The independent checker: verifies an allocator's event stream and statistics, never its
//! internals.
//!
//! In the manner of regalloc2's `Checker`, it rebuilds from the events alone what the memory
//! must look like (which segments and mapped pages are live, which blocks are live in them,
//! what the statistics must read), so a bug in a policy cannot hide behind the same bug in its
//! own bookkeeping. It is fed event by event ([`Checker::on_event`]) and, after each op, the
//! allocator's statistics ([`Checker::on_stats`]), so the replay engine can run it alongside
//! any policy on any trace without holding the event log.
//!
//! Every violation is reported with the index of the event that caused it, and checking goes
//! on after one: a report lists all of them (stored up to a cap, all counted), as a compiler
//! lists all errors. Each check is O(log n) in live blocks and segments.
//!
//! **Architecture Invariant:** depends on `allocsim-core` only, and on nothing a policy
//! exposes beyond `Event` and `MemoryStats`.

mod memory;
mod stats;
mod violation;

pub use violation::{CheckReport, Violation, ViolationKind};

use allocsim_core::{BlockState, Event, MemoryStats, StartState};
use memory::MemoryMap;
use stats::Implied;

/// What the checker needs to know about the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckConfig {
    /// Live segments plus mapped pages may never exceed this.
    pub device_total_bytes: u64,
    /// Every block address must be a multiple of this: 512 for PyTorch, 256 for BFC and RMM.
    pub alignment_bytes: u64,
    /// Compare the allocator's statistics with the events in `on_stats`.
    pub check_stats: bool,
    /// Violations kept verbatim; all are counted.
    pub max_stored_violations: usize,
}

impl Default for CheckConfig {
    /// The H100 of the bundled traces, PyTorch's alignment, statistics checked.
    fn default() -> Self {
        CheckConfig {
            device_total_bytes: 85_017_493_504,
            alignment_bytes: 512,
            check_stats: true,
            max_stored_violations: 1000,
        }
    }
}

impl CheckConfig {
    pub fn new(device_total_bytes: u64) -> Self {
        CheckConfig { device_total_bytes, ..CheckConfig::default() }
    }
}

/// Where violations go: stored up to a cap, all counted, each stamped with the current event.
#[derive(Debug)]
pub(crate) struct Sink {
    stored: Vec<Violation>,
    total: u64,
    cap: usize,
    event_index: u64,
    op_index: u64,
}

impl Sink {
    pub(crate) fn report(&mut self, kind: ViolationKind, message: String) {
        self.total += 1;
        if self.stored.len() < self.cap {
            let (event_index, op_index) = (self.event_index, self.op_index);
            self.stored.push(Violation { event_index, op_index, kind, message });
        }
    }
}

/// Checks one run. See the module doc.
#[derive(Debug)]
pub struct Checker {
    check_stats: bool,
    memory: MemoryMap,
    implied: Implied,
    sink: Sink,
    events_checked: u64,
    stats_checked: u64,
}

impl Checker {
    pub fn new(cfg: CheckConfig) -> Self {
        Checker {
            check_stats: cfg.check_stats,
            memory: MemoryMap::new(cfg.device_total_bytes, cfg.alignment_bytes),
            implied: Implied::default(),
            sink: Sink {
                stored: Vec::new(),
                total: 0,
                cap: cfg.max_stored_violations,
                event_index: 0,
                op_index: 0,
            },
            events_checked: 0,
            stats_checked: 0,
        }
    }

    /// The run starts from `start` (a recording that begins mid-run): its segments and live
    /// blocks are in the map, and the statistics the events imply start at its figures, the
    /// counters of device calls and OOMs where the allocator's `stats` start them (they count
    /// what came before). Called before the first event.
    pub fn on_start(&mut self, start: &StartState, stats: &MemoryStats) {
        let (memory, implied, sink) = (&mut self.memory, &mut self.implied, &mut self.sink);
        implied.start_counters(stats);
        for seg in &start.segments {
            if seg.is_expandable {
                memory.segment_map(sink, seg.address, seg.total_size);
            } else {
                memory.segment_alloc(sink, seg.address, seg.total_size);
            }
            implied.start_segment(seg.pool, seg.total_size, !seg.is_expandable);
            for b in seg.blocks.iter().filter(|b| b.state.is_active()) {
                let Some(id) = start.id_at(b.address) else { continue };
                if memory.alloc(sink, id, b.address, b.size, b.requested_size, seg.pool) {
                    implied.alloc(seg.pool, b.size, b.requested_size);
                }
                if b.state == BlockState::ActivePendingFree {
                    let freed =
                        memory.free_requested(sink, id, b.address, b.size, b.requested_size);
                    if freed.is_some() {
                        implied.free_requested(seg.pool, b.size);
                    }
                }
            }
        }
    }

    /// Check event number `event_index` (0-based over the run), emitted during op `op_index`.
    pub fn on_event(&mut self, event_index: u64, op_index: u64, ev: &Event) {
        self.sink.event_index = event_index;
        self.sink.op_index = op_index;
        self.events_checked += 1;
        let (memory, implied, sink) = (&mut self.memory, &mut self.implied, &mut self.sink);
        match *ev {
            Event::Alloc { id, addr, size, requested, pool, .. } => {
                if memory.alloc(sink, id, addr, size, requested, pool) {
                    implied.alloc(pool, size, requested);
                }
            }
            Event::FreeRequested { id, addr, size, requested } => {
                if let Some(live) = memory.free_requested(sink, id, addr, size, requested) {
                    implied.free_requested(live.pool, live.size);
                }
            }
            Event::FreeCompleted { id, addr, size, requested } => {
                if let Some(live) = memory.free_completed(sink, id, addr, size, requested) {
                    if !live.freed {
                        implied.free_requested(live.pool, live.size);
                    }
                    implied.free_completed(live.pool, live.size, live.requested);
                }
            }
            Event::SegmentAlloc { addr, size, pool, .. } => {
                memory.segment_alloc(sink, addr, size);
                implied.device(pool, size, 1, true);
            }
            Event::SegmentFree { addr, size, pool, .. } => {
                memory.segment_free(sink, addr, size);
                implied.device(pool, size, -1, true);
            }
            Event::SegmentMap { addr, size, pool, .. } => {
                memory.segment_map(sink, addr, size);
                implied.device(pool, size, 1, false);
            }
            Event::SegmentUnmap { addr, size, pool, .. } => {
                memory.segment_unmap(sink, addr, size);
                implied.device(pool, size, -1, false);
            }
            Event::Oom { .. } => implied.oom(),
        }
    }

    /// Check the allocator's statistics after op `op_index`; `event_index` is the number of
    /// events seen so far (the index the next event will have).
    pub fn on_stats(&mut self, event_index: u64, op_index: u64, stats: &MemoryStats) {
        if !self.check_stats {
            return;
        }
        self.sink.event_index = event_index;
        self.sink.op_index = op_index;
        self.stats_checked += 1;
        self.implied.check(&mut self.sink, stats);
    }

    /// The violations stored so far.
    pub fn violations(&self) -> &[Violation] {
        &self.sink.stored
    }

    /// All violations so far, stored or not.
    pub fn total_violations(&self) -> u64 {
        self.sink.total
    }

    pub fn finish(self) -> CheckReport {
        CheckReport {
            violations: self.sink.stored,
            total_violations: self.sink.total,
            events_checked: self.events_checked,
            stats_checked: self.stats_checked,
        }
    }
}

#[cfg(test)]
mod tests;
