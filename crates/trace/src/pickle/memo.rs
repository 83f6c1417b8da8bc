//! The pickle memo: what `MEMOIZE`/`PUT` stored, for `GET`.
//!
//! A memoized container is usually still being filled (`EMPTY_DICT MEMOIZE MARK ...
//! SETITEMS`), so until it leaves the stack the memo only records where it is
//! ([`Memo::OnStack`]); it holds the finished `Value` from then on. Keys are dense in every
//! pickle CPython writes, so they index a `Vec`; a sparse map takes any others.
//!
//! A snapshot memoizes one or two things per trace entry, so the dense table is as long as
//! the trace is: each key names a slot (a value or a marker, with its nesting depth; runs of
//! keys holding the same marker or string share one, and so do the keys of one stack's
//! frames list), and the keys are packed in blocks by the few slots they name (`keys.rs`:
//! about a byte a key), so the memo grows with the distinct values, not with the entries.

use super::keys::Keys;
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

/// A state of a [`MemoTable`] to go back to.
#[derive(Clone, Copy)]
pub struct Mark {
    len: usize,
    dense: usize,
    slots: usize,
}

/// `dense` entry of a key never stored.
const EMPTY: u32 = 0;

/// log2 of the entries of [`MemoTable::list_slots`].
const LIST_SLOT_BITS: u32 = 12;

/// The memo. Dense keys map to slots through a `u32` each: the record streamer stores the
/// same marker or the same string under long runs of keys (one pair per trace entry), which
/// then share one slot, and the same list under many keys (a stack's frames, one list for
/// all its entries: `lists.rs`), which share one slot too.
pub struct MemoTable {
    /// Per dense key: 1 + its index in `slots`, or `EMPTY`.
    dense: Keys,
    slots: Vec<Slot>,
    /// The nesting depth of each slot's value (0 for the others).
    depths: Vec<u32>,
    sparse: HashMap<u64, Memo>,
    len: usize,
    /// The slot (1 + index) last given to a list, by the list's address: checked against the
    /// slot before use, so what a rollback took back is never reused.
    list_slots: Vec<(usize, u32)>,
    /// Bumped whenever an entry that held a finished value or a streamed marker is replaced
    /// (not when an open container's is finished): while it stands, every key that held a
    /// finished value still holds it, or, after a [`MemoTable::rollback`], nothing (see
    /// there).
    epoch: u64,
}

impl Default for MemoTable {
    fn default() -> Self {
        MemoTable {
            dense: Keys::default(),
            slots: Vec::new(),
            depths: Vec::new(),
            sparse: HashMap::new(),
            len: 0,
            list_slots: vec![(0, EMPTY); 1 << LIST_SLOT_BITS],
            epoch: 0,
        }
    }
}

