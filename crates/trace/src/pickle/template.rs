//! A record's opcodes, learned from one record and matched against the next.
//!
//! The records of a snapshot's trace repeat one shape: the same keys, written as the same
//! `GET`s of strings memoized once, in the same order, each followed by a value of the same
//! kind, memoized or not in the same places. `flat_record` (in `stream`) reads any flat
//! record, deciding at every opcode what it is; a [`Template`] is what it found in one record,
//! and reading the next as "the same again" checks a key with one masked compare and a value's
//! opcode against the one kind expected. Without stacks that is most of reading a snapshot.
//!
//! It is a shortcut of `flat_record`, never a reader of its own: a record it accepts is one
//! `flat_record` would accept, and it leaves the fields, the memo and the charge as
//! `flat_record` would. Anything else (another key, a value of another kind, a string that is
//! not the one learned, a `GET` of a key this very record memoized) is a miss, and the record
//! goes to `flat_record` as before. A miss changes only field values that the fallback
//! overwrites, and clears nothing: the memo appends come last, when all else matched.

use super::budget::{own_bytes, str_bytes};
use super::memo::{Memo, MemoRef, MemoTable};
use super::opcodes as op;
use super::Value;
use std::rc::Rc;

/// A key that is none of the spec's fields (as in `stream`).
const IGNORED: u8 = u8::MAX;

/// Most pairs a template holds (a snapshot's records have about eight).
pub(super) const MAX_PAIRS: usize = 16;

/// What a record's value is, as learned.
#[derive(Debug, Clone)]
enum Shape {
    /// `BININT1`, `BININT2`, `BININT` or `LONG1` of 1 to 8 bytes.
    Int,
    /// `BINGET` or `LONG_BINGET` of a finished value.
    Get,
    /// `SHORT_BINUNICODE` of exactly this text (kept or memoized: this string is used).
    Str(Rc<String>),
    /// `SHORT_BINUNICODE` of any text, neither kept nor memoized (`flat_record` skips it).
    AnyStr,
    /// `NONE`, `NEWTRUE` or `NEWFALSE`: this opcode.
    Op(u8),
}

impl Shape {
    /// The most bytes a value of this shape takes, opcode included.
    fn max_len(&self) -> usize {
        match self {
            Shape::Int => 1 + 9,
            Shape::Get => 1 + 4,
            Shape::Str(s) => 2 + s.len(),
            Shape::AnyStr => 2 + 255,
            Shape::Op(_) => 1,
        }
    }
}

/// Bytes that every record of a shape has at one place: the opcodes between two values (the
/// memo put of the one before, the next key's `GET`), up to 8 of them, compared at once.
#[derive(Debug, Clone, Copy, Default)]
struct Fixed {
    /// The bytes, little-endian, under `mask`.
    word: u64,
    mask: u64,
    len: u8,
}

impl Fixed {
    fn of(bytes: &[u8]) -> Option<Fixed> {
        let len = bytes.len();
        if len == 0 || len > 8 {
            return None;
        }
        let mut word = [0; 8];
        word[..len].copy_from_slice(bytes);
        let mask = u64::MAX >> (64 - 8 * len);
        Some(Fixed { word: u64::from_le_bytes(word), mask, len: len as u8 })
    }

    /// Whether `w` has these bytes at `p`.
    #[inline(always)]
    fn at<const WINDOW: usize>(&self, w: &[u8; WINDOW], p: usize) -> Option<bool> {
        Some(u64::from_le_bytes(*w.get(p..)?.first_chunk::<8>()?) & self.mask == self.word)
    }
}

#[derive(Debug, Clone)]
struct Pair {
    /// The bytes before the value: the memo put after the last value (or the record's
    /// `[MEMOIZE] MARK`) and this key's `GET`.
    before: Fixed,
    field: u8,
    shape: Shape,
    /// Whether a `MEMOIZE` follows the value (it begins the next pair's `before`).
    memoized: bool,
}

/// The shape of the last record `flat_record` read in place, while the memo only grew.
#[derive(Debug, Default)]
pub(super) struct Template {
    /// The memo's epoch when learned: while it stands, a key's `GET` names the same string.
    epoch: u64,
    dict_memoized: bool,
    /// Empty: nothing learned.
    pairs: Vec<Pair>,
    /// The bytes after the last value: its memo put, and `SETITEMS`.
    end: Fixed,
    /// The memo slot of each entry the last record of this shape appended (the dict's
    /// first), for [`MemoTable::append_again`].
    slots: [u32; MAX_PAIRS + 1],
}

/// What [`Template::learn`] needs of the record streamer's state.
pub(super) struct Seen<'a> {
    /// The memo key and field of the key read at each position of the record.
    pub keys: &'a [(u64, u8)],
    /// The fields, as the record left them.
    pub fields: &'a [Option<Value>],
    /// The string last made at each position of the record.
    pub strings: &'a [Option<Rc<String>>],
}

