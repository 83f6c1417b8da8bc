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

use super::common::{
    books_glue, parse_bytes, parse_conf, round_up, rounded_request, unknown_key, Books, Live,
    ALIGN_256, PAGE_2MIB,
};
use super::tiling::Tiling;
use allocsim_core::{
    AllocId, Allocator, ConfigError, Env, Granted, OomInfo, SnapshotSegment, StreamId, MIB,
};
use std::collections::BTreeSet;

const NAME: &str = "tlsf";
const KEYS: &[&str] = &["segment_size", "sl_bits"];
const ALIGN_LOG2: u32 = 8;
const NIL: u64 = u64::MAX;
/// `NEW_BLOCK_SIZE_SHIFT_MAX` in VMA.
const NEW_SEGMENT_SHIFT_MAX: u32 = 3;
const MAX_REQUEST_BYTES: u64 = 1 << 50;

/// Links of a free chunk in its class list.
#[derive(Debug, Clone, Copy)]
struct Links {
    prev: u64,
    next: u64,
}

const UNLINKED: Links = Links { prev: NIL, next: NIL };

#[derive(Debug)]
pub struct Tlsf {
    books: Books,
    tiling: Tiling<Links>,
    sl_bits: u32,
    fl_bitmap: u64,
    sl_bitmap: [u64; 64],
    /// Head of each class list, `fl * 2^sl_bits + sl`.
    heads: Vec<u64>,
    segment_size: u64,
    /// Segments dedicated to one allocation.
    dedicated: BTreeSet<u64>,
}

impl Tlsf {
    pub fn from_conf(conf: &str) -> Result<Self, ConfigError> {
        let mut me = Tlsf {
            books: Books::default(),
            tiling: Tiling::default(),
            sl_bits: 5,
            fl_bitmap: 0,
            sl_bitmap: [0; 64],
            heads: Vec::new(),
            segment_size: 256 * MIB,
            dedicated: BTreeSet::new(),
        };
        me.set_settings(conf)?;
        me.heads = vec![NIL; 64 << me.sl_bits];
        Ok(me)
    }

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

    fn link(&mut self, addr: u64) {
        let Some(c) = self.tiling.get(addr) else { return };
        let (fl, sl) = self.class(c.size);
        let h = self.head((fl, sl));
        let old = self.heads[h];
        if old != NIL {
            if let Some(o) = self.tiling.get(old) {
                let links = Links { prev: addr, ..o.tag };
                self.tiling.set_tag(old, links);
            }
        }
        self.tiling.set_tag(addr, Links { prev: NIL, next: old });
        self.heads[h] = addr;
        self.fl_bitmap |= 1 << fl;
        self.sl_bitmap[fl] |= 1 << sl;
    }

    fn unlink(&mut self, addr: u64) {
        let Some(&c) = self.tiling.get(addr) else { return };
        let (fl, sl) = self.class(c.size);
        let Links { prev, next } = c.tag;
        if let Some(&p) = self.tiling.get(prev).filter(|_| prev != NIL) {
            self.tiling.set_tag(prev, Links { next, ..p.tag });
        } else {
            let h = self.head((fl, sl));
            self.heads[h] = next;
        }
        if let Some(&n) = self.tiling.get(next).filter(|_| next != NIL) {
            self.tiling.set_tag(next, Links { prev, ..n.tag });
        }
        self.tiling.set_tag(addr, UNLINKED);
        if self.heads[self.head((fl, sl))] == NIL {
            self.sl_bitmap[fl] &= !(1 << sl);
            if self.sl_bitmap[fl] == 0 {
                self.fl_bitmap &= !(1 << fl);
            }
        }
    }

    /// Take the block at `addr` (listed, free) for `rounded` bytes, listing the remainder.
    fn carve(&mut self, addr: u64, rounded: u64) {
        self.unlink(addr);
        if let Some(rest) = self.tiling.split(addr, rounded, UNLINKED) {
            self.link(rest);
        }
    }

