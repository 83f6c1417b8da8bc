//! Executing one opcode: the dispatch table of the VM in `read`, and the opcodes that make
//! scalars. Kept apart from the stack and memo machinery so each file reads on its own.

use super::budget::BOX;
use super::input::{InputError, BUF_BYTES};
use super::opcodes::{self as op, name};
use super::read::{release, Failure, Slot, Step, Vm};
use super::{PickleErrorKind as K, Value};
use std::io::Read;
use std::rc::Rc;

impl<R: Read> Vm<'_, R> {
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

    /// A string or bytes of `n` bytes, counted by whoever keeps it. One longer than the input
    /// buffer is gathered in the scratch buffer as it arrives and copied out, within the
    /// memory left.
    fn string(&mut self, n: u64, as_str: bool) -> Result<Value, Failure> {
        let long = n > BUF_BYTES as u64;
        let room = self.held.room().saturating_sub(BOX);
        let mut scratch = std::mem::take(&mut self.scratch);
        let strings = &mut self.strings;
        let v = self.input.with_bytes(n, &mut scratch, room, |b| {
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
        // A long string's scratch is not kept: it is held only while the string is read.
        self.scratch = if long { Vec::new() } else { scratch };
        match v {
            Ok(v) => Ok(v),
            Err(InputError::Limit) => Err(self.over_limit().into()),
            Err(e) => Err(e.into()),
        }
    }

    fn long(&mut self, n: u64) -> Result<Value, Failure> {
        if n == 9 {
            // A non-negative int below 2^64 (C++'s `size_t(-1)`, PyTorch's line of a frame
            // without one) keeps its 64 bits: 2^64 - 1 reads as -1.
            let low = self.input.array::<8>()?;
            if self.input.byte()? != 0 {
                return Err(self.err(K::IntTooWide(n)).into());
            }
            return Ok(Value::Int(i64::from_le_bytes(low)));
        }
        if n > 8 {
            return Err(self.err(K::IntTooWide(n)).into());
        }
        let n = n as usize;
        let mut bytes = self.input.up_to_8(n)?;
        if n > 0 && bytes[n - 1] & 0x80 != 0 {
            bytes[n..].fill(0xff);
        }
        Ok(Value::Int(i64::from_le_bytes(bytes)))
    }

    /// The value of an opcode that makes a scalar (an int, a float, a string, None, a bool)
    /// from its arguments alone; `None` for every other opcode, whose arguments are left
    /// unread. Shared by [`Vm::step`] and the record streamer.
    #[inline]
    pub(super) fn scalar(&mut self, code: u8) -> Result<Option<Value>, Failure> {
        let v = match code {
            op::NONE => Value::None,
            op::NEWTRUE => Value::Bool(true),
            op::NEWFALSE => Value::Bool(false),
            op::BININT1 => Value::Int(i64::from(self.input.byte()?)),
            op::BININT2 => Value::Int(i64::from(u16::from_le_bytes(self.input.array::<2>()?))),
            op::BININT => Value::Int(i64::from(i32::from_le_bytes(self.input.array::<4>()?))),
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
                match text.as_str() {
                    "00" => Value::Bool(false),
                    "01" => Value::Bool(true),
                    t => Value::Int(
                        t.parse().map_err(|_| self.err(K::BadText("INT", text.clone())))?,
                    ),
                }
            }
            op::LONG => Value::Int(self.text_int()?),
            op::FLOAT => {
                let text = self.text_arg()?;
                Value::Float(text.parse().map_err(|_| self.err(K::BadText("FLOAT", text.clone())))?)
            }
            op::BINFLOAT => Value::Float(f64::from_be_bytes(self.input.array::<8>()?)),
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
            _ => return Ok(None),
        };
        Ok(Some(v))
    }

    pub(super) fn step(&mut self) -> Step {
        let code = self.opcode;
        if let Some(v) = self.scalar(code)? {
            return self.push_new(v, 0);
        }
        match code {
            op::PROTO => {
                self.idle()?;
                let v = self.input.byte()?;
                if !(2..=5).contains(&v) {
                    return Err(self.err(K::Protocol(v)).into());
                }
            }
            op::FRAME => {
                // Framing only groups opcodes for buffered reading; the length is not needed.
                self.idle()?;
                self.input.array::<8>()?;
            }
            op::MARK => {
                if !self.held.reserve(&mut self.marks, 1) {
                    return Err(self.over_limit().into());
                }
                self.marks.push(self.stack.len())
            }
            op::POP => {
                self.idle()?;
                // Python 3 pops a MARK when nothing was pushed after it.
                if self.marks.last() == Some(&self.stack.len()) {
                    self.marks.pop();
                } else {
                    let slot = self.pop()?;
                    let v = release(slot, &mut self.memo);
                    self.dispose(v);
                }
            }
            op::POP_MARK => {
                self.idle()?;
                let from = self.take_mark()?;
                self.discard(from);
            }
            op::DUP => {
                let Some(i) = self.stack.len().checked_sub(1).filter(|&i| i >= self.floor()) else {
                    return Err(self.underflow().into());
                };
                let (v, depth) = self.share_at(i);
                self.push(Slot::new(v, depth))?
            }
            op::EMPTY_LIST => self.push_new(Value::list(Vec::new()), 1)?,
            op::EMPTY_DICT => self.push_new(Value::dict(Vec::new()), 1)?,
            op::EMPTY_TUPLE => self.push_new(Value::tuple(Vec::new()), 1)?,
            op::TUPLE1 => self.small_tuple(1)?,
            op::TUPLE2 => self.small_tuple(2)?,
            op::TUPLE3 => self.small_tuple(3)?,
            op::TUPLE => {
                let from = self.take_mark()?;
                self.make_tuple(from)?
            }
            op::LIST => {
                let from = self.take_mark()?;
                let (items, deepest) = self.drain_values(from)?;
                let depth = self.check_depth(deepest + 1)?;
                self.push(Slot::new(Value::list(items), depth))?
            }
            op::DICT => {
                let from = self.take_mark()?;
                let empty = Value::dict(Vec::new());
                self.charge(BOX)?;
                if !self.held.reserve(&mut self.stack, 1) {
                    return Err(self.over_limit().into());
                }
                self.stack.insert(from, Slot::new(empty, 1));
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
