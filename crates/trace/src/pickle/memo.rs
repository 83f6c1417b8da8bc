//! The pickle memo: what `MEMOIZE`/`PUT` stored, for `GET`.
//!
//! A memoized container is usually still being filled (`EMPTY_DICT MEMOIZE MARK ...
//! SETITEMS`), so until it leaves the stack the memo only records where it is
//! ([`Memo::OnStack`]); it holds the finished `Value` from then on. Keys are dense in every
//! pickle CPython writes, so they index a `Vec`; a sparse map takes any others.
//!
//! A snapshot memoizes two things per trace entry, so the dense table is as long as the trace
//! is: each key takes a `u32` naming a slot (a value or a marker; runs of keys holding the
//! same marker or string share one) and a byte of nesting depth, which only containers have
//! (an overflow map holds depths that do not fit one).

use super::Value;
use std::collections::HashMap;
use std::rc::Rc;

#[derive(Clone)]
pub enum Memo {
    /// A finished value and its nesting depth.
    Value(Value, u32),
    /// A container still being built at this stack position.
    OnStack(usize),
    /// A container the record streamer consumed without building it (see `stream`): a `GET`
    /// of it sends the whole file back to the generic reader.
    Streamed,
}

/// A memo entry as [`MemoTable::get`] shows it.
#[derive(Clone, Copy)]
pub enum MemoRef<'a> {
    Value(&'a Value, u32),
    OnStack(usize),
    Streamed,
}

/// A memo value without its depth (16 bytes instead of 24).
enum Slot {
    Value(Value),
    OnStack(usize),
    Streamed,
}

impl Slot {
    /// The same thing as `other`: a marker, or one shared string (for which consecutive memo
    /// entries can share one slot).
    fn same_as(&self, other: &Slot) -> bool {
        match (self, other) {
            (Slot::Streamed, Slot::Streamed) => true,
            (Slot::Value(Value::Str(a)), Slot::Value(Value::Str(b))) => Rc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// Depths of this and more are kept in the overflow map.
const DEEP: u8 = u8::MAX;
/// `dense` entry of a key never stored.
const EMPTY: u32 = 0;

/// The memo. Dense keys map to slots through a `u32` each: the record streamer stores the
/// same marker or the same string under long runs of keys (one pair per trace entry), which
/// then share one slot.
#[derive(Default)]
pub struct MemoTable {
    /// Per dense key: 1 + its index in `slots`, or `EMPTY`.
    dense: Vec<u32>,
    /// The depth of each dense value (0 for the others), `DEEP` meaning "see `deep`".
    depth: Vec<u8>,
    slots: Vec<Slot>,
    deep: HashMap<usize, u32>,
    sparse: HashMap<u64, Memo>,
    len: usize,
}

impl MemoTable {
    /// Number of keys stored (CPython's `len(memo)`, the key `MEMOIZE` uses next).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `key` holds anything.
    #[inline(always)]
    pub fn contains(&self, key: u64) -> bool {
        match usize::try_from(key).ok().and_then(|i| self.dense.get(i)) {
            Some(&slot) => slot != EMPTY,
            None => !self.sparse.is_empty() && self.sparse.contains_key(&key),
        }
    }

    #[inline(always)]
    pub fn get(&self, key: u64) -> Option<MemoRef<'_>> {
        match usize::try_from(key).ok().and_then(|i| self.dense.get(i).map(|&s| (i, s))) {
            Some((_, EMPTY)) => None,
            Some((i, slot)) => Some(match &self.slots[slot as usize - 1] {
                Slot::Value(v) => MemoRef::Value(v, self.depth_at(i)),
                &Slot::OnStack(at) => MemoRef::OnStack(at),
                Slot::Streamed => MemoRef::Streamed,
            }),
            None if self.sparse.is_empty() => None,
            None => self.sparse.get(&key).map(|m| match m {
                Memo::Value(v, depth) => MemoRef::Value(v, *depth),
                &Memo::OnStack(at) => MemoRef::OnStack(at),
                Memo::Streamed => MemoRef::Streamed,
            }),
        }
    }

    #[inline(always)]
    fn depth_at(&self, i: usize) -> u32 {
        match self.depth[i] {
            DEEP => self.deep.get(&i).copied().unwrap_or(u32::from(DEEP)),
            d => u32::from(d),
        }
    }

    /// `set(len(), memo)`, as `MEMOIZE` does: the record streamer's case, whose entries are
    /// mostly the marker or the string of one of the last two slots, for which this only
    /// appends a key. The same result as `set`, which takes every other case.
    #[inline]
    pub fn push(&mut self, memo: Memo) {
        let i = self.len;
        let n = self.slots.len();
        if i == self.dense.len() && n >= 2 {
            let shared = |s: &Slot| match (&memo, s) {
                (Memo::Streamed, Slot::Streamed) => true,
                (Memo::Value(Value::Str(a), 0), Slot::Value(Value::Str(b))) => Rc::ptr_eq(a, b),
                _ => false,
            };
            let back = if shared(&self.slots[n - 1]) {
                1
            } else if shared(&self.slots[n - 2]) {
                2
            } else {
                0
            };
            if back > 0 {
                self.dense.push((n + 1 - back) as u32);
                self.depth.push(0);
                self.len += 1;
                return;
            }
        }
        self.set(i as u64, memo);
    }

    pub fn set(&mut self, key: u64, memo: Memo) {
        let dense = usize::try_from(key).ok().filter(|&i| i <= self.dense.len());
        let Some(i) = dense.filter(|_| self.slots.len() < u32::MAX as usize - 1) else {
            let is_new = self.sparse.insert(key, memo).is_none();
            self.len += usize::from(is_new);
            return;
        };
        let (slot, depth) = match memo {
            Memo::Value(v, depth) => (Slot::Value(v), depth),
            Memo::OnStack(at) => (Slot::OnStack(at), 0),
            Memo::Streamed => (Slot::Streamed, 0),
        };
        // The last two slots: a snapshot's entries alternate a dict marker and a string.
        let start = self.slots.len().saturating_sub(2);
        let index = match self.slots[start..].iter().rposition(|s| s.same_as(&slot)) {
            Some(at) => (start + at + 1) as u32,
            None => {
                self.slots.push(slot);
                self.slots.len() as u32
            }
        };
        let byte = u8::try_from(depth).unwrap_or(DEEP);
        if byte == DEEP {
            self.deep.insert(i, depth);
        }
        if i == self.dense.len() {
            self.dense.push(index);
            self.depth.push(byte);
            self.len += 1;
        } else {
            if self.depth[i] == DEEP && byte != DEEP {
                self.deep.remove(&i);
            }
            self.depth[i] = byte;
            self.len += usize::from(std::mem::replace(&mut self.dense[i], index) == EMPTY);
        }
    }
}
