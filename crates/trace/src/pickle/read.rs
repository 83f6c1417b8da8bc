//! The pickle virtual machine, restricted to building data.
//!
//! Shape, and why:
//! - Opcodes that import or call anything (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`,
//!   `OBJ`, `NEWOBJ`, `NEWOBJ_EX`, `EXT*`, `PERSID`) are refused where they stand, with their
//!   byte offset: there is no object model behind this VM, so nothing can be executed.
//! - A list or dict is open (APPEND/SETITEM may fill it) while its `Rc` is unique, which is
//!   while it sits on the stack unshared; the memo records only its stack position until it
//!   leaves the stack (into a parent, or at `STOP`), or until a `GET` shares it. CPython
//!   never changes a container after sharing it, except to build a recursive structure;
//!   here that is refused, so values are plain trees (DAGs) that need no second pass.
//! - Every value's nesting depth is known when it is made, so neither building nor dropping
//!   a value can recurse deeper than [`Limits::max_depth`].
//! - Memory is charged before it is taken and refunded when freed ([`Held`], `budget.rs`)
//!   against [`Limits::max_held_bytes`], so a small compressed file cannot expand into
//!   unbounded memory, and no length field is trusted for an allocation. Opcodes that build
//!   nothing are counted against [`Limits::max_idle_ops`], so it cannot spin either.

use super::budget::{self, own_bytes, unique_bytes, ITEM};
use super::input::{Input, InputError};
use super::memo::{Memo, MemoRef, MemoTable};
use super::opcodes::{self as op, name};
use super::strings::StrCache;
use super::{Limits, PickleError, PickleErrorKind as K, Value};
use std::io::Read;
use std::rc::Rc;

/// A stack item. A list or dict whose `Rc` is unique is still open to APPEND/SETITEM; once
/// shared (by `GET`, `DUP` or the memo after it left the stack) it is finished.
pub(super) struct Slot {
    pub(super) value: Value,
    /// Nesting depth: 0 for scalars, 1 + the deepest child for containers.
    pub(super) depth: u32,
    /// The memo key of an open container, so the memo can take it when it leaves the stack.
    pub(super) memo: u32,
}

pub(super) const NO_MEMO: u32 = u32::MAX;

impl Slot {
    pub(super) fn new(value: Value, depth: u32) -> Slot {
        Slot { value, depth, memo: NO_MEMO }
    }
}

/// Take a value off the stack, handing it to the memo if it was memoized while open.
#[inline(always)]
pub(super) fn release(slot: Slot, memo: &mut MemoTable) -> Value {
    if slot.memo != NO_MEMO {
        memoize_released(&slot, memo);
    }
    slot.value
}

#[cold]
fn memoize_released(slot: &Slot, memo: &mut MemoTable) {
    memo.set(u64::from(slot.memo), Memo::Value(slot.value.clone(), slot.depth));
}

/// The bytes the reader holds, against [`Limits::max_held_bytes`].
pub(super) struct Held {
    pub(super) bytes: u64,
    max: u64,
}

impl Held {
    /// Count `n` more bytes; false once over the limit.
    #[inline]
    pub(super) fn charge(&mut self, n: u64) -> bool {
        self.bytes = self.bytes.saturating_add(n);
        self.bytes <= self.max
    }

    /// Whether `n` more bytes would fit, counting nothing.
    pub(super) fn fits(&self, n: u64) -> bool {
        self.bytes.saturating_add(n) <= self.max
    }

    /// The bytes left under the limit.
    pub(super) fn room(&self) -> u64 {
        self.max.saturating_sub(self.bytes)
    }

    #[inline]
    pub(super) fn refund(&mut self, n: u64) {
        self.bytes = self.bytes.saturating_sub(n);
    }

    /// Room for `n` more items in `v`, its growth charged before it grows; false (with `v`
    /// unchanged) when the growth does not fit.
    #[inline]
    pub(super) fn reserve<T>(&mut self, v: &mut Vec<T>, n: usize) -> bool {
        if v.capacity() - v.len() >= n {
            return true;
        }
        self.grow(v, n)
    }

    #[cold]
    fn grow<T>(&mut self, v: &mut Vec<T>, n: usize) -> bool {
        let size = size_of::<T>() as u64;
        let before = v.capacity();
        // What `Vec` grows to: double, or what is needed if more, and at least 4 items.
        let predicted = v.len().saturating_add(n).max(before.saturating_mul(2)).max(4);
        if !self.fits((predicted - before) as u64 * size) {
            return false;
        }
        v.reserve(n);
        self.bytes += (v.capacity() - before) as u64 * size;
        true
    }
}

