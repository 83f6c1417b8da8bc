//! A record's opcodes, learned from one record and matched against the next.
//!
//! The records of a snapshot's trace repeat a few shapes: the same keys, written as the same
//! `GET`s of strings memoized once, in the same order, each followed by a value of the same
//! kind, memoized or not in the same places. `flat_record` (in `stream`) reads any flat
//! record, deciding at every opcode what it is; a [`Template`] is what it found in one record,
//! and reading the next as "the same again" checks the bytes between two values (a memo put,
//! the next key's `GET`) with one masked compare, and a value's opcode against the one kind
//! expected. A stack's list of frames met before is read as `flat_record` reads it.
//!
//! It is a shortcut of `flat_record`, never a reader of its own: a record it accepts is one
//! `flat_record` would accept, and it leaves the fields, the memo and the charge as
//! `flat_record` would. Anything else (another key, a value of another kind, a string that is
//! not the one learned, a `GET` of a key this very record memoized) is a miss, and the record
//! goes to `flat_record` as before. A miss changes only field values that the fallback
//! overwrites, and clears nothing: the memo appends come last, when all else matched.

use super::budget::{own_bytes, str_bytes};
use super::inplace::{list_end, list_items, FLAT_LIMIT, FLAT_WINDOW_BYTES};
use super::lists::{ListCache, ListsByBytes};
use super::memo::{Memo, MemoRef, MemoTable};
use super::opcodes as op;
use super::Value;
use std::rc::Rc;

/// A key that is none of the spec's fields (as in `stream`).
const IGNORED: u8 = u8::MAX;

/// Most pairs a template holds (a snapshot's records have about eight).
const MAX_PAIRS: usize = 16;

/// What a record's value is, as learned.
#[derive(Debug, Clone)]
enum Shape {
    /// `BININT1`, `BININT2`, `BININT` or `LONG1` of 1 to 8 bytes.
    Int,
    /// `BINGET` or `LONG_BINGET` of a finished value.
    Get,
    /// `SHORT_BINUNICODE` of exactly this text (kept or memoized: this string is used), and
    /// the opcode, length and text as one [`Fixed`] when they fit in eight bytes (else one
    /// of length 0).
    Str(Rc<String>, Fixed),
    /// `SHORT_BINUNICODE` of any text, neither kept nor memoized (`flat_record` skips it).
    AnyStr,
    /// `NONE`, `NEWTRUE` or `NEWFALSE`: this opcode.
    Op(u8),
    /// `EMPTY_LIST MEMOIZE` and the `GET`s of its items, as `flat_record` reads a stack: any
    /// number of them, then at most `rest` bytes to the record's end.
    List { rest: usize },
}

impl Shape {
    /// The most bytes a value of this shape takes, opcode included (a list's items aside).
    fn max_len(&self) -> usize {
        match self {
            Shape::Int => 1 + 9,
            Shape::Get => 1 + 4,
            Shape::Str(s, _) => 2 + s.len(),
            Shape::AnyStr => 2 + 255,
            Shape::Op(_) => 1,
            Shape::List { .. } => 2,
        }
    }
}

/// The record streamer's lists (see `flat_record`), for a record's stack.
pub(super) struct Lists<'a> {
    pub by_bytes: &'a mut ListsByBytes,
    pub cache: &'a mut ListCache,
    pub items: &'a mut Vec<Value>,
    pub max_depth: u32,
}

