//! Following a device call by call: what `allocsim validate` compares a GPU run with.
//!
//! [`RecordedDevice`](crate::RecordedDevice) follows a PyTorch recording, which shows events
//! only: a refusal that left no event behind, or a driver that packed small segments into one
//! page, cannot be read back from it. On a device we drive ourselves we can do better:
//! [`CallLogger`] wraps it and writes down every call the policy makes (arguments, and the
//! answer: granted where, or refused with which error), every `mem_info` answer, and the free
//! memory after each call; [`ReplayCallsDevice`] then answers the same calls exactly as that
//! device did, while the policy makes them, and from its model ([`SimDevice`]) from the first
//! call it makes differently, saying where ([`CallDivergence`]).
//!
//! Rules for [`ReplayCallsDevice`] (`begin_op(i)` sets the current op; the log is walked in
//! order by a cursor):
//! - every call (`malloc`, `free`, `reserve_address`, `release_address`, `map`, `unmap`) must
//!   be the next logged call: same op, kind, size, and address (or alignment) argument. Then it
//!   gets the logged answer: granted at the logged address (the model books it there, exact
//!   byte range, whatever its own free memory says) or refused with the logged error (the
//!   model counts a failed call). Anything else is a divergence.
//! - `begin_op(i)`: logged calls of earlier ops still unconsumed are a divergence (the policy
//!   did not make a call the device saw).
//! - `mem_info` in op `i` answers the logged answers of op `i` in order, then the model's;
//!   before the first op, always the model's (it starts from the device's free and total).
//! - after each followed call whose log has the device's free memory, the model's free memory
//!   is compared with it ([`FreeMemoryCheck`]): that tests the model's page accounting against
//!   the driver's, and decides nothing.
//!
//! After a divergence every call goes to the model, which kept the books all along.

use crate::recorded::DeviceCall;
use crate::SimDevice;
use allocsim_core::{CallKind, Device, DeviceCalls, DeviceError, MemInfo};
use std::cell::{Cell, RefCell};
use std::fmt;

/// One device call and the device's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedCall {
    /// The op it was made in; `None` before the first op (a memory fraction being set, say).
    pub op: Option<u64>,
    /// What was asked; `addr` is the argument (0 for `malloc` and `reserve_address`).
    pub call: DeviceCall,
    /// `reserve_address`'s alignment argument; 0 for the other calls.
    pub alignment: u64,
    /// The answer: the address for `malloc` and `reserve_address`, 0 for the other calls
    /// (`free`, `unmap` and `release_address` cannot fail).
    pub answer: Result<u64, DeviceError>,
    /// The device's free memory right after the call, when the logger measured it.
    pub free_after: Option<u64>,
}

impl fmt::Display for LoggedCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.call)?;
        if self.call.kind == CallKind::ReserveAddress {
            write!(f, " aligned {}", self.alignment)?;
        }
        match (&self.answer, self.call.kind) {
            (Ok(addr), CallKind::Malloc | CallKind::ReserveAddress) => {
                write!(f, " (granted at {addr:#x})")
            }
            (Ok(_), CallKind::Map) => write!(f, " (granted)"),
            (Ok(_), _) => Ok(()),
            (Err(DeviceError::OutOfMemory { .. }), _) => write!(f, " (refused: out of memory)"),
            (Err(e), _) => write!(f, " (failed: {e})"),
        }
    }
}

/// A `mem_info` answer and the op it was given in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggedMemInfo {
    pub op: Option<u64>,
    pub info: MemInfo,
}

/// Everything a [`CallLogger`] wrote down, in call order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallLog {
    pub calls: Vec<LoggedCall>,
    pub mem_infos: Vec<LoggedMemInfo>,
}

/// A device that passes every call to `inner` and writes it down with its answer.
pub struct CallLogger<'a, D: Device + ?Sized> {
    inner: &'a mut D,
    op: Option<u64>,
    measure_free: bool,
    calls: Vec<LoggedCall>,
    /// `mem_info` takes `&self`.
    mem_infos: RefCell<Vec<LoggedMemInfo>>,
}

impl<D: Device + ?Sized> fmt::Debug for CallLogger<'_, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallLogger")
            .field("op", &self.op)
            .field("measure_free", &self.measure_free)
            .field("calls", &self.calls.len())
            .field("mem_infos", &self.mem_infos.borrow().len())
            .finish_non_exhaustive()
    }
}