pub(super) struct Vm<'l, R> {
    pub(super) input: Input<R>,
    pub(super) limits: &'l Limits,
    pub(super) stack: Vec<Slot>,
    pub(super) marks: Vec<usize>,
    pub(super) memo: MemoTable,
    pub(super) strings: StrCache,
    pub(super) held: Held,
    /// The memo's share of `held` (its capacity), as last counted.
    memo_bytes: u64,
    /// Opcodes so far that built nothing.
    idle: u64,
    pub(super) scratch: Vec<u8>,
    /// Offset and opcode being executed, for errors.
    pub(super) at: u64,
    pub(super) opcode: u8,
}

/// Read one pickle from `reader` and return its value, then read the rest of the stream (which
/// is ignored, as Python does) so that a compressed stream's checksum is verified. See the
/// module doc.
pub fn read<R: Read>(reader: R, limits: &Limits) -> Result<Value, PickleError> {
    let mut vm = Vm::new(reader, limits);
    vm.start()?;
    loop {
        vm.at = vm.input.offset();
        vm.opcode = match vm.input.next_byte() {
            Ok(Some(b)) => b,
            Ok(None) => return Err(vm.err(K::NoStop)),
            Err(e) => return Err(vm.input_err(e)),
        };
        if vm.opcode == op::STOP {
            let top = vm.pop()?;
            let value = release(top, &mut vm.memo);
            vm.at = vm.input.offset();
            return match vm.input.drain() {
                Ok(_) | Err(InputError::Eof | InputError::Limit) => Ok(value),
                Err(InputError::Io(e)) => Err(vm.err(K::AfterStop(e))),
            };
        }
        match vm.step() {
            Ok(()) => {}
            Err(Failure::Input(e)) => return Err(vm.input_err(e)),
            Err(Failure::Pickle(e)) => return Err(e),
            // Only the record streamer makes `Streamed` memos; never here.
            Err(Failure::Unusual) => {
                return Err(vm.err(K::Unsupported("a memo entry the record streamer consumed")))
            }
        }
    }
}

pub(super) enum Failure {
    Input(InputError),
    Pickle(PickleError),
    /// The record streamer met something it does not handle: read the file generically.
    Unusual,
}

impl From<InputError> for Failure {
    fn from(e: InputError) -> Self {
        Failure::Input(e)
    }
}

impl From<PickleError> for Failure {
    fn from(e: PickleError) -> Self {
        Failure::Pickle(e)
    }
}

pub(super) type Step = Result<(), Failure>;

impl<'l, R: Read> Vm<'l, R> {
    pub(super) fn new(reader: R, limits: &'l Limits) -> Self {
        Vm {
            input: Input::new(reader),
            limits,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: MemoTable::default(),
            strings: StrCache::default(),
            held: Held { bytes: budget::FIXED, max: limits.max_held_bytes },
            memo_bytes: 0,
            idle: 0,
            scratch: Vec::new(),
            at: 0,
            opcode: 0,
        }
    }

    pub(super) fn err(&self, kind: K) -> PickleError {
        PickleError { offset: self.at, kind }
    }

    pub(super) fn input_err(&self, e: InputError) -> PickleError {
        match e {
            InputError::Eof if self.input.offset() == 0 => self.err(K::Empty),
            InputError::Eof => self.err(K::Truncated(name(self.opcode))),
            InputError::Io(e) => self.err(K::Io(e)),
            InputError::Limit => self.over_limit(),
        }
    }

    pub(super) fn underflow(&self) -> PickleError {
        self.err(K::StackUnderflow(name(self.opcode)))
    }

    /// The first opcode must be `PROTO` 2..=5: anything else is not a file we read.
    pub(super) fn start(&mut self) -> Result<(), PickleError> {
        let first = self.input.next_byte().map_err(|e| self.input_err(e))?;
        match first {
            None => Err(self.err(K::Empty)),
            Some(op::PROTO) => {
                self.opcode = op::PROTO;
                let v = self.input.byte().map_err(|e| self.input_err(e))?;
                if (2..=5).contains(&v) {
                    Ok(())
                } else {
                    Err(self.err(K::Protocol(v)))
                }
            }
            Some(b) => Err(self.err(K::NotAPickle(b))),
        }
    }

    #[inline]
    pub(super) fn charge(&mut self, bytes: u64) -> Result<(), PickleError> {
        if self.held.charge(bytes) {
            Ok(())
        } else {
            Err(self.over_limit())
        }
    }

    /// Fail unless `bytes` more would fit, counting nothing (for memory a step is about to
    /// take and charge once taken).
    pub(super) fn check_room(&self, bytes: u64) -> Result<(), PickleError> {
        if self.held.fits(bytes) {
            Ok(())
        } else {
            Err(self.over_limit())
        }
    }

    #[cold]
    pub(super) fn over_limit(&self) -> PickleError {
        self.err(K::MemoryLimit(self.limits.max_held_bytes))
    }

