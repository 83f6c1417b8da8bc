//! A binary buddy allocator (Knowlton 1965; Knuth, TAOCP vol. 1, 2.5) over power-of-two
//! device segments.
//!
//! - A request rounds up to a power of two, at least `min_block`.
//! - Free blocks are kept per order (size `min_block << order`), lowest address first. A request
//!   takes the lowest-addressed free block of the smallest order that has one and halves it
//!   down to its order, each upper half going on the free list of its order.
//! - A freed block merges with its buddy (the other half of its parent, found by flipping the
//!   size bit of its offset in the segment) while the buddy is wholly free, repeatedly.
//! - Growth: a segment of `max(segment_size, block)` bytes (a power of two); when the device
//!   refuses, one of exactly the block; then wholly free segments go back to the device and
//!   growth is tried once more before OOM. `empty_cache` returns wholly free segments.
//!
//! Settings (`key:value,...`):
//! - `min_block` (bytes, power of two >= 256, default 512),
//! - `segment_size` (bytes, power of two >= `min_block`, default 64 MiB).

use super::common::{books_glue, parse_bytes, parse_conf, unknown_key, Books, Live};
use super::tiling::Tiling;
use allocsim_core::{
    AllocId, Allocator, ConfigError, Env, FreeSpace, Granted, OomInfo, SnapshotSegment, StreamId,
    MIB,
};
use std::collections::BTreeSet;

const NAME: &str = "buddy";
const KEYS: &[&str] = &["min_block", "segment_size"];
/// No block or segment larger than this (1 TiB): bigger requests are refused outright.
const MAX_BLOCK_BYTES: u64 = 1 << 40;

#[derive(Debug)]
pub struct Buddy {
    books: Books,
    tiling: Tiling<()>,
    /// Free block addresses per order.
    free: Vec<BTreeSet<u64>>,
    min_block: u64,
    segment_size: u64,
}

impl Buddy {
    pub fn from_conf(conf: &str) -> Result<Self, ConfigError> {
        let mut me = Buddy {
            books: Books::default(),
            tiling: Tiling::default(),
            free: Vec::new(),
            min_block: 512,
            segment_size: 64 * MIB,
        };
        me.set_settings(conf)?;
        Ok(me)
    }

    fn order(&self, block: u64) -> usize {
        (block / self.min_block).trailing_zeros() as usize
    }

    fn list(&mut self, order: usize) -> &mut BTreeSet<u64> {
        if self.free.len() <= order {
            self.free.resize_with(order + 1, BTreeSet::new);
        }
        &mut self.free[order]
    }

    /// Take a free block of `order`, splitting a larger one if needed.
    fn take_block(&mut self, order: usize) -> Option<u64> {
        let from = (order..self.free.len()).find(|&j| !self.free[j].is_empty())?;
        let addr = self.free[from].pop_first()?;
        for j in (order..from).rev() {
            let half = self.min_block << j;
            if let Some(upper) = self.tiling.split(addr, half, ()) {
                self.list(j).insert(upper);
            }
        }
        Some(addr)
    }

    fn grow(&mut self, env: &mut Env<'_>, block: u64, stream: StreamId) -> bool {
        let preferred = self.segment_size.max(block);
        for size in [preferred, block] {
            if let Some(addr) = self.books.device_malloc(env, size, stream) {
                self.tiling.add_segment(addr, size, stream, ());
                let order = self.order(size);
                self.list(order).insert(addr);
                return true;
            }
            if size == block {
                break;
            }
        }
        false
    }

    /// Merge the free block at `addr` with its buddies as far as possible, then list it.
    fn release_block(&mut self, addr: u64) {
        self.tiling.release(addr, ());
        let mut at = addr;
        while let Some(&c) = self.tiling.get(at) {
            let Some(base) = self.tiling.seg_of(at) else { break };
            let seg_size = self.tiling.seg(base).map_or(0, |s| s.size);
            if c.size >= seg_size {
                break;
            }
            let buddy = base + ((at - base) ^ c.size);
            let order = self.order(c.size);
            let buddy_free =
                self.tiling.get(buddy).is_some_and(|b| b.is_free() && b.size == c.size);
            if !buddy_free {
                break;
            }
            self.list(order).remove(&buddy);
            let lower = at.min(buddy);
            self.tiling.merge_next(lower);
            at = lower;
        }
        if let Some(c) = self.tiling.get(at) {
            let order = self.order(c.size);
            self.list(order).insert(at);
        }
    }

    /// Return wholly free segments to the device; whether any went.
    fn release_free_segments(&mut self, env: &mut Env<'_>) -> bool {
        let free: Vec<u64> =
            self.tiling.segments().filter(|(_, s)| s.is_wholly_free()).map(|(b, _)| b).collect();
        for &base in &free {
            if let Some(seg) = self.tiling.remove_segment(base) {
                let order = self.order(seg.size);
                self.list(order).remove(&base);
                self.books.device_free(env, base, seg.size, seg.stream);
            }
        }
        !free.is_empty()
    }

