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

use super::common::{
    books_glue, parse_bytes, parse_conf, rounded_request, unknown_key, Books, Live, ALIGN_256,
};
use super::tiling::Tiling;
use allocsim_core::{
    AllocId, Allocator, ConfigError, Env, FreeSpace, Granted, OomInfo, SnapshotSegment, StreamId,
    MIB,
};
use std::collections::{BTreeMap, BTreeSet};

const NAME: &str = "rmm_arena";
const KEYS: &[&str] = &["arena_size"];
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

#[derive(Debug, Default)]
pub struct RmmArena {
    books: Books,
    tiling: Tiling<()>,
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

impl RmmArena {
    pub fn from_conf(conf: &str) -> Result<Self, ConfigError> {
        let mut me = RmmArena::default();
        me.set_settings(conf)?;
        Ok(me)
    }

    /// The global arena's upstream block, reserved at the first request.
    fn start(&mut self, env: &mut Env<'_>, stream: StreamId) -> bool {
        if self.upstream.is_some() {
            return true;
        }
        let wanted = self.arena_size.unwrap_or_else(|| env.device.mem_info().free_bytes / 2);
        let size = wanted.min(self.books.headroom()) / ALIGN_256 * ALIGN_256;
        if size < SUPERBLOCK_MIN_BYTES {
            return false;
        }
        let Some(addr) = self.books.device_malloc(env, size, stream) else { return false };
        self.upstream = Some((addr, size, stream));
        self.tiling.add_segment(addr, size, stream, ());
        self.sbs.insert(addr, Superblock::whole(addr, size, Owner::Global));
        self.global.insert(addr);
        true
    }

    /// `superblock::first_fit`: the first free block that fits, cut to `size`.
    fn sb_first_fit(&mut self, base: u64, size: u64) -> Option<u64> {
        let sb = self.sbs.get_mut(&base)?;
        let (&addr, &free) = sb.free.iter().find(|(_, &s)| s >= size)?;
        sb.free.remove(&addr);
        if free > size {
            sb.free.insert(addr + size, free - size);
            self.tiling.split(addr, size, ());
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
    fn sb_coalesce(&mut self, base: u64, addr: u64, size: u64) {
        let Some(sb) = self.sbs.get_mut(&base) else { return };
        let (mut at, mut len) = (addr, size);
        if let Some((&n, &ns)) =
            sb.free.range(addr + size..).next().filter(|(&n, _)| n == addr + size)
        {
            sb.free.remove(&n);
            self.tiling.merge_next(at);
            len += ns;
        }
        if let Some((&p, &ps)) =
            sb.free.range(..addr).next_back().filter(|(&p, &ps)| p + ps == addr)
        {
            sb.free.remove(&p);
            self.tiling.merge_next(p);
            at = p;
            len += ps;
        }
        sb.free.insert(at, len);
        sb.refresh();
        self.sync_open(base);
    }

    /// `global_arena::first_fit`: take a superblock that fits `size` out of the global set,
    /// splitting an empty one that is big enough.
    fn global_first_fit(&mut self, size: u64) -> Option<u64> {
        let base =
            *self.global.iter().find(|b| self.sbs.get(b).is_some_and(|sb| sb.max_free >= size))?;
        self.global.remove(&base);
        let min_size = SUPERBLOCK_MIN_BYTES.max(size);
        let sb = self.sbs.get(&base)?;
        if sb.is_empty(base) && sb.size >= min_size + SUPERBLOCK_MIN_BYTES {
            let tail = base + min_size;
            let tail_size = sb.size - min_size;
            self.tiling.split(base, min_size, ());
            self.sbs.insert(base, Superblock::whole(base, min_size, Owner::Global));
            self.sbs.insert(tail, Superblock::whole(tail, tail_size, Owner::Global));
            self.global.insert(tail);
        }
        Some(base)
    }

    /// `global_arena::coalesce`: superblock `base` joins the global set, merging with empty
    /// contiguous neighbours when it is empty.
    fn global_release(&mut self, base: u64) {
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
                self.tiling.merge_next(base);
                size += next_size;
            }
        }
        if let Some(&prev) = self.global.range(..base).next_back() {
            if let Some(prev_size) = empty_at(&self.sbs, prev).filter(|&ps| prev + ps == base) {
                self.sbs.remove(&base);
                self.global.remove(&prev);
                self.tiling.merge_next(prev);
                at = prev;
                size += prev_size;
            }
        }
        self.sbs.insert(at, Superblock::whole(at, size, Owner::Global));
        self.global.insert(at);
    }

    /// `arena::allocate` for `stream`, or the global arena for large requests.
    fn allocate(&mut self, stream: StreamId, size: u64) -> Option<u64> {
        if size > SUPERBLOCK_MAX_BYTES {
            return None;
        }
        if size > SUPERBLOCK_MIN_BYTES {
            let base = self.global_first_fit(size)?;
            let addr = self.sb_first_fit(base, size);
            self.global.insert(base);
            return addr;
        }
        let open = self.open.get(&stream).into_iter().flatten().copied();
        let found =
            open.into_iter().find(|b| self.sbs.get(b).is_some_and(|sb| sb.max_free >= size));
        if let Some(base) = found {
            return self.sb_first_fit(base, size);
        }
        let base = self.global_first_fit(size)?;
        if let Some(sb) = self.sbs.get_mut(&base) {
            sb.owner = Owner::Stream(stream);
        }
        self.arenas.entry(stream).or_default().insert(base);
        self.sync_open(base);
        self.sb_first_fit(base, size)
    }