    /// Count one opcode that built nothing.
    #[inline]
    pub(super) fn idle(&mut self) -> Result<(), PickleError> {
        self.idle += 1;
        if self.idle > self.limits.max_idle_ops {
            return Err(self.err(K::IdleLimit(self.limits.max_idle_ops)));
        }
        Ok(())
    }

    /// Drop `v`, refunding what that frees.
    pub(super) fn dispose(&mut self, v: Value) {
        self.held.refund(unique_bytes(&v));
    }

    /// Room in the memo for `n` more entries, before they are stored (see [`Vm::memo_sync`]).
    #[inline]
    pub(super) fn memo_room(&self, n: usize) -> Result<(), PickleError> {
        self.growth_room(self.memo.growth_bytes(n))
    }

    /// Room for `bytes` the memo may grow by ([`MemoTable::growth_bytes`] or
    /// [`MemoTable::append_growth_bytes`]): checked only when it would grow.
    #[inline]
    pub(super) fn growth_room(&self, bytes: u64) -> Result<(), PickleError> {
        match bytes {
            0 => Ok(()),
            bytes => self.check_room(bytes),
        }
    }

    /// Count the memo's capacity after entries were stored.
    #[inline]
    pub(super) fn memo_sync(&mut self) -> Result<(), PickleError> {
        let now = self.memo.heap_bytes();
        if now != self.memo_bytes {
            self.held.refund(self.memo_bytes);
            self.memo_bytes = now;
            self.charge(now)?;
        }
        Ok(())
    }

    pub(super) fn check_depth(&self, depth: u32) -> Result<u32, PickleError> {
        if depth > self.limits.max_depth {
            Err(self.err(K::TooDeep(self.limits.max_depth)))
        } else {
            Ok(depth)
        }
    }

    /// Push a value already counted (made by a charged step, or shared).
    #[inline]
    pub(super) fn push(&mut self, slot: Slot) -> Step {
        if !self.held.reserve(&mut self.stack, 1) {
            return Err(self.over_limit().into());
        }
        self.stack.push(slot);
        Ok(())
    }

    /// Push a value just made, charging it.
    pub(super) fn push_new(&mut self, v: Value, depth: u32) -> Step {
        self.charge(own_bytes(&v))?;
        self.push(Slot::new(v, depth))
    }

    /// The lowest stack index the current opcode may take items from.
    pub(super) fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    /// Pop the top item, which must lie above the last MARK (Python's stack starts anew there).
    pub(super) fn pop(&mut self) -> Result<Slot, PickleError> {
        if self.stack.len() <= self.floor() {
            return Err(self.underflow());
        }
        self.stack.pop().ok_or_else(|| self.underflow())
    }

    /// Stack index where the items above the last MARK start, removing the mark.
    pub(super) fn take_mark(&mut self) -> Result<usize, PickleError> {
        let m = self.marks.pop().ok_or_else(|| self.err(K::NoMark(name(self.opcode))))?;
        if m > self.stack.len() {
            return Err(self.underflow());
        }
        Ok(m)
    }

    /// Freeze and remove the items from `from` up, returning them with their deepest depth;
    /// the list that holds them is charged before it is made.
    pub(super) fn drain_values(&mut self, from: usize) -> Result<(Vec<Value>, u32), PickleError> {
        self.charge(budget::BOX + (self.stack.len() - from) as u64 * ITEM)?;
        let memo = &mut self.memo;
        let mut deepest = 0;
        let items = self
            .stack
            .drain(from..)
            .map(|s| {
                deepest = deepest.max(s.depth);
                release(s, memo)
            })
            .collect();
        Ok((items, deepest))
    }

    /// Drop the items from `from` up (`POP_MARK`).
    pub(super) fn discard(&mut self, from: usize) {
        let mut freed = 0;
        for slot in self.stack.drain(from..) {
            freed += unique_bytes(&release(slot, &mut self.memo));
        }
        self.held.refund(freed);
    }

    /// The value at stack index `i`, shared: an open container is finished from now on, and
    /// the memo holds it instead of its stack position.
    pub(super) fn share_at(&mut self, i: usize) -> (Value, u32) {
        let slot = &mut self.stack[i];
        if slot.memo != NO_MEMO {
            let memo = Memo::Value(slot.value.clone(), slot.depth);
            self.memo.set(u64::from(std::mem::replace(&mut slot.memo, NO_MEMO)), memo);
        }
        (slot.value.clone(), slot.depth)
    }

    pub(super) fn make_tuple(&mut self, from: usize) -> Step {
        let (items, deepest) = self.drain_values(from)?;
        let depth = self.check_depth(deepest + 1)?;
        self.push(Slot::new(Value::Tuple(Rc::new(items)), depth))
    }

    pub(super) fn small_tuple(&mut self, n: usize) -> Step {
        let from = self.stack.len().checked_sub(n).filter(|&f| f >= self.floor());
        let from = from.ok_or_else(|| self.underflow())?;
        self.make_tuple(from)
    }

