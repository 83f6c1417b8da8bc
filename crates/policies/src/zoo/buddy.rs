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

use crate::kit::{Kit, Live, Room, Rules, Setting, Tiling};
use crate::settings;
use allocsim_core::{StreamId, MIB};
use std::collections::BTreeSet;

/// No block or segment larger than this (1 TiB): bigger requests are refused outright.
const MAX_BLOCK_BYTES: u64 = 1 << 40;

/// The buddy rules: free block addresses per order, and the two sizes that decide them.
#[derive(Debug, Clone)]
pub struct BuddyRules {
    /// Free block addresses per order (size `min_block << order`).
    free: Vec<BTreeSet<u64>>,
    min_block: u64,
    segment_size: u64,
}

impl Default for BuddyRules {
    fn default() -> Self {
        BuddyRules { free: Vec::new(), min_block: 512, segment_size: 64 * MIB }
    }
}

pub type Buddy = Kit<BuddyRules>;

impl BuddyRules {
    fn order(&self, block: u64) -> usize {
        (block / self.min_block).trailing_zeros() as usize
    }

    fn list(&mut self, order: usize) -> &mut BTreeSet<u64> {
        if self.free.len() <= order {
            self.free.resize_with(order + 1, BTreeSet::new);
        }
        &mut self.free[order]
    }
}

impl Rules for BuddyRules {
    const NAME: &'static str = "buddy";
    const SETTINGS: &'static [Setting<Self>] = &settings![
        /// the smallest block, a power of two >= 256 (only before the first request)
        min_block: Bytes,
        /// the segment reserved for blocks up to its size, a power of two
        segment_size: Bytes,
    ];
    type Tag = ();

    fn block_size(&self, size: u64) -> u64 {
        size.max(self.min_block).checked_next_power_of_two().unwrap_or(u64::MAX)
    }

    fn refuses(&self, block: u64) -> bool {
        block > MAX_BLOCK_BYTES
    }

    fn segment_size(&mut self, _: &Tiling<()>, block: u64, _: &Room<'_>) -> Option<u64> {
        Some(self.segment_size.max(block))
    }

    fn smaller_segment(&mut self, block: u64, _refused: u64) -> Option<u64> {
        Some(block)
    }

    /// The lowest-addressed free block of the smallest order that has one, halved down to the
    /// block's order, each upper half listed in its order.
    fn take(&mut self, tiling: &mut Tiling<()>, block: u64, _stream: StreamId) -> Option<u64> {
        let order = self.order(block);
        let from = (order..self.free.len()).find(|&j| !self.free[j].is_empty())?;
        let addr = self.free[from].pop_first()?;
        for j in (order..from).rev() {
            let half = self.min_block << j;
            if let Some(upper) = tiling.split(addr, half, ()) {
                self.list(j).insert(upper);
            }
        }
        Some(addr)
    }

    fn added(&mut self, tiling: &mut Tiling<()>, base: u64) {
        if let Some(seg) = tiling.seg(base) {
            let order = self.order(seg.size);
            self.list(order).insert(base);
        }
    }

    /// Merge with the buddy (the other half of the parent: flip the size bit of the offset in
    /// the segment) while it is wholly free, repeatedly; then list the result.
    fn give_back(&mut self, tiling: &mut Tiling<()>, block: &Live, _: bool) {
        let addr = block.addr;
        tiling.release(addr, ());
        let mut at = addr;
        while let Some(&c) = tiling.get(at) {
            let Some(base) = tiling.seg_of(at) else { break };
            if c.size >= tiling.seg(base).map_or(0, |s| s.size) {
                break;
            }
            let buddy = base + ((at - base) ^ c.size);
            if !tiling.get(buddy).is_some_and(|b| b.is_free() && b.size == c.size) {
                break;
            }
            let order = self.order(c.size);
            self.list(order).remove(&buddy);
            let lower = at.min(buddy);
            tiling.merge_next(lower);
            at = lower;
        }
        if let Some(c) = tiling.get(at) {
            let order = self.order(c.size);
            self.list(order).insert(at);
        }
    }

    fn removing(&mut self, tiling: &mut Tiling<()>, base: u64) {
        if let Some(seg) = tiling.seg(base) {
            let order = self.order(seg.size);
            self.list(order).remove(&base);
        }
    }

    /// `min_block` takes effect only before the first request.
    fn check(&mut self, previous: &Self, started: bool) -> Result<(), String> {
        let pow2 = |v: u64| v.is_power_of_two();
        if !pow2(self.min_block)
            || self.min_block < 256
            || !pow2(self.segment_size)
            || self.segment_size < self.min_block
            || self.segment_size > MAX_BLOCK_BYTES
        {
            return Err("need powers of two 256 <= min_block <= segment_size <= 1 TiB".into());
        }
        if started {
            self.min_block = previous.min_block;
        }
        Ok(())
    }
}
