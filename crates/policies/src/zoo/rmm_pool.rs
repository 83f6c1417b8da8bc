//! RAPIDS RMM's `pool_memory_resource` (`rmm/mr/device/pool_memory_resource.hpp` over
//! `detail/stream_ordered_memory_resource.hpp` and `detail/coalescing_free_list.hpp`).
//!
//! - Sizes round up to 256 B (`CUDA_ALLOCATION_ALIGNMENT`); a block is cut to exactly that.
//! - Stream-ordered: one address-ordered, coalescing free list per stream. A free goes to the
//!   list of its stream (the allocation stream here) and merges with contiguous free blocks of
//!   that list, never across upstream allocations (`is_head`).
//! - A request takes the best fit (smallest, then lowest address) of its stream's list; else
//!   the best fit of another stream's list, taken in stream order, whose remainder stays on that
//!   list (RMM inserts a `cudaStreamWaitEvent`); else it merges the other lists one by one into
//!   its own (a "sync", counted in `num_sync_all_streams`) until one fits; else it grows.
//! - Growth: `size_to_grow = max(size, pool_size)` (the pool doubles) without a maximum, else
//!   `max(size, remaining / 2)`; `try_to_expand` halves the try size down to the request on a
//!   device refusal. Each growth is one device segment; the remainder goes on the stream's list.
//! - Memory is never given back: RMM releases upstream blocks only when the resource dies, so
//!   `empty_cache` does nothing.
//! - The lists are keyed by stream id here (RMM orders them by event handle).
//!
//! Settings (`key:value,...`):
//! - `initial_pool_size` (bytes, default 0: grow on demand; RMM now requires it explicitly),
//!   reserved at the first request on the legacy stream 0's list, skipped if the device refuses;
//! - `maximum_pool_size` (bytes, default none).

use crate::kit::{
    round_up, rounded_request, Cx, FreeLists, Kit, Live, Rules, Setting, Tiling, ALIGN_256,
};
use crate::settings;
use allocsim_core::StreamId;

/// What a chunk is to the pool and the layers above it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Piece {
    /// On the pool's free list of this stream.
    Free(StreamId),
    /// Handed out by the pool.
    #[default]
    Used,
    /// A fixed-size block of a binning bin (carved from a pool block).
    Bin,
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PoolConf {
    pub initial_pool_size: u64,
    pub maximum_pool_size: Option<u64>,
}

impl PoolConf {
    pub fn set_initial(&mut self, bytes: u64) {
        self.initial_pool_size = round_up(bytes, ALIGN_256);
    }
}

/// The pool itself, on a tiling shared with the layers above (binning).
#[derive(Debug, Clone, Default)]
pub(super) struct PoolCore {
    /// Per stream: free blocks.
    lists: FreeLists<StreamId>,
    pub conf: PoolConf,
    started: bool,
}

impl PoolCore {
    /// A block of exactly `size` (a multiple of 256) bytes for `stream`, tagged `Used` and
    /// unowned; `None` when the pool cannot grow.
    pub fn allocate(
        &mut self,
        cx: &mut Cx<'_, '_, Piece>,
        size: u64,
        stream: StreamId,
    ) -> Option<u64> {
        self.start(cx);
        if let Some(addr) = self.lists.take(stream, size) {
            return Some(self.cut(cx.tiling, addr, size, stream));
        }
        let others: Vec<StreamId> = self.lists.keys().filter(|&s| s != stream).collect();
        for &other in &others {
            if let Some(addr) = self.lists.take(other, size) {
                return Some(self.cut(cx.tiling, addr, size, other));
            }
        }
        for &other in &others {
            self.merge_list(cx, other, stream);
            if let Some(addr) = self.lists.take(stream, size) {
                return Some(self.cut(cx.tiling, addr, size, stream));
            }
        }
        let addr = self.expand(cx, size, stream)?;
        Some(self.cut(cx.tiling, addr, size, stream))
    }

    /// The unowned chunk at `addr` goes back on `stream`'s list, coalescing.
    pub fn deallocate(&mut self, tiling: &mut Tiling<Piece>, addr: u64, stream: StreamId) {
        tiling.set_tag(addr, Piece::Free(stream));
        self.lists.merge_in(tiling, addr, stream);
    }

