//! The free-block index of one pool: PyTorch's `std::set<Block*, BlockComparatorSize>`,
//! ordered by (stream, size, address), rebuilt for speed.
//!
//! Replay speed is dominated by this set (a best-fit lookup, a removal and an insertion per
//! allocation; removals and an insertion per free), and a general ordered tree spends most of
//! that time descending nodes. Here each stream has its own index, in which sizes fall into
//! size classes (exact below 32 KiB, then 32 classes per power of two, as TLSF does) marked in
//! a two-level bitmap. A class holds its few blocks in an unsorted list; a lookup scans one
//! class and, if nothing there is big enough, takes two `trailing_zeros` to the next non-empty
//! class, whose smallest block is the answer. A class that grows past [`FLAT_MAX`] blocks
//! (many free blocks of nearly one size) switches to a `BTreeMap`, so no operation degrades
//! past O(log n) plus a bounded scan. A lookup returns a [`Found`] that says where the block
//! is, so that `get_free_block` removes the block it chose without a second search.
//!
//! Two layouts measured slower and were dropped: classes boxed at a fixed capacity (8-byte
//! table entries, +5% time), and all classes' lists in one array with a table of lengths
//! (+4% on the lent Sapphire Rapids host). See `benches/README.md`.
//!
//! The order is exactly PyTorch's: classes are monotone in size, the best block of a class is
//! the smallest (size, address), and streams are kept in numeric order.
//!
//! A stream's state is proportional to its use, so that a trace of tens of thousands of streams
//! with a block or two each costs little: a stream of at most [`FLAT_MAX`] free blocks keeps
//! them in one list (class 0 of a [`StreamSet`] in its small form) and takes the size classes
//! only when it grows past that, and a stream's classes are allocated up to the highest one it
//! has used. Streams are found by a `BTreeMap` once there are more than a few, never by
//! insertion into a sorted array, and the largest free block over all streams
//! ([`FreeSet::largest`], which every OOM asks for) is kept per stream, redone only for the
//! streams that changed since the last question.

use std::cell::RefCell;
use std::collections::BTreeMap;

/// A free block as `BlockComparatorSize` orders it: (stream, size, address). `index` never
/// decides (addresses are unique within a pool); it is the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SizeKey {
    pub stream: u64,
    pub size: u64,
    pub addr: u64,
    pub index: u32,
}

/// Sizes below `64 << UNIT_SHIFT` get a class each (by 512 B unit).
const UNIT_SHIFT: u32 = 9;
const LINEAR_CLASSES: usize = 64;
/// log2 of the classes per power of two above the linear range.
const SUB_BITS: u32 = 5;
const NUM_CLASSES: usize = LINEAR_CLASSES + (64 - 6) * (1 << SUB_BITS);
const WORDS: usize = NUM_CLASSES.div_ceil(64);
/// A class holding more blocks than this becomes a tree; one with fewer than `FLAT_MIN`
/// becomes flat again.
const FLAT_MAX: usize = 16;
const FLAT_MIN: usize = 8;

