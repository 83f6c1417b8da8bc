//! TLSF, two-level segregated fit (Masmano, Ripoll, Crespo, Real: "TLSF: a new dynamic memory
//! allocator for real-time systems", ECRTS 2004), the default algorithm of AMD's Vulkan
//! Memory Allocator 3, with VMA's block-vector rules around it.
//!
//! - Sizes round up to 256 B. Free blocks are classed by a first level (power of two) and
//!   `2^sl_bits` linear second-level classes within it; below `2^(sl_bits + 8)` bytes the
//!   classes are 256 B apart. Two levels of bitmaps find a non-empty class in O(1).
//! - A search rounds the request up to the next class boundary (`mapping_search`), so the head
//!   of any class found fits: good fit, not best fit. Class lists are LIFO (doubly linked
//!   through the chunks, as in TLSF), so the most recently freed block is reused first.
//! - The block found is split when the remainder is at least 256 B; frees coalesce at once
//!   with free physical neighbours (boundary tags).
//! - Segments follow VMA's `VmaBlockVector`: requests over `segment_size / 2` get a dedicated
//!   segment of their own (rounded to 2 MiB), returned to the device at free. Otherwise a new
//!   segment is `segment_size`, halved up to 3 times while the half is larger than every
//!   existing segment and at least twice the request (VMA starts small), and halved again (up
//!   to 3 times in all, never below the request) when the device refuses. At most one wholly
//!   free segment is kept; another that empties goes back at once.
//! - Before OOM, wholly free segments go back and growth is tried once more.
//!   `empty_cache` returns every wholly free segment.
//! - Classes are O(1); the chunk map itself is an ordered map (for determinism and snapshots),
//!   so each operation costs O(log n) in this simulation.
//!
//! Settings (`key:value,...`):
//! - `segment_size` (bytes, at least 2 MiB, default 256 MiB: VMA's preferred large-heap block),
//! - `sl_bits` (second-level bits, 1..=6, default 5 as in TLSF and VMA).

use crate::kit::{
    round_up, Kit, Live, Release, Room, Rules, Setting, Tiling, ALIGN_256, PAGE_2MIB,
};
use crate::settings;
use allocsim_core::{StreamId, MIB};

const ALIGN_LOG2: u32 = 8;
const NIL: u64 = u64::MAX;
/// `NEW_BLOCK_SIZE_SHIFT_MAX` in VMA.
const NEW_SEGMENT_SHIFT_MAX: u32 = 3;
const MAX_REQUEST_BYTES: u64 = 1 << 50;

/// Links of a free chunk in its class list (`NIL` both: not listed).
#[derive(Debug, Clone, Copy)]
pub struct Links {
    prev: u64,
    next: u64,
}

impl Default for Links {
    fn default() -> Self {
        Links { prev: NIL, next: NIL }
    }
}

pub type Tlsf = Kit<TlsfRules>;

#[derive(Debug, Clone)]
pub struct TlsfRules {
    sl_bits: u32,
    segment_size: u64,
    fl_bitmap: u64,
    sl_bitmap: [u64; 64],
    /// Head of each class list, `fl * 2^sl_bits + sl` (made at the first segment).
    heads: Vec<u64>,
    /// The size tried for a regular segment, before rounding, and the halvings so far.
    trying: (u64, u32),
}

impl Default for TlsfRules {
    fn default() -> Self {
        TlsfRules {
            sl_bits: 5,
            segment_size: 256 * MIB,
            fl_bitmap: 0,
            sl_bitmap: [0; 64],
            heads: Vec::new(),
            trying: (0, 0),
        }
    }
}

impl TlsfRules {
    /// `mapping_insert`: the class of a free block of `size` bytes.
    fn class(&self, size: u64) -> (usize, usize) {
        let small = 1u64 << (self.sl_bits + ALIGN_LOG2);
        if size < small {
            return (0, (size >> ALIGN_LOG2) as usize);
        }
        let f = 63 - size.leading_zeros();
        let sl = (size >> (f - self.sl_bits)) ^ (1 << self.sl_bits);
        ((f - self.sl_bits - ALIGN_LOG2 + 1) as usize, sl as usize)
    }