    /// A regular segment able to hold `rounded`, sized by VMA's rules.
    fn grow(&mut self, env: &mut Env<'_>, rounded: u64, stream: StreamId) -> bool {
        let largest = self
            .tiling
            .segments()
            .filter(|(b, _)| !self.dedicated.contains(b))
            .map(|(_, s)| s.size)
            .max();
        let mut size = self.segment_size;
        let mut shift = 0;
        while shift < NEW_SEGMENT_SHIFT_MAX
            && size / 2 > largest.unwrap_or(0)
            && size / 2 >= rounded * 2
        {
            size /= 2;
            shift += 1;
        }
        loop {
            let seg = round_up(size, ALIGN_256);
            if let Some(addr) = self.books.device_malloc(env, seg, stream) {
                self.tiling.add_segment(addr, seg, stream, UNLINKED);
                self.link(addr);
                return true;
            }
            if shift >= NEW_SEGMENT_SHIFT_MAX || size / 2 < rounded {
                return false;
            }
            size /= 2;
            shift += 1;
        }
    }

    fn dedicated_segment(
        &mut self,
        env: &mut Env<'_>,
        rounded: u64,
        stream: StreamId,
    ) -> Option<(u64, u64)> {
        let size = round_up(rounded, PAGE_2MIB);
        let addr = self.books.device_malloc(env, size, stream)?;
        self.tiling.add_segment(addr, size, stream, UNLINKED);
        self.dedicated.insert(addr);
        Some((addr, size))
    }

    /// Return wholly free segments, keeping `keep` of them; whether any went.
    fn release_free_segments(&mut self, env: &mut Env<'_>, keep: usize) -> bool {
        let free: Vec<u64> =
            self.tiling.segments().filter(|(_, s)| s.is_wholly_free()).map(|(b, _)| b).collect();
        let mut released = false;
        for &base in free.iter().skip(keep) {
            self.unlink(base);
            if let Some(seg) = self.tiling.remove_segment(base) {
                self.books.device_free(env, base, seg.size, seg.stream);
                released = true;
            }
        }
        released
    }

    fn find(&mut self, env: &mut Env<'_>, rounded: u64, stream: StreamId) -> Option<(u64, u64)> {
        if rounded > self.segment_size / 2 {
            if let Some(found) = self.dedicated_segment(env, rounded, stream) {
                return Some(found);
            }
        } else {
            let class = self.search_class(rounded);
            if let Some(addr) = self.find_suitable(class) {
                self.carve(addr, rounded);
                return Some((addr, rounded));
            }
            if self.grow(env, rounded, stream) {
                let addr = self.find_suitable(class)?;
                self.carve(addr, rounded);
                return Some((addr, rounded));
            }
        }
        self.books.stats.num_alloc_retries += 1;
        if !self.release_free_segments(env, 0) {
            return None;
        }
        if rounded > self.segment_size / 2 {
            return self.dedicated_segment(env, rounded, stream);
        }
        let class = self.search_class(rounded);
        let addr = self.find_suitable(class).or_else(|| {
            self.grow(env, rounded, stream).then(|| self.find_suitable(class)).flatten()
        })?;
        self.carve(addr, rounded);
        Some((addr, rounded))
    }

    fn release_block(&mut self, env: &mut Env<'_>, addr: u64) {
        self.tiling.release(addr, UNLINKED);
        let seg = self.tiling.seg_of(addr).unwrap_or(addr);
        if self.dedicated.remove(&seg) {
            if let Some(s) = self.tiling.remove_segment(seg) {
                self.books.device_free(env, seg, s.size, s.stream);
            }
            return;
        }
        let mut at = addr;
        if let Some((next, _)) = self.tiling.next(at).filter(|(_, c)| c.is_free()) {
            self.unlink(next);
            self.tiling.merge_next(at);
        }
        if let Some((prev, _)) = self.tiling.prev(at).filter(|(_, c)| c.is_free()) {
            self.unlink(prev);
            self.tiling.merge_next(prev);
            at = prev;
        }
        self.link(at);
        if self.tiling.seg(seg).is_some_and(|s| s.is_wholly_free()) {
            // VMA keeps one empty block: if another was empty already, this one goes.
            self.release_free_segments(env, 1);
        }
    }
}

impl Tlsf {
    /// The block of a completed free is the policy's again (see `books_glue!`).
    fn take_back(&mut self, env: &mut Env<'_>, b: Live, _deferred: bool) {
        self.release_block(env, b.addr);
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }
}