/// The class of a size; monotone non-decreasing in `size`.
fn class_of(size: u64) -> usize {
    let units = size >> UNIT_SHIFT;
    if units < LINEAR_CLASSES as u64 {
        return units as usize;
    }
    let log = 63 - units.leading_zeros(); // >= 6
    let sub = (units >> (log - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    LINEAR_CLASSES + (log as usize - 6) * (1 << SUB_BITS) + sub as usize
}

/// (size, address) as one number, so that comparing two takes two instructions and no branch.
type Key = u128;

fn key(size: u64, addr: u64) -> Key {
    (Key::from(size) << 64) | Key::from(addr)
}

fn key_of(k: &SizeKey) -> Key {
    key(k.size, k.addr)
}

/// One free block in a class: (size, address) is the key, `index` the arena slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    size: u64,
    addr: u64,
    index: u32,
}

impl Entry {
    fn key(&self) -> Key {
        key(self.size, self.addr)
    }
}

/// `v.swap_remove(pos)`, the last entry moved field by field. The last entry is often one an
/// insert wrote a moment ago with narrow stores; `swap_remove`'s copy reads it with a 16-byte
/// load, which the core cannot forward from two stores, so it waits for them to reach the
/// cache. The opaque reads keep the loads as narrow as the stores (`benches/README.md`).
#[inline(always)]
fn swap_remove(v: &mut Vec<Entry>, pos: usize) {
    let last = v.len() - 1;
    if pos != last {
        let e = &v[last];
        let moved = Entry {
            size: std::hint::black_box(e.size),
            addr: std::hint::black_box(e.addr),
            index: e.index,
        };
        v[pos] = moved;
    }
    v.truncate(last);
}

/// The blocks of one class. Nearly every class holds a handful of blocks (replaying the real
/// traces, over 99% of lookups find at most 7), so a small class is an unsorted list: a
/// linear scan finds the best fit and a removal swaps the last entry in, no shifting. A class
/// that grows past [`FLAT_MAX`] blocks becomes a tree ordered by (size, address).
#[derive(Debug)]
enum Bucket {
    Flat(Vec<Entry>),
    Tree(BTreeMap<Key, u32>),
}

fn entry((key, index): (&Key, &u32)) -> Entry {
    Entry { size: (key >> 64) as u64, addr: *key as u64, index: *index }
}

impl Bucket {
    fn len(&self) -> usize {
        match self {
            Bucket::Flat(v) => v.len(),
            Bucket::Tree(t) => t.len(),
        }
    }

    fn insert(&mut self, e: Entry) {
        match self {
            Bucket::Flat(v) if v.len() < FLAT_MAX => v.push(e),
            _ => self.insert_slow(e),
        }
    }

    /// [`Bucket::insert`] into a list with room to spare; false (and nothing done) for a tree,
    /// a full list or one that would have to grow.
    #[inline(always)]
    fn push_in_room(&mut self, e: Entry) -> bool {
        match self {
            Bucket::Flat(v) if v.len() < v.capacity().min(FLAT_MAX) => {
                v.push(e);
                true
            }
            _ => false,
        }
    }

    /// Insert into a tree, or into a full list, which becomes a tree.
    #[cold]
    #[inline(never)]
    fn insert_slow(&mut self, e: Entry) {
        if let Bucket::Flat(v) = self {
            *self = Bucket::Tree(v.iter().map(|x| (x.key(), x.index)).collect());
        }
        if let Bucket::Tree(t) = self {
            t.insert(e.key(), e.index);
        }
    }

    /// Remove the block with this key; `at` is its position in a list if the caller knows it.
    #[inline(always)]
    fn remove(&mut self, key: Key, at: u32) -> bool {
        let Bucket::Flat(v) = self else { return self.remove_from_tree(key) };
        let pos = if at != NO_POS {
            debug_assert_eq!(v[at as usize].key(), key);
            at as usize
        } else {
            match v.iter().position(|x| x.key() == key) {
                Some(pos) => pos,
                None => return false,
            }
        };
        swap_remove(v, pos);
        true
    }

    #[cold]
    #[inline(never)]
    fn remove_from_tree(&mut self, key: Key) -> bool {
        let Bucket::Tree(t) = self else { return false };
        let found = t.remove(&key).is_some();
        if t.len() < FLAT_MIN {
            *self = Bucket::Flat(t.iter().map(entry).collect());
        }
        found
    }

    /// The first block with key >= `key`, with its position in a list (`NO_POS` in a tree).
    #[inline(always)]
    fn at_least(&self, key: Key) -> Option<(Entry, u32)> {
        match self {
            Bucket::Flat(v) => {
                // No block has the key Key::MAX (its size would be 2^64 - 1).
                let (mut best, mut at) = (Key::MAX, NO_POS);
                for (i, x) in v.iter().enumerate() {
                    let k = x.key();
                    if k >= key && k < best {
                        (best, at) = (k, i as u32);
                    }
                }
                v.get(at as usize).map(|e| (*e, at))
            }
            Bucket::Tree(t) => t.range(key..).next().map(|kv| (entry(kv), NO_POS)),
        }
    }

    /// The last block with key < `key`.
    fn below(&self, key: Key) -> Option<Entry> {
        match self {
            Bucket::Flat(v) => v.iter().filter(|x| x.key() < key).max_by_key(|x| x.key()).copied(),
            Bucket::Tree(t) => t.range(..key).next_back().map(entry),
        }
    }

    /// The smallest block, with its position in a list (`NO_POS` in a tree).
    #[inline(always)]
    fn first(&self) -> Option<(Entry, u32)> {
        match self {
            Bucket::Flat(v) => {
                let (mut best, mut at) = (Key::MAX, NO_POS);
                for (i, x) in v.iter().enumerate() {
                    if x.key() < best {
                        (best, at) = (x.key(), i as u32);
                    }
                }
                v.get(at as usize).map(|e| (*e, at))
            }
            Bucket::Tree(t) => t.iter().next().map(|kv| (entry(kv), NO_POS)),
        }
    }

    fn last(&self) -> Option<Entry> {
        match self {
            Bucket::Flat(v) => v.iter().max_by_key(|x| x.key()).copied(),
            Bucket::Tree(t) => t.iter().next_back().map(entry),
        }
    }

    /// The arena indices in (size, address) order.
    fn collect_indices(&self, out: &mut Vec<u32>) {
        match self {
            Bucket::Flat(v) => {
                // At most FLAT_MAX entries: sorted on the stack, no allocation.
                let mut sorted = [Entry { size: 0, addr: 0, index: 0 }; FLAT_MAX + 1];
                let sorted = &mut sorted[..v.len()];
                sorted.copy_from_slice(v);
                sorted.sort_unstable_by_key(|x| x.key());
                out.extend(sorted.iter().map(|e| e.index));
            }
            Bucket::Tree(t) => out.extend(t.values().copied()),
        }
    }
}

/// The free blocks of one stream.
#[derive(Debug)]
struct StreamSet {
    stream: u64,
    len: usize,
    /// Every block is in class 0, one list of at most [`FLAT_MAX`] blocks (which is still
    /// ordered by (size, address) as a class is): a stream that never holds more than a few
    /// free blocks costs a few hundred bytes, not a table of every class.
    small: bool,
    /// Bit `w` set iff `words[w] != 0`.
    summary: u64,
    /// Bit `c % 64` of word `c / 64` set iff class `c` is non-empty. Boxed: the set of a
    /// stream is then 80 bytes, which a trace of tens of thousands of streams moves each time
    /// the list of streams grows (a tenth of each run of 20,000 streams inline).
    words: Box<[u64; WORDS]>,
    /// Class `c`'s blocks, for every class up to the highest one used; a class past the end
    /// is empty.
    buckets: Vec<Bucket>,
}

impl StreamSet {
    fn new(stream: u64) -> Self {
        StreamSet {
            stream,
            len: 0,
            small: true,
            summary: 0,
            words: Box::new([0; WORDS]),
            buckets: Vec::new(),
        }
    }

    /// The class a block of `size` bytes is kept in.
    #[inline(always)]
    fn class(&self, size: u64) -> usize {
        if self.small {
            0
        } else {
            class_of(size)
        }
    }

    fn insert(&mut self, e: Entry) {
        if self.small && self.len >= FLAT_MAX {
            self.grow_classes();
        }
        let c = self.class(e.size);
        if c >= self.buckets.len() {
            self.buckets.resize_with(c + 1, || Bucket::Flat(Vec::new()));
        }
        self.buckets[c].insert(e);
        self.mark(c);
    }

    /// The small form is full: every block goes to its size class.
    #[cold]
    #[inline(never)]
    fn grow_classes(&mut self) {
        let blocks = match self.buckets.pop() {
            Some(Bucket::Flat(v)) => v,
            Some(Bucket::Tree(t)) => t.iter().map(entry).collect(),
            None => Vec::new(),
        };
        debug_assert!(self.buckets.is_empty());
        self.buckets.clear();
        (self.small, self.len, self.summary) = (false, 0, 0);
        *self.words = [0; WORDS];
        for e in blocks {
            self.insert(e);
        }
    }

    /// [`StreamSet::insert`] into a list that has room without growing; false (and nothing
    /// done) otherwise.
    #[inline(always)]
    fn insert_in_room(&mut self, e: Entry) -> bool {
        let c = self.class(e.size);
        if !self.buckets.get_mut(c).is_some_and(|b| b.push_in_room(e)) {
            return false;
        }
        self.mark(c);
        true
    }

    /// Class `c` gained a block.
    #[inline(always)]
    fn mark(&mut self, c: usize) {
        self.words[c / 64] |= 1 << (c % 64);
        self.summary |= 1 << (c / 64);
        self.len += 1;
    }

    /// Remove the block with this key from class `c`, at position `at` if known.
    #[inline(always)]
    fn remove(&mut self, c: usize, key: Key, at: u32) -> bool {
        if !self.buckets.get_mut(c).is_some_and(|b| b.remove(key, at)) {
            return false;
        }
        self.len -= 1;
        if self.buckets[c].len() == 0 {
            self.words[c / 64] &= !(1 << (c % 64));
            if self.words[c / 64] == 0 {
                self.summary &= !(1 << (c / 64));
            }
        }
        true
    }

    /// The first non-empty class at or after `from`.
    fn class_from(&self, from: usize) -> Option<usize> {
        if from >= NUM_CLASSES {
            return None;
        }
        let (w, b) = (from / 64, from % 64);
        let here = self.words[w] & (!0u64 << b);
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let later = self.summary & (!0u64).checked_shl(w as u32 + 1).unwrap_or(0);
        let w = nonzero(later)?.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }

    /// The last non-empty class strictly before `before`.
    fn class_before(&self, before: usize) -> Option<usize> {
        let upto = before.checked_sub(1)?;
        let (w, b) = (upto / 64, upto % 64);
        let here = self.words[w] & (!0u64 >> (63 - b));
        if here != 0 {
            return Some(w * 64 + 63 - here.leading_zeros() as usize);
        }
        let earlier = self.summary & ((1u64 << w) - 1);
        let w = 63 - nonzero(earlier)?.leading_zeros() as usize;
        Some(w * 64 + 63 - self.words[w].leading_zeros() as usize)
    }

    /// The first block with key >= `key`, with its class and position.
    #[inline(always)]
    fn at_least(&self, key: Key) -> Option<(Entry, usize, u32)> {
        let c = self.class((key >> 64) as u64);
        if let Some((e, at)) = self.buckets.get(c).and_then(|b| b.at_least(key)) {
            return Some((e, c, at));
        }
        let c = self.class_from(c + 1)?;
        let (e, at) = self.buckets[c].first()?;
        Some((e, c, at))
    }

    /// The last block with key < `key`.
    fn below(&self, key: Key) -> Option<Entry> {
        let c = self.class((key >> 64) as u64);
        if let Some(e) = self.buckets.get(c).and_then(|b| b.below(key)) {
            return Some(e);
        }
        self.buckets[self.class_before(c)?].last()
    }

    fn last(&self) -> Option<Entry> {
        self.buckets[self.class_before(NUM_CLASSES)?].last()
    }
}

/// `bits` if any is set.
fn nonzero(bits: u64) -> Option<u64> {
    (bits != 0).then_some(bits)
}

/// `Bucket::remove`'s "position unknown".
const NO_POS: u32 = u32::MAX;

/// A block a lookup found, and where: lets the caller remove it without a second search
/// ([`FreeSet::remove_found`]). Valid until the set next changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub key: SizeKey,
    stream_pos: u32,
    class: u32,
    /// Position in the class's list; `NO_POS` in a tree.
    at: u32,
}

