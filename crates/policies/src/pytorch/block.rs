//! Blocks and block pools (docs/pytorch-caching-allocator.md §2), laid out for speed.
//!
//! PyTorch's `Block` is a heap object linked to its neighbours by raw `prev`/`next` pointers
//! and kept in `std::set`s ordered by (stream, size, ptr). Here blocks live in an [`Arena`]
//! (a slab indexed by `u32`, slots recycled), links are indices, and each pool keeps its free
//! set as a `BTreeSet` of small copyable keys. Object identity still matters for fidelity: a
//! block keeps its slot, and with it its stale `requested_size`, exactly as long as PyTorch
//! keeps the `Block` object alive.

use super::freeset::{FreeSet, SizeKey};
use allocsim_core::{AllocId, MemPoolId, Pool, StreamId};
use std::collections::BTreeSet;
use std::ops::{Index, IndexMut};

/// "No block": the null pointer of `prev`, `next` and `expandable`.
pub const NIL: u32 = u32::MAX;

/// PyTorch's `Block`, with `event_count` reduced to `pending` (a free waiting on other
/// streams) and `stream_uses` to a count (the streams themselves live beside the arena).
#[derive(Debug, Clone, Copy)]
pub struct Block {
    pub addr: u64,
    pub size: u64,
    /// The last request this block object served; never reset on free.
    pub requested: u64,
    pub stream: StreamId,
    /// `get_free_blocks_call_count` when the block last entered the free set (GC age).
    pub gc_count_base: u64,
    /// The allocation this block serves while allocated or pending.
    pub id: AllocId,
    pub prev: u32,
    pub next: u32,
    /// Index of the expandable segment the block lies in, or `NIL` for a cudaMalloc segment.
    pub expandable: u32,
    /// The pool the block's segment belongs to: 0 the default pools, `k` the private pool in
    /// slot `k - 1` (`block->pool`).
    pub slot: u16,
    /// How many streams other than `stream` the block was recorded on.
    pub stream_uses: u32,
    pub small: bool,
    pub allocated: bool,
    /// `event_count > 0`: freed by the program, still in use on another stream.
    pub pending: bool,
    pub mapped: bool,
    /// False once the slot is vacant (`delete block`).
    pub live: bool,
}

impl Block {
    pub fn new(addr: u64, size: u64, stream: StreamId, small: bool) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            gc_count_base: 0,
            id: AllocId(u64::MAX),
            prev: NIL,
            next: NIL,
            expandable: NIL,
            slot: 0,
            stream_uses: 0,
            small,
            allocated: false,
            pending: false,
            mapped: true,
            live: true,
        }
    }

    /// `Block::is_split`.
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    pub fn is_expandable(&self) -> bool {
        self.expandable != NIL
    }

    /// Free, what `release_blocks` acts on: a whole segment, or a block of an expandable one.
    #[inline(always)]
    pub fn releasable(&self) -> bool {
        self.is_expandable() || !self.is_split()
    }

    /// Free with nothing outstanding: the blocks `try_merge_blocks` may absorb. The fields are
    /// combined without short-circuits: one branch on the answer rather than one per field.
    pub fn is_allocatable(&self) -> bool {
        !self.allocated & !self.pending & (self.stream_uses == 0)
    }

    pub fn pool(&self) -> Pool {
        if self.small {
            Pool::Small
        } else {
            Pool::Large
        }
    }

    /// The key under which the block sits in its pool's free set.
    pub fn size_key(&self, index: u32) -> SizeKey {
        SizeKey { stream: self.stream.0, size: self.size, addr: self.addr, index }
    }

    /// The key under which an unmapped block sits in its pool's `unmapped` set.
    pub fn addr_key(&self, index: u32) -> AddrKey {
        AddrKey { stream: self.stream.0, addr: self.addr, index }
    }
}

/// `BlockComparatorAddress`: (stream, address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AddrKey {
    pub stream: u64,
    pub addr: u64,
    pub index: u32,
}

/// A slab of blocks: `new Block` and `delete block` without heap traffic per op.
#[derive(Debug, Default)]
pub struct Arena {
    slots: Vec<Block>,
    vacant: Vec<u32>,
}

