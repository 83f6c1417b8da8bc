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
//! - Memory is charged as values are made (an estimate per value plus payload bytes) against
//!   [`Limits::max_value_bytes`], so a small compressed file cannot expand into unbounded
//!   memory, and no length field is trusted for an allocation.

use super::input::{Input, InputError};
use super::memo::{Memo, MemoTable};
use super::opcodes::{self as op, name};
use super::strings::StrCache;
use super::{Limits, PickleError, PickleErrorKind as K, Value};
use std::io::Read;
use std::rc::Rc;

/// A stack item. A list or dict whose `Rc` is unique is still open to APPEND/SETITEM; once
/// shared (by `GET`, `DUP` or the memo after it left the stack) it is finished.
struct Slot {
    value: Value,
    /// Nesting depth: 0 for scalars, 1 + the deepest child for containers.
    depth: u32,
    /// The memo key of an open container, so the memo can take it when it leaves the stack.
    memo: u32,
}

const NO_MEMO: u32 = u32::MAX;
/// Estimated bytes of one value, charged against the memory limit.
const VALUE_COST: u64 = 48;

impl Slot {
    fn new(value: Value, depth: u32) -> Slot {
        Slot { value, depth, memo: NO_MEMO }
    }
}

/// Take a value off the stack, handing it to the memo if it was memoized while open.
#[inline(always)]
fn release(slot: Slot, memo: &mut MemoTable) -> Value {
    if slot.memo != NO_MEMO {
        memoize_released(&slot, memo);
    }
    slot.value
}

#[cold]
fn memoize_released(slot: &Slot, memo: &mut MemoTable) {
    memo.set(u64::from(slot.memo), Memo::Value(slot.value.clone(), slot.depth));
}

struct Vm<'l, R> {
    input: Input<R>,
    limits: &'l Limits,
    stack: Vec<Slot>,
    marks: Vec<usize>,
    memo: MemoTable,
    strings: StrCache,
    charged: u64,
    scratch: Vec<u8>,
    /// Offset and opcode being executed, for errors.
    at: u64,
    opcode: u8,
}

/// Read one pickle from `reader` and return its value, then read the rest of the stream (which
/// is ignored, as Python does) so that a compressed stream's checksum is verified. See the
/// module doc.
pub fn read<R: Read>(reader: R, limits: &Limits) -> Result<Value, PickleError> {
    let mut vm = Vm {
        input: Input::new(reader),
        limits,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: MemoTable::default(),
        strings: StrCache::default(),
        charged: 0,
        scratch: Vec::new(),
        at: 0,
        opcode: 0,
    };
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
                Ok(_) | Err(InputError::Eof) => Ok(value),
                Err(InputError::Io(e)) => Err(vm.err(K::AfterStop(e))),
            };
        }
        match vm.step() {
            Ok(()) => {}
            Err(Failure::Input(e)) => return Err(vm.input_err(e)),
            Err(Failure::Pickle(e)) => return Err(e),
        }
    }
}

enum Failure {
    Input(InputError),
    Pickle(PickleError),
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

type Step = Result<(), Failure>;

impl<R: Read> Vm<'_, R> {
    fn err(&self, kind: K) -> PickleError {
        PickleError { offset: self.at, kind }
    }

    fn input_err(&self, e: InputError) -> PickleError {
        match e {
            InputError::Eof if self.input.offset() == 0 => self.err(K::Empty),
            InputError::Eof => self.err(K::Truncated(name(self.opcode))),
            InputError::Io(e) => self.err(K::Io(e)),
        }
    }

    fn underflow(&self) -> PickleError {
        self.err(K::StackUnderflow(name(self.opcode)))
    }