impl Lists<'_> {
    fn reborrow(&mut self) -> Lists<'_> {
        let Lists { by_bytes, cache, items, max_depth } = self;
        Lists { by_bytes, cache, items, max_depth: *max_depth }
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
    fn at(&self, w: &[u8; FLAT_WINDOW_BYTES], p: usize) -> Option<bool> {
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

/// The shape of a record `flat_record` read in place, while the memo only grew.
#[derive(Debug)]
struct Template {
    /// The memo's epoch when learned: while it stands, a key's `GET` names the same string.
    epoch: u64,
    dict_memoized: bool,
    /// At least one.
    pairs: Vec<Pair>,
    /// The bytes after the last value: its memo put, and `SETITEMS`.
    end: Fixed,
    /// The pairs whose value gets a memo entry (a memo put after it, or a list's own).
    puts: Vec<usize>,
    /// The memo slot of each entry the last record of this shape appended (the dict's
    /// first), for [`MemoTable::append_again`].
    slots: [u32; MAX_PAIRS + 1],
}

/// Shapes a [`Templates`] keeps: a snapshot with stacks alternates three kinds of entry (an
/// allocation and a free request, each with a list of its own, and a free completion sharing
/// its request's).
const SHAPES: usize = 4;

/// The shapes of the last records read in place, each tried first after the one it last
/// followed.
#[derive(Debug, Default)]
pub(super) struct Templates {
    shapes: Vec<Template>,
    /// The shape that read the last record.
    last: usize,
    /// For each shape, the one that read the record after it last time.
    after: [usize; SHAPES],
    /// Where the next shape learned goes, once all are taken.
    next: usize,
}

impl Templates {
    /// Read one record by a shape it has ([`Template::read`]). `None`: no shape matched, and
    /// the memo holds what it held unless an append failed (the caller rolls back); the
    /// fields set on the way are some of the record's own (its first pairs, as it has them).
    #[inline(always)]
    pub fn read(
        &mut self,
        w: &[u8; FLAT_WINDOW_BYTES],
        memo: &mut MemoTable,
        mut lists: Lists<'_>,
        fields: &mut [Option<Value>],
        present: &mut u64,
    ) -> Option<(usize, u64)> {
        let first = self.after[self.last];
        let len = memo.len();
        // The shape that followed the last record's, then the others.
        let order = std::iter::once(first).chain((0..self.shapes.len()).filter(|&i| i != first));
        for i in order {
            let Some(shape) = self.shapes.get_mut(i) else { break };
            if let Some(read) = shape.read(w, memo, lists.reborrow(), fields, present) {
                (self.after[self.last], self.last) = (i, i);
                return Some(read);
            }
            if memo.len() != len {
                return None;
            }
            *present = 0;
        }
        None
    }

    /// Learn the shape of a record no shape matched and `flat_record` read (see
    /// [`Template::learn`]), in place of the one learned longest ago once all are taken.
    pub fn learn(&mut self, record: &[u8], memo: &MemoTable, seen: Seen<'_>) {
        let Some(shape) = Template::learn(record, memo, seen) else { return };
        let i = if self.shapes.len() < SHAPES {
            self.shapes.push(shape);
            self.shapes.len() - 1
        } else {
            self.shapes[self.next] = shape;
            self.next
        };
        self.next = (i + 1) % SHAPES;
        (self.after[self.last], self.last) = (i, i);
    }
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
    /// The shape of `record`, the bytes after `EMPTY_DICT` that `flat_record` has just read
    /// (it ends with `SETITEMS`); `None` if it has another kind of value (a list not memoized,
    /// say), no pair, more pairs than `seen.keys` covers, or a shape whose records may reach
    /// `FLAT_LIMIT` besides their lists' items.
    fn learn(record: &[u8], memo: &MemoTable, seen: Seen<'_>) -> Option<Template> {
        // The record as `flat_record` saw it, for `list_end`.
        let mut window = [0; FLAT_WINDOW_BYTES];
        if let Some(w) = window.get_mut(..record.len()) {
            w.copy_from_slice(record);
        }
        let byte = |p: usize| record.get(p).copied();
        let dict_memoized = byte(0) == Some(op::MEMOIZE);
        let mut p = usize::from(dict_memoized);
        if byte(p) != Some(op::MARK) {
            return None;
        }
        p += 1;
        // Where the fixed bytes before the next value start.
        let mut fixed = 0;
        let mut pairs: Vec<Pair> = Vec::with_capacity(8);
        let mut max_len = 0;
        while let Some(code) = byte(p) {
            if code == op::SETITEMS {
                let end = Fixed::of(&record[fixed..=p])?;
                max_len += p + 1 - fixed;
                // What may follow each list.
                let mut rest = p + 1 - fixed;
                for pair in pairs.iter_mut().rev() {
                    match &mut pair.shape {
                        Shape::List { rest: after } => *after = rest,
                        shape => rest += usize::from(pair.before.len) + shape.max_len(),
                    }
                }
                if p + 1 == record.len() && !pairs.is_empty() && max_len < FLAT_LIMIT {
                    let (epoch, slots) = (memo.epoch(), [0; MAX_PAIRS + 1]);
                    let put = |p: &Pair| p.memoized || matches!(p.shape, Shape::List { .. });
                    let puts = (0..pairs.len()).filter(|&i| put(&pairs[i])).collect();
                    return Some(Template { epoch, dict_memoized, pairs, end, puts, slots });
                }
                return None;
            }
            let key = match code {
                op::BINGET => u64::from(byte(p + 1).unwrap_or(0)),
                op::LONG_BINGET => {
                    u64::from(u32::from_le_bytes(*record.get(p + 1..)?.first_chunk()?))
                }
                _ => return None,
            };
            p += if code == op::BINGET { 2 } else { 5 };
            let at = pairs.len();
            let field = match seen.keys.get(at) {
                Some(&(k, field)) if k == key && at < MAX_PAIRS => field,
                _ => return None,
            };
            let before = Fixed::of(record.get(fixed..p)?)?;
            let code = byte(p)?;
            let value_len = match code {
                op::BININT1 => 1,
                op::BININT2 => 2,
                op::BININT => 4,
                op::LONG1 => match byte(p + 1) {
                    Some(n @ 1..=8) => 1 + usize::from(n),
                    _ => return None,
                },
                op::BINGET => 1,
                op::LONG_BINGET => 4,
                op::SHORT_BINUNICODE => 1 + usize::from(byte(p + 1).unwrap_or(0)),
                op::NONE | op::NEWTRUE | op::NEWFALSE => 0,
                // A memoized list of GETs, as far as `list_end` reads it.
                op::EMPTY_LIST if byte(p + 1) == Some(op::MEMOIZE) => {
                    match list_end(&window, p + 2) {
                        Some(end) if end <= record.len() => end - p - 1,
                        _ => return None,
                    }
                }
                _ => return None,
            };
            let value = record.get(p + 1..p + 1 + value_len)?;
            p += 1 + value_len;
            let memoized = byte(p) == Some(op::MEMOIZE);
            let shape = match code {
                op::BININT1 | op::BININT2 | op::BININT | op::LONG1 => Shape::Int,
                op::BINGET | op::LONG_BINGET => Shape::Get,
                op::EMPTY_LIST => Shape::List { rest: 0 },
                op::SHORT_BINUNICODE if field == IGNORED && !memoized => Shape::AnyStr,
                op::SHORT_BINUNICODE => {
                    // The string made for the memo (as `flat_record` makes it, so that it is
                    // charged the same), else the one the field holds.
                    let held = match (memoized, seen.fields.get(usize::from(field))) {
                        (false, Some(Some(Value::Str(s)))) => Some(s),
                        _ => seen.strings.get(at).and_then(Option::as_ref),
                    };
                    match held {
                        Some(s) if s.as_bytes() == &value[1..] => Shape::Str(
                            s.clone(),
                            Fixed::of(&record[p - 1 - value_len..p]).unwrap_or_default(),
                        ),
                        _ => return None,
                    }
                }
                _ => Shape::Op(code),
            };
            let lists = pairs.iter().filter(|p| matches!(p.shape, Shape::List { .. })).count();
            if matches!(shape, Shape::List { .. }) && (memoized || lists > 0) {
                // A list memoized twice, or a second list: `read` keeps one, memoized once.
                return None;
            }
            max_len += usize::from(before.len) + shape.max_len();
            fixed = p;
            p += usize::from(memoized);
            pairs.push(Pair { before, field, shape, memoized });
        }
        None
    }

    /// Read one record of the learned shape from `w` (the bytes after its `EMPTY_DICT`), as
    /// `flat_record` would: set the fields it sets (marking them in `present`), append the
    /// memo entries and return the bytes used and the memory to charge. `None` when the
    /// record is not of that shape; the memo then holds what it held (unless an append
    /// failed, which `flat_record` would refuse too: the caller rolls back).
    ///
    /// A record of this shape takes fewer than `FLAT_LIMIT` bytes besides its list's items
    /// (`learn` made sure, and after a list its `rest` is checked), the bound below which
    /// `flat_record` reads opcodes, which leaves room in `w` for any argument: so it is read
    /// with no check of its length on the way.
    #[inline(always)]
    fn read(
        &mut self,
        w: &[u8; FLAT_WINDOW_BYTES],
        memo: &mut MemoTable,
        lists: Lists<'_>,
        fields: &mut [Option<Value>],
        present: &mut u64,
    ) -> Option<(usize, u64)> {
        if memo.epoch() != self.epoch {
            return None;
        }
        let mut p = 0;
        let mut cost = 0;
        // The argument of each memoized value, and the list, appended once the whole record
        // matched.
        let mut args = [0u64; MAX_PAIRS];
        let mut list = None;
        for (at, pair) in self.pairs.iter().enumerate() {
            if !pair.before.at(w, p)? {
                return None;
            }
            p += usize::from(pair.before.len);
            let code = w[p];
            p += 1;
            let f = usize::from(pair.field);
            let keep = pair.field != IGNORED;
            match &pair.shape {
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
                    if pair.memoized {
                        args[at] = x;
                    }
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
                    if pair.memoized {
                        args[at] = key;
                    }
                }
                Shape::Str(s, fixed) => {
                    // Opcode, length and text: most often one compare (a snapshot's "N/A").
                    match fixed.len {
                        0 => {
                            let n = usize::from(w[p]);
                            if code != op::SHORT_BINUNICODE || w[p + 1..].get(..n)? != s.as_bytes()
                            {
                                return None;
                            }
                            p += 1 + n;
                        }
                        len if fixed.at(w, p - 1)? => p += usize::from(len) - 1,
                        _ => return None,
                    }
                    if keep {
                        *present |= 1 << pair.field;
                        match &fields[f] {
                            Some(Value::Str(old)) if Rc::ptr_eq(old, s) => {}
                            _ => fields[f] = Some(Value::Str(s.clone())),
                        }
                    }
                }
                Shape::AnyStr if code == op::SHORT_BINUNICODE => {
                    p += 1 + usize::from(w[p]);
                }
                &Shape::Op(expected) if code == expected => {
                    if keep {
                        *present |= 1 << pair.field;
                        fields[f] = Some(constant(code));
                    }
                }
                &Shape::List { rest } if code == op::EMPTY_LIST && w[p] == op::MEMOIZE => {
                    // As the `EMPTY_LIST` arm of `flat_record` builds it.
                    let body = p + 1;
                    p = list_end(w, body)?;
                    if p + rest > FLAT_LIMIT {
                        return None;
                    }
                    let ops = &w[body..p];
                    let (value, depth) = match lists.by_bytes.find(ops, memo.epoch()) {
                        Some((rc, depth)) => (Value::List(rc.clone()), depth),
                        None => {
                            // Nothing is appended before the whole record matched: every
                            // key the list GETs is older than the record.
                            let depth = list_items(ops, memo, lists.items)?.0.saturating_add(1);
                            let (value, shared) = lists.cache.get(lists.items);
                            if !shared {
                                cost += own_bytes(&value);
                            }
                            if let Value::List(rc) = &value {
                                lists.by_bytes.insert(ops, memo.epoch(), rc, depth);
                            }
                            (value, depth)
                        }
                    };
                    if depth > lists.max_depth {
                        return None;
                    }
                    if keep {
                        *present |= 1 << pair.field;
                        fields[f] = Some(value.clone());
                    }
                    list = Some((value, depth));
                }
                _ => return None,
            }
        }
        if !self.end.at(w, p)? {
            return None;
        }
        p += usize::from(self.end.len);
        // All matched: the memo entries, in the order the record made them. Most are the
        // marker or the string the last record appended, in a slot of the memo already.
        let mut slots = self.slots.iter_mut();
        if self.dict_memoized {
            append_again(slots.next()?, memo, None, || Memo::Streamed)?;
        }
        // A string appended into the slot that holds it is no new memory (a fresh `"N/A"` in
        // every entry, as CPython writes PyTorch's: charged each time, it was 43 bytes an
        // entry the reader did not hold); one given a slot of its own is charged.
        for &at in &self.puts {
            let (pair, arg) = (&self.pairs[at], args[at]);
            match &pair.shape {
                Shape::Str(s, _) => {
                    let make = || Memo::Value(Value::Str(s.clone()), 0);
                    if append_again(slots.next()?, memo, Some(s), make)? {
                        cost += str_bytes(s);
                    }
                }
                Shape::Int => memo.append(Memo::Value(Value::Int(arg as i64), 0))?,
                Shape::Get => {
                    let Some(MemoRef::Value(v, depth)) = memo.get(arg) else { return None };
                    let v = v.clone();
                    cost += own_bytes(&v);
                    memo.append(Memo::Value(v, depth))?;
                }
                &Shape::Op(code) => memo.append(Memo::Value(constant(code), 0))?,
                Shape::List { .. } => {
                    let (value, depth) = list.take()?;
                    memo.append(Memo::Value(value, depth))?;
                }
                Shape::AnyStr => return None,
            }
        }
        Some((p, cost))
    }
}

/// Append the marker (`string` None) or `string` to the memo in `slot`, the slot of the
/// last record's entry, or else as `make` makes it, and remember its slot. Whether `make`
/// made it.
#[inline(always)]
fn append_again(
    slot: &mut u32,
    memo: &mut MemoTable,
    string: Option<&Rc<String>>,
    make: impl FnOnce() -> Memo,
) -> Option<bool> {
    if memo.append_again(*slot, string) {
        return Some(false);
    }
    memo.append(make())?;
    *slot = memo.last_slot();
    Some(true)
}

/// The value of `NONE`, `NEWTRUE` or `NEWFALSE`.
fn constant(code: u8) -> Value {
    match code {
        op::NEWTRUE => Value::Bool(true),
        op::NEWFALSE => Value::Bool(false),
        _ => Value::None,
    }
}
