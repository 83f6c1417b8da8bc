//! The driver's virtual address space, modelled, and the set of mapped pages in a reservation.
//!
//! The real driver's placement is not reproducible (fidelity notes §1: jumps up and down), so
//! the model picks a rule that is simple, deterministic and reuses freed space the way a
//! first-fit driver would: **the lowest address at or above [`VA_BASE`], aligned as asked,
//! whose range overlaps no live range**. Freed ranges become holes that later requests fill
//! from the bottom; when no hole fits, the range lands above the highest live one. Segments
//! (`malloc`) and address reservations share one space, as they do in the driver.
//!
//! Placement scans the live ranges in address order, O(live ranges): allocators keep at most
//! a few thousand segments live, and a gap index is not worth its complexity at that size.

use std::collections::BTreeMap;

/// The lowest address the model hands out, in the range where Linux puts CUDA's mappings.
pub const VA_BASE: u64 = 0x7f00_0000_0000;

/// Live address ranges, `start -> end` (exclusive), never overlapping.
#[derive(Debug, Clone, Default)]
pub struct AddressSpace {
    live: BTreeMap<u64, u64>,
}

impl AddressSpace {
    /// Place `size_bytes` at the lowest free multiple of `alignment`.
    /// `None` only when the 64-bit space is exhausted.
    pub fn place(&mut self, size_bytes: u64, alignment: u64) -> Option<u64> {
        let mut candidate = align_up(VA_BASE, alignment)?;
        for (&start, &end) in &self.live {
            if end <= candidate {
                continue;
            }
            if candidate.checked_add(size_bytes)? <= start {
                break;
            }
            candidate = align_up(end, alignment)?;
        }
        let end = candidate.checked_add(size_bytes)?;
        self.live.insert(candidate, end);
        Some(candidate)
    }

    /// Place `size_bytes` at exactly `addr` if that overlaps no live range.
    pub fn place_at(&mut self, addr: u64, size_bytes: u64) -> bool {
        let Some(end) = addr.checked_add(size_bytes) else { return false };
        if size_bytes == 0 || self.overlaps(addr, end) {
            return false;
        }
        self.live.insert(addr, end);
        true
    }

    /// Forget the range starting at `addr`; false if none starts there.
    pub fn release(&mut self, addr: u64) -> bool {
        self.live.remove(&addr).is_some()
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.live.range(..end).next_back().is_some_and(|(_, &e)| e > start)
    }

    pub fn live_ranges(&self) -> usize {
        self.live.len()
    }
}

/// Round `value` up to a multiple of `alignment` (any; 0 and 1 mean none).
pub fn align_up(value: u64, alignment: u64) -> Option<u64> {
    if alignment <= 1 {
        return Some(value);
    }
    value.div_ceil(alignment).checked_mul(alignment)
}

/// Disjoint, merged `[start, end)` intervals: the mapped pages of one reservation.
/// Adjacent mappings merge, so an unmap may cover pages mapped by several calls, and may cut
/// one mapping in two, as `cuMemUnmap` over page-sized handles allows.
#[derive(Debug, Clone, Default)]
pub struct IntervalSet {
    ranges: BTreeMap<u64, u64>,
    total_bytes: u64,
}

impl IntervalSet {
    /// True if any of `[start, end)` is in the set.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.ranges.range(..end).next_back().is_some_and(|(_, &e)| e > start)
    }

    /// Add `[start, end)`; false (and nothing changes) if any of it is already in the set.
    pub fn insert(&mut self, start: u64, end: u64) -> bool {
        if start >= end || self.overlaps(start, end) {
            return false;
        }
        let mut new_start = start;
        let mut new_end = end;
        if let Some((&s, &e)) = self.ranges.range(..start).next_back() {
            if e == start {
                new_start = s;
                self.ranges.remove(&s);
            }
        }
        if let Some(e) = self.ranges.remove(&end) {
            new_end = e;
        }
        self.ranges.insert(new_start, new_end);
        self.total_bytes += end - start;
        true
    }

    /// Remove `[start, end)`; false (and nothing changes) unless all of it is in the set.
    pub fn remove(&mut self, start: u64, end: u64) -> bool {
        let Some((&s, &e)) = self.ranges.range(..=start).next_back() else { return false };
        if start >= end || e < end {
            return false;
        }
        self.ranges.remove(&s);
        if s < start {
            self.ranges.insert(s, start);
        }
        if end < e {
            self.ranges.insert(end, e);
        }
        self.total_bytes -= end - start;
        true
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB2: u64 = 2 << 20;

    #[test]
    fn first_fit_reuses_the_lowest_hole() {
        let mut va = AddressSpace::default();
        let a = va.place(4 * MIB2, MIB2).unwrap();
        let b = va.place(MIB2, MIB2).unwrap();
        let c = va.place(MIB2, MIB2).unwrap();
        assert_eq!((a, b, c), (VA_BASE, VA_BASE + 4 * MIB2, VA_BASE + 5 * MIB2));
        assert!(va.release(a));
        // A bigger request skips the hole, a smaller one fills it from the bottom.
        assert_eq!(va.place(5 * MIB2, MIB2), Some(VA_BASE + 6 * MIB2));
        assert_eq!(va.place(MIB2, MIB2), Some(VA_BASE));
        assert_eq!(va.place(3 * MIB2, MIB2), Some(VA_BASE + MIB2));
        assert_eq!(va.place(MIB2, MIB2), Some(VA_BASE + 11 * MIB2));
    }

    #[test]
    fn alignment_and_exact_placement() {
        let mut va = AddressSpace::default();
        va.place(MIB2, MIB2).unwrap();
        assert_eq!(va.place(MIB2, 1 << 30), Some(VA_BASE + (1 << 30)));
        assert!(!va.place_at(VA_BASE + (1 << 30) + 4096, MIB2), "overlaps");
        assert!(va.place_at(0x1000_0000, MIB2));
        assert!(!va.release(0x1000_0001));
    }

    #[test]
    fn interval_set_merges_and_splits() {
        let mut s = IntervalSet::default();
        assert!(s.insert(0, 10));
        assert!(s.insert(20, 30));
        assert!(s.insert(10, 20), "fills the gap and merges both sides");
        assert!(!s.insert(5, 6), "double map");
        assert_eq!(s.total_bytes(), 30);
        assert!(s.remove(12, 18), "cuts the merged range in two");
        assert!(!s.remove(11, 13), "partly unmapped");
        assert!(s.remove(0, 12));
        assert!(s.remove(18, 30));
        assert!(s.is_empty());
        assert_eq!(s.total_bytes(), 0);
    }
}
