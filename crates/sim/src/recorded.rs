//! A device that follows a recording (docs/fidelity-notes.md §1–3).
//!
//! Replaying a PyTorch snapshot under its own settings should reproduce the run exactly, and
//! two things the trace alone cannot model decide that: the addresses the driver returned
//! (they break ties between equal free blocks) and the moments the driver said no earlier than
//! arithmetic predicts. So this device answers each reservation from the recording while the
//! policy makes the same device calls as the recorded allocator, and from the model
//! ([`SimDevice`]) from the first call where it does not.
//!
//! Rules, per op (`begin_op(i)` makes the recorded segment events of op `i` the expected ones,
//! walked in order by a cursor):
//! - `malloc(size)`: next expected `segment_alloc` of `size` → granted at the recorded
//!   address; next expected `segment_free`/`segment_unmap`/`oom` → refused with `OutOfMemory`
//!   (the recorded allocator had to free or fail first), cursor unmoved; anything else → a
//!   divergence.
//! - `map(addr, size)`: the same, with `segment_map` of the same address and size.
//! - `free`/`unmap`: next expected `segment_free`/`segment_unmap` of the same address and size,
//!   else a divergence.
//! - `reserve_address`: placed at the first recorded `segment_map` ahead that lies in no live
//!   reservation (the head of the new range), when that place is free; else where the model
//!   puts it. Not recorded, so never a divergence; `release_address` goes to the model.
//! - `begin_op`: recorded events of earlier ops still unconsumed, other than `oom`, are a
//!   divergence (`oom` entries stay when the policy failed without asking the device, as under
//!   a memory fraction).
//!
//! A replay that starts while its trace is still being read gets the events through a
//! [`RecordedFeed`] instead, each op's before the op begins ([`RecordedDevice::fed`]).
//!
//! After a divergence every call goes to the model. The model keeps the books all along
//! (reserved bytes, address ranges, costs), so it continues from the right free memory, and
//! `mem_info` always comes from it.

use crate::SimDevice;
use allocsim_core::{
    CallKind, Device, DeviceCalls, DeviceError, MemInfo, RecordedEvent, RecordedKind,
};
use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

/// Recorded events handed to a [`RecordedDevice`] as the trace is read: appended in op order
/// (each op's events whole, in recorded order), every op's before the op begins.
pub type RecordedFeed = Rc<RefCell<Vec<RecordedEvent>>>;

/// A device call as the policy made it (`addr` is 0 for `malloc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCall {
    pub kind: CallKind,
    pub addr: u64,
    pub size: u64,
}

impl fmt::Display for DeviceCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.name(), self.size)?;
        if self.kind != CallKind::Malloc {
            write!(f, " at {:#x}", self.addr)?;
        }
        Ok(())
    }
}

/// Where and how a run left the recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    pub op_index: u64,
    /// Device calls answered from the recording before this point.
    pub followed_calls: u64,
    /// The recorded event that was next; `None` when the op had no more.
    pub expected: Option<RecordedEvent>,
    /// The call the policy made instead; `None` when the op ended without the expected call.
    pub got: Option<DeviceCall>,
    /// Why, when `expected` and `got` alone do not say.
    pub detail: Option<String>,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "left the recording at op {}: ", self.op_index)?;
        if let (None, None, Some(detail)) = (self.expected, self.got, &self.detail) {
            return write!(f, "{detail}; modelled from there");
        }
        match self.expected {
            Some(e) => {
                write!(f, "expected {} {}", e.kind.action(), e.size)?;
                if e.kind != RecordedKind::SegmentAlloc {
                    write!(f, " at {:#x}", e.addr)?;
                }
            }
            None => write!(f, "expected no more device calls in that op")?,
        }
        match self.got {
            Some(call) => write!(f, ", policy asked {call}")?,
            None => write!(f, ", policy made no further device call in that op")?,
        }
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        write!(f, "; modelled from there")
    }
}

/// A device that follows a recording, then its model. See the module doc for the rules.
#[derive(Debug, Clone)]
pub struct RecordedDevice {
    /// The recorded segment events (and `oom`s), in op order.
    expected: Vec<RecordedEvent>,
    cursor: usize,
    /// End of the current op's events in `expected`.
    op_end: usize,
    op: u64,
    model: SimDevice,
    divergence: Option<Divergence>,
    followed_calls: u64,
    /// Where more of `expected` comes from, if it is not all known at the start.
    feed: Option<RecordedFeed>,
}

