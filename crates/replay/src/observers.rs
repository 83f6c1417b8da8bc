//! The observer interface and the small observers: the event log and the checker adapter.

use crate::OpOutcome;
use allocsim_check::Checker;
use allocsim_core::{
    Allocator, Device, Event, Op, RecordedEvent, RecordedKind, StartState, StreamId,
};
use std::io::Write;

/// Sees every event and every finished op of a run. Return `false` to stop the run.
///
/// Two callbacks, because some observers need the allocator's own view (its statistics, its
/// free space) and that is only consistent between ops, while others need each event as it
/// happens: `on_event` runs while the allocator is inside the op (the engine's event sink
/// calls it), `on_op` once the op is done. Observers get shared references only: they can
/// never steer the policy.
pub trait Observer {
    /// The allocator starts from `start` instead of empty (a recording that begins mid-run,
    /// seeded into the policy; `allocator` holds it now): called once, before any event.
    fn on_start(&mut self, start: &StartState, allocator: &dyn Allocator) {
        let _ = (start, allocator);
    }

    fn on_event(&mut self, event_index: u64, op_index: u64, event: &Event) -> bool {
        let _ = (event_index, op_index, event);
        true
    }

    fn on_op(
        &mut self,
        op_index: u64,
        op: &Op,
        outcome: &OpOutcome,
        allocator: &dyn Allocator,
        device: &dyn Device,
    ) -> bool {
        let _ = (op_index, op, outcome, allocator, device);
        true
    }
}

/// A list of observers is one observer: each sees everything, and any of them can stop the run.
impl Observer for [&mut dyn Observer] {
    fn on_start(&mut self, start: &StartState, allocator: &dyn Allocator) {
        for o in self.iter_mut() {
            o.on_start(start, allocator);
        }
    }

    fn on_event(&mut self, event_index: u64, op_index: u64, event: &Event) -> bool {
        let mut keep_going = true;
        for o in self.iter_mut() {
            keep_going &= o.on_event(event_index, op_index, event);
        }
        keep_going
    }

    fn on_op(
        &mut self,
        op_index: u64,
        op: &Op,
        outcome: &OpOutcome,
        allocator: &dyn Allocator,
        device: &dyn Device,
    ) -> bool {
        let mut keep_going = true;
        for o in self.iter_mut() {
            keep_going &= o.on_op(op_index, op, outcome, allocator, device);
        }
        keep_going
    }
}

/// Writes every event as one line of text. The format is stable and byte-identical for the
/// same trace, policy, device and seed: the determinism oracle compares these logs.
#[derive(Debug)]
pub struct EventLog<W: Write> {
    out: W,
    error: Option<std::io::Error>,
}

impl<W: Write> EventLog<W> {
    pub fn new(out: W) -> Self {
        EventLog { out, error: None }
    }

    /// The writer back, or the first write error.
    pub fn finish(mut self) -> std::io::Result<W> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One event as a line: `event op action key=value...`.
pub fn format_event(event_index: u64, op_index: u64, event: &Event) -> String {
    let head = format!("{event_index} {op_index} {}", event.action());
    match event {
        Event::SegmentAlloc { addr, size, stream, pool }
        | Event::SegmentFree { addr, size, stream, pool }
        | Event::SegmentMap { addr, size, stream, pool }
        | Event::SegmentUnmap { addr, size, stream, pool } => {
            format!(
                "{head} addr={addr:#x} size={size} stream={} pool={}",
                stream.0,
                pool.segment_type()
            )
        }
        Event::Alloc { id, addr, size, requested, stream, pool } => format!(
            "{head} id={} addr={addr:#x} size={size} requested={requested} stream={} pool={}",
            id.0,
            stream.0,
            pool.segment_type()
        ),
        Event::FreeRequested { id, addr, size, requested }
        | Event::FreeCompleted { id, addr, size, requested } => {
            format!("{head} id={} addr={addr:#x} size={size} requested={requested}", id.0)
        }
        Event::Oom { id, size, stream, info } => format!(
            "{head} id={} size={size} stream={} device_free={} reserved={} allocated={}",
            id.0, stream.0, info.device_free_bytes, info.reserved_bytes, info.allocated_bytes
        ),
    }
}

impl<W: Write> Observer for EventLog<W> {
    fn on_event(&mut self, event_index: u64, op_index: u64, event: &Event) -> bool {
        if self.error.is_none() {
            if let Err(e) = writeln!(self.out, "{}", format_event(event_index, op_index, event)) {
                self.error = Some(e);
            }
        }
        self.error.is_none()
    }
}

/// Runs the independent checker over the run: every event, and the statistics after each op.
#[derive(Debug)]
pub struct CheckObserver {
    pub checker: Checker,
    last_event_index: u64,
    stop_at_violation: bool,
}

impl CheckObserver {
    /// Checks the whole run, reporting every violation.
    pub fn new(checker: Checker) -> Self {
        CheckObserver { checker, last_event_index: 0, stop_at_violation: false }
    }