    fn find(&mut self, env: &mut Env<'_>, block: u64, stream: StreamId) -> Option<u64> {
        let order = self.order(block);
        if let Some(addr) = self.take_block(order) {
            return Some(addr);
        }
        if self.grow(env, block, stream) {
            return self.take_block(order);
        }
        self.books.stats.num_alloc_retries += 1;
        if self.release_free_segments(env) && self.grow(env, block, stream) {
            return self.take_block(order);
        }
        None
    }
}

impl Buddy {
    /// The block of a completed free is the policy's again (see `books_glue!`).
    fn take_back(&mut self, _env: &mut Env<'_>, b: Live, _deferred: bool) {
        self.release_block(b.addr);
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }
}

impl Allocator for Buddy {
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
        let block = size.max(self.min_block).checked_next_power_of_two().unwrap_or(u64::MAX);
        let found = if block <= MAX_BLOCK_BYTES { self.find(env, block, stream) } else { None };
        let result = match found {
            Some(addr) => {
                self.tiling.take(addr, id);
                Ok(self.books.grant(env, id, (addr, block), size, stream))
            }
            None => Err(self.books.oom(env, id, block, stream, self.tiling.largest_free())),
        };
        self.books.sync_inactive_split(self.tiling.inactive_split());
        result
    }

    books_glue!();

    fn empty_cache(&mut self, env: &mut Env<'_>) {
        self.release_free_segments(env);
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }

    /// `min_block` takes effect only before the first request.
    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        let (mut min_block, mut segment_size) = (self.min_block, self.segment_size);
        for (key, value) in parse_conf(NAME, conf)? {
            match key.as_str() {
                "min_block" => min_block = parse_bytes(NAME, &key, &value)?,
                "segment_size" => segment_size = parse_bytes(NAME, &key, &value)?,
                _ => return Err(unknown_key(NAME, &key, KEYS)),
            }
        }
        let pow2 = |v: u64| v.is_power_of_two();
        if !pow2(min_block)
            || min_block < 256
            || !pow2(segment_size)
            || segment_size < min_block
            || segment_size > MAX_BLOCK_BYTES
        {
            return Err(ConfigError(format!(
                "policy {NAME}: need powers of two 256 <= min_block <= segment_size <= 1 TiB"
            )));
        }
        if self.books.stats.num_device_alloc == 0 {
            self.min_block = min_block;
        }
        self.segment_size = segment_size;
        Ok(())
    }

    fn snapshot(&self) -> Vec<SnapshotSegment> {
        self.tiling.snapshot(&self.books)
    }

    fn free_space(&self) -> FreeSpace {
        let mut space = FreeSpace::default();
        for (order, list) in self.free.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
            let size = self.min_block << order;
            space.cached_bytes += size * list.len() as u64;
            space.largest_free_block_bytes = size;
        }
        space
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Rig;
    use allocsim_core::{GIB, MIB};

    #[test]
    fn splits_to_the_order_and_merges_buddies() {
        let mut rig = Rig::new("buddy", Some("segment_size:1MiB"), GIB);
        let a = rig.malloc(1, 100 << 10, 0).unwrap();
        assert_eq!(a.size, 128 << 10, "power of two");
        let b = rig.malloc(2, 100 << 10, 0).unwrap();
        assert_eq!(b.addr, a.addr + (128 << 10), "a's buddy");
        let c = rig.malloc(3, 1, 0).unwrap();
        assert_eq!(c.size, 512);
        assert_eq!(c.addr, a.addr + (256 << 10));
        rig.free(1);
        let d = rig.malloc(4, 128 << 10, 0).unwrap();
        assert_eq!(d.addr, a.addr, "lowest address of the order");
        for id in [2, 3, 4] {
            rig.free(id);
        }
        let snap = rig.policy.snapshot();
        assert_eq!(snap[0].blocks.len(), 1, "all merged back");
    }

    #[test]
    fn grows_and_returns_free_segments() {
        let mut rig = Rig::new("buddy", Some("segment_size:4MiB"), GIB);
        rig.malloc(1, 3 * MIB, 0).unwrap();
        rig.malloc(2, 3 * MIB, 0).unwrap();
        assert_eq!(rig.reserved(), 8 * MIB);
        rig.malloc(3, 5 * MIB, 0).unwrap();
        assert_eq!(rig.reserved(), 16 * MIB, "8 MiB block gets an 8 MiB segment");
        rig.free(3);
        rig.empty_cache();
        assert_eq!(rig.reserved(), 8 * MIB);
    }

    #[test]
    fn oom_and_gc_when_the_device_refuses() {
        let mut rig = Rig::new("buddy", Some("segment_size:4MiB"), 10 * MIB);
        rig.malloc(1, 1, 0).unwrap();
        rig.free(1);
        // A free 4 MiB segment and 6 MiB of device left: an 8 MiB block needs the segment back.
        rig.malloc(2, 5 * MIB, 0).unwrap();
        let s = rig.policy.stats();
        assert_eq!(
            (s.num_alloc_retries, s.num_device_free, s.reserved_bytes.all.current),
            (1, 1, 8 << 20)
        );
        assert!(rig.malloc(3, 5 * MIB, 0).is_err());
    }
}