impl RecordedDevice {
    /// Follow `recorded` (a trace's `recorded` list; only segment events and `oom`s are used),
    /// falling back to `model`, which should start in the recorded run's state (total, free).
    pub fn new(recorded: &[RecordedEvent], model: SimDevice) -> Self {
        let mut expected: Vec<RecordedEvent> =
            recorded.iter().filter(|e| e.kind.is_segment_event()).copied().collect();
        expected.sort_by_key(|e| e.op);
        let op_end = expected.partition_point(|e| e.op == 0);
        RecordedDevice {
            expected,
            cursor: 0,
            op_end,
            op: 0,
            model,
            divergence: None,
            followed_calls: 0,
            feed: None,
        }
    }

    /// Follow the events that `feed` will hold. The lookahead of `reserve_address` (for
    /// expandable segments) sees only the events fed so far.
    pub fn fed(feed: RecordedFeed, model: SimDevice) -> Self {
        RecordedDevice { feed: Some(feed), ..RecordedDevice::new(&[], model) }
    }

    /// Move what the feed holds to `expected`. Asked at every op once the cursor caught up,
    /// so an empty feed costs a check.
    #[inline]
    fn pull(&mut self) {
        if let Some(feed) = &self.feed {
            let mut fed = feed.borrow_mut();
            if !fed.is_empty() {
                self.expected.extend(fed.drain(..).filter(|e| e.kind.is_segment_event()));
            }
        }
    }

    /// Where the run left the recording, if it did.
    pub fn divergence(&self) -> Option<Divergence> {
        self.divergence.clone()
    }

    /// Device calls answered from the recording so far.
    pub fn followed_calls(&self) -> u64 {
        self.followed_calls
    }

    /// The model that keeps the books and takes over after a divergence.
    pub fn model(&self) -> &SimDevice {
        &self.model
    }

    fn following(&self) -> bool {
        self.divergence.is_none()
    }

    fn next_expected(&self) -> Option<RecordedEvent> {
        (self.cursor < self.op_end).then(|| self.expected[self.cursor])
    }

    fn advance(&mut self) {
        self.cursor += 1;
        self.followed_calls += 1;
    }

    fn diverge(
        &mut self,
        expected: Option<RecordedEvent>,
        got: Option<DeviceCall>,
        detail: Option<String>,
    ) {
        let op_index = expected.filter(|_| got.is_none()).map_or(self.op, |e| e.op);
        let followed_calls = self.followed_calls;
        self.divergence = Some(Divergence { op_index, followed_calls, expected, got, detail });
    }

    /// The head of the next reservation as the recording shows it: the first `segment_map`
    /// ahead that lies in no live reservation.
    fn recorded_reservation_base(&self) -> Option<u64> {
        self.expected[self.cursor..]
            .iter()
            .find(|e| e.kind == RecordedKind::SegmentMap && !self.model.is_reserved(e.addr))
            .map(|e| e.addr)
    }

    /// How many recorded device events, other than `oom`s, were not consumed, and the op of
    /// the first; `None` if all were.
    fn unconsumed(&self) -> Option<(usize, u64)> {
        let fed = self.feed.as_ref().map(|f| f.borrow());
        let fed = fed.iter().flat_map(|f| f.iter()).filter(|e| e.kind.is_segment_event());
        let mut left =
            self.expected[self.cursor..].iter().chain(fed).filter(|e| e.kind != RecordedKind::Oom);
        let first_op = left.next()?.op;
        Some((left.count() + 1, first_op))
    }
}

/// The recorded allocator freed or failed before this point: the driver had said no.
fn shows_refusal(kind: RecordedKind) -> bool {
    matches!(kind, RecordedKind::SegmentFree | RecordedKind::SegmentUnmap | RecordedKind::Oom)
}

impl Device for RecordedDevice {
    fn begin_op(&mut self, index: u64) {
        self.model.begin_op(index);
        if !self.following() {
            return;
        }
        if index < self.op {
            let detail = format!("ops went backwards, from {} to {index}", self.op);
            self.diverge(None, None, Some(detail));
            return;
        }
        if self.cursor == self.expected.len() {
            self.pull();
        }
        // Most ops have no device events: the next one expected is a later op's.
        if self.expected.get(self.cursor).is_none_or(|e| e.op > index) {
            (self.op, self.op_end) = (index, self.cursor);
            return;
        }
        // `expected` is sorted by op and ops only go forward: scan on from the cursor.
        let ahead = &self.expected[self.cursor..];
        let start = self.cursor + ahead.iter().position(|e| e.op >= index).unwrap_or(ahead.len());
        let missed = self.expected[self.cursor..start].iter().find(|e| e.kind != RecordedKind::Oom);
        if let Some(&e) = missed {
            self.diverge(Some(e), None, None);
            return;
        }
        self.cursor = start;
        self.op = index;
        let this_op = &self.expected[start..];
        self.op_end = start + this_op.iter().position(|e| e.op > index).unwrap_or(this_op.len());
    }

