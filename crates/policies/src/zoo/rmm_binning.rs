//! RAPIDS RMM's `binning_memory_resource` over a `pool_memory_resource`, as RMM's replay and
//! random-allocation benchmarks build it (`binning_memory_resource(pool, 18, 22)`).
//!
//! - Bins of `2^min_exp .. 2^max_exp` bytes (256 KiB .. 4 MiB by default), each a
//!   `fixed_size_memory_resource`: a request goes to the smallest bin at least its size (after
//!   256 B alignment) and gets the bin's whole block; larger requests go to the pool
//!   ([`super::rmm_pool`], same rules and settings).
//! - A bin is stream-ordered like the pool, with FIFO lists of blocks per stream (pop the front,
//!   push frees at the back): own list, then steal from another stream's list, then merge the
//!   other lists into its own, then grow by `blocks_to_preallocate` blocks carved from one pool
//!   allocation. Bin blocks never go back to the pool, and the pool never gives memory back,
//!   so `empty_cache` does nothing.
//! - RMM preallocates every bin in the constructor; here that happens at the first request
//!   (on the legacy stream 0), and a bin whose preallocation the device refuses grows later on
//!   demand instead of failing construction.
//!
//! Settings (`key:value,...`): the pool's `initial_pool_size` and `maximum_pool_size`, and
//! - `min_exp` (default 18), `max_exp` (default 22): the bin sizes, `8 <= min <= max <= 40`;
//! - `blocks_to_preallocate` (default 128): blocks per growth of a bin;
//! - `preallocate` (bool, default `true`): fill every bin at the first request.

use super::rmm_pool::{pool_settings, Piece, PoolCore};
use crate::kit::{rounded_request, Cx, Kit, Live, Rules, Setting, Tiling, ALIGN_256};
use crate::settings;
use allocsim_core::StreamId;
use std::collections::{BTreeMap, VecDeque};

/// One `fixed_size_memory_resource`.
#[derive(Debug, Clone)]
struct Bin {
    block: u64,
    lists: BTreeMap<StreamId, VecDeque<u64>>,
}

#[derive(Debug, Clone)]
pub struct Binning {
    pool: PoolCore,
    bins: Vec<Bin>,
    min_exp: u32,
    max_exp: u32,
    blocks_to_preallocate: u64,
    preallocate: bool,
    started: bool,
}

/// RMM's `binning_memory_resource` over a `pool_memory_resource`.
pub type RmmBinning = Kit<Binning>;

impl Default for Binning {
    fn default() -> Self {
        let mut me = Binning {
            pool: PoolCore::default(),
            bins: Vec::new(),
            min_exp: 18,
            max_exp: 22,
            blocks_to_preallocate: 128,
            preallocate: true,
            started: false,
        };
        me.make_bins();
        me
    }
}

impl Binning {
    fn make_bins(&mut self) {
        self.bins = (self.min_exp..=self.max_exp)
            .map(|e| Bin { block: 1u64 << e, lists: BTreeMap::new() })
            .collect();
    }

    /// `blocks_from_upstream`: carve a pool allocation into blocks at the back of `stream`'s list.
    fn grow_bin(&mut self, cx: &mut Cx<'_, '_, Piece>, bin: usize, stream: StreamId) -> bool {
        let block = self.bins[bin].block;
        let n = self.blocks_to_preallocate;
        let Some(addr) = self.pool.allocate(cx, block * n, stream) else {
            return false;
        };
        cx.tiling.set_tag(addr, Piece::Bin);
        let list = self.bins[bin].lists.entry(stream).or_default();
        for i in 0..n {
            let at = addr + i * block;
            if i + 1 < n {
                cx.tiling.split(at, block, Piece::Bin);
            }
            list.push_back(at);
        }
        true
    }