    /// `initialize_pool`: the initial block on the legacy stream's list.
    fn start(&mut self, cx: &mut Cx<'_, '_, Piece>) {
        if std::mem::replace(&mut self.started, true) || self.conf.initial_pool_size == 0 {
            return;
        }
        let initial = self.conf.initial_pool_size;
        if let Some(addr) = self.try_to_expand(cx, initial, initial, StreamId(0)) {
            self.deallocate(cx.tiling, addr, StreamId(0));
        }
    }

    /// `allocate_and_insert_remainder`: cut `size` bytes off the free chunk at `addr`; the
    /// remainder goes on `list`'s free list.
    fn cut(&mut self, tiling: &mut Tiling<Piece>, addr: u64, size: u64, list: StreamId) -> u64 {
        // Tag it first: the remainder must not coalesce back into it.
        tiling.set_tag(addr, Piece::Used);
        if let Some(rest) = tiling.split(addr, size, Piece::Free(list)) {
            self.lists.merge_in(tiling, rest, list);
        }
        addr
    }

    /// `merge_lists`: move `other`'s free list into `stream`'s, coalescing.
    fn merge_list(&mut self, cx: &mut Cx<'_, '_, Piece>, other: StreamId, stream: StreamId) {
        let Some(addrs) = self.lists.remove_list(other) else { return };
        cx.synced();
        for addr in addrs {
            self.deallocate(cx.tiling, addr, stream);
        }
    }

    /// `expand_pool`: grow by `size_to_grow(size)`, halving on refusal.
    fn expand(&mut self, cx: &mut Cx<'_, '_, Piece>, size: u64, stream: StreamId) -> Option<u64> {
        let pool_size = cx.reserved();
        let try_size = match self.conf.maximum_pool_size {
            None => size.max(pool_size),
            Some(max) => {
                let remaining = round_up(max.saturating_sub(pool_size), ALIGN_256);
                if size <= remaining {
                    size.max(remaining / 2)
                } else {
                    0
                }
            }
        };
        self.try_to_expand(cx, try_size, size, stream)
    }

    /// `try_to_expand`: a new segment of `try_size`, halving down to `min_size` on refusal;
    /// returns it as one unlisted free chunk.
    fn try_to_expand(
        &mut self,
        cx: &mut Cx<'_, '_, Piece>,
        mut try_size: u64,
        min_size: u64,
        stream: StreamId,
    ) -> Option<u64> {
        while try_size >= min_size && try_size > 0 {
            if let Some(addr) = cx.reserve(try_size, stream, Piece::Used) {
                return Some(addr);
            }
            if try_size == min_size {
                break;
            }
            try_size = min_size.max(try_size / 2);
        }
        None
    }
}

/// The pool's rules: every request is a pool allocation.
#[derive(Debug, Clone, Default)]
pub struct Pool {
    core: PoolCore,
}

/// RMM's `pool_memory_resource`.
pub type RmmPool = Kit<Pool>;

/// The pool's settings, for the pool and the layers on it (`$rules`, whose `$core` is the pool).
macro_rules! pool_settings {
    ($rules:ty, $core:ident) => {
        settings![
            /// bytes reserved at the first request (0: grow on demand)
            initial_pool_size: Bytes => |r: &mut $rules, v| r.$core.conf.set_initial(v),
            /// the most the pool reserves, in bytes
            maximum_pool_size: Bytes => |r: &mut $rules, v| r.$core.conf.maximum_pool_size = Some(v),
        ]
    };
}
pub(super) use pool_settings;

impl Rules for Pool {
    const NAME: &'static str = "rmm_pool";
    const SETTINGS: &'static [Setting<Self>] = &pool_settings!(Pool, core);
    type Tag = Piece;

    fn block_size(&self, size: u64) -> u64 {
        rounded_request(size, ALIGN_256)
    }

    fn find(&mut self, cx: &mut Cx<'_, '_, Piece>, block: u64, stream: StreamId) -> Option<u64> {
        self.core.allocate(cx, block, stream)
    }

    fn give_back(&mut self, tiling: &mut Tiling<Piece>, block: &Live, _: bool) {
        tiling.release(block.addr, Piece::Free(block.stream));
        self.core.deallocate(tiling, block.addr, block.stream);
    }

    /// RMM gives upstream memory back only when the resource dies.
    fn empty_cache(&mut self, _: &mut Cx<'_, '_, Piece>) {}
}