    /// `mapping_search`: the first class whose every block fits `size`.
    fn search_class(&self, size: u64) -> (usize, usize) {
        let small = 1u64 << (self.sl_bits + ALIGN_LOG2);
        if size < small {
            return self.class(size);
        }
        let f = 63 - size.leading_zeros();
        self.class(size + (1u64 << (f - self.sl_bits)) - 1)
    }

    fn head(&self, (fl, sl): (usize, usize)) -> usize {
        (fl << self.sl_bits) + sl
    }

    /// `find_suitable_block`: the head of the first non-empty class at or above `(fl, sl)`.
    fn find_suitable(&self, (fl, sl): (usize, usize)) -> Option<u64> {
        if fl >= 64 {
            return None;
        }
        let sl_map = self.sl_bitmap[fl] & (u64::MAX << sl);
        let (fl, sl_map) = if sl_map != 0 {
            (fl, sl_map)
        } else {
            let fl_map = if fl + 1 >= 64 { 0 } else { self.fl_bitmap & (u64::MAX << (fl + 1)) };
            if fl_map == 0 {
                return None;
            }
            let fl = fl_map.trailing_zeros() as usize;
            (fl, self.sl_bitmap[fl])
        };
        let addr = self.heads[self.head((fl, sl_map.trailing_zeros() as usize))];
        (addr != NIL).then_some(addr)
    }

    fn link(&mut self, tiling: &mut Tiling<Links>, addr: u64) {
        let Some(c) = tiling.get(addr) else { return };
        if self.heads.is_empty() {
            self.heads = vec![NIL; 64 << self.sl_bits];
        }
        let (fl, sl) = self.class(c.size);
        let h = self.head((fl, sl));
        let old = self.heads[h];
        if let Some(o) = tiling.get(old).filter(|_| old != NIL) {
            let links = Links { prev: addr, ..o.tag };
            tiling.set_tag(old, links);
        }
        tiling.set_tag(addr, Links { prev: NIL, next: old });
        self.heads[h] = addr;
        self.fl_bitmap |= 1 << fl;
        self.sl_bitmap[fl] |= 1 << sl;
    }

    fn unlink(&mut self, tiling: &mut Tiling<Links>, addr: u64) {
        let Some(&c) = tiling.get(addr) else { return };
        let (fl, sl) = self.class(c.size);
        let Links { prev, next } = c.tag;
        if let Some(&p) = tiling.get(prev).filter(|_| prev != NIL) {
            tiling.set_tag(prev, Links { next, ..p.tag });
        } else {
            let h = self.head((fl, sl));
            self.heads[h] = next;
        }
        if let Some(&n) = tiling.get(next).filter(|_| next != NIL) {
            tiling.set_tag(next, Links { prev, ..n.tag });
        }
        tiling.set_tag(addr, Links::default());
        if self.heads[self.head((fl, sl))] == NIL {
            self.sl_bitmap[fl] &= !(1 << sl);
            if self.sl_bitmap[fl] == 0 {
                self.fl_bitmap &= !(1 << fl);
            }
        }
    }
}