    /// [`RmmArena::allocate`], skipping its first-fit walks over superblocks when no free
    /// block anywhere is big enough (the tiling knows its largest in O(log n)): a run of
    /// failing requests then costs no walk each.
    fn allocate_if_room(&mut self, stream: StreamId, size: u64) -> Option<u64> {
        (size <= self.tiling.largest_free_chunk()).then(|| self.allocate(stream, size)).flatten()
    }

    /// Free the block `[addr, addr+size)` in whichever superblock holds it.
    fn deallocate(&mut self, addr: u64, size: u64) {
        let Some((&base, sb)) = self.sbs.range(..=addr).next_back() else { return };
        let owner = sb.owner;
        self.tiling.release(addr, ());
        self.sb_coalesce(base, addr, size);
        if owner == Owner::Global && self.sbs.get(&base).is_some_and(|sb| sb.is_empty(base)) {
            self.global.remove(&base);
            self.global_release(base);
        }
    }

    /// `defragment`: every arena's superblocks back to the global arena (`clean`).
    fn defragment(&mut self) {
        self.books.stats.num_sync_all_streams += 1;
        self.open.clear();
        for (_, arena) in std::mem::take(&mut self.arenas) {
            for base in arena {
                self.global_release(base);
            }
        }
    }

    fn sync(&mut self) {
        self.books.sync_inactive_split(self.tiling.inactive_split());
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

impl RmmArena {
    /// The block of a completed free is the policy's again (see `books_glue!`).
    fn take_back(&mut self, _env: &mut Env<'_>, b: Live, _deferred: bool) {
        self.deallocate(b.addr, b.size);
        self.sync();
    }
}

impl Allocator for RmmArena {
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
        let mut found = None;
        if self.start(env, stream) {
            found = self.allocate_if_room(stream, rounded);
            if found.is_none() {
                self.defragment();
                found = self.allocate_if_room(stream, rounded);
            }
        }
        let result = match found {
            Some(addr) => {
                self.tiling.take(addr, id);
                Ok(self.books.grant(env, id, (addr, rounded), size, stream))
            }
            None => Err(self.books.oom(env, id, rounded, stream, self.tiling.largest_free())),
        };
        self.sync();
        result
    }

    books_glue!();

    fn empty_cache(&mut self, _env: &mut Env<'_>) {
        self.defragment();
        self.sync();
    }

    /// `arena_size` takes effect only before the first request.
    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        let mut arena_size = self.arena_size;
        for (key, value) in parse_conf(NAME, conf)? {
            match key.as_str() {
                "arena_size" => arena_size = Some(parse_bytes(NAME, &key, &value)?),
                _ => return Err(unknown_key(NAME, &key, KEYS)),
            }
        }
        if arena_size.is_some_and(|s| s < SUPERBLOCK_MIN_BYTES) {
            return Err(ConfigError(format!(
                "policy {NAME}: arena_size below the 1 MiB superblock"
            )));
        }
        self.arena_size = arena_size;
        Ok(())
    }

    fn snapshot(&self) -> Vec<SnapshotSegment> {
        self.tiling.snapshot(&self.books)
    }

    fn free_space(&self) -> FreeSpace {
        let mut space = FreeSpace::default();
        for &size in self.sbs.values().flat_map(|sb| sb.free.values()) {
            space.cached_bytes += size;
            space.largest_free_block_bytes = space.largest_free_block_bytes.max(size);
        }
        space
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Rig;
    use allocsim_core::{GIB, MIB};

    #[test]
    fn small_blocks_share_a_stream_superblock_first_fit() {
        let mut rig = Rig::new("rmm_arena", None, 2 * GIB);
        let a = rig.malloc(1, 1000, 0).unwrap();
        assert_eq!(rig.reserved(), GIB, "half the free memory, up front");
        let b = rig.malloc(2, 1000, 0).unwrap();
        assert_eq!(b.addr, a.addr + 1024);
        rig.free(1);
        let c = rig.malloc(3, 512, 0).unwrap();
        assert_eq!(c.addr, a.addr, "address-ordered first fit");
        let d = rig.malloc(4, 1000, 7).unwrap();
        assert_eq!(d.addr, a.addr + MIB, "stream 7 gets its own superblock");
    }

    #[test]
    fn large_blocks_go_to_the_global_arena_and_coalesce() {
        let mut rig = Rig::new("rmm_arena", Some("arena_size:64MiB"), GIB);
        let a = rig.malloc(1, 10 * MIB, 0).unwrap();
        let b = rig.malloc(2, 10 * MIB, 0).unwrap();
        assert_eq!(b.addr, a.addr + 10 * MIB);
        rig.free(1);
        rig.free(2);
        // Both superblocks are empty again and merged with the tail: 60 MiB fit.
        rig.malloc(3, 60 * MIB, 0).unwrap();
    }

    #[test]
    fn defragment_on_failure_then_oom() {
        let mut rig = Rig::new("rmm_arena", Some("arena_size:4MiB"), GIB);
        for (id, stream) in [(1, 0), (2, 7), (3, 13)] {
            rig.malloc(id, 1000, stream).unwrap();
        }
        for id in 1..=3 {
            rig.free(id);
        }
        // Three 1 MiB superblocks sit empty in stream arenas: 2 MiB needs them back.
        rig.malloc(4, 2 * MIB, 0).unwrap();
        assert_eq!(rig.policy.stats().num_sync_all_streams, 1);
        assert!(rig.malloc(5, 3 * MIB, 0).is_err());
    }

    #[test]
    fn oom_when_the_device_refuses_the_arena() {
        let mut rig = Rig::new("rmm_arena", Some("arena_size:2GiB"), GIB);
        assert!(rig.malloc(1, 1, 0).is_err());
        assert_eq!(rig.reserved(), 0);
    }
}