/// The largest block of each stream but the first, counted lazily: a change to a stream lists
/// it in `dirty`, and [`FreeSet::largest`] counts only the listed streams again. The first
/// stream (most runs' only one) is not listed, so its hot path marks nothing: it is looked at
/// on every question, in O(1).
#[derive(Debug, Default)]
struct Maxima {
    /// How many streams (past the first) have their largest block of this size.
    counts: BTreeMap<u64, u32>,
    /// By position: the largest block as last counted (0: none), and whether the stream
    /// changed since (then it is in `dirty`).
    counted: Vec<(u64, bool)>,
    /// Positions of the streams changed since the last count.
    dirty: Vec<u32>,
}

impl Maxima {
    fn count(&mut self, pos: usize, largest: u64) {
        let (was, listed) = &mut self.counted[pos];
        *listed = false;
        let was = std::mem::replace(was, largest);
        if was == largest {
            return;
        }
        if was != 0 {
            match self.counts.get_mut(&was) {
                Some(n) if *n > 1 => *n -= 1,
                _ => drop(self.counts.remove(&was)),
            }
        }
        if largest != 0 {
            *self.counts.entry(largest).or_insert(0) += 1;
        }
    }
}

/// The free (mapped) blocks of a pool, by (stream, size, address).
#[derive(Debug, Default)]
pub struct FreeSet {
    /// In the order the streams were first seen, so a position stays valid.
    streams: Vec<StreamSet>,
    /// Stream to position in `streams`, in stream order: what finds a stream among many.
    order: BTreeMap<u64, u32>,
    maxima: RefCell<Maxima>,
}