impl Arena {
    #[inline]
    pub fn insert(&mut self, block: Block) -> u32 {
        if let Some(index) = self.vacant.pop() {
            self.slots[index as usize] = block;
            index
        } else {
            self.slots.push(block);
            (self.slots.len() - 1) as u32
        }
    }

    /// `delete block`. Callers drop every link to it first.
    #[inline]
    pub fn remove(&mut self, index: u32) {
        self.slots[index as usize].live = false;
        self.vacant.push(index);
    }

    /// Every live block with its index, in slot order.
    pub fn iter_live(&self) -> impl Iterator<Item = (u32, &Block)> {
        self.slots.iter().enumerate().filter(|(_, b)| b.live).map(|(i, b)| (i as u32, b))
    }
}

impl Index<u32> for Arena {
    type Output = Block;
    fn index(&self, index: u32) -> &Block {
        &self.slots[index as usize]
    }
}

impl IndexMut<u32> for Arena {
    fn index_mut(&mut self, index: u32) -> &mut Block {
        &mut self.slots[index as usize]
    }
}

/// A private pool (`PrivatePool`): its own small and large free sets, how many owners and
/// contexts hold it, and its segments.
#[derive(Debug)]
pub struct PrivatePool {
    pub id: MemPoolId,
    pub small: BlockPool,
    pub large: BlockPool,
    /// `use_count`: the pool's owner plus the contexts allocating to it. At 0 it is freeable:
    /// a release of cached blocks frees its whole free segments.
    pub use_count: u32,
    /// `cudaMalloc_count`: its live segments. A freeable pool with none left is deleted.
    pub segments: u32,
    /// False once deleted; the slot stays, so blocks' slot numbers stay valid.
    pub live: bool,
}

impl PrivatePool {
    pub fn new(id: MemPoolId, use_count: u32) -> PrivatePool {
        let (small, large) = (BlockPool::new(), BlockPool::new());
        PrivatePool { id, small, large, use_count, segments: 0, live: true }
    }
}

/// PyTorch's `BlockPool`: the free (mapped) blocks by size, the unmapped expandable ranges
/// by address, and the GC clock.
#[derive(Debug)]
pub struct BlockPool {
    pub blocks: FreeSet,
    /// The free blocks `release_blocks` and the GC act on (whole segments, and the blocks of
    /// expandable segments), in the same order: so an OOM, which releases what is cached,
    /// looks at those only and not at every free block (issue 50: 200,000 streams each with a
    /// split free block made every OOM walk all of them). A block's membership is fixed while
    /// it is free: it changes only with its neighbours, which merge with it or split it after
    /// it has left the set.
    pub releasable: BTreeSet<SizeKey>,
    pub unmapped: BTreeSet<AddrKey>,
    pub get_free_blocks_call_count: u64,
}

impl BlockPool {
    pub fn new() -> BlockPool {
        BlockPool {
            blocks: FreeSet::default(),
            releasable: BTreeSet::new(),
            unmapped: BTreeSet::new(),
            get_free_blocks_call_count: 0,
        }
    }

    /// The largest free block over all streams.
    pub fn largest_free(&self) -> u64 {
        self.blocks.largest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_keys_order_by_stream_size_address() {
        let a = SizeKey { stream: 0, size: 10, addr: 900, index: 3 };
        let b = SizeKey { stream: 0, size: 20, addr: 100, index: 1 };
        let c = SizeKey { stream: 1, size: 1, addr: 0, index: 2 };
        assert!(a < b && b < c);
    }

    #[test]
    fn largest_free_spans_streams() {
        let mut pool = BlockPool::new();
        pool.blocks.insert(SizeKey { stream: 0, size: 50, addr: 0, index: 0 });
        pool.blocks.insert(SizeKey { stream: 5, size: 10, addr: 0, index: 1 });
        pool.blocks.insert(SizeKey { stream: 9, size: 20, addr: 0, index: 2 });
        assert_eq!(pool.largest_free(), 50);
    }
}