impl Template {
    /// Learn the shape of `record`, the bytes after `EMPTY_DICT` that `flat_record` has just
    /// read (it ends with `SETITEMS`). Keeps the template learned before if this record has
    /// another kind of value (a list, say), no pair, more pairs than `seen.keys` covers, or a
    /// shape whose records may take `limit` bytes or more.
    pub fn learn(&mut self, record: &[u8], limit: usize, memo: &MemoTable, seen: Seen<'_>) {
        let byte = |p: usize| record.get(p).copied();
        let dict_memoized = byte(0) == Some(op::MEMOIZE);
        let mut p = usize::from(dict_memoized);
        if byte(p) != Some(op::MARK) {
            return;
        }
        p += 1;
        // Where the fixed bytes before the next value start.
        let mut fixed = 0;
        let mut pairs: Vec<Pair> = Vec::with_capacity(self.pairs.capacity().max(8));
        let mut max_len = 0;
        while let Some(code) = byte(p) {
            if code == op::SETITEMS {
                let Some(end) = Fixed::of(&record[fixed..=p]) else { return };
                max_len += p + 1 - fixed;
                if p + 1 == record.len() && !pairs.is_empty() && max_len <= limit {
                    let (epoch, slots) = (memo.epoch(), [0; MAX_PAIRS + 1]);
                    *self = Template { epoch, dict_memoized, pairs, end, slots };
                }
                return;
            }
            let key = match code {
                op::BINGET => u64::from(byte(p + 1).unwrap_or(0)),
                op::LONG_BINGET => match record.get(p + 1..p + 5) {
                    Some(b) => u64::from(u32::from_le_bytes(b.try_into().unwrap_or_default())),
                    None => return,
                },
                _ => return,
            };
            p += if code == op::BINGET { 2 } else { 5 };
            let at = pairs.len();
            let field = match seen.keys.get(at) {
                Some(&(k, field)) if k == key && at < MAX_PAIRS => field,
                _ => return,
            };
            let Some(before) = Fixed::of(record.get(fixed..p).unwrap_or_default()) else {
                return;
            };
            let Some(code) = byte(p) else { return };
            let value_len = match code {
                op::BININT1 => 1,
                op::BININT2 => 2,
                op::BININT => 4,
                op::LONG1 => match byte(p + 1) {
                    Some(n @ 1..=8) => 1 + usize::from(n),
                    _ => return,
                },
                op::BINGET => 1,
                op::LONG_BINGET => 4,
                op::SHORT_BINUNICODE => 1 + usize::from(byte(p + 1).unwrap_or(0)),
                op::NONE | op::NEWTRUE | op::NEWFALSE => 0,
                _ => return,
            };
            let Some(value) = record.get(p + 1..p + 1 + value_len) else { return };
            p += 1 + value_len;
            let memoized = byte(p) == Some(op::MEMOIZE);
            let shape = match code {
                op::BININT1 | op::BININT2 | op::BININT | op::LONG1 => Shape::Int,
                op::BINGET | op::LONG_BINGET => Shape::Get,
                op::SHORT_BINUNICODE if field == IGNORED && !memoized => Shape::AnyStr,
                op::SHORT_BINUNICODE => {
                    // The string made for the memo (as `flat_record` makes it, so that it is
                    // charged the same), else the one the field holds.
                    let held = match (memoized, seen.fields.get(usize::from(field))) {
                        (false, Some(Some(Value::Str(s)))) => Some(s),
                        _ => seen.strings.get(at).and_then(Option::as_ref),
                    };
                    match held {
                        Some(s) if s.as_bytes() == &value[1..] => Shape::Str(s.clone()),
                        _ => return,
                    }
                }
                _ => Shape::Op(code),
            };
            max_len += usize::from(before.len) + shape.max_len();
            fixed = p;
            p += usize::from(memoized);
            pairs.push(Pair { before, field, shape, memoized });
        }
    }