/// Up to this many streams, a stream is found by a scan of `streams`.
const SCAN_STREAMS: usize = 8;

impl FreeSet {
    /// The position of `stream` in `streams`. Most runs use one stream: checked first.
    #[inline]
    fn position(&self, stream: u64) -> Option<usize> {
        match self.streams.first() {
            Some(s) if s.stream == stream => Some(0),
            _ if self.streams.len() <= SCAN_STREAMS => {
                self.streams.iter().position(|s| s.stream == stream)
            }
            _ => self.order.get(&stream).map(|&pos| pos as usize),
        }
    }

    #[inline]
    fn stream(&self, stream: u64) -> Option<&StreamSet> {
        let pos = self.position(stream)?;
        Some(&self.streams[pos])
    }

    /// The stream at `pos` (not the first) changed: its largest block is counted again at the
    /// next [`FreeSet::largest`].
    #[inline]
    fn touch(&mut self, pos: usize) {
        if pos == 0 {
            return;
        }
        let m = self.maxima.get_mut();
        if pos >= m.counted.len() {
            m.counted.resize(pos + 1, (0, false));
        }
        if !m.counted[pos].1 {
            m.counted[pos].1 = true;
            m.dirty.push(pos as u32);
        }
    }

    #[inline]
    pub fn insert(&mut self, key: SizeKey) {
        self.insert_parts(key.stream, key.size, key.addr, key.index);
    }

