//! RAPIDS RMM's `arena_memory_resource` (`rmm/mr/device/arena_memory_resource.hpp`,
//! `detail/arena.hpp`).
//!
//! - One upstream allocation, the global arena, of `arena_size` bytes (RMM's default: half the
//!   device's free memory), reserved at the first request here (RMM: in the constructor). It
//!   never grows and is never returned.
//! - The global arena is an address-ordered set of superblocks (min 1 MiB). Per-stream arenas
//!   take superblocks from it: `acquire` is address-ordered first fit over superblocks that have
//!   a free block big enough; an empty superblock at least `max(1 MiB, size) + 1 MiB` is split
//!   and its tail stays global.
//! - Inside a superblock, blocks are address-ordered first fit with coalescing of contiguous
//!   free neighbours. Sizes round up to 256 B (RMM without `RMM_ARENA_USE_SIZE_CLASSES`).
//! - Requests over 1 MiB go straight to the global arena (`global_arena::handles`): first fit
//!   over its superblocks, the block cut from the superblock found; freeing such a block
//!   coalesces it, and an empty global superblock merges with empty contiguous neighbours.
//! - Stream arenas keep their superblocks, even empty ones, until a request fails: then
//!   `defragment` (a device synchronize, counted in `num_sync_all_streams`) returns every
//!   superblock of every arena to the global arena (`clean`), and the request is tried once
//!   more before OOM. `empty_cache` runs the same `defragment`; no memory goes to the device.
//!
//! Settings (`key:value,...`):
//! - `arena_size` (bytes, default: half of the device's free memory at the first request),
//!   capped by the memory fraction, at least 1 MiB.

use crate::kit::{rounded_request, Apply, Cx, Kit, Live, Rules, Setting, Tiling, ALIGN_256};
use allocsim_core::{StreamId, MIB};
use std::collections::{BTreeMap, BTreeSet};

/// `superblock::minimum_size`.
const SUPERBLOCK_MIN_BYTES: u64 = MIB;
/// `superblock::maximum_size`.
const SUPERBLOCK_MAX_BYTES: u64 = 1 << 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Global,
    Stream(StreamId),
}

#[derive(Debug, Clone)]
struct Superblock {
    size: u64,
    owner: Owner,
    /// Free blocks, address-ordered: address -> size.
    free: BTreeMap<u64, u64>,
    max_free: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Arena {
    sbs: BTreeMap<u64, Superblock>,
    global: BTreeSet<u64>,
    arenas: BTreeMap<StreamId, BTreeSet<u64>>,
    /// The superblocks of each stream arena with a free block (all sizes are multiples of
    /// 256 B, so only these can serve a request): first fit walks these, not the full ones.
    open: BTreeMap<StreamId, BTreeSet<u64>>,
    /// The upstream block: (address, size, stream).
    upstream: Option<(u64, u64, StreamId)>,
    arena_size: Option<u64>,
}

/// RMM's `arena_memory_resource`.
pub type RmmArena = Kit<Arena>;

impl Arena {
    /// The global arena's upstream block, reserved at the first request.
    fn start(&mut self, cx: &mut Cx<'_, '_, ()>, stream: StreamId) -> bool {
        if self.upstream.is_some() {
            return true;
        }
        let room = cx.room();
        let wanted = self.arena_size.unwrap_or_else(|| room.device_free() / 2);
        let size = wanted.min(room.headroom()) / ALIGN_256 * ALIGN_256;
        if size < SUPERBLOCK_MIN_BYTES {
            return false;
        }
        let Some(addr) = cx.reserve(size, stream, ()) else { return false };
        self.upstream = Some((addr, size, stream));
        self.sbs.insert(addr, Superblock::whole(addr, size, Owner::Global));
        self.global.insert(addr);
        true
    }

    /// `superblock::first_fit`: the first free block that fits, cut to `size`.
    fn sb_first_fit(&mut self, tiling: &mut Tiling<()>, base: u64, size: u64) -> Option<u64> {
        let sb = self.sbs.get_mut(&base)?;
        let (&addr, &free) = sb.free.iter().find(|(_, &s)| s >= size)?;
        sb.free.remove(&addr);
        if free > size {
            sb.free.insert(addr + size, free - size);
            tiling.split(addr, size, ());
        }
        sb.refresh();
        self.sync_open(base);
        Some(addr)
    }

