//! Expandable segments (docs/pytorch-caching-allocator.md §6): one large address reservation per (stream, pool),
//! a private pool's too (PyTorch 2.11 gives a `MemPool` or a CUDA graph pool its own), into which pages (2 MiB small, 20 MiB large) are mapped as the pool grows and unmapped by
//! `empty_cache`. Blocks of such a segment are ordinary blocks with a `mapped` flag; unmapped
//! ranges sit in the pool's `unmapped` set so that growth can find them by address.
//!
//! Statistics differ from cudaMalloc segments on purpose, as in PyTorch: mappings move
//! `reserved_bytes` and the device call counters but never `segment` or `oversize_*`, and
//! `inactive_split` ignores expandable blocks.

use super::block::{AddrKey, Block, NIL};
use super::malloc::pool_of;
use super::rounding::{K_LARGE_BUFFER, K_SMALL_BUFFER};
use super::stats::StatArrayExt;
use super::PyTorchAllocator;
use allocsim_core::{Emit, Env, Event, StreamId};

/// PyTorch's `ExpandableSegment`: a reserved range cut into pages of `page` bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct ExpandableSegment {
    pub base: u64,
    pub size: u64,
    pub page: u64,
    /// False once released; slots are not reused so block indices into them stay valid.
    pub live: bool,
}

impl ExpandableSegment {
    /// `ExpandableSegment::map` arithmetic: the pages `[addr, addr+size)` touches, as
    /// (address, bytes); `segmentLeft` of the start to `segmentRight` of the end.
    fn pages_covering(&self, addr: u64, size: u64) -> (u64, u64) {
        let begin = (addr - self.base) / self.page;
        let end = (addr + size - self.base).div_ceil(self.page);
        (self.base + begin * self.page, (end - begin) * self.page)
    }

    /// `ExpandableSegment::unmap` arithmetic: the pages wholly inside `[addr, addr+size)`.
    fn pages_inside(&self, addr: u64, size: u64) -> (u64, u64) {
        let begin = (addr - self.base).div_ceil(self.page);
        let end = (addr + size - self.base) / self.page;
        if begin >= end {
            return (self.base + begin * self.page, 0);
        }
        (self.base + begin * self.page, (end - begin) * self.page)
    }
}