    /// [`FreeSet::insert`] with the key in registers rather than in memory. The common case
    /// (the first stream, a list with room) calls nothing and so saves few registers; the rest
    /// is [`FreeSet::insert_slow`], which takes the key in registers too: an entry passed by
    /// reference is written field by field and copied on with one 16-byte load, which waits
    /// for the stores (`benches/README.md`).
    #[inline(never)]
    fn insert_parts(&mut self, stream: u64, size: u64, addr: u64, index: u32) {
        if let Some(s) = self.streams.first_mut().filter(|s| s.stream == stream) {
            if s.insert_in_room(Entry { size, addr, index }) {
                return;
            }
        }
        self.insert_slow(stream, size, addr, index);
    }

    /// A stream other than the first, a new stream, a list that grows or turns into a tree.
    #[inline(never)]
    fn insert_slow(&mut self, stream: u64, size: u64, addr: u64, index: u32) {
        let pos = match self.position(stream) {
            Some(pos) => pos,
            None => self.add_stream(stream),
        };
        self.streams[pos].insert(Entry { size, addr, index });
        self.touch(pos);
    }

    #[cold]
    #[inline(never)]
    fn add_stream(&mut self, stream: u64) -> usize {
        let pos = self.streams.len();
        self.streams.push(StreamSet::new(stream));
        self.order.insert(stream, pos as u32);
        pos
    }

    /// Remove the block with this (stream, size, address); false if absent.
    #[inline]
    pub fn remove(&mut self, key: &SizeKey) -> bool {
        let Some(pos) = self.position(key.stream) else { return false };
        let s = &mut self.streams[pos];
        let removed = s.remove(s.class(key.size), key_of(key), NO_POS);
        self.touch(pos);
        removed
    }

    /// Remove the block a lookup just found, without searching for it again. The set must not
    /// have changed since the lookup.
    #[inline(always)]
    pub fn remove_found(&mut self, found: &Found) {
        let key = key_of(&found.key);
        let pos = found.stream_pos as usize;
        let removed = self.streams[pos].remove(found.class as usize, key, found.at);
        debug_assert!(removed);
        self.touch(pos);
    }