impl Allocator for Tlsf {
    fn name(&self) -> &str {
        NAME
    }

    fn malloc(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        size: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo> {
        let rounded = rounded_request(size, ALIGN_256);
        let found =
            if rounded <= MAX_REQUEST_BYTES { self.find(env, rounded, stream) } else { None };
        let result = match found {
            Some((addr, block)) => {
                self.tiling.take(addr, id);
                Ok(self.books.grant(env, id, (addr, block), size, stream))
            }
            None => Err(self.books.oom(env, id, rounded, stream, self.tiling.largest_free())),
        };
        self.books.sync_inactive_split(self.tiling.inactive_split());
        result
    }

    books_glue!();

    fn empty_cache(&mut self, env: &mut Env<'_>) {
        self.release_free_segments(env, 0);
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }

    /// `sl_bits` takes effect only at construction.
    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        let (mut segment_size, mut sl_bits) = (self.segment_size, self.sl_bits as u64);
        for (key, value) in parse_conf(NAME, conf)? {
            match key.as_str() {
                "segment_size" => segment_size = parse_bytes(NAME, &key, &value)?,
                "sl_bits" => sl_bits = parse_bytes(NAME, &key, &value)?,
                _ => return Err(unknown_key(NAME, &key, KEYS)),
            }
        }
        if !(PAGE_2MIB..=MAX_REQUEST_BYTES).contains(&segment_size) || !(1..=6).contains(&sl_bits) {
            return Err(ConfigError(format!(
                "policy {NAME}: need 2 MiB <= segment_size <= 1 PiB and 1 <= sl_bits <= 6"
            )));
        }
        self.segment_size = segment_size;
        if self.heads.is_empty() {
            self.sl_bits = sl_bits as u32;
        }
        Ok(())
    }

    fn snapshot(&self) -> Vec<SnapshotSegment> {
        self.tiling.snapshot(&self.books)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Rig;
    use allocsim_core::{GIB, MIB};

    #[test]
    fn classes_are_monotone_and_search_rounds_up() {
        let t = super::Tlsf::from_conf("").unwrap();
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

    #[test]
    fn lifo_reuse_and_coalescing() {
        let mut rig = Rig::new("tlsf", None, GIB);
        let a = rig.malloc(1, 1000, 0).unwrap();
        assert_eq!(rig.reserved(), 32 * MIB, "VMA starts at 1/8 of the preferred size");
        let _b = rig.malloc(2, 1000, 0).unwrap();
        let c = rig.malloc(3, 1000, 0).unwrap();
        let _d = rig.malloc(4, 1000, 0).unwrap();
        rig.free(1);
        rig.free(3);
        let e = rig.malloc(5, 1000, 0).unwrap();
        assert_eq!(e.addr, c.addr, "last freed first");
        for id in [2, 4, 5] {
            rig.free(id);
        }
        assert_eq!(rig.policy.snapshot()[0].blocks.len(), 1, "coalesced");
        let _ = a;
    }

    #[test]
    fn dedicated_segments_for_large_requests() {
        let mut rig = Rig::new("tlsf", Some("segment_size:64MiB"), GIB);
        let a = rig.malloc(1, 40 * MIB, 0).unwrap();
        assert_eq!(a.size, 40 * MIB);
        assert_eq!(rig.reserved(), 40 * MIB);
        rig.free(1);
        assert_eq!(rig.reserved(), 0, "dedicated memory goes back at free");
    }

    #[test]
    fn keeps_one_empty_segment_and_ooms() {
        let mut rig = Rig::new("tlsf", Some("segment_size:16MiB"), 24 * MIB);
        rig.malloc(1, 7 * MIB, 0).unwrap();
        rig.malloc(2, 7 * MIB, 0).unwrap();
        rig.malloc(3, 7 * MIB, 0).unwrap();
        let segs = rig.policy.snapshot().len();
        assert!(segs >= 2, "{segs}");
        rig.free(1);
        rig.free(2);
        rig.free(3);
        assert_eq!(rig.policy.snapshot().len(), 1, "one empty segment kept");
        assert!(rig.malloc(4, 30 * MIB, 0).is_err());
    }
}
