//! TensorFlow/XLA's BFC allocator ("best-fit with coalescing", `xla/tsl/framework/
//! bfc_allocator.cc`), classic non-partitioned mode.
//!
//! - Requests round up to 256 B (`RoundedBytes`); chunks tile regions (device segments).
//! - Free chunks live in 21 bins of `256 << i` bytes, each ordered by (size, address); a search
//!   starts at the request's bin and takes the first chunk that fits. Since bins partition
//!   sizes in increasing order, that is the smallest fitting chunk, ties to the lowest address,
//!   which is what one (size, address) ordered set gives; that is how it is kept here.
//! - A found chunk is split (`ShouldSplitChunk`) iff `chunk >= 2 * rounded` or
//!   `chunk - rounded >= max_internal_fragmentation` (128 MiB by default, else
//!   `fragmentation_fraction * memory_limit`); otherwise the whole chunk is handed out.
//! - Frees coalesce at once with both free neighbours (`TryToCoalesce`).
//! - Growth (`Extend`): with `allow_growth` the first region is `min(limit, 2 MiB)`; a request
//!   bigger than the current region size doubles it until it fits; the region is
//!   `min(curr, limit - reserved)`; on a device refusal it backs off by 0.9 (rounded to 256 B,
//!   strictly decreasing) until it would not fit the request. An extension that did not need to
//!   grow doubles the next region size. Without `allow_growth` the first region is the whole
//!   `memory_limit`.
//! - Before giving up, regions that are wholly free go back to the device
//!   (`DeallocateFreeRegions`, when `garbage_collection` is on and it can help) and `Extend` is
//!   tried once more; then OOM.
//! - `memory_limit` is the device's free memory at the first request (TF computes it at start),
//!   or the `memory_limit` setting, capped by the memory fraction.
//!
//! Not modelled: timestamped (stream-safe) chunk merging, the retry-for-10-seconds wrapper,
//! alignment beyond 256 B, and region extension in place (the CUDA sub-allocator does not
//! coalesce regions). There is no `empty_cache` in TF; here it releases wholly free regions,
//! as the garbage collection does.
//!
//! Settings (`key:value,...`):
//! - `allow_growth` (bool, default `true`; TF's own default is `false`),
//! - `memory_limit` (bytes, default: device free memory at the first request),
//! - `garbage_collection` (bool, default `true`, as GPU TF),
//! - `fragmentation_fraction` (float in [0, 1], default 0 = use 128 MiB).

use crate::kit::{round_up, Kit, Live, Room, Rules, Setting, Tiling, ALIGN_256};
use crate::settings;
use allocsim_core::{StreamId, MIB};
use std::collections::BTreeSet;

/// `kMaxInternalFragmentation` when no fraction is set.
const DEFAULT_MAX_INTERNAL_FRAGMENTATION_BYTES: u64 = 128 * MIB;
const BACKPEDAL_FACTOR: f64 = 0.9;

pub type Bfc = Kit<BfcRules>;

#[derive(Debug, Clone)]
pub struct BfcRules {
    allow_growth: bool,
    memory_limit: Option<u64>,
    garbage_collection: bool,
    fragmentation_fraction: f64,
    /// Free chunks by (size, address): the 21 bins in one ordered set.
    free: BTreeSet<(u64, u64)>,
    /// `memory_limit_`, fixed at the first request.
    limit: Option<u64>,
    /// `curr_region_allocation_bytes_`.
    curr_region_bytes: u64,
    /// The region being reserved did not need to grow: the next one doubles.
    double_next: bool,
}

impl Default for BfcRules {
    fn default() -> Self {
        BfcRules {
            allow_growth: true,
            memory_limit: None,
            garbage_collection: true,
            fragmentation_fraction: 0.0,
            free: BTreeSet::new(),
            limit: None,
            curr_region_bytes: 0,
            double_next: false,
        }
    }
}

impl BfcRules {
    /// TF's `GetFragmentation()`: `(free - largest free chunk) / free`, 0 when nothing is free.
    pub fn fragmentation(&self) -> f64 {
        let free: u64 = self.free.iter().map(|&(s, _)| s).sum();
        let largest = self.free.last().map_or(0, |&(s, _)| s);
        if free == 0 {
            0.0
        } else {
            (free - largest) as f64 / free as f64
        }
    }

    /// The limit in force now: the one fixed at the first request, capped by the fraction.
    fn memory_limit(&mut self, room: &Room<'_>) -> u64 {
        let limit = *self.limit.get_or_insert_with(|| {
            let limit = self.memory_limit.unwrap_or_else(|| room.device_free());
            self.curr_region_bytes = if self.allow_growth {
                round_up(limit.min(2 * MIB), ALIGN_256)
            } else {
                round_up(limit, ALIGN_256)
            };
            limit
        });
        limit.min(room.allowed.unwrap_or(u64::MAX))
    }