    /// The first block of `stream` at or after (`size`, `addr`).
    #[inline(always)]
    fn find(&self, stream: u64, size: u64, addr: u64) -> Option<Found> {
        let pos = self.position(stream)?;
        let (e, class, at) = self.streams[pos].at_least(key(size, addr))?;
        Some(Found {
            key: SizeKey { stream, size: e.size, addr: e.addr, index: e.index },
            stream_pos: pos as u32,
            class: class as u32,
            at,
        })
    }

    /// `lower_bound`, restricted to one stream: the smallest block of `stream` with at least
    /// `size` bytes, lowest address first among equals.
    #[inline]
    pub fn lower_bound(&self, stream: u64, size: u64) -> Option<Found> {
        self.find(stream, size, 0)
    }

    /// The block after `key` in the same stream.
    pub fn next_in_stream(&self, key: &SizeKey) -> Option<Found> {
        match key.addr.checked_add(1) {
            Some(addr) => self.find(key.stream, key.size, addr),
            None => self.find(key.stream, key.size + 1, 0),
        }
    }

    /// The block before (size, addr) in `stream`.
    pub fn prev_in_stream(&self, stream: u64, size: u64, addr: u64) -> Option<SizeKey> {
        let e = self.stream(stream)?.below(key(size, addr))?;
        Some(SizeKey { stream, size: e.size, addr: e.addr, index: e.index })
    }

    /// Every block's arena index, in (stream, size, address) order.
    pub fn collect_indices(&self, out: &mut Vec<u32>) {
        for &pos in self.order.values() {
            let s = &self.streams[pos as usize];
            let mut class = s.class_from(0);
            while let Some(c) = class {
                s.buckets[c].collect_indices(out);
                class = s.class_from(c + 1);
            }
        }
    }

    /// The largest free block over all streams: the first stream's, and the largest of the
    /// others' as counted after the streams changed since the last question are counted again.
    pub fn largest(&self) -> u64 {
        let largest_of = |s: &StreamSet| s.last().map_or(0, |e| e.size);
        let Some(first) = self.streams.first() else { return 0 };
        let mut maxima = self.maxima.borrow_mut();
        let dirty = std::mem::take(&mut maxima.dirty);
        for &pos in &dirty {
            maxima.count(pos as usize, largest_of(&self.streams[pos as usize]));
        }
        maxima.dirty = dirty;
        maxima.dirty.clear();
        let others = maxima.counts.keys().next_back().copied().unwrap_or(0);
        largest_of(first).max(others)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.streams.iter().map(|s| s.len).sum()
    }

