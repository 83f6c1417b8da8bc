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

use super::common::{
    books_glue, parse_bool, parse_bytes, parse_conf, rounded_request, unknown_key, Books, Live,
    ALIGN_256,
};
use super::rmm_pool::{Piece, PoolCore};
use super::tiling::Tiling;
use allocsim_core::{
    AllocId, Allocator, ConfigError, Env, FreeSpace, Granted, OomInfo, SnapshotSegment, StreamId,
};
use std::collections::{BTreeMap, VecDeque};

const NAME: &str = "rmm_binning";
const KEYS: &[&str] = &[
    "initial_pool_size",
    "maximum_pool_size",
    "min_exp",
    "max_exp",
    "blocks_to_preallocate",
    "preallocate",
];

#[derive(Debug, Clone, Copy)]
struct BinningConf {
    min_exp: u32,
    max_exp: u32,
    blocks_to_preallocate: u64,
    preallocate: bool,
}

/// One `fixed_size_memory_resource`.
#[derive(Debug)]
struct Bin {
    block: u64,
    lists: BTreeMap<StreamId, VecDeque<u64>>,
}

#[derive(Debug)]
pub struct RmmBinning {
    books: Books,
    tiling: Tiling<Piece>,
    pool: PoolCore,
    bins: Vec<Bin>,
    conf: BinningConf,
    started: bool,
}

impl RmmBinning {
    pub fn from_conf(conf: &str) -> Result<Self, ConfigError> {
        let mut me = RmmBinning {
            books: Books::default(),
            tiling: Tiling::default(),
            pool: PoolCore::default(),
            bins: Vec::new(),
            conf: BinningConf {
                min_exp: 18,
                max_exp: 22,
                blocks_to_preallocate: 128,
                preallocate: true,
            },
            started: false,
        };
        me.set_settings(conf)?;
        Ok(me)
    }

    fn make_bins(&mut self) {
        self.bins = (self.conf.min_exp..=self.conf.max_exp)
            .map(|e| Bin { block: 1u64 << e, lists: BTreeMap::new() })
            .collect();
    }

    /// `blocks_from_upstream`: carve a pool allocation into blocks at the back of `stream`'s list.
    fn grow_bin(&mut self, env: &mut Env<'_>, bin: usize, stream: StreamId) -> bool {
        let block = self.bins[bin].block;
        let n = self.conf.blocks_to_preallocate;
        let Some(addr) =
            self.pool.allocate(&mut self.books, &mut self.tiling, env, block * n, stream)
        else {
            return false;
        };
        self.tiling.set_tag(addr, Piece::Bin);
        let list = self.bins[bin].lists.entry(stream).or_default();
        for i in 0..n {
            let at = addr + i * block;
            if i + 1 < n {
                self.tiling.split(at, block, Piece::Bin);
            }
            list.push_back(at);
        }
        true
    }

    /// `stream_ordered_memory_resource::get_block` over FIFO lists.
    fn bin_block(&mut self, env: &mut Env<'_>, bin: usize, stream: StreamId) -> Option<u64> {
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
            self.books.stats.num_sync_all_streams += 1;
            let own = self.bins[bin].lists.entry(stream).or_default();
            own.append(&mut moved);
            if let Some(addr) = own.pop_front() {
                return Some(addr);
            }
        }
        if !self.grow_bin(env, bin, stream) {
            return None;
        }
        self.bins[bin].lists.get_mut(&stream).and_then(VecDeque::pop_front)
    }

    /// The constructor's preallocation, at the first request.
    fn start(&mut self, env: &mut Env<'_>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        if self.bins.is_empty() {
            self.make_bins();
        }
        if self.conf.preallocate {
            for bin in 0..self.bins.len() {
                self.grow_bin(env, bin, StreamId(0));
            }
        }
    }

    fn release(&mut self, addr: u64, size: u64, stream: StreamId) {
        let is_bin_block = self.tiling.get(addr).is_some_and(|c| c.tag == Piece::Bin);
        match self.bins.iter().position(|b| b.block == size) {
            Some(bin) if is_bin_block => {
                self.tiling.release(addr, Piece::Bin);
                self.bins[bin].lists.entry(stream).or_default().push_back(addr);
            }
            _ => {
                self.tiling.release(addr, Piece::Free(stream));
                self.pool.deallocate(&mut self.tiling, addr, stream);
            }
        }
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }
}

impl RmmBinning {
    /// The block of a completed free is the policy's again (see `books_glue!`).
    fn take_back(&mut self, _env: &mut Env<'_>, b: Live, _deferred: bool) {
        self.release(b.addr, b.size, b.stream);
    }
}