    /// APPEND(S)/SETITEM(S): move the items from `from` up into the open container just below.
    pub(super) fn extend(&mut self, from: usize, dict: bool) -> Step {
        let Some(t) = from.checked_sub(1) else {
            return Err(self.underflow().into());
        };
        let n = self.stack.len() - from;
        if n == 0 {
            // An empty APPENDS/SETITEMS changes nothing, whatever lies below the mark: CPython
            // returns before it looks at the target, and so does the record streamer.
            return Ok(());
        }
        if dict && n & 1 != 0 {
            return Err(self.err(K::OddItems).into());
        }
        // Take the container out of its slot so the items can be drained into it.
        let mut target = std::mem::replace(&mut self.stack[t].value, Value::None);
        let mut deepest = 0;
        // Room for the items, charged before the container grows.
        let room = match &mut target {
            Value::List(rc) if !dict => Rc::get_mut(rc).map(|l| self.held.reserve(l, n)),
            Value::Dict(rc) if dict => Rc::get_mut(rc).map(|d| self.held.reserve(d, n / 2)),
            _ => None,
        };
        if room == Some(false) {
            self.stack[t].value = target;
            return Err(self.over_limit().into());
        }
        // Items are moved out in place (leaving `None`) and the stack truncated after: exact-size
        // iterators let `extend` skip a capacity check per item.
        let (memo, items) = (&mut self.memo, &mut self.stack[from..]);
        let mut take = |s: &mut Slot| {
            deepest = deepest.max(s.depth);
            if s.memo != NO_MEMO {
                memoize_released(s, memo);
            }
            std::mem::take(&mut s.value)
        };
        let outcome = match &mut target {
            Value::List(rc) if !dict => {
                Rc::get_mut(rc).map(|list| list.extend(items.iter_mut().map(&mut take)))
            }
            Value::Dict(rc) if dict => Rc::get_mut(rc).map(|pairs| {
                pairs.extend(items.chunks_exact_mut(2).map(|kv| {
                    let k = take(&mut kv[0]);
                    (k, take(&mut kv[1]))
                }))
            }),
            _ => None,
        };
        self.stack.truncate(from);
        if outcome.is_none() {
            let kind = match &target {
                Value::List(_) | Value::Dict(_) if dict == matches!(target, Value::Dict(_)) => {
                    K::SharedMutation
                }
                v => K::BadTarget {
                    op: name(self.opcode),
                    target: v.type_name(),
                    expected: if dict { "dict" } else { "list" },
                },
            };
            return Err(self.err(kind).into());
        }
        let slot = &mut self.stack[t];
        slot.value = target;
        slot.depth = slot.depth.max(deepest + 1);
        let depth = slot.depth;
        self.check_depth(depth)?;
        Ok(())
    }

    pub(super) fn memo_put(&mut self, key: u64) -> Step {
        let Some(i) = self.stack.len().checked_sub(1).filter(|&i| i >= self.floor()) else {
            return Err(self.underflow().into());
        };
        let slot = &mut self.stack[i];
        let open = match &mut slot.value {
            Value::List(rc) => Rc::get_mut(rc).is_some(),
            Value::Dict(rc) => Rc::get_mut(rc).is_some(),
            _ => false,
        };
        if self.memo.get(key).is_some() {
            self.idle()?;
        }
        self.memo_room(1)?;
        let slot = &mut self.stack[i];
        let dropped = match u32::try_from(key) {
            Ok(k) if open && k != NO_MEMO && slot.memo == NO_MEMO => {
                slot.memo = k;
                self.memo.set(key, Memo::OnStack(i))
            }
            _ => {
                let (v, depth) = self.share_at(i);
                self.memo.set(key, Memo::Value(v, depth))
            }
        };
        if let Some(Memo::Value(v, _)) = dropped {
            self.dispose(v);
        }
        if self.memo.len() > self.limits.max_memo {
            return Err(self.err(K::MemoLimit(self.limits.max_memo)).into());
        }
        self.memo_sync()?;
        Ok(())
    }

    #[inline]
    pub(super) fn memo_get(&mut self, key: u64) -> Step {
        let slot = match self.memo.get(key) {
            Some(MemoRef::Value(v, depth)) => Slot::new(v.clone(), depth),
            Some(MemoRef::OnStack(i)) if i < self.stack.len() => {
                let (v, depth) = self.share_at(i);
                Slot::new(v, depth)
            }
            Some(MemoRef::OnStack(_)) => return Err(self.err(K::MemoMissing(key)).into()),
            Some(MemoRef::Streamed) => return Err(Failure::Unusual),
            None => return Err(self.err(K::MemoMissing(key)).into()),
        };
        self.push(slot)
    }
}