    fn max_internal_fragmentation(&self) -> u64 {
        match self.limit {
            Some(limit) if self.fragmentation_fraction > 0.0 => {
                (self.fragmentation_fraction * limit as f64) as u64
            }
            _ => DEFAULT_MAX_INTERNAL_FRAGMENTATION_BYTES,
        }
    }
}

impl Rules for BfcRules {
    const NAME: &'static str = "bfc";
    const SETTINGS: &'static [Setting<Self>] = &settings![
        /// start with a 2 MiB region and grow (true), or reserve the whole limit (false)
        allow_growth: Bool,
        /// bytes the allocator may reserve (default: free memory at the first request)
        memory_limit: Bytes => |rules, v| rules.memory_limit = Some(v),
        /// give wholly free regions back before an OOM
        garbage_collection: Bool,
        /// split a chunk when the rest is at least this fraction of the limit (0: 128 MiB)
        fragmentation_fraction: Number,
    ];
    type Tag = ();

    fn block_size(&self, size: u64) -> u64 {
        crate::kit::rounded_request(size, ALIGN_256)
    }

    /// `Extend`: a region able to hold the block, or none when the limit leaves no room.
    fn segment_size(&mut self, _: &Tiling<()>, block: u64, room: &Room<'_>) -> Option<u64> {
        let limit = self.memory_limit(room);
        let available = limit.saturating_sub(room.reserved) / ALIGN_256 * ALIGN_256;
        if block > available {
            return None;
        }
        self.double_next = true;
        while block > self.curr_region_bytes {
            self.curr_region_bytes = self.curr_region_bytes.saturating_mul(2).max(ALIGN_256);
            self.double_next = false;
        }
        Some(self.curr_region_bytes.min(available))
    }

    /// Back off by 0.9 (rounded to 256 B, strictly smaller) while the request still fits.
    fn smaller_segment(&mut self, block: u64, refused: u64) -> Option<u64> {
        let smaller = round_up((refused as f64 * BACKPEDAL_FACTOR) as u64, ALIGN_256);
        let smaller = if smaller < refused { smaller } else { refused - ALIGN_256 };
        (smaller >= block).then_some(smaller)
    }

    /// `FindChunkPtr`: best fit; split per `ShouldSplitChunk`, else the whole chunk.
    fn take(&mut self, tiling: &mut Tiling<()>, block: u64, _: StreamId) -> Option<u64> {
        let &(chunk, addr) = self.free.range((block, 0)..).next()?;
        self.free.remove(&(chunk, addr));
        if chunk >= block.saturating_mul(2) || chunk - block >= self.max_internal_fragmentation() {
            if let Some(rest) = tiling.split(addr, block, ()) {
                self.free.insert((chunk - block, rest));
            }
        }
        Some(addr)
    }

    fn added(&mut self, tiling: &mut Tiling<()>, base: u64) {
        if self.double_next {
            self.curr_region_bytes = self.curr_region_bytes.saturating_mul(2);
        }
        if let Some(seg) = tiling.seg(base) {
            self.free.insert((seg.size, base));
        }
    }

    /// `MarkFree` + `TryToCoalesce` + `InsertFreeChunk`.
    fn give_back(&mut self, tiling: &mut Tiling<()>, block: &Live, _: bool) {
        tiling.release(block.addr, ());
        let at = tiling.coalesce(
            block.addr,
            |_| true,
            |_, a, c| {
                self.free.remove(&(c.size, a));
            },
        );
        if let Some(c) = tiling.get(at) {
            self.free.insert((c.size, at));
        }
    }

    fn removing(&mut self, tiling: &mut Tiling<()>, base: u64) {
        if let Some(seg) = tiling.seg(base) {
            self.free.remove(&(seg.size, base));
        }
    }

    fn check(&mut self, _: &Self, _: bool) -> Result<(), String> {
        let f = self.fragmentation_fraction;
        (0.0..=1.0)
            .contains(&f)
            .then_some(())
            .ok_or(format!("fragmentation_fraction {f} not in [0, 1]"))
    }

    /// `DeallocateFreeRegions`: only when on, and when it can make room for the block.
    fn may_release(&mut self, block: u64, free: u64, room: &Room<'_>) -> bool {
        let limit = self.memory_limit(room);
        self.garbage_collection && block <= limit.saturating_sub(room.reserved) + free
    }
}