impl<'a, D: Device + ?Sized> CallLogger<'a, D> {
    /// Log the calls made to `inner`; with `measure_free`, also ask `inner` for its free memory
    /// after each call (one `cuMemGetInfo` on a GPU, outside the call's own measured time).
    pub fn new(inner: &'a mut D, measure_free: bool) -> Self {
        CallLogger {
            inner,
            op: None,
            measure_free,
            calls: Vec::new(),
            mem_infos: RefCell::new(Vec::new()),
        }
    }

    /// The log, giving the device back.
    pub fn finish(self) -> CallLog {
        CallLog { calls: self.calls, mem_infos: self.mem_infos.into_inner() }
    }

    fn log(
        &mut self,
        kind: CallKind,
        addr: u64,
        size: u64,
        alignment: u64,
        answer: Result<u64, DeviceError>,
    ) {
        let free_after = self.measure_free.then(|| self.inner.mem_info().free_bytes);
        let call = DeviceCall { kind, addr, size };
        self.calls.push(LoggedCall { op: self.op, call, alignment, answer, free_after });
    }
}

impl<D: Device + ?Sized> Device for CallLogger<'_, D> {
    fn begin_op(&mut self, index: u64) {
        self.op = Some(index);
        self.inner.begin_op(index);
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        let answer = self.inner.malloc(size);
        self.log(CallKind::Malloc, 0, size, 0, answer.clone());
        answer
    }

    fn free(&mut self, addr: u64, size: u64) {
        self.inner.free(addr, size);
        self.log(CallKind::Free, addr, size, 0, Ok(0));
    }

    fn reserve_address(&mut self, size: u64, alignment: u64) -> Result<u64, DeviceError> {
        let answer = self.inner.reserve_address(size, alignment);
        self.log(CallKind::ReserveAddress, 0, size, alignment, answer.clone());
        answer
    }

    fn release_address(&mut self, addr: u64, size: u64) {
        self.inner.release_address(addr, size);
        self.log(CallKind::ReleaseAddress, addr, size, 0, Ok(0));
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let answer = self.inner.map(addr, size);
        self.log(CallKind::Map, addr, size, 0, answer.clone().map(|()| 0));
        answer
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        self.inner.unmap(addr, size);
        self.log(CallKind::Unmap, addr, size, 0, Ok(0));
    }

    fn mem_info(&self) -> MemInfo {
        let info = self.inner.mem_info();
        self.mem_infos.borrow_mut().push(LoggedMemInfo { op: self.op, info });
        info
    }

    fn calls(&self) -> &DeviceCalls {
        self.inner.calls()
    }

    fn notes(&self) -> Vec<String> {
        self.inner.notes()
    }
}

/// Where and how a run left the logged calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallDivergence {
    /// The op the run was in (`None`: before the first op).
    pub op: Option<u64>,
    /// Calls answered from the log before this point.
    pub followed_calls: u64,
    /// The logged call that was next; `None` when the log had no more.
    pub expected: Option<LoggedCall>,
    /// The call the policy made instead (with `reserve_address`'s alignment); `None` when the
    /// op ended without the logged call.
    pub got: Option<(DeviceCall, u64)>,
    /// Why, when `expected` and `got` alone do not say.
    pub detail: Option<String>,
}

impl fmt::Display for CallDivergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op {
            Some(op) => write!(f, "left the device's calls at op {op}")?,
            None => write!(f, "left the device's calls before the first op")?,
        }
        write!(f, " after {} followed calls: ", self.followed_calls)?;
        match &self.expected {
            Some(e) if e.op == self.op || self.got.is_none() => {
                let op = e.op.map_or("before the first op".to_string(), |o| format!("in op {o}"));
                write!(f, "the device was asked {e} {op}")?
            }
            _ => write!(f, "the device was asked nothing more in that op")?,
        }
        match &self.got {
            Some((call, alignment)) => {
                write!(f, ", the policy asked {call}")?;
                if call.kind == CallKind::ReserveAddress {
                    write!(f, " aligned {alignment}")?;
                }
            }
            None => write!(f, ", the policy made no such call")?,
        }
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        write!(f, "; modelled from there")
    }
}

/// The model's free memory against the device's, after each followed call that logged it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FreeMemoryCheck {
    pub compared: u64,
    pub equal: u64,
    /// The first call after which they differed: (index in the log, device free, model free).
    pub first_difference: Option<(usize, LoggedCall, u64, u64)>,
    /// The smallest and largest `device free − model free` seen; `None` before any compare.
    pub delta_range: Option<(i64, i64)>,
}