impl PyTorchAllocator {
    /// `try_allocate_expandable_block`: find room in the segments of pool `slot`, map what is
    /// missing, and hand back one free mapped block of at least `size` bytes, out of the free
    /// set.
    pub(super) fn try_allocate_expandable_block<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        stream: StreamId,
        slot: u16,
        small: bool,
        size: u64,
    ) -> Option<u32> {
        let mut candidate = self.find_expandable_block(env, stream, slot, small, size)?;
        if !self.arena[candidate].mapped {
            let n = self.arena[candidate].size.min(size);
            if !self.map_block(env, candidate, n) {
                return None;
            }
        }
        while self.arena[candidate].size < size {
            // Invariant: free -> unmapped -> ...; mapping merges into the free block.
            let remaining = size - self.arena[candidate].size;
            let next = self.arena[candidate].next;
            if next == NIL || self.arena[next].mapped {
                return None;
            }
            let n = remaining.min(self.arena[next].size);
            if !self.map_block(env, next, n) {
                return None;
            }
            candidate = next;
        }
        self.erase_from_blocks(candidate);
        Some(candidate)
    }

    /// `find_expandable_block`: the lowest-address unmapped range of this stream in the pool
    /// (with the free block just before it) that can hold `size`; else a new segment's whole
    /// range.
    fn find_expandable_block<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        stream: StreamId,
        slot: u16,
        small: bool,
        size: u64,
    ) -> Option<u32> {
        let start = AddrKey { stream: stream.0, addr: 0, index: 0 };
        for key in self.pool(slot, small).unmapped.range(start..) {
            if key.stream != stream.0 {
                break;
            }
            let mut c = key.index;
            let prev = self.arena[c].prev;
            if prev != NIL && self.arena[prev].is_allocatable() {
                c = prev;
            }
            if self.has_available_address_space(c, size) {
                return Some(c);
            }
        }
        let page = if small { K_SMALL_BUFFER } else { K_LARGE_BUFFER };
        let total = env.device.mem_info().total_bytes;
        let reserve = total.saturating_add(total / 8).div_ceil(page).max(1).saturating_mul(page);
        // `cuMemAddressReserve(&ptr_, size, 0, 0, 0)`: alignment 0, the driver's default (its
        // granularity, 2 MiB), not the page size. Pages count from `base`, so nothing here
        // needs more; a recording shows large-pool ranges that are not 20 MiB-aligned.
        let base = env.device.reserve_address(reserve, 0).ok()?;
        let segment = self.segments.len() as u32;
        self.segments.push(ExpandableSegment { base, size: reserve, page, live: true });
        let mut whole = Block::new(base, reserve, stream, small);
        whole.mapped = false;
        whole.expandable = segment;
        whole.slot = slot;
        let index = self.arena.insert(whole);
        self.pool_mut(slot, small).unmapped.insert(whole.addr_key(index));
        if slot != 0 {
            self.private[usize::from(slot) - 1].segments += 1;
        }
        Some(index)
    }

    /// Do the allocatable blocks from `b` on add up to `size`?
    fn has_available_address_space(&self, mut b: u32, size: u64) -> bool {
        let mut bytes = 0;
        while bytes < size && b != NIL && self.arena[b].is_allocatable() {
            bytes += self.arena[b].size;
            b = self.arena[b].next;
        }
        bytes >= size
    }

    /// `map_block`: back the pages covering the first `size` bytes of unmapped block
    /// `to_map`, split off the unmapped rest, merge with free neighbours, and count it.
    fn map_block<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        to_map: u32,
        size: u64,
    ) -> bool {
        let b = self.arena[to_map];
        let seg = self.segments[b.expandable as usize];
        let (addr, mapped) = seg.pages_covering(b.addr, size);
        if mapped == 0 || env.device.map(addr, mapped).is_err() {
            return false;
        }
        self.pool_mut(b.slot, b.small).unmapped.remove(&b.addr_key(to_map));
        self.arena[to_map].mapped = true;
        if mapped < b.size {
            let mut rest = Block::new(b.addr + mapped, b.size - mapped, b.stream, b.small);
            rest.mapped = false;
            rest.expandable = b.expandable;
            rest.slot = b.slot;
            let r = self.link_between(to_map, b.next, rest);
            self.arena[to_map].size = mapped;
            self.pool_mut(b.slot, b.small).unmapped.insert(rest.addr_key(r));
        }
        self.try_merge_blocks(to_map, self.arena[to_map].prev);
        self.try_merge_blocks(to_map, self.arena[to_map].next);
        self.insert_into_blocks(to_map);
        let pool = pool_of(b.small);
        self.total_allocated_memory += mapped;
        self.stats.reserved_bytes.inc(pool, mapped);
        self.stats.num_device_alloc += 1;
        env.events.emit(Event::SegmentMap { addr, size: mapped, stream: b.stream, pool });
        true
    }

    /// A new block in the arena, linked in between blocks `prev` and `next` (either may be
    /// `NIL`): its index.
    fn link_between(&mut self, prev: u32, next: u32, mut block: Block) -> u32 {
        (block.prev, block.next) = (prev, next);
        let new = self.arena.insert(block);
        if prev != NIL {
            self.arena[prev].next = new;
        }
        if next != NIL {
            self.arena[next].prev = new;
        }
        new
    }

    /// `unmap_block`: unmap the whole pages inside free block `index`; the partial pages at
    /// either end stay mapped as new free blocks.
    pub(super) fn unmap_block<E: Emit + ?Sized>(&mut self, env: &mut Env<'_, E>, index: u32) {
        let b = self.arena[index];
        let seg = self.segments[b.expandable as usize];
        let (addr, unmapped) = seg.pages_inside(b.addr, b.size);
        if unmapped == 0 {
            return;
        }
        env.device.unmap(addr, unmapped);
        self.erase_from_blocks(index);
        let before = addr - b.addr;
        if before > 0 {
            let mut head = Block::new(b.addr, before, b.stream, b.small);
            head.expandable = b.expandable;
            head.slot = b.slot;
            let h = self.link_between(b.prev, index, head);
            self.insert_into_blocks(h);
        }
        let after = b.size - before - unmapped;
        if after > 0 {
            let mut tail = Block::new(addr + unmapped, after, b.stream, b.small);
            tail.expandable = b.expandable;
            tail.slot = b.slot;
            let t = self.link_between(index, b.next, tail);
            self.insert_into_blocks(t);
        }
        let blk = &mut self.arena[index];
        blk.addr = addr;
        blk.size = unmapped;
        blk.mapped = false;
        self.try_merge_blocks(index, self.arena[index].prev);
        self.try_merge_blocks(index, self.arena[index].next);
        let key = self.arena[index].addr_key(index);
        self.pool_mut(b.slot, b.small).unmapped.insert(key);
        let pool = pool_of(b.small);
        self.total_allocated_memory -= unmapped;
        self.stats.reserved_bytes.dec(pool, unmapped);
        self.stats.num_device_free += 1;
        env.events.emit(Event::SegmentUnmap { addr, size: unmapped, stream: b.stream, pool });
    }

    /// `release_expandable_segment`: the whole range is unmapped; give the address space back.
    pub(super) fn release_expandable_segment<E: Emit + ?Sized>(
        &mut self,
        env: &mut Env<'_, E>,
        index: u32,
    ) {
        let b = self.arena[index];
        let seg = &mut self.segments[b.expandable as usize];
        seg.live = false;
        env.device.release_address(seg.base, seg.size);
        self.pool_mut(b.slot, b.small).unmapped.remove(&b.addr_key(index));
        self.arena.remove(index);
        if b.slot != 0 {
            self.private[usize::from(b.slot) - 1].segments -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_arithmetic() {
        let seg = ExpandableSegment {
            base: 1000 * K_LARGE_BUFFER,
            size: 10 * K_LARGE_BUFFER,
            page: K_LARGE_BUFFER,
            live: true,
        };
        let p = K_LARGE_BUFFER;
        assert_eq!(seg.pages_covering(seg.base, 1), (seg.base, p));
        assert_eq!(seg.pages_covering(seg.base + p, p + 1), (seg.base + p, 2 * p));
        assert_eq!(seg.pages_inside(seg.base + 1, 2 * p), (seg.base + p, p));
        assert_eq!(seg.pages_inside(seg.base + 1, p).1, 0);
    }
}