    /// Keep superblock `base` in its stream's `open` set exactly while it has a free block.
    fn sync_open(&mut self, base: u64) {
        let Some(sb) = self.sbs.get(&base) else { return };
        if let Owner::Stream(stream) = sb.owner {
            let open = self.open.entry(stream).or_default();
            if sb.max_free > 0 {
                open.insert(base);
            } else {
                open.remove(&base);
            }
        }
    }

    /// `superblock::coalesce`: the block at `addr` is free again inside superblock `base`.
    fn sb_coalesce(&mut self, tiling: &mut Tiling<()>, base: u64, addr: u64, size: u64) {
        let Some(sb) = self.sbs.get_mut(&base) else { return };
        let (mut at, mut len) = (addr, size);
        if let Some((&n, &ns)) =
            sb.free.range(addr + size..).next().filter(|(&n, _)| n == addr + size)
        {
            sb.free.remove(&n);
            tiling.merge_next(at);
            len += ns;
        }
        if let Some((&p, &ps)) =
            sb.free.range(..addr).next_back().filter(|(&p, &ps)| p + ps == addr)
        {
            sb.free.remove(&p);
            tiling.merge_next(p);
            at = p;
            len += ps;
        }
        sb.free.insert(at, len);
        sb.refresh();
        self.sync_open(base);
    }

    /// `global_arena::first_fit`: take a superblock that fits `size` out of the global set,
    /// splitting an empty one that is big enough.
    fn global_first_fit(&mut self, tiling: &mut Tiling<()>, size: u64) -> Option<u64> {
        let base =
            *self.global.iter().find(|b| self.sbs.get(b).is_some_and(|sb| sb.max_free >= size))?;
        self.global.remove(&base);
        let min_size = SUPERBLOCK_MIN_BYTES.max(size);
        let sb = self.sbs.get(&base)?;
        if sb.is_empty(base) && sb.size >= min_size + SUPERBLOCK_MIN_BYTES {
            let tail = base + min_size;
            let tail_size = sb.size - min_size;
            tiling.split(base, min_size, ());
            self.sbs.insert(base, Superblock::whole(base, min_size, Owner::Global));
            self.sbs.insert(tail, Superblock::whole(tail, tail_size, Owner::Global));
            self.global.insert(tail);
        }
        Some(base)
    }

    /// `global_arena::coalesce`: superblock `base` joins the global set, merging with empty
    /// contiguous neighbours when it is empty.
    fn global_release(&mut self, tiling: &mut Tiling<()>, base: u64) {
        let Some(sb) = self.sbs.get_mut(&base) else { return };
        sb.owner = Owner::Global;
        if !sb.is_empty(base) {
            self.global.insert(base);
            return;
        }
        let (mut at, mut size) = (base, sb.size);
        let empty_at = |sbs: &BTreeMap<u64, Superblock>, b: u64| {
            sbs.get(&b).filter(|s| s.is_empty(b)).map(|s| s.size)
        };
        if let Some(&next) = self.global.range(base + 1..).next() {
            if let Some(next_size) = empty_at(&self.sbs, next).filter(|_| next == base + size) {
                self.sbs.remove(&next);
                self.global.remove(&next);
                tiling.merge_next(base);
                size += next_size;
            }
        }
        if let Some(&prev) = self.global.range(..base).next_back() {
            if let Some(prev_size) = empty_at(&self.sbs, prev).filter(|&ps| prev + ps == base) {
                self.sbs.remove(&base);
                self.global.remove(&prev);
                tiling.merge_next(prev);
                at = prev;
                size += prev_size;
            }
        }
        self.sbs.insert(at, Superblock::whole(at, size, Owner::Global));
        self.global.insert(at);
    }