    /// The recording starts with these segments alive: the model holds them from the start.
    fn adopt_segment(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.model.adopt_segment(addr, size)
    }

    fn adopt_reservation(
        &mut self,
        addr: u64,
        size: u64,
        mapped: &[(u64, u64)],
    ) -> Result<(), DeviceError> {
        self.model.adopt_reservation(addr, size, mapped)
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        if !self.following() {
            return self.model.malloc(size);
        }
        let call = DeviceCall { kind: CallKind::Malloc, addr: 0, size };
        match self.next_expected() {
            Some(e) if e.kind == RecordedKind::SegmentAlloc && e.size == size => {
                if self.model.malloc_at(e.addr, size) {
                    self.advance();
                    return Ok(e.addr);
                }
                let detail = "the recorded address overlaps a range live in the model".to_string();
                self.diverge(Some(e), Some(call), Some(detail));
            }
            Some(e) if shows_refusal(e.kind) => {
                self.followed_calls += 1;
                return Err(self.model.refuse(CallKind::Malloc, size));
            }
            other => self.diverge(other, Some(call), None),
        }
        self.model.malloc(size)
    }

    fn free(&mut self, addr: u64, size: u64) {
        if self.following() {
            match self.next_expected() {
                Some(e)
                    if e.kind == RecordedKind::SegmentFree && (e.addr, e.size) == (addr, size) =>
                {
                    self.advance()
                }
                other => {
                    let call = DeviceCall { kind: CallKind::Free, addr, size };
                    self.diverge(other, Some(call), None)
                }
            }
        }
        self.model.free(addr, size);
    }

    fn reserve_address(&mut self, size: u64, alignment: u64) -> Result<u64, DeviceError> {
        if self.following() {
            self.followed_calls += 1;
            let base = self.recorded_reservation_base();
            if let Some(addr) = base.and_then(|b| self.model.reserve_address_at(b, size, alignment))
            {
                return Ok(addr);
            }
        }
        self.model.reserve_address(size, alignment)
    }

    fn release_address(&mut self, addr: u64, size: u64) {
        if self.following() {
            self.followed_calls += 1;
        }
        self.model.release_address(addr, size);
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        if !self.following() {
            return self.model.map(addr, size);
        }
        let call = DeviceCall { kind: CallKind::Map, addr, size };
        match self.next_expected() {
            Some(e) if e.kind == RecordedKind::SegmentMap && (e.addr, e.size) == (addr, size) => {
                let result = self.model.map_granted(addr, size);
                match &result {
                    Ok(()) => self.advance(),
                    Err(err) => self.diverge(
                        Some(e),
                        Some(call),
                        Some(format!("the model refuses it: {err}")),
                    ),
                }
                result
            }
            Some(e) if shows_refusal(e.kind) => {
                self.followed_calls += 1;
                Err(self.model.refuse(CallKind::Map, size))
            }
            other => {
                self.diverge(other, Some(call), None);
                self.model.map(addr, size)
            }
        }
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        if self.following() {
            match self.next_expected() {
                Some(e)
                    if e.kind == RecordedKind::SegmentUnmap && (e.addr, e.size) == (addr, size) =>
                {
                    self.advance()
                }
                other => {
                    let call = DeviceCall { kind: CallKind::Unmap, addr, size };
                    self.diverge(other, Some(call), None)
                }
            }
        }
        self.model.unmap(addr, size);
    }

    fn mem_info(&self) -> MemInfo {
        self.model.mem_info()
    }

    fn calls(&self) -> &DeviceCalls {
        self.model.calls()
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = self.model.notes();
        match &self.divergence {
            Some(d) => notes.push(d.to_string()),
            None => {
                let n = self.followed_calls;
                notes.push(format!("followed the recording for all {n} device calls"));
                if let Some((left, first_op)) = self.unconsumed() {
                    notes.push(format!(
                        "the run stopped with {left} recorded device events not reached \
                         (the first in op {first_op})"
                    ));
                }
            }
        }
        notes
    }
}

#[cfg(test)]
#[path = "recorded_tests.rs"]
mod tests;