impl FreeMemoryCheck {
    fn compare(&mut self, index: usize, call: &LoggedCall, model_free: u64) {
        let Some(device_free) = call.free_after else { return };
        self.compared += 1;
        let delta = device_free as i128 - model_free as i128;
        let delta = delta.clamp(i64::MIN.into(), i64::MAX.into()) as i64;
        if delta == 0 {
            self.equal += 1;
        } else if self.first_difference.is_none() {
            self.first_difference = Some((index, call.clone(), device_free, model_free));
        }
        let (lo, hi) = self.delta_range.unwrap_or((delta, delta));
        self.delta_range = Some((lo.min(delta), hi.max(delta)));
    }
}

impl fmt::Display for FreeMemoryCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.compared == 0 {
            return write!(f, "no free memory logged");
        }
        write!(f, "free memory equal after {} of {} calls", self.equal, self.compared)?;
        if let Some((index, call, device, model)) = &self.first_difference {
            let op = call.op.map_or("before the first op".to_string(), |o| format!("op {o}"));
            let (lo, hi) = self.delta_range.unwrap_or_default();
            write!(
                f,
                "; first differs after call {index} ({op}, {call}): device {device}, model \
                 {model}; device − model from {lo} to {hi} bytes"
            )?;
        }
        Ok(())
    }
}

/// A device that answers each call as a logged device did, then as its model. See the module
/// doc for the rules.
#[derive(Debug, Clone)]
pub struct ReplayCallsDevice {
    calls: Vec<LoggedCall>,
    cursor: usize,
    mem_infos: Vec<LoggedMemInfo>,
    mem_cursor: Cell<usize>,
    op: Option<u64>,
    model: SimDevice,
    divergence: Option<CallDivergence>,
    followed_calls: u64,
    free_check: FreeMemoryCheck,
}

impl ReplayCallsDevice {
    /// Follow `log`, falling back to `model`, which should start in the logged device's state
    /// (its total and free memory at the start).
    pub fn new(log: CallLog, model: SimDevice) -> Self {
        ReplayCallsDevice {
            calls: log.calls,
            cursor: 0,
            mem_infos: log.mem_infos,
            mem_cursor: Cell::new(0),
            op: None,
            model,
            divergence: None,
            followed_calls: 0,
            free_check: FreeMemoryCheck::default(),
        }
    }

    /// Where the run left the log, if it did.
    pub fn divergence(&self) -> Option<&CallDivergence> {
        self.divergence.as_ref()
    }

    /// Calls answered from the log so far.
    pub fn followed_calls(&self) -> u64 {
        self.followed_calls
    }

    /// Calls in the log.
    pub fn logged_calls(&self) -> usize {
        self.calls.len()
    }

    /// While following: how many logged calls were not reached, and the first of them.
    pub fn unreached(&self) -> Option<(usize, &LoggedCall)> {
        if self.divergence.is_some() {
            return None;
        }
        self.calls.get(self.cursor).map(|first| (self.calls.len() - self.cursor, first))
    }

    /// The model's free memory against the device's so far.
    pub fn free_check(&self) -> &FreeMemoryCheck {
        &self.free_check
    }

    /// The model that keeps the books and takes over after a divergence.
    pub fn model(&self) -> &SimDevice {
        &self.model
    }

    fn following(&self) -> bool {
        self.divergence.is_none()
    }

    fn diverge(
        &mut self,
        expected: Option<LoggedCall>,
        got: Option<(DeviceCall, u64)>,
        detail: Option<String>,
    ) {
        self.divergence = Some(CallDivergence {
            op: self.op,
            followed_calls: self.followed_calls,
            expected,
            got,
            detail,
        });
    }

    /// The logged call, if `call` is the next one while following; a divergence otherwise.
    fn expect(
        &mut self,
        kind: CallKind,
        addr: u64,
        size: u64,
        alignment: u64,
    ) -> Option<LoggedCall> {
        if !self.following() {
            return None;
        }
        let call = DeviceCall { kind, addr, size };
        match self.calls.get(self.cursor) {
            Some(e) if e.op == self.op && e.call == call && e.alignment == alignment => {
                Some(e.clone())
            }
            next => {
                let next = next.cloned();
                self.diverge(next, Some((call, alignment)), None);
                None
            }
        }
    }