    /// `stream_ordered_memory_resource::get_block` over FIFO lists.
    fn bin_block(
        &mut self,
        cx: &mut Cx<'_, '_, Piece>,
        bin: usize,
        stream: StreamId,
    ) -> Option<u64> {
        if let Some(addr) = self.bins[bin].lists.get_mut(&stream).and_then(VecDeque::pop_front) {
            return Some(addr);
        }
        let others: Vec<StreamId> =
            self.bins[bin].lists.keys().copied().filter(|&s| s != stream).collect();
        for &other in &others {
            if let Some(addr) = self.bins[bin].lists.get_mut(&other).and_then(VecDeque::pop_front) {
                return Some(addr);
            }
        }
        for &other in &others {
            let Some(mut moved) = self.bins[bin].lists.remove(&other) else { continue };
            cx.synced();
            let own = self.bins[bin].lists.entry(stream).or_default();
            own.append(&mut moved);
            if let Some(addr) = own.pop_front() {
                return Some(addr);
            }
        }
        if !self.grow_bin(cx, bin, stream) {
            return None;
        }
        self.bins[bin].lists.get_mut(&stream).and_then(VecDeque::pop_front)
    }

    /// The constructor's preallocation, at the first request.
    fn start(&mut self, cx: &mut Cx<'_, '_, Piece>) {
        if std::mem::replace(&mut self.started, true) || !self.preallocate {
            return;
        }
        for bin in 0..self.bins.len() {
            self.grow_bin(cx, bin, StreamId(0));
        }
    }
}

/// An exponent setting, `8..=40` once checked.
fn exponent(value: u64) -> u32 {
    value.min(64) as u32
}

impl Rules for Binning {
    const NAME: &'static str = "rmm_binning";
    const SETTINGS: &'static [Setting<Self>] = &{
        let [initial, maximum] = pool_settings!(Binning, pool);
        let [min, max, blocks, preallocate]: [Setting<Self>; 4] = settings![
            /// the smallest bin is 2^min_exp bytes
            min_exp: Bytes => |r, v| r.min_exp = exponent(v),
            /// the largest bin is 2^max_exp bytes
            max_exp: Bytes => |r, v| r.max_exp = exponent(v),
            /// blocks per growth of a bin
            blocks_to_preallocate: Bytes,
            /// fill every bin at the first request
            preallocate: Bool,
        ];
        [initial, maximum, min, max, blocks, preallocate]
    };
    type Tag = Piece;

    fn block_size(&self, size: u64) -> u64 {
        rounded_request(size, ALIGN_256)
    }

    fn find(&mut self, cx: &mut Cx<'_, '_, Piece>, block: u64, stream: StreamId) -> Option<u64> {
        self.start(cx);
        match self.bins.iter().position(|b| b.block >= block) {
            Some(bin) => self.bin_block(cx, bin, stream),
            None => self.pool.allocate(cx, block, stream),
        }
    }

    fn give_back(&mut self, tiling: &mut Tiling<Piece>, block: &Live, _: bool) {
        let (addr, stream) = (block.addr, block.stream);
        let is_bin_block = tiling.get(addr).is_some_and(|c| c.tag == Piece::Bin);
        match self.bins.iter().position(|b| b.block == block.size) {
            Some(bin) if is_bin_block => {
                tiling.release(addr, Piece::Bin);
                self.bins[bin].lists.entry(stream).or_default().push_back(addr);
            }
            _ => {
                tiling.release(addr, Piece::Free(stream));
                self.pool.deallocate(tiling, addr, stream);
            }
        }
    }

    /// Bin blocks never go back to the pool, and the pool gives nothing back.
    fn empty_cache(&mut self, _: &mut Cx<'_, '_, Piece>) {}

    /// Bin settings take effect only before the first request (RMM fixes bins at construction).
    fn check(&mut self, _: &Self, _: bool) -> Result<(), String> {
        if !(8 <= self.min_exp && self.min_exp <= self.max_exp && self.max_exp <= 40) {
            return Err("need 8 <= min_exp <= max_exp <= 40".into());
        }
        if !(1..=1 << 20).contains(&self.blocks_to_preallocate) {
            return Err("blocks_to_preallocate must be in 1..=2^20".into());
        }
        if !self.started {
            self.make_bins();
        }
        Ok(())
    }
}