    /// Read one record of the learned shape from `w` (the bytes after its `EMPTY_DICT`), as
    /// `flat_record` would: set the fields it sets (marking them in `present`), append the
    /// memo entries and return the bytes used and the memory to charge. `None` when the
    /// record is not of that shape; the memo then holds what it held (unless an append
    /// failed, which `flat_record` would refuse too: the caller rolls back).
    ///
    /// A record of this shape takes fewer than `limit` bytes (`learn` made sure), the bound
    /// below which `flat_record` reads opcodes, which leaves room in `w` for any argument:
    /// so it is read with no check of its length on the way.
    #[inline(always)]
    pub fn read<const WINDOW: usize>(
        &mut self,
        w: &[u8; WINDOW],
        memo: &mut MemoTable,
        fields: &mut [Option<Value>],
        present: &mut u64,
    ) -> Option<(usize, u64)> {
        if self.pairs.is_empty() || memo.epoch() != self.epoch {
            return None;
        }
        let mut p = 0;
        // The argument of each memoized value, appended once the whole record matched.
        let mut args = [0u64; MAX_PAIRS];
        for (at, pair) in self.pairs.iter().enumerate() {
            if !pair.before.at(w, p)? {
                return None;
            }
            p += usize::from(pair.before.len);
            let code = w[p];
            p += 1;
            let f = usize::from(pair.field);
            let keep = pair.field != IGNORED;
            let arg = match &pair.shape {
                Shape::Int => {
                    let arg = u64::from_le_bytes(*w.get(p + 1..)?.first_chunk::<8>()?);
                    let x = match code {
                        op::BININT1 => {
                            p += 1;
                            u64::from(w[p - 1])
                        }
                        op::BININT2 => {
                            p += 2;
                            u64::from(u16::from_le_bytes([w[p - 2], w[p - 1]]))
                        }
                        op::BININT => {
                            p += 4;
                            i64::from(i32::from_le_bytes(*w[p - 4..].first_chunk::<4>()?)) as u64
                        }
                        op::LONG1 => {
                            // Little-endian two's complement of n bytes, sign-extended.
                            let n = usize::from(w[p]);
                            if n == 0 || n > 8 {
                                return None;
                            }
                            p += 1 + n;
                            let shift = 64 - 8 * n as u32;
                            (((arg << shift) as i64) >> shift) as u64
                        }
                        _ => return None,
                    };
                    if keep {
                        *present |= 1 << pair.field;
                        match &mut fields[f] {
                            Some(Value::Int(old)) => *old = x as i64,
                            slot => *slot = Some(Value::Int(x as i64)),
                        }
                    }
                    x
                }
                Shape::Get => {
                    let key = match code {
                        op::BINGET => {
                            p += 1;
                            u64::from(w[p - 1])
                        }
                        op::LONG_BINGET => {
                            p += 4;
                            u64::from(u32::from_le_bytes(*w[p - 4..].first_chunk::<4>()?))
                        }
                        _ => return None,
                    };
                    let Some(MemoRef::Value(v, _)) = memo.get(key) else { return None };
                    if keep {
                        *present |= 1 << pair.field;
                        match (v, &mut fields[f]) {
                            (Value::Str(new), Some(Value::Str(old))) if Rc::ptr_eq(new, old) => {}
                            (v, slot) => *slot = Some(v.clone()),
                        }
                    }
                    key
                }
                Shape::Str(s) if code == op::SHORT_BINUNICODE => {
                    let n = usize::from(w[p]);
                    if w[p + 1..].get(..n)? != s.as_bytes() {
                        return None;
                    }
                    p += 1 + n;
                    if keep {
                        *present |= 1 << pair.field;
                        match &fields[f] {
                            Some(Value::Str(old)) if Rc::ptr_eq(old, s) => {}
                            _ => fields[f] = Some(Value::Str(s.clone())),
                        }
                    }
                    0
                }
                Shape::AnyStr if code == op::SHORT_BINUNICODE => {
                    p += 1 + usize::from(w[p]);
                    0
                }
                &Shape::Op(expected) if code == expected => {
                    if keep {
                        *present |= 1 << pair.field;
                        fields[f] = Some(constant(code));
                    }
                    0
                }
                _ => return None,
            };
            args[at] = arg;
        }
        if !self.end.at(w, p)? {
            return None;
        }
        p += usize::from(self.end.len);
        // All matched: the memo entries, in the order the record made them. Most are the
        // marker or the string the last record appended, in a slot of the memo already.
        let mut cost = 0;
        let mut slots = self.slots.iter_mut();
        if self.dict_memoized {
            append_again(slots.next()?, memo, None, || Memo::Streamed)?;
        }
        for (pair, &arg) in self.pairs.iter().zip(&args).filter(|(pair, _)| pair.memoized) {
            match &pair.shape {
                Shape::Str(s) => {
                    cost += str_bytes(s);
                    let make = || Memo::Value(Value::Str(s.clone()), 0);
                    append_again(slots.next()?, memo, Some(s), make)?;
                }
                Shape::Int => memo.append(Memo::Value(Value::Int(arg as i64), 0))?,
                Shape::Get => {
                    let Some(MemoRef::Value(v, depth)) = memo.get(arg) else { return None };
                    let v = v.clone();
                    cost += own_bytes(&v);
                    memo.append(Memo::Value(v, depth))?;
                }
                &Shape::Op(code) => memo.append(Memo::Value(constant(code), 0))?,
                Shape::AnyStr => return None,
            }
        }
        Some((p, cost))
    }
}

/// Append the marker (`string` None) or `string` to the memo in `slot`, the slot of the
/// last record's entry, or else as `make` makes it, and remember its slot.
#[inline(always)]
fn append_again(
    slot: &mut u32,
    memo: &mut MemoTable,
    string: Option<&Rc<String>>,
    make: impl FnOnce() -> Memo,
) -> Option<()> {
    if !memo.append_again(*slot, string) {
        memo.append(make())?;
        *slot = memo.last_slot();
    }
    Some(())
}

/// The value of `NONE`, `NEWTRUE` or `NEWFALSE`.
fn constant(code: u8) -> Value {
    match code {
        op::NEWTRUE => Value::Bool(true),
        op::NEWFALSE => Value::Bool(false),
        _ => Value::None,
    }
}