    /// `arena::allocate` for `stream`, or the global arena for large requests.
    fn allocate(&mut self, tiling: &mut Tiling<()>, stream: StreamId, size: u64) -> Option<u64> {
        if size > SUPERBLOCK_MAX_BYTES {
            return None;
        }
        if size > SUPERBLOCK_MIN_BYTES {
            let base = self.global_first_fit(tiling, size)?;
            let addr = self.sb_first_fit(tiling, base, size);
            self.global.insert(base);
            return addr;
        }
        let open = self.open.get(&stream).into_iter().flatten().copied();
        let found =
            open.into_iter().find(|b| self.sbs.get(b).is_some_and(|sb| sb.max_free >= size));
        if let Some(base) = found {
            return self.sb_first_fit(tiling, base, size);
        }
        let base = self.global_first_fit(tiling, size)?;
        if let Some(sb) = self.sbs.get_mut(&base) {
            sb.owner = Owner::Stream(stream);
        }
        self.arenas.entry(stream).or_default().insert(base);
        self.sync_open(base);
        self.sb_first_fit(tiling, base, size)
    }

    /// [`Arena::allocate`], skipping its first-fit walks over superblocks when no free
    /// block anywhere is big enough (the tiling knows its largest in O(log n)): a run of
    /// failing requests then costs no walk each.
    fn allocate_if_room(
        &mut self,
        tiling: &mut Tiling<()>,
        stream: StreamId,
        size: u64,
    ) -> Option<u64> {
        (size <= tiling.largest_free_chunk()).then(|| self.allocate(tiling, stream, size)).flatten()
    }

    /// Free the block `[addr, addr+size)` in whichever superblock holds it.
    fn deallocate(&mut self, tiling: &mut Tiling<()>, addr: u64, size: u64) {
        let Some((&base, sb)) = self.sbs.range(..=addr).next_back() else { return };
        let owner = sb.owner;
        tiling.release(addr, ());
        self.sb_coalesce(tiling, base, addr, size);
        if owner == Owner::Global && self.sbs.get(&base).is_some_and(|sb| sb.is_empty(base)) {
            self.global.remove(&base);
            self.global_release(tiling, base);
        }
    }

    /// `defragment`: every arena's superblocks back to the global arena (`clean`).
    fn defragment(&mut self, cx: &mut Cx<'_, '_, ()>) {
        cx.synced();
        self.open.clear();
        for (_, arena) in std::mem::take(&mut self.arenas) {
            for base in arena {
                self.global_release(cx.tiling, base);
            }
        }
    }
}

impl Superblock {
    fn whole(base: u64, size: u64, owner: Owner) -> Superblock {
        Superblock { size, owner, free: BTreeMap::from([(base, size)]), max_free: size }
    }

    fn is_empty(&self, base: u64) -> bool {
        self.free.len() == 1 && self.free.get(&base) == Some(&self.size)
    }

    fn refresh(&mut self) {
        self.max_free = self.free.values().copied().max().unwrap_or(0);
    }
}

impl Rules for Arena {
    const NAME: &'static str = "rmm_arena";
    const SETTINGS: &'static [Setting<Self>] = &[Setting {
        key: "arena_size",
        help:
            "bytes of the one upstream allocation (default: half the free memory), at least 1 MiB",
        apply: Apply::Bytes(|r, v| r.arena_size = Some(v)),
    }];
    type Tag = ();

    fn block_size(&self, size: u64) -> u64 {
        rounded_request(size, ALIGN_256)
    }

    fn find(&mut self, cx: &mut Cx<'_, '_, ()>, block: u64, stream: StreamId) -> Option<u64> {
        if !self.start(cx, stream) {
            return None;
        }
        self.allocate_if_room(cx.tiling, stream, block).or_else(|| {
            self.defragment(cx);
            self.allocate_if_room(cx.tiling, stream, block)
        })
    }

    fn give_back(&mut self, tiling: &mut Tiling<()>, block: &Live, _: bool) {
        self.deallocate(tiling, block.addr, block.size);
    }

    /// `defragment`; no memory goes to the device.
    fn empty_cache(&mut self, cx: &mut Cx<'_, '_, ()>) {
        self.defragment(cx);
    }

    /// `arena_size` takes effect only before the first request.
    fn check(&mut self, _: &Self, _: bool) -> Result<(), String> {
        match self.arena_size {
            Some(s) if s < SUPERBLOCK_MIN_BYTES => {
                Err("arena_size below the 1 MiB superblock".into())
            }
            _ => Ok(()),
        }
    }
}