    /// The logged call was answered as logged: move on and compare free memory.
    fn followed(&mut self, logged: &LoggedCall) {
        self.free_check.compare(self.cursor, logged, self.model.free_bytes());
        self.cursor += 1;
        self.followed_calls += 1;
    }

    /// The logged refusal, with the model counting a failed call.
    fn refused(&mut self, logged: &LoggedCall, err: &DeviceError) -> DeviceError {
        let _ = self.model.refuse(logged.call.kind, logged.call.size);
        self.followed(logged);
        err.clone()
    }
}

impl Device for ReplayCallsDevice {
    fn begin_op(&mut self, index: u64) {
        self.model.begin_op(index);
        let op = Some(index);
        if self.following() {
            if let Some(missed) = self.calls.get(self.cursor).filter(|e| e.op < op).cloned() {
                self.diverge(Some(missed), None, None);
            }
        }
        self.op = op;
        let mut m = self.mem_cursor.get();
        while self.mem_infos.get(m).is_some_and(|e| e.op < op) {
            m += 1;
        }
        self.mem_cursor.set(m);
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        let Some(logged) = self.expect(CallKind::Malloc, 0, size, 0) else {
            return self.model.malloc(size);
        };
        match &logged.answer {
            Ok(addr) => {
                if self.model.malloc_at(*addr, size) {
                    self.followed(&logged);
                    return Ok(*addr);
                }
                let detail = "the device's address overlaps a range live in the model";
                let call = logged.call;
                self.diverge(Some(logged), Some((call, 0)), Some(detail.to_string()));
                self.model.malloc(size)
            }
            Err(e) => Err(self.refused(&logged, e)),
        }
    }

    fn free(&mut self, addr: u64, size: u64) {
        let logged = self.expect(CallKind::Free, addr, size, 0);
        self.model.free(addr, size);
        if let Some(logged) = logged {
            self.followed(&logged);
        }
    }

    fn reserve_address(&mut self, size: u64, alignment: u64) -> Result<u64, DeviceError> {
        let Some(logged) = self.expect(CallKind::ReserveAddress, 0, size, alignment) else {
            return self.model.reserve_address(size, alignment);
        };
        match &logged.answer {
            Ok(addr) => {
                if self.model.reserve_address_granted(*addr, size) {
                    self.followed(&logged);
                    return Ok(*addr);
                }
                let detail = "the device's range overlaps a range live in the model";
                let call = logged.call;
                self.diverge(Some(logged), Some((call, alignment)), Some(detail.to_string()));
                self.model.reserve_address(size, alignment)
            }
            Err(e) => Err(self.refused(&logged, e)),
        }
    }

    fn release_address(&mut self, addr: u64, size: u64) {
        let logged = self.expect(CallKind::ReleaseAddress, addr, size, 0);
        self.model.release_address(addr, size);
        if let Some(logged) = logged {
            self.followed(&logged);
        }
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let Some(logged) = self.expect(CallKind::Map, addr, size, 0) else {
            return self.model.map(addr, size);
        };
        match &logged.answer {
            Ok(_) => {
                let result = self.model.map_granted(addr, size);
                match &result {
                    Ok(()) => self.followed(&logged),
                    Err(err) => {
                        let detail = format!("the model refuses it: {err}");
                        let call = logged.call;
                        self.diverge(Some(logged), Some((call, 0)), Some(detail));
                    }
                }
                result
            }
            Err(e) => Err(self.refused(&logged, e)),
        }
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        let logged = self.expect(CallKind::Unmap, addr, size, 0);
        self.model.unmap(addr, size);
        if let Some(logged) = logged {
            self.followed(&logged);
        }
    }

    fn mem_info(&self) -> MemInfo {
        if self.following() && self.op.is_some() {
            let m = self.mem_cursor.get();
            if let Some(logged) = self.mem_infos.get(m).filter(|e| e.op == self.op) {
                self.mem_cursor.set(m + 1);
                return logged.info;
            }
        }
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
                notes.push(format!("followed the device for all {n} calls"));
                if let Some((left, first)) = self.unreached() {
                    notes.push(format!(
                        "the run stopped with {left} logged calls not made, the first: {first}"
                    ));
                }
            }
        }
        if self.free_check.compared > 0 {
            notes.push(self.free_check.to_string());
        }
        notes
    }
}

#[cfg(test)]
#[path = "calls_tests.rs"]
mod tests;
