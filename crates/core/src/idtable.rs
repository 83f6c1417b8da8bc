//! [`IdTable`]: a small value per allocation id, in memory that does not grow with the trace.
//!
//! Every trace reader numbers allocations 0, 1, 2, ... in the order they happen, and most
//! allocations die young, so the ids in use at any moment are nearly all recent. The table
//! keeps the values of a window of recent ids in a flat array, where a lookup is one
//! subtraction and one comparison, and everything outside the window (the few long-lived
//! allocations the window has moved past, and ids of hand-made traces that do not follow the
//! pattern) in a hash map. When a new id falls past the window, the window moves forward by
//! half its length and the live values of the ids it leaves go to the map.
//!
//! A table indexed by id alone (what the engine and the PyTorch policy used before) costs a
//! few bytes per op of the trace, all of it written once and never read again: 1 GB near
//! 240 M ops, and a page fault per thousand ops on the way.

use crate::AllocId;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Ids in the window: 1 Mi, so the window's array stays in the last-level cache. Any window
/// gives the same answers; a larger one moves less often and sends fewer values to the map.
const WINDOW: u64 = 1 << 20;

/// A map from [`AllocId`] to a `Copy` value, with `empty` standing for "no entry".
#[derive(Debug, Clone)]
pub struct IdTable<T> {
    empty: T,
    /// The id of `window[0]`; a multiple of `WINDOW / 2`.
    base: u64,
    /// Values of the ids `base..base + window.len()`; grows to `WINDOW` entries.
    window: Vec<T>,
    /// Values of the ids outside the window that are not `empty`.
    far: HashMap<u64, T, BuildHasherDefault<IdHasher>>,
}

impl<T: Copy + PartialEq> IdTable<T> {
    pub fn new(empty: T) -> Self {
        IdTable { empty, base: 0, window: Vec::new(), far: HashMap::default() }
    }

    #[inline(always)]
    pub fn get(&self, id: AllocId) -> T {
        match self.window.get(id.0.wrapping_sub(self.base) as usize) {
            Some(&v) => v,
            None => self.get_far(id),
        }
    }

    #[inline(always)]
    pub fn set(&mut self, id: AllocId, value: T) {
        match self.window.get_mut(id.0.wrapping_sub(self.base) as usize) {
            Some(slot) => *slot = value,
            None => self.set_far(id, value),
        }
    }

    #[inline(never)]
    fn get_far(&self, id: AllocId) -> T {
        self.far.get(&id.0).copied().unwrap_or(self.empty)
    }

    #[cold]
    #[inline(never)]
    fn set_far(&mut self, id: AllocId, value: T) {
        // An id up to four windows past the window's start moves it; one further on (a
        // hand-made trace's) or below it goes to the map.
        let off = id.0.wrapping_sub(self.base);
        if value != self.empty && off < 4 * WINDOW {
            self.cover(id.0);
            self.window[(id.0 - self.base) as usize] = value;
        } else if value == self.empty {
            self.far.remove(&id.0);
        } else {
            self.far.insert(id.0, value);
        }
    }

    /// Grow or move the window so that it covers `id` (>= `base`).
    fn cover(&mut self, id: u64) {
        let off = id - self.base;
        if off < WINDOW {
            let len = (off + 1).max(2 * self.window.len() as u64).clamp(1024, WINDOW);
            self.window.resize(len as usize, self.empty);
            return;
        }
        // Move so that `id` falls in the upper half: the lower half keeps the newest ids the
        // window held, where nearly all the live values are. The rest go to the map.
        let half = WINDOW / 2;
        let new_base = (id / half - 1) * half;
        let gone = (new_base - self.base).min(self.window.len() as u64) as usize;
        let empty = self.empty;
        for (i, &v) in self.window[..gone].iter().enumerate() {
            if v != empty {
                self.far.insert(self.base + i as u64, v);
            }
        }
        self.window.drain(..gone);
        self.window.resize(WINDOW as usize, empty);
        self.base = new_base;
        // Values the map held for ids the window now covers move in.
        if !self.far.is_empty() {
            let (base, window) = (self.base, &mut self.window);
            self.far.retain(|&k, v| match k.checked_sub(base).filter(|&o| o < WINDOW) {
                Some(o) => {
                    window[o as usize] = *v;
                    false
                }
                None => true,
            });
        }
    }
}

/// Allocation ids are mostly dense counters: a multiplicative hash spreads them enough, and
/// is much cheaper than SipHash. Iteration order is never used.
#[derive(Debug, Default, Clone, Copy)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Against a plain map: dense ids with long- and short-lived values, jumps past the
    /// window, ids far below it and far above it.
    #[test]
    fn behaves_like_a_map() {
        let mut table = IdTable::new(0u32);
        let mut model = BTreeMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut counter = 0u64;
        let mut live: Vec<u64> = Vec::new();
        for step in 0..200_000u32 {
            let r = next();
            counter += match r % 1000 {
                0 => r % (2 * WINDOW), // a jump, often past the window
                _ => 1 + r % 8,
            };
            // Now and then a hand-made id, far from the others.
            let id = if r % 1000 == 1 { counter + (1 << 40) + (r >> 40) } else { counter };
            let value = 1 + step;
            table.set(AllocId(id), value);
            model.insert(id, value);
            if r % 50 == 0 {
                live.push(id); // long-lived: freed much later
            } else if r % 3 != 0 {
                table.set(AllocId(id), 0); // short-lived
                model.remove(&id);
            }
            if r % 997 == 0 && !live.is_empty() {
                let old = live.swap_remove((r >> 20) as usize % live.len());
                table.set(AllocId(old), 0);
                model.remove(&old);
            }
            let probe = match r >> 60 {
                0 => counter.saturating_sub(r >> 40 & 0xfffff),
                1 => live.get((r >> 20) as usize % live.len().max(1)).copied().unwrap_or(0),
                _ => id,
            };
            assert_eq!(table.get(AllocId(probe)), model.get(&probe).copied().unwrap_or(0));
        }
        for (&k, &v) in &model {
            assert_eq!(table.get(AllocId(k)), v, "id {k}");
        }
        assert!(!table.far.is_empty(), "no value ever left the window: the test misses the map");
        assert!(table.base > 4 * WINDOW, "the window never moved far");
        assert!(table.window.len() as u64 <= WINDOW);
    }
}