    /// Stops the run at the first violation: a broken policy's later state is garbage, and
    /// walking it can take without bound (for generated programs and fuzzing).
    pub fn stopping(checker: Checker) -> Self {
        CheckObserver { stop_at_violation: true, ..CheckObserver::new(checker) }
    }

    fn keep_going(&self) -> bool {
        !self.stop_at_violation || self.checker.total_violations() == 0
    }
}

impl Observer for CheckObserver {
    fn on_start(&mut self, start: &StartState, allocator: &dyn Allocator) {
        self.checker.on_start(start, &allocator.stats());
    }

    fn on_event(&mut self, event_index: u64, op_index: u64, event: &Event) -> bool {
        self.checker.on_event(event_index, op_index, event);
        self.last_event_index = event_index;
        self.keep_going()
    }

    fn on_op(
        &mut self,
        op_index: u64,
        _op: &Op,
        _outcome: &OpOutcome,
        allocator: &dyn Allocator,
        _device: &dyn Device,
    ) -> bool {
        self.checker.on_stats(self.last_event_index, op_index, &allocator.stats());
        self.keep_going()
    }
}

/// Keeps the run's events in the shape of a recording (`RecordedEvent`s tagged with their op),
/// so a simulated run can be written out as a trace or a PyTorch snapshot and compared with
/// a real one by the same tools.
#[derive(Debug, Default)]
pub struct Recorder {
    pub events: Vec<RecordedEvent>,
    recording: Recording,
}

impl Observer for Recorder {
    fn on_event(&mut self, _event_index: u64, op: u64, event: &Event) -> bool {
        self.events.push(self.recording.event(op, event));
        true
    }
}

/// Hands each of the run's events, in the shape of a recording, to its function as the run
/// goes ([`Recorder`] without the list): a writer of the run holds no event. The function's
/// false stops the run.
#[derive(Debug)]
pub struct RecordedTo<F> {
    to: F,
    recording: Recording,
}

impl<F: FnMut(&RecordedEvent) -> bool> RecordedTo<F> {
    pub fn new(to: F) -> Self {
        RecordedTo { to, recording: Recording::default() }
    }
}

impl<F: FnMut(&RecordedEvent) -> bool> Observer for RecordedTo<F> {
    fn on_event(&mut self, _event_index: u64, op: u64, event: &Event) -> bool {
        (self.to)(&self.recording.event(op, event))
    }
}

/// An event as a recording shows it.
#[derive(Debug, Default)]
struct Recording {
    /// Stream of each live block by address: PyTorch records it on free entries too.
    streams: std::collections::HashMap<u64, StreamId>,
}

impl Recording {
    fn event(&mut self, op: u64, event: &Event) -> RecordedEvent {
        use RecordedKind as K;
        let (kind, addr, size, stream) = match *event {
            Event::SegmentAlloc { addr, size, stream, .. } => (K::SegmentAlloc, addr, size, stream),
            Event::SegmentFree { addr, size, stream, .. } => (K::SegmentFree, addr, size, stream),
            Event::SegmentMap { addr, size, stream, .. } => (K::SegmentMap, addr, size, stream),
            Event::SegmentUnmap { addr, size, stream, .. } => (K::SegmentUnmap, addr, size, stream),
            Event::Alloc { addr, requested, stream, .. } => {
                self.streams.insert(addr, stream);
                (K::Alloc, addr, requested, stream)
            }
            Event::FreeRequested { addr, requested, .. } => {
                let stream = self.streams.get(&addr).copied().unwrap_or_default();
                (K::FreeRequested, addr, requested, stream)
            }
            Event::FreeCompleted { addr, requested, .. } => {
                let stream = self.streams.remove(&addr).unwrap_or_default();
                (K::FreeCompleted, addr, requested, stream)
            }
            Event::Oom { size, stream, info, .. } => (K::Oom, info.device_free_bytes, size, stream),
        };
        RecordedEvent { op, kind, addr, size, stream }
    }
}