impl Allocator for RmmBinning {
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
        self.start(env);
        let rounded = rounded_request(size, ALIGN_256);
        let found = match self.bins.iter().position(|b| b.block >= rounded) {
            Some(bin) => self.bin_block(env, bin, stream).map(|addr| (addr, self.bins[bin].block)),
            None => self
                .pool
                .allocate(&mut self.books, &mut self.tiling, env, rounded, stream)
                .map(|a| (a, rounded)),
        };
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

    fn empty_cache(&mut self, _env: &mut Env<'_>) {}

    /// Bin settings take effect only before the first request (RMM fixes bins at construction).
    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        let mut c = self.conf;
        let mut pool = self.pool.conf;
        for (key, value) in parse_conf(NAME, conf)? {
            if pool.apply(NAME, &key, &value)? {
                continue;
            }
            match key.as_str() {
                "min_exp" => c.min_exp = parse_bytes(NAME, &key, &value)?.min(64) as u32,
                "max_exp" => c.max_exp = parse_bytes(NAME, &key, &value)?.min(64) as u32,
                "blocks_to_preallocate" => {
                    c.blocks_to_preallocate = parse_bytes(NAME, &key, &value)?
                }
                "preallocate" => c.preallocate = parse_bool(NAME, &key, &value)?,
                _ => return Err(unknown_key(NAME, &key, KEYS)),
            }
        }
        if !(8 <= c.min_exp && c.min_exp <= c.max_exp && c.max_exp <= 40) {
            return Err(ConfigError(format!("policy {NAME}: need 8 <= min_exp <= max_exp <= 40")));
        }
        if !(1..=1 << 20).contains(&c.blocks_to_preallocate) {
            return Err(ConfigError(format!(
                "policy {NAME}: blocks_to_preallocate must be in 1..=2^20"
            )));
        }
        self.conf = c;
        self.pool.conf = pool;
        if !self.started {
            self.make_bins();
        }
        Ok(())
    }

    fn snapshot(&self) -> Vec<SnapshotSegment> {
        self.tiling.snapshot(&self.books)
    }

    fn free_space(&self) -> FreeSpace {
        let mut space = self.pool.free_space();
        for bin in &self.bins {
            let n: u64 = bin.lists.values().map(|l| l.len() as u64).sum();
            space.cached_bytes += n * bin.block;
            if n > 0 {
                space.largest_free_block_bytes = space.largest_free_block_bytes.max(bin.block);
            }
        }
        space
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Rig;
    use allocsim_core::{GIB, MIB};

    #[test]
    fn bins_preallocate_and_round_to_their_block() {
        let mut rig = Rig::new("rmm_binning", None, 4 * GIB);
        let a = rig.malloc(1, 1000, 0).unwrap();
        assert_eq!(a.size, 256 << 10, "smallest bin");
        // 128 blocks of each of 256 KiB .. 4 MiB, from a pool that grows by max(size, pool).
        let bins: u64 = (18..=22).map(|e| 128u64 << e).sum();
        let s = rig.policy.stats();
        assert!(s.reserved_bytes.all.current as u64 >= bins, "{s:?}");
        let b = rig.malloc(2, 3 * MIB, 0).unwrap();
        assert_eq!(b.size, 4 * MIB);
        let c = rig.malloc(3, 5 * MIB, 0).unwrap();
        assert_eq!(c.size, 5 * MIB, "past the bins: the pool, 256 B aligned");
    }

    #[test]
    fn fifo_reuse_and_growth() {
        let mut rig =
            Rig::new("rmm_binning", Some("blocks_to_preallocate:2,preallocate:false"), GIB);
        let a = rig.malloc(1, 300 << 10, 0).unwrap();
        assert_eq!(a.size, 512 << 10);
        let b = rig.malloc(2, 300 << 10, 0).unwrap();
        assert_eq!(b.addr, a.addr + (512 << 10));
        let before = rig.reserved();
        let c = rig.malloc(3, 300 << 10, 0).unwrap();
        assert!(rig.reserved() > before, "third block grows the bin");
        rig.free(1);
        rig.free(3);
        let d = rig.malloc(4, 300 << 10, 0).unwrap();
        assert_eq!(d.addr, c.addr + (512 << 10), "FIFO: c's sibling, then a, then c");
    }

    #[test]
    fn oom_when_pool_cannot_grow() {
        let mut rig = Rig::new("rmm_binning", Some("preallocate:false"), 64 * MIB);
        rig.malloc(1, 60 * MIB, 0).unwrap();
        assert!(rig.malloc(2, 8 * MIB, 0).is_err());
        assert_eq!(rig.policy.stats().num_ooms, 1);
    }
}
