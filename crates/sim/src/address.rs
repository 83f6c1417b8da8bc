//! The driver's virtual address space, modelled, and the set of mapped pages in a reservation.
//!
//! The real driver's placement is not reproducible (docs/fidelity-notes.md §1: jumps up and down), so
//! the model picks a rule that is simple, deterministic and reuses freed space the way a
//! first-fit driver would: **the lowest address at or above [`VA_BASE`], aligned as asked,
//! whose range overlaps no live range**. Freed ranges become holes that later requests fill
//! from the bottom; when no hole fits, the range lands above the highest live one. Segments
//! (`malloc`) and address reservations share one space, as they do in the driver.
//!
//! Placement scans the live ranges in address order, O(live ranges): allocators keep at most
//! a few thousand segments live, and a gap index is not worth its complexity at that size.
//!
//! What the real driver does is not copied: it mostly places each new range below the last,
//! but the same program gets other addresses, and neighbours swap places, when a different
//! amount of memory is free at its start (`validation/` shows it). So [`Placement::Descending`]
//! models the rule, and a question whose answer hangs on ties between equal free blocks (how
//! little memory a run needs) is also asked under [`Placement::Jittered`], the rule with seeded
//! swaps: the spread of the answers is what the addresses leave open.

use crate::faults::SplitMix64;
use std::collections::BTreeMap;

/// The lowest address the model hands out, in the range where Linux puts CUDA's mappings.
pub const VA_BASE: u64 = 0x7f00_0000_0000;
/// The top of the 47-bit user address space, where descending placement starts.
const VA_TOP: u64 = 0x8000_0000_0000;
/// Jittered placement passes over up to this many gaps a range would fit in.
const JITTER_GAPS: u64 = 2;

/// How the modelled driver picks an address for a new range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// The lowest free place (first fit): freed ranges are reused from the bottom.
    #[default]
    Lowest,
    /// The highest free place below the top of the user address space: each new range lands
    /// below the last, as the CUDA driver mostly places them, so the newest of equal free
    /// blocks has the lowest address.
    Descending,
    /// `Descending`, but each range passes over a random number (below 3, drawn from this seed)
    /// of the highest gaps it would fit in: neighbours swap places as they do between runs.
    Jittered { seed: u64 },
}

impl Placement {
    /// `lowest`, `descending` or `jittered:SEED`, as flags take it.
    pub fn parse(text: &str) -> Result<Placement, String> {
        match text {
            "lowest" => Ok(Placement::Lowest),
            "descending" => Ok(Placement::Descending),
            _ => text
                .strip_prefix("jittered:")
                .and_then(|seed| seed.parse().ok())
                .map(|seed| Placement::Jittered { seed })
                .ok_or_else(|| format!("{text:?}: expected lowest, descending or jittered:SEED")),
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Lowest => write!(f, "lowest"),
            Placement::Descending => write!(f, "descending"),
            Placement::Jittered { seed } => write!(f, "jittered:{seed}"),
        }
    }
}

/// Live address ranges, `start -> end` (exclusive), never overlapping.
#[derive(Debug, Clone, Default)]
pub struct AddressSpace {
    live: BTreeMap<u64, u64>,
    placement: Placement,
    jitter: Option<SplitMix64>,
}

impl AddressSpace {
    pub fn new(placement: Placement) -> Self {
        let jitter = match placement {
            Placement::Jittered { seed } => Some(SplitMix64(seed)),
            _ => None,
        };
        AddressSpace { live: BTreeMap::new(), placement, jitter }
    }

    /// Place `size_bytes` at a free multiple of `alignment` as the placement says.
    /// `None` only when the 64-bit space is exhausted.
    pub fn place(&mut self, size_bytes: u64, alignment: u64) -> Option<u64> {
        let skip = match &mut self.jitter {
            Some(rng) => rng.next_u64() % JITTER_GAPS,
            None => 0,
        };
        let addr = match self.placement {
            Placement::Lowest => None,
            Placement::Descending | Placement::Jittered { .. } => {
                self.highest_fit(size_bytes, alignment, skip)
            }
        };
        let addr = match addr {
            Some(a) => a,
            None => self.lowest_fit(size_bytes, alignment)?,
        };
        self.live.insert(addr, addr.checked_add(size_bytes)?);
        Some(addr)
    }

    /// The highest aligned start below `VA_TOP` whose range overlaps nothing live, passing over
    /// the first `skip` gaps it would fit in while there is a lower one.
    fn highest_fit(&self, size_bytes: u64, alignment: u64, mut skip: u64) -> Option<u64> {
        let align_down = |v: u64| v - v % alignment.max(1);
        let fit_below = |end: u64, floor: u64| {
            end.checked_sub(size_bytes).map(align_down).filter(|&c| c >= floor.max(VA_BASE))
        };
        let mut found = None;
        let mut end = VA_TOP;
        for (&start, &live_end) in self.live.iter().rev() {
            if let Some(c) = fit_below(end, live_end) {
                found = Some(c);
                if skip == 0 {
                    return found;
                }
                skip -= 1;
            }
            end = end.min(start);
        }
        fit_below(end, VA_BASE).or(found)
    }

    /// The lowest aligned start at or above `VA_BASE` whose range overlaps nothing live.
    fn lowest_fit(&self, size_bytes: u64, alignment: u64) -> Option<u64> {
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
    fn descending_placement_goes_down_and_refills_from_the_top() {
        let mut va = AddressSpace::new(Placement::Descending);
        let a = va.place(4 * MIB2, MIB2).unwrap();
        let b = va.place(MIB2, MIB2).unwrap();
        assert_eq!((a, b), (VA_TOP - 4 * MIB2, VA_TOP - 5 * MIB2));
        assert!(va.release(a));
        assert_eq!(va.place(MIB2, MIB2), Some(VA_TOP - MIB2), "the highest hole first");
        assert_eq!(va.place(5 * MIB2, MIB2), Some(VA_TOP - 10 * MIB2), "too big for the hole");
    }

    #[test]
    fn jittered_placement_is_seeded_disjoint_and_mostly_descending() {
        let place_all = |seed| {
            let mut va = AddressSpace::new(Placement::Jittered { seed });
            let mut out = Vec::new();
            for i in 0..200u64 {
                out.push(va.place(3 * MIB2, MIB2).unwrap());
                if i % 3 == 0 {
                    assert!(va.release(out[out.len() / 2]));
                }
            }
            out
        };
        let a = place_all(7);
        assert_eq!(a, place_all(7), "same seed, same addresses");
        assert_ne!(a, place_all(8));
        assert!(a.iter().all(|&x| x % MIB2 == 0 && (VA_BASE..VA_TOP).contains(&x)));
        assert!(a.windows(2).filter(|w| w[1] < w[0]).count() > a.len() / 2, "mostly down");
    }

    #[test]
    fn placements_parse_as_they_print() {
        for p in [Placement::Lowest, Placement::Descending, Placement::Jittered { seed: 3 }] {
            assert_eq!(Placement::parse(&p.to_string()), Ok(p));
        }
        assert!(Placement::parse("jittered:x").is_err());
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