impl Rules for TlsfRules {
    const NAME: &'static str = "tlsf";
    const SETTINGS: &'static [Setting<Self>] = &settings![
        /// the preferred segment, 2 MiB to 1 PiB (VMA's preferred block size)
        segment_size: Bytes,
        /// second-level bits, 1 to 6 (only before the first request)
        sl_bits: Text => |rules, value| {
            rules.sl_bits = value.parse().map_err(|_| "not a whole number".to_string())?;
            Ok(())
        },
    ];
    type Tag = Links;

    fn block_size(&self, size: u64) -> u64 {
        crate::kit::rounded_request(size, ALIGN_256)
    }

    fn refuses(&self, block: u64) -> bool {
        block > MAX_REQUEST_BYTES
    }

    /// VMA: a block over half the preferred size gets a segment of its own.
    fn dedicated(&self, block: u64) -> bool {
        block > self.segment_size / 2
    }

    /// VMA's regular segment: the preferred size, halved up to 3 times while the half is
    /// larger than every regular segment and at least twice the block.
    fn segment_size(&mut self, tiling: &Tiling<Links>, block: u64, _: &Room<'_>) -> Option<u64> {
        let regular = tiling.segments().filter(|(_, s)| !s.dedicated);
        let largest = regular.map(|(_, s)| s.size).max().unwrap_or(0);
        let (mut size, mut shift) = (self.segment_size, 0);
        while shift < NEW_SEGMENT_SHIFT_MAX && size / 2 > largest && size / 2 >= block * 2 {
            size /= 2;
            shift += 1;
        }
        self.trying = (size, shift);
        Some(round_up(size, ALIGN_256))
    }

    /// Halve again (3 halvings in all), never below the block.
    fn smaller_segment(&mut self, block: u64, _: u64) -> Option<u64> {
        let (size, shift) = self.trying;
        if shift >= NEW_SEGMENT_SHIFT_MAX || size / 2 < block {
            return None;
        }
        self.trying = (size / 2, shift + 1);
        Some(round_up(size / 2, ALIGN_256))
    }

    /// The head of the first class that surely fits; the rest is listed again.
    fn take(&mut self, tiling: &mut Tiling<Links>, block: u64, _: StreamId) -> Option<u64> {
        let addr = self.find_suitable(self.search_class(block))?;
        self.unlink(tiling, addr);
        if let Some(rest) = tiling.split(addr, block, Links::default()) {
            self.link(tiling, rest);
        }
        Some(addr)
    }

    /// From a new segment too, only what the class search finds (a segment smaller than the
    /// block's search class is left unused).
    fn take_from(&mut self, t: &mut Tiling<Links>, _: u64, block: u64, s: StreamId) -> Option<u64> {
        self.take(t, block, s)
    }

    fn added(&mut self, tiling: &mut Tiling<Links>, base: u64) {
        self.link(tiling, base);
    }

    /// Coalesce with free physical neighbours at once, and list the result first (LIFO).
    fn give_back(&mut self, tiling: &mut Tiling<Links>, block: &Live, _: bool) {
        tiling.release(block.addr, Links::default());
        let at = tiling.coalesce(block.addr, |_| true, |tiling, a, _| self.unlink(tiling, a));
        self.link(tiling, at);
    }

    fn removing(&mut self, tiling: &mut Tiling<Links>, base: u64) {
        self.unlink(tiling, base);
    }

    /// VMA keeps one empty segment.
    fn on_segment_free(&mut self, _: &Tiling<Links>, _: u64) -> Release {
        Release::KeepingFirst(1)
    }

    /// `sl_bits` takes effect only before the first request.
    fn check(&mut self, previous: &Self, started: bool) -> Result<(), String> {
        if !(PAGE_2MIB..=MAX_REQUEST_BYTES).contains(&self.segment_size)
            || !(1..=6).contains(&self.sl_bits)
        {
            return Err("need 2 MiB <= segment_size <= 1 PiB and 1 <= sl_bits <= 6".into());
        }
        if started {
            self.sl_bits = previous.sl_bits;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn classes_are_monotone_and_search_rounds_up() {
        let t = super::TlsfRules::default();
        let mut last = (0, 0);
        for size in (256..(64 << 20)).step_by(4099 * 256) {
            let c = t.class(size);
            assert!(c >= last, "{size}");
            last = c;
            let s = t.search_class(size);
            assert!(s >= c);
        }
        // Every block in the searched class fits: the smallest size of that class is >= size.
        assert_eq!(t.class(8192), (1, 0));
        assert_eq!(t.search_class(8193), (1, 1));
    }
}