    /// The first opcode must be `PROTO` 2..=5: anything else is not a file we read.
    fn start(&mut self) -> Result<(), PickleError> {
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
    fn charge(&mut self, bytes: u64) -> Result<(), PickleError> {
        self.charged = self.charged.saturating_add(bytes);
        if self.charged > self.limits.max_value_bytes {
            return Err(self.over_limit());
        }
        Ok(())
    }

    #[cold]
    fn over_limit(&self) -> PickleError {
        self.err(K::MemoryLimit(self.limits.max_value_bytes))
    }

    fn check_depth(&self, depth: u32) -> Result<u32, PickleError> {
        if depth > self.limits.max_depth {
            Err(self.err(K::TooDeep(self.limits.max_depth)))
        } else {
            Ok(depth)
        }
    }

    #[inline]
    fn push(&mut self, slot: Slot) -> Step {
        self.charge(VALUE_COST)?;
        self.stack.push(slot);
        Ok(())
    }

    fn push_value(&mut self, v: Value) -> Step {
        self.push(Slot::new(v, 0))
    }

    /// The lowest stack index the current opcode may take items from.
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    /// Pop the top item, which must lie above the last MARK (Python's stack starts anew there).
    fn pop(&mut self) -> Result<Slot, PickleError> {
        if self.stack.len() <= self.floor() {
            return Err(self.underflow());
        }
        self.stack.pop().ok_or_else(|| self.underflow())
    }

    /// Stack index where the items above the last MARK start, removing the mark.
    fn take_mark(&mut self) -> Result<usize, PickleError> {
        let m = self.marks.pop().ok_or_else(|| self.err(K::NoMark(name(self.opcode))))?;
        if m > self.stack.len() {
            return Err(self.underflow());
        }
        Ok(m)
    }

    /// Freeze and remove the items from `from` up, returning them with their deepest depth.
    fn drain_values(&mut self, from: usize) -> (Vec<Value>, u32) {
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
        (items, deepest)
    }

    /// The value at stack index `i`, shared: an open container is finished from now on, and
    /// the memo holds it instead of its stack position.
    fn share_at(&mut self, i: usize) -> (Value, u32) {
        let slot = &mut self.stack[i];
        if slot.memo != NO_MEMO {
            let memo = Memo::Value(slot.value.clone(), slot.depth);
            self.memo.set(u64::from(std::mem::replace(&mut slot.memo, NO_MEMO)), memo);
        }
        (slot.value.clone(), slot.depth)
    }

    fn make_tuple(&mut self, from: usize) -> Step {
        let (items, deepest) = self.drain_values(from);
        let depth = self.check_depth(deepest + 1)?;
        self.push(Slot::new(Value::Tuple(Rc::new(items)), depth))
    }

    fn small_tuple(&mut self, n: usize) -> Step {
        let from = self.stack.len().checked_sub(n).filter(|&f| f >= self.floor());
        let from = from.ok_or_else(|| self.underflow())?;
        self.make_tuple(from)
    }

    /// APPEND(S)/SETITEM(S): move the items from `from` up into the open container just below.
    fn extend(&mut self, from: usize, dict: bool) -> Step {
        let Some(t) = from.checked_sub(1) else {
            return Err(self.underflow().into());
        };
        let n = self.stack.len() - from;
        if dict && n & 1 != 0 {
            return Err(self.err(K::OddItems).into());
        }
        // Take the container out of its slot so the items can be drained into it.
        let mut target = std::mem::replace(&mut self.stack[t].value, Value::None);
        let mut deepest = 0;
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

    fn memo_put(&mut self, key: u64) -> Step {
        let Some(i) = self.stack.len().checked_sub(1).filter(|&i| i >= self.floor()) else {
            return Err(self.underflow().into());
        };
        let slot = &mut self.stack[i];
        let open = match &mut slot.value {
            Value::List(rc) => Rc::get_mut(rc).is_some(),
            Value::Dict(rc) => Rc::get_mut(rc).is_some(),
            _ => false,
        };
        match u32::try_from(key) {
            Ok(k) if open && k != NO_MEMO && slot.memo == NO_MEMO => {
                slot.memo = k;
                self.memo.set(key, Memo::OnStack(i));
            }
            _ => {
                let (v, depth) = self.share_at(i);
                self.memo.set(key, Memo::Value(v, depth));
            }
        }
        if self.memo.len() > self.limits.max_memo {
            return Err(self.err(K::MemoLimit(self.limits.max_memo)).into());
        }
        self.charge(VALUE_COST)?;
        Ok(())
    }

    #[inline]
    fn memo_get(&mut self, key: u64) -> Step {
        let slot = match self.memo.get(key) {
            Some(Memo::Value(v, depth)) => Slot::new(v.clone(), *depth),
            Some(&Memo::OnStack(i)) if i < self.stack.len() => {
                let (v, depth) = self.share_at(i);
                Slot::new(v, depth)
            }
            Some(Memo::OnStack(_)) => return Err(self.err(K::MemoMissing(key)).into()),
            None => return Err(self.err(K::MemoMissing(key)).into()),
        };
        self.push(slot)
    }

    fn text_arg(&mut self) -> Result<String, Failure> {
        let mut line = std::mem::take(&mut self.scratch);
        let complete = self.input.line(64, &mut line)?;
        let text = String::from_utf8_lossy(&line).into_owned();
        self.scratch = line;
        if !complete {
            return Err(self.err(K::BadText(name(self.opcode), text)).into());
        }
        Ok(text)
    }

    fn text_int(&mut self) -> Result<i64, Failure> {
        let text = self.text_arg()?;
        let digits = text.strip_suffix('L').unwrap_or(&text);
        digits.parse().map_err(|_| self.err(K::BadText(name(self.opcode), text.clone())).into())
    }

    fn text_index(&mut self) -> Result<u64, Failure> {
        let text = self.text_arg()?;
        text.parse().map_err(|_| self.err(K::BadText(name(self.opcode), text.clone())).into())
    }

    fn string(&mut self, n: u64, as_str: bool) -> Step {
        self.charge(n)?;
        let mut scratch = std::mem::take(&mut self.scratch);
        let strings = &mut self.strings;
        let v = self.input.with_bytes(n, &mut scratch, |b| {
            if !as_str {
                return Value::bytes(b);
            }
            // Python writes lone surrogates with `surrogatepass`; they become U+FFFD here
            // rather than failing a whole trace over one odd file name.
            match std::str::from_utf8(b) {
                Ok(s) => Value::Str(strings.get(s)),
                Err(_) => Value::Str(Rc::new(String::from_utf8_lossy(b).into_owned())),
            }
        });
        self.scratch = scratch;
        self.push_value(v?)
    }

    fn long(&mut self, n: u64) -> Step {
        if n > 8 {
            return Err(self.err(K::IntTooWide(n)).into());
        }
        let n = n as usize;
        let mut bytes = self.input.up_to_8(n)?;
        if n > 0 && bytes[n - 1] & 0x80 != 0 {
            bytes[n..].fill(0xff);
        }
        self.push_value(Value::Int(i64::from_le_bytes(bytes)))
    }

    fn step(&mut self) -> Step {
        let code = self.opcode;
        match code {
            op::PROTO => {
                let v = self.input.byte()?;
                if !(2..=5).contains(&v) {
                    return Err(self.err(K::Protocol(v)).into());
                }
            }
            op::FRAME => {
                // Framing only groups opcodes for buffered reading; the length is not needed.
                self.input.array::<8>()?;
            }
            op::MARK => self.marks.push(self.stack.len()),
            op::POP => {
                // Python 3 pops a MARK when nothing was pushed after it.
                if self.marks.last() == Some(&self.stack.len()) {
                    self.marks.pop();
                } else {
                    let slot = self.pop()?;
                    release(slot, &mut self.memo);
                }
            }
            op::POP_MARK => {
                let from = self.take_mark()?;
                self.drain_values(from);
            }
            op::DUP => {
                let Some(i) = self.stack.len().checked_sub(1).filter(|&i| i >= self.floor()) else {
                    return Err(self.underflow().into());
                };
                let (v, depth) = self.share_at(i);
                self.push(Slot::new(v, depth))?
            }
            op::NONE => self.push_value(Value::None)?,
            op::NEWTRUE => self.push_value(Value::Bool(true))?,
            op::NEWFALSE => self.push_value(Value::Bool(false))?,
            op::BININT1 => {
                let b = self.input.byte()?;
                self.push_value(Value::Int(i64::from(b)))?
            }
            op::BININT2 => {
                let b = self.input.array::<2>()?;
                self.push_value(Value::Int(i64::from(u16::from_le_bytes(b))))?
            }
            op::BININT => {
                let b = self.input.array::<4>()?;
                self.push_value(Value::Int(i64::from(i32::from_le_bytes(b))))?
            }
            op::LONG1 => {
                let n = self.input.byte()?;
                self.long(u64::from(n))?
            }
            op::LONG4 => {
                let n = u32::from_le_bytes(self.input.array::<4>()?);
                self.long(u64::from(n))?
            }
            op::INT => {
                let text = self.text_arg()?;
                let v = match text.as_str() {
                    "00" => Value::Bool(false),
                    "01" => Value::Bool(true),
                    t => Value::Int(
                        t.parse().map_err(|_| self.err(K::BadText("INT", text.clone())))?,
                    ),
                };
                self.push_value(v)?
            }
            op::LONG => {
                let v = self.text_int()?;
                self.push_value(Value::Int(v))?
            }
            op::FLOAT => {
                let text = self.text_arg()?;
                let v = text.parse().map_err(|_| self.err(K::BadText("FLOAT", text.clone())))?;
                self.push_value(Value::Float(v))?
            }
            op::BINFLOAT => {
                let b = self.input.array::<8>()?;
                self.push_value(Value::Float(f64::from_be_bytes(b)))?
            }
            op::SHORT_BINUNICODE => {
                let n = self.input.byte()?;
                self.string(u64::from(n), true)?
            }
            op::BINUNICODE => {
                let n = u32::from_le_bytes(self.input.array::<4>()?);
                self.string(u64::from(n), true)?
            }
            op::BINUNICODE8 => {
                let n = u64::from_le_bytes(self.input.array::<8>()?);
                self.string(n, true)?
            }
            // Python 2 `str`: Python 3 reads it as text (encoding='ASCII' by default).
            op::SHORT_BINSTRING => {
                let n = self.input.byte()?;
                self.string(u64::from(n), true)?
            }
            op::BINSTRING => {
                let n = i32::from_le_bytes(self.input.array::<4>()?);
                let n = u64::try_from(n).map_err(|_| self.err(K::NegativeLength(n.into())))?;
                self.string(n, true)?
            }
            op::SHORT_BINBYTES => {
                let n = self.input.byte()?;
                self.string(u64::from(n), false)?
            }
            op::BINBYTES => {
                let n = u32::from_le_bytes(self.input.array::<4>()?);
                self.string(u64::from(n), false)?
            }
            op::BINBYTES8 | op::BYTEARRAY8 => {
                let n = u64::from_le_bytes(self.input.array::<8>()?);
                self.string(n, false)?
            }
            op::EMPTY_LIST => self.push(Slot::new(Value::list(Vec::new()), 1))?,
            op::EMPTY_DICT => self.push(Slot::new(Value::dict(Vec::new()), 1))?,
            op::EMPTY_TUPLE => self.push(Slot::new(Value::tuple(Vec::new()), 1))?,
            op::TUPLE1 => self.small_tuple(1)?,
            op::TUPLE2 => self.small_tuple(2)?,
            op::TUPLE3 => self.small_tuple(3)?,
            op::TUPLE => {
                let from = self.take_mark()?;
                self.make_tuple(from)?
            }
            op::LIST => {
                let from = self.take_mark()?;
                let (items, deepest) = self.drain_values(from);
                let depth = self.check_depth(deepest + 1)?;
                self.push(Slot::new(Value::list(items), depth))?
            }
            op::DICT => {
                let from = self.take_mark()?;
                let empty = Slot::new(Value::dict(Vec::new()), 1);
                self.stack.insert(from, empty);
                self.extend(from + 1, true)?
            }
            op::APPEND => {
                let from = self.stack.len().checked_sub(1).filter(|&f| f > self.floor());
                self.extend(from.ok_or_else(|| self.underflow())?, false)?
            }
            op::APPENDS => {
                let from = self.take_mark()?;
                self.extend(from, false)?
            }
            op::SETITEM => {
                let from = self.stack.len().checked_sub(2).filter(|&f| f > self.floor());
                self.extend(from.ok_or_else(|| self.underflow())?, true)?
            }
            op::SETITEMS => {
                let from = self.take_mark()?;
                self.extend(from, true)?
            }
            op::MEMOIZE => self.memo_put(self.memo.len() as u64)?,
            op::PUT => {
                let key = self.text_index()?;
                self.memo_put(key)?
            }
            op::BINPUT => {
                let key = self.input.byte()?;
                self.memo_put(u64::from(key))?
            }
            op::LONG_BINPUT => {
                let key = u32::from_le_bytes(self.input.array::<4>()?);
                self.memo_put(u64::from(key))?
            }
            op::GET => {
                let key = self.text_index()?;
                self.memo_get(key)?
            }
            op::BINGET => {
                let key = self.input.byte()?;
                self.memo_get(u64::from(key))?
            }
            op::LONG_BINGET => {
                let key = u32::from_le_bytes(self.input.array::<4>()?);
                self.memo_get(u64::from(key))?
            }
            op::GLOBAL
            | op::STACK_GLOBAL
            | op::REDUCE
            | op::BUILD
            | op::INST
            | op::OBJ
            | op::NEWOBJ
            | op::NEWOBJ_EX
            | op::EXT1
            | op::EXT2
            | op::EXT4
            | op::PERSID
            | op::BINPERSID => {
                return Err(self.err(K::Refused { name: name(code), code }).into());
            }
            op::EMPTY_SET | op::ADDITEMS | op::FROZENSET => {
                return Err(self.err(K::Unsupported("sets are in no trace format")).into());
            }
            op::NEXT_BUFFER | op::READONLY_BUFFER => {
                return Err(self.err(K::Unsupported("out-of-band buffers")).into());
            }
            op::STRING | op::UNICODE => {
                return Err(self.err(K::Unsupported("protocol 0 text strings")).into());
            }
            other => return Err(self.err(K::UnknownOpcode(other)).into()),
        }
        Ok(())
    }
}