    /// Bytes held for the streams' indexes (not counting the lists' and trees' entries).
    #[cfg(test)]
    fn index_bytes(&self) -> usize {
        let per_stream =
            |s: &StreamSet| size_of::<StreamSet>() + s.buckets.capacity() * size_of::<Bucket>();
        self.streams.iter().map(per_stream).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotone() {
        let mut last = 0;
        let mut size = 0u64;
        while size < (1 << 50) {
            let c = class_of(size);
            assert!(c >= last && c < NUM_CLASSES, "size {size}");
            last = c;
            size += 1 + size / 37;
        }
        assert!(class_of(u64::MAX) < NUM_CLASSES);
    }

    /// Many streams with a block or two each (issue 50: 40,000 streams took 2.4 GB): a stream's
    /// index is proportional to its use, and the largest block over all streams follows every
    /// change (it is counted lazily per changed stream).
    #[test]
    fn many_streams_cost_little_each() {
        let mut set = FreeSet::default();
        let mut model: BTreeMap<(u64, u64, u64), u32> = BTreeMap::new();
        let streams = 20_000u64;
        for i in 0..streams {
            // Descending streams: a sorted insertion would shift every stream each time.
            let stream = streams - i;
            for (k, size) in [512, (2 << 20) - 512].into_iter().enumerate() {
                let addr = i * (2 << 20) + k as u64 * 512;
                set.insert(SizeKey { stream, size, addr, index: i as u32 });
                model.insert((stream, size, addr), i as u32);
            }
            if i % 1000 == 0 {
                assert_eq!(set.largest(), (2 << 20) - 512);
            }
        }
        let per_stream = set.index_bytes() / streams as usize;
        assert!(per_stream <= 512, "{per_stream} bytes of index a stream");
        // Take the big blocks away one stream at a time, asking for the largest each time.
        for i in 0..streams {
            let stream = streams - i;
            let found = set.lower_bound(stream, 4096).expect("the big block");
            set.remove_found(&found);
            let k = found.key;
            model.remove(&(k.stream, k.size, k.addr));
            let want = if i + 1 < streams { (2 << 20) - 512 } else { 512 };
            assert_eq!(set.largest(), want, "after stream {stream}");
        }
        let mut all = Vec::new();
        set.collect_indices(&mut all);
        assert_eq!(all, model.values().copied().collect::<Vec<_>>());
    }

    /// Against a `BTreeMap` model, with sizes crowding single classes to force trees.
    #[test]
    fn behaves_like_an_ordered_set() {
        let mut set = FreeSet::default();
        let mut model: BTreeMap<(u64, u64, u64), u32> = BTreeMap::new();
        let key_of = |(&(stream, size, addr), &index): (&(u64, u64, u64), &u32)| SizeKey {
            stream,
            size,
            addr,
            index,
        };
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut saw_trees = false;
        for step in 0..20_000u32 {
            saw_trees |=
                set.streams.iter().any(|s| s.buckets.iter().any(|b| matches!(b, Bucket::Tree(_))));
            let r = next();
            // Mostly three streams (classes crowd into trees), sometimes one of ten more (past
            // the scan: streams found by the map, in stream order, not the order first seen).
            let stream = match (r >> 60) % 4 {
                0 => [9, 3, 1 << 41, 7, 2, 11, 4, 6, 8, 1][((r >> 56) % 10) as usize],
                _ => [0, 5, 1 << 40][(r % 3) as usize],
            };
            let size = match (r >> 8) % 4 {
                0 => 512,
                1 => 512 * (1 + (r >> 20) % 100),
                2 => (1 << 20) + 512 * ((r >> 20) % 4096),
                _ => (r >> 20) % (1 << 36),
            };
            let addr = (r >> 30) % 2048 * 512;
            if let Some(index) = model.remove(&(stream, size, addr)) {
                assert!(set.remove(&SizeKey { stream, size, addr, index }));
            } else if step % 5 != 0 {
                set.insert(SizeKey { stream, size, addr, index: step });
                model.insert((stream, size, addr), step);
            }
            let probe = (next() >> 20) % (1 << 30);
            let want =
                model.range((stream, probe, 0)..).next().map(key_of).filter(|k| k.stream == stream);
            let found = set.lower_bound(stream, probe);
            assert_eq!(found.map(|f| f.key), want);
            if let Some(f) = found.filter(|_| step % 3 == 0) {
                // What get_free_block does: remove the block lower_bound just found.
                set.remove_found(&f);
                let k = f.key;
                assert_eq!(model.remove(&(k.stream, k.size, k.addr)), Some(k.index));
                continue;
            }
            if let Some(k) = want {
                let at = (k.stream, k.size, k.addr);
                let want_next = model.range(at..).nth(1).map(key_of).filter(|n| n.stream == stream);
                let next = set.next_in_stream(&k);
                assert_eq!(next.map(|f| f.key), want_next);
                if let Some(n) = next.filter(|_| step % 7 == 1) {
                    // What the expandable search does: remove the block next_in_stream found.
                    set.remove_found(&n);
                    model.remove(&(n.key.stream, n.key.size, n.key.addr));
                    continue;
                }
                let want_prev =
                    model.range(..at).next_back().map(key_of).filter(|p| p.stream == stream);
                assert_eq!(set.prev_in_stream(stream, k.size, k.addr), want_prev);
            }
        }
        assert!(saw_trees, "no class grew into a tree: the test misses half the code");
        let mut all = Vec::new();
        set.collect_indices(&mut all);
        assert_eq!(all, model.values().copied().collect::<Vec<_>>());
        assert_eq!(set.len(), model.len());
        assert_eq!(set.largest(), model.keys().map(|k| k.1).max().unwrap_or(0));
    }
}
