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
//! past O(log n) plus a bounded scan.
//!
//! The order is exactly PyTorch's: classes are monotone in size, the best block of a class is
//! the smallest (size, address), and streams are kept in numeric order.

use super::block::SizeKey;
use std::collections::BTreeMap;

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

/// One free block in a class: (size, address) is the key, `index` the arena slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    size: u64,
    addr: u64,
    index: u32,
}

impl Entry {
    fn key(&self) -> (u64, u64) {
        (self.size, self.addr)
    }
}

/// The blocks of one class. Nearly every class holds a handful of blocks (replaying the real
/// traces, over 99% of lookups find at most 7), so a small class is an unsorted list: a
/// linear scan finds the best fit and a removal swaps the last entry in, no shifting. A class
/// that grows past [`FLAT_MAX`] blocks becomes a tree ordered by (size, address).
#[derive(Debug)]
enum Bucket {
    Flat(Vec<Entry>),
    Tree(BTreeMap<(u64, u64), u32>),
}

fn entry(((size, addr), index): (&(u64, u64), &u32)) -> Entry {
    Entry { size: *size, addr: *addr, index: *index }
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
            Bucket::Flat(v) => {
                v.push(e);
                if v.len() > FLAT_MAX {
                    *self = Bucket::Tree(v.iter().map(|x| (x.key(), x.index)).collect());
                }
            }
            Bucket::Tree(t) => {
                t.insert(e.key(), e.index);
            }
        }
    }

    fn remove(&mut self, key: (u64, u64)) -> bool {
        match self {
            Bucket::Flat(v) => match v.iter().position(|x| x.key() == key) {
                Some(pos) => {
                    v.swap_remove(pos);
                    true
                }
                None => false,
            },
            Bucket::Tree(t) => {
                let found = t.remove(&key).is_some();
                if t.len() < FLAT_MIN {
                    *self = Bucket::Flat(t.iter().map(entry).collect());
                }
                found
            }
        }
    }

    /// The first block with key >= `key`.
    fn at_least(&self, key: (u64, u64)) -> Option<Entry> {
        match self {
            Bucket::Flat(v) => v.iter().filter(|x| x.key() >= key).min_by_key(|x| x.key()).copied(),
            Bucket::Tree(t) => t.range(key..).next().map(entry),
        }
    }

    /// The last block with key < `key`.
    fn below(&self, key: (u64, u64)) -> Option<Entry> {
        match self {
            Bucket::Flat(v) => v.iter().filter(|x| x.key() < key).max_by_key(|x| x.key()).copied(),
            Bucket::Tree(t) => t.range(..key).next_back().map(entry),
        }
    }

    fn first(&self) -> Option<Entry> {
        match self {
            Bucket::Flat(v) => v.iter().min_by_key(|x| x.key()).copied(),
            Bucket::Tree(t) => t.iter().next().map(entry),
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
    /// Bit `w` set iff `words[w] != 0`.
    summary: u64,
    /// Bit `c % 64` of word `c / 64` set iff class `c` is non-empty.
    words: [u64; WORDS],
    buckets: Vec<Bucket>,
}

impl StreamSet {
    fn new(stream: u64) -> Self {
        let buckets = (0..NUM_CLASSES).map(|_| Bucket::Flat(Vec::new())).collect();
        StreamSet { stream, len: 0, summary: 0, words: [0; WORDS], buckets }
    }

    fn insert(&mut self, e: Entry) {
        let c = class_of(e.size);
        self.buckets[c].insert(e);
        self.words[c / 64] |= 1 << (c % 64);
        self.summary |= 1 << (c / 64);
        self.len += 1;
    }

    fn remove(&mut self, key: (u64, u64)) -> bool {
        let c = class_of(key.0);
        if !self.buckets[c].remove(key) {
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

    /// The first block with key >= `key`.
    fn at_least(&self, key: (u64, u64)) -> Option<Entry> {
        let c = class_of(key.0);
        if let Some(e) = self.buckets[c].at_least(key) {
            return Some(e);
        }
        self.buckets[self.class_from(c + 1)?].first()
    }

    /// The last block with key < `key`.
    fn below(&self, key: (u64, u64)) -> Option<Entry> {
        let c = class_of(key.0);
        if let Some(e) = self.buckets[c].below(key) {
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

/// The free (mapped) blocks of a pool, by (stream, size, address).
#[derive(Debug, Default)]
pub struct FreeSet {
    /// Sorted by stream.
    streams: Vec<StreamSet>,
}

impl FreeSet {
    /// The position of `stream` in `streams`. Most runs use one stream: checked first.
    #[inline]
    fn position(&self, stream: u64) -> Result<usize, usize> {
        match self.streams.first() {
            Some(s) if s.stream == stream => Ok(0),
            _ => self.streams.binary_search_by_key(&stream, |s| s.stream),
        }
    }

    #[inline]
    fn stream(&self, stream: u64) -> Option<&StreamSet> {
        let pos = self.position(stream).ok()?;
        Some(&self.streams[pos])
    }

    #[inline]
    pub fn insert(&mut self, key: SizeKey) {
        let pos = match self.position(key.stream) {
            Ok(pos) => pos,
            Err(pos) => {
                self.streams.insert(pos, StreamSet::new(key.stream));
                pos
            }
        };
        self.streams[pos].insert(Entry { size: key.size, addr: key.addr, index: key.index });
    }

    /// Remove the block with this (stream, size, address); false if absent.
    #[inline]
    pub fn remove(&mut self, key: &SizeKey) -> bool {
        match self.position(key.stream) {
            Ok(pos) => self.streams[pos].remove((key.size, key.addr)),
            Err(_) => false,
        }
    }

    /// `lower_bound`, restricted to one stream: the smallest block of `stream` with at least
    /// `size` bytes, lowest address first among equals.
    pub fn lower_bound(&self, stream: u64, size: u64) -> Option<SizeKey> {
        let e = self.stream(stream)?.at_least((size, 0))?;
        Some(SizeKey { stream, size: e.size, addr: e.addr, index: e.index })
    }

    /// The block after `key` in the same stream.
    pub fn next_in_stream(&self, key: &SizeKey) -> Option<SizeKey> {
        let after = key.addr.checked_add(1).map_or((key.size + 1, 0), |a| (key.size, a));
        let e = self.stream(key.stream)?.at_least(after)?;
        Some(SizeKey { stream: key.stream, size: e.size, addr: e.addr, index: e.index })
    }

    /// The block before (size, addr) in `stream`.
    pub fn prev_in_stream(&self, stream: u64, size: u64, addr: u64) -> Option<SizeKey> {
        let e = self.stream(stream)?.below((size, addr))?;
        Some(SizeKey { stream, size: e.size, addr: e.addr, index: e.index })
    }

    /// Every block's arena index, in (stream, size, address) order.
    pub fn collect_indices(&self, out: &mut Vec<u32>) {
        for s in &self.streams {
            let mut class = s.class_from(0);
            while let Some(c) = class {
                s.buckets[c].collect_indices(out);
                class = s.class_from(c + 1);
            }
        }
    }

    /// The largest free block over all streams.
    pub fn largest(&self) -> u64 {
        self.streams.iter().filter_map(|s| s.last()).map(|e| e.size).max().unwrap_or(0)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.streams.iter().map(|s| s.len).sum()
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
            let stream = [0, 5, 1 << 40][(r % 3) as usize];
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
            assert_eq!(set.lower_bound(stream, probe), want);
            if let Some(k) = want.filter(|_| step % 3 == 0) {
                // What get_free_block does: remove the block lower_bound just found.
                assert!(set.remove(&k));
                assert_eq!(model.remove(&(k.stream, k.size, k.addr)), Some(k.index));
                continue;
            }
            if let Some(k) = want {
                let at = (k.stream, k.size, k.addr);
                let want_next = model.range(at..).nth(1).map(key_of).filter(|n| n.stream == stream);
                assert_eq!(set.next_in_stream(&k), want_next);
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