impl MemoTable {
    /// Number of keys stored (CPython's `len(memo)`, the key `MEMOIZE` uses next).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Changes when an entry already stored changes; see [`MemoTable::epoch`]'s field.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    #[inline(always)]
    pub fn get(&self, key: u64) -> Option<MemoRef<'_>> {
        match usize::try_from(key).ok().and_then(|i| self.dense.get(i)) {
            Some(EMPTY) => None,
            Some(slot) => Some(match &self.slots[slot as usize - 1] {
                Slot::Value(v) => MemoRef::Value(v, self.depths[slot as usize - 1]),
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

    /// `set(len(), memo)`, as `MEMOIZE` does, in the record streamer's case: the next dense
    /// key and a finished entry, most often the marker or the string of one of the last two
    /// slots, which then only appends a key. `None`, storing nothing, in any other case.
    /// Entries stored this way can be taken back with [`MemoTable::rollback`].
    /// `inline(always)`: not inlined, its calls from the record streamer cost the Llama
    /// snapshot's reading thread 1.4 % more instructions.
    #[inline(always)]
    pub fn append(&mut self, memo: Memo) -> Option<()> {
        if self.len != self.dense.len() || !self.sparse.is_empty() {
            return None;
        }
        let (slot, depth) = match memo {
            Memo::Value(v, depth) => (Slot::Value(v), depth),
            Memo::Streamed => (Slot::Streamed, 0),
            Memo::OnStack(_) => return None,
        };
        if self.slots.len() >= u32::MAX as usize - 1 {
            return None;
        }
        let index = self.slot_for(slot, depth);
        self.dense.push(index);
        self.len += 1;
        Some(())
    }

    /// The slot (1 + its index) of the key stored last, for [`MemoTable::append_again`].
    #[inline]
    pub fn last_slot(&self) -> u32 {
        self.dense.last().unwrap_or(EMPTY)
    }

    /// [`MemoTable::append`] of the marker `Streamed` (`string` None) or of `string` at depth
    /// 0, when slot `slot` (as [`MemoTable::last_slot`] told) holds it and is one of the last
    /// two: the case where `append` adds a key for a slot it has, found here with no search
    /// and no value made. `false`, storing nothing, in any other case.
    #[inline(always)]
    pub fn append_again(&mut self, slot: u32, string: Option<&Rc<String>>) -> bool {
        let i = slot as usize;
        let same = match (self.slots.get(i.wrapping_sub(1)), string) {
            (Some(Slot::Streamed), None) => true,
            (Some(Slot::Value(Value::Str(held))), Some(s)) => Rc::ptr_eq(held, s),
            _ => false,
        };
        let n = self.slots.len();
        if !same || i + 1 < n || n >= u32::MAX as usize - 1 {
            return false;
        }
        if self.len != self.dense.len() || !self.sparse.is_empty() {
            return false;
        }
        self.dense.push(slot);
        self.len += 1;
        true
    }

    /// The `dense` entry for `slot` at `depth`: one of the last two slots if it is the same
    /// marker or string (a snapshot's entries alternate a dict marker and a string), the slot
    /// of the same list if it has one, else a new one. `inline(always)`: with `inline` alone the
    /// pickle thread took 4% more instructions (callgrind, 312 -> 324 M).
    #[inline(always)]
    fn slot_for(&mut self, slot: Slot, depth: u32) -> u32 {
        if let Slot::Value(Value::List(list)) = &slot {
            let addr = Rc::as_ptr(list) as usize;
            let at = (addr as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - LIST_SLOT_BITS);
            let entry = &mut self.list_slots[at as usize];
            let i = entry.1.checked_sub(1).map(|i| i as usize);
            let held = i.and_then(|i| self.slots.get(i).zip(self.depths.get(i)));
            if entry.0 == addr
                && matches!(held, Some((Slot::Value(Value::List(l)), &d)) if Rc::ptr_eq(l, list) && d == depth)
            {
                return entry.1;
            }
            self.slots.push(slot);
            self.depths.push(depth);
            *entry = (addr, self.slots.len() as u32);
            return entry.1;
        }
        let start = self.slots.len().saturating_sub(2);
        let same = |(s, &d): (&Slot, &u32)| s.same_as(&slot) && d == depth;
        match self.slots[start..].iter().zip(&self.depths[start..]).rposition(same) {
            Some(at) => (start + at + 1) as u32,
            None => {
                self.slots.push(slot);
                self.depths.push(depth);
                self.slots.len() as u32
            }
        }
    }

    /// Where the table stands, for [`MemoTable::rollback`].
    pub fn mark(&self) -> Mark {
        Mark { len: self.len, dense: self.dense.len(), slots: self.slots.len() }
    }

    /// Forget what [`MemoTable::append`] stored since `mark`, the start of a record read in
    /// place, which the opcode reader then reads again, storing equal values under the same
    /// keys. The epoch stands: what it vouches for names only keys older than the mark (a
    /// shape learned from an earlier record, `template`; a list found by its bytes, which
    /// GETs no key of its own record, `ListsByBytes`).
    pub fn rollback(&mut self, mark: Mark) {
        self.dense.truncate(mark.dense);
        self.slots.truncate(mark.slots);
        self.depths.truncate(mark.slots);
        self.len = mark.len;
    }

    /// Store `memo` under `key`. Returns what was stored there before if that is now dropped
    /// (a replaced dense entry keeps its slot, which others may share).
    pub fn set(&mut self, key: u64, memo: Memo) -> Option<Memo> {
        let dense = usize::try_from(key).ok().filter(|&i| i <= self.dense.len());
        let Some(i) = dense.filter(|_| self.slots.len() < u32::MAX as usize - 1) else {
            let old = self.sparse.insert(key, memo);
            self.len += usize::from(old.is_none());
            self.epoch += u64::from(matches!(old, Some(Memo::Value(..) | Memo::Streamed)));
            return old;
        };
        let (slot, depth) = match memo {
            Memo::Value(v, depth) => (Slot::Value(v), depth),
            Memo::OnStack(at) => (Slot::OnStack(at), 0),
            Memo::Streamed => (Slot::Streamed, 0),
        };
        let index = self.slot_for(slot, depth);
        if i == self.dense.len() {
            self.dense.push(index);
            self.len += 1;
        } else {
            let old = self.dense.get(i).unwrap_or(EMPTY);
            self.dense.set(i, index);
            let fresh = old == EMPTY;
            self.len += usize::from(fresh);
            // An open container finished (`OnStack` to its value) changes nothing a reader of
            // finished values saw: it could not GET the key before.
            let finished = !fresh && matches!(self.slots[old as usize - 1], Slot::OnStack(_));
            self.epoch += u64::from(!fresh && !finished);
        }
        None
    }

    /// The memory the table holds, by capacity.
    pub fn heap_bytes(&self) -> u64 {
        let vecs = self.dense.heap_bytes()
            + self.slots.capacity() * size_of::<Slot>()
            + self.depths.capacity() * size_of::<u32>()
            + self.list_slots.capacity() * size_of::<(usize, u32)>();
        let maps = map_bytes(&self.sparse);
        (vecs + maps) as u64
    }

    /// At most how many bytes storing `n` more entries may allocate (0 while they fit).
    pub fn growth_bytes(&self, n: usize) -> u64 {
        fn map<V>(m: &HashMap<impl Sized, V>, n: usize) -> usize {
            if m.len().saturating_add(n) <= m.capacity() {
                0
            } else {
                2 * map_bytes(m).max(64)
            }
        }
        self.append_growth_bytes(n) + map(&self.sparse, n) as u64
    }

    /// [`MemoTable::growth_bytes`] of `n` more [`MemoTable::append`]s, which never touch the
    /// maps.
    #[inline]
    pub fn append_growth_bytes(&self, n: usize) -> u64 {
        fn vec<T>(v: &Vec<T>, n: usize) -> usize {
            let need = v.len().saturating_add(n);
            let grown = if need <= v.capacity() { 0 } else { need.max(2 * v.capacity()) };
            grown * size_of::<T>()
        }
        (self.dense.growth_bytes(n) + vec(&self.slots, n) + vec(&self.depths, n)) as u64
    }
}

/// A hash map's memory: a table of 8/7 its capacity, rounded up to a power of two, of
/// entries and one control byte each.
fn map_bytes<K, V>(m: &HashMap<K, V>) -> usize {
    if m.capacity() == 0 {
        return 0;
    }
    let buckets = (m.capacity() * 8 / 7).next_power_of_two();
    buckets * (size_of::<(K, V)>() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn str_at(memo: &MemoTable, key: u64) -> Option<String> {
        match memo.get(key) {
            Some(MemoRef::Value(Value::Str(s), 0)) => Some(s.to_string()),
            _ => None,
        }
    }

    /// The epoch stands while entries are only added, taken back to a mark or finished (an
    /// open container's), and moves when a finished value is replaced.
    #[test]
    fn the_epoch_moves_when_a_stored_entry_changes() {
        let mut memo = MemoTable::default();
        let e = memo.epoch();
        memo.append(Memo::Streamed).unwrap();
        memo.set(1, Memo::Value(Value::Int(1), 0));
        memo.set(1 << 40, Memo::Value(Value::Int(2), 0));
        assert_eq!(memo.epoch(), e, "added only");
        memo.set(2, Memo::OnStack(0));
        memo.set(2, Memo::Value(Value::Int(5), 1));
        memo.set(1 << 41, Memo::OnStack(0));
        memo.set(1 << 41, Memo::Value(Value::Int(6), 1));
        assert_eq!(memo.epoch(), e, "open containers finished");
        memo.set(1, Memo::Value(Value::Int(3), 0));
        let e1 = memo.epoch();
        assert_ne!(e1, e, "a dense entry replaced");
        memo.set(1 << 40, Memo::Value(Value::Int(4), 0));
        assert_ne!(memo.epoch(), e1, "a sparse entry replaced");
        let mut memo = MemoTable::default();
        let mark = memo.mark();
        memo.rollback(mark);
        assert_eq!(memo.epoch(), e, "nothing taken back");
        memo.append(Memo::Streamed).unwrap();
        memo.rollback(mark);
        assert_eq!(memo.epoch(), e, "an entry added since the mark taken back");
    }

    /// `append` stores what `set(len(), ..)` stores, and `rollback` forgets exactly what was
    /// appended after the mark, shared slots included.
    #[test]
    fn append_then_rollback() {
        let (mut appended, mut set) = (MemoTable::default(), MemoTable::default());
        let na = Value::Str(Rc::new("N/A".to_string()));
        let entries = [Memo::Streamed, Memo::Value(na.clone(), 0), Memo::Streamed];
        for m in entries.iter().cloned() {
            appended.append(m.clone()).unwrap();
            set.set(set.len() as u64, m);
        }
        let mark = appended.mark();
        appended.append(Memo::Value(na.clone(), 0)).unwrap();
        appended.append(Memo::Value(Value::Str(Rc::new("x".to_string())), 0)).unwrap();
        assert_eq!(str_at(&appended, 4).as_deref(), Some("x"));
        appended.rollback(mark);
        assert_eq!(appended.len(), set.len());
        assert!(appended.get(3).is_none() && appended.get(4).is_none());
        for key in 0..3 {
            assert_eq!(str_at(&appended, key), str_at(&set, key));
            let streamed = |m: &MemoTable| matches!(m.get(key), Some(MemoRef::Streamed));
            assert_eq!(streamed(&appended), streamed(&set));
        }
        // An open container, or not the next dense key: refused, nothing stored.
        assert!(appended.append(Memo::OnStack(0)).is_none());
        assert_eq!(appended.len(), 3);
        // A deep value's depth is its slot's.
        appended.append(Memo::Value(Value::list(vec![na]), 300)).unwrap();
        assert!(matches!(appended.get(3), Some(MemoRef::Value(_, 300))));
        appended.rollback(mark);
        appended.set(10, Memo::Streamed);
        assert!(appended.append(Memo::Streamed).is_none());
    }

    /// `append_again` stores what `append` would, into the slot it names, while that slot holds
    /// the same marker or string and is one of the last two; otherwise it stores nothing.
    #[test]
    fn append_again_is_append_into_a_slot_known() {
        let na = Rc::new("N/A".to_string());
        let (mut again, mut plain) = (MemoTable::default(), MemoTable::default());
        for m in [&mut again, &mut plain] {
            m.append(Memo::Streamed).unwrap();
            m.append(Memo::Value(Value::Str(na.clone()), 0)).unwrap();
        }
        let (marker, string) = (again.dense.get(0).unwrap(), again.last_slot());
        for _ in 0..3 {
            assert!(again.append_again(marker, None));
            assert!(again.append_again(string, Some(&na)));
            plain.append(Memo::Streamed).unwrap();
            plain.append(Memo::Value(Value::Str(na.clone()), 0)).unwrap();
        }
        assert_eq!((again.len(), again.slots.len()), (plain.len(), plain.slots.len()));
        for key in 0..again.len() as u64 {
            assert_eq!(str_at(&again, key), str_at(&plain, key));
            let streamed = |m: &MemoTable| matches!(m.get(key), Some(MemoRef::Streamed));
            assert_eq!(streamed(&again), streamed(&plain));
        }
        // Another string, a slot that is not the marker, a slot never given: nothing stored.
        let len = again.len();
        assert!(!again.append_again(string, Some(&Rc::new("N/A".to_string()))));
        assert!(!again.append_again(string, None));
        assert!(!again.append_again(0, None));
        // A slot no longer among the last two.
        again.append(Memo::Value(Value::Str(Rc::new("x".to_string())), 0)).unwrap();
        again.append(Memo::Value(Value::Str(Rc::new("y".to_string())), 0)).unwrap();
        assert!(!again.append_again(marker, None));
        assert_eq!(again.len(), len + 2);
    }

    /// One list under many keys takes one slot; a list whose slot a rollback took back gets
    /// a new one.
    #[test]
    fn a_list_stored_again_shares_its_slot() {
        let list = |n| Value::list(vec![Value::Int(n)]);
        let same = |m: &MemoTable, key, v: &Value| match (m.get(key), v) {
            (Some(MemoRef::Value(Value::List(a), _)), Value::List(b)) => Rc::ptr_eq(a, b),
            _ => false,
        };
        let (a, b) = (list(1), list(2));
        let mut memo = MemoTable::default();
        for _ in 0..3 {
            memo.append(Memo::Value(a.clone(), 1)).unwrap();
        }
        assert_eq!(memo.slots.len(), 1);
        assert!((0..3).all(|key| same(&memo, key, &a)));
        let mark = memo.mark();
        memo.append(Memo::Value(b.clone(), 1)).unwrap();
        memo.rollback(mark);
        memo.append(Memo::Value(a.clone(), 1)).unwrap();
        memo.append(Memo::Value(b.clone(), 1)).unwrap();
        assert_eq!(memo.slots.len(), 2);
        assert!(same(&memo, 3, &a) && same(&memo, 4, &b));
    }
}
