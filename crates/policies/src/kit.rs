//! The policy kit: a new policy states its decisions, the kit does the bookkeeping.
//!
//! Most of an allocator is the same whatever its policy: rounding a request, asking the device
//! for a segment, giving segments back, the events and `memory_stats()` counters under
//! PyTorch's names, deferred frees of blocks used on other streams, the memory fraction, the
//! OOM explanation, the snapshot. [`Kit`] does all of that over a [`Tiling`] (every segment
//! cut into chunks, each a live block or free) and [`Books`] (live allocations and
//! statistics). A policy is a [`Rules`] value: where a block goes, what a segment is, whether
//! freed chunks merge and when segments go back. The checker, the property tests and `allocsim
//! compare` take any policy registered in [`crate::POLICIES`].
//!
//! A policy with its own index over the free chunks (free lists by order: `buddy`) overrides
//! the hooks that keep it in step; [`FreeIndex`] and [`FreeLists`] are two such indexes ready
//! made. A block that gets a segment of its own ([`Rules::dedicated`]) is the kit's alone. A policy whose search talks to the device on its own terms
//! (RMM's pool expands and halves, binning carves pool blocks into bins, a stream-ordered pool
//! synchronizes and trims before it gives up) overrides [`Rules::find`], which gets a [`Cx`]:
//! the tiling and the device calls, counted by the books.

pub use crate::zoo::common::{round_up, rounded_request, Books, Live, ALIGN_256, PAGE_2MIB};
pub use crate::zoo::tiling::{Chunk, Seg, Tiling};

use crate::zoo::common::parse_conf;
use allocsim_core::text::quoted;
use allocsim_core::{
    AllocId, Allocator, ConfigError, Device, Env, FreeSpace, Granted, MemoryStats, OomInfo, Pool,
    SnapshotSegment, StreamId,
};

/// One setting of a policy: its key in `key:value,...` strings, what it means, and how a value
/// applies.
#[derive(Debug)]
pub struct Setting<R> {
    pub key: &'static str,
    pub help: &'static str,
    pub apply: Apply<R>,
}

/// How a setting's value applies to the rules: parsed by the kit as a byte count, a bool or a
/// number, or by the policy itself (an error says what is wrong with the value; the kit names
/// the policy and the key).
#[derive(Debug)]
pub enum Apply<R> {
    /// Digits with an optional binary suffix (`k`, `MiB`, `g`, ...), or `max`.
    Bytes(fn(&mut R, u64)),
    /// `true`/`false`, `1`/`0`, `yes`/`no`.
    Bool(fn(&mut R, bool)),
    /// A finite number.
    Number(fn(&mut R, f64)),
    /// Any text, the policy's to read.
    Text(fn(&mut R, &str) -> Result<(), String>),
}

impl<R> Apply<R> {
    fn to(&self, rules: &mut R, value: &str) -> Result<(), String> {
        use crate::zoo::common::parse_value as common;
        match self {
            Apply::Bytes(set) => set(rules, bytes_value(value)?),
            Apply::Bool(set) => set(
                rules,
                common(value, "true or false", |v| match v {
                    "true" | "1" | "yes" => Some(true),
                    "false" | "0" | "no" => Some(false),
                    _ => None,
                })?,
            ),
            Apply::Number(set) => set(
                rules,
                common(value, "a number", |v| v.parse::<f64>().ok().filter(|f| f.is_finite()))?,
            ),
            Apply::Text(set) => set(rules, value)?,
        }
        Ok(())
    }
}

/// A policy's settings, one line each: its help as a doc comment, then its key, how its value
/// applies ([`Apply`]'s variant) and, unless the value goes to the field of the key's name,
/// what it does. An array, for `&settings![...]`:
///
/// ```ignore
/// settings![
///     /// the smallest segment reserved, in bytes
///     min_segment: Bytes,
///     /// bytes the allocator may reserve (default: the device's free memory)
///     memory_limit: Bytes => |rules, v| rules.memory_limit = Some(v),
/// ]
/// ```
#[macro_export]
macro_rules! settings {
    ($($(#[doc = $help:literal])+ $key:ident: $kind:ident $(=> $apply:expr)?),* $(,)?) => {
        [$($crate::kit::Setting {
            key: stringify!($key),
            help: concat!($($help),+).trim_ascii_start(),
            apply: $crate::settings!(@apply $kind $key $($apply)?),
        }),*]
    };
    (@apply $kind:ident $key:ident) => {
        $crate::kit::Apply::$kind(|rules, v| rules.$key = v)
    };
    (@apply $kind:ident $key:ident $apply:expr) => {
        $crate::kit::Apply::$kind($apply)
    };
}

/// A setting's value as a byte count: digits with an optional binary suffix (`k`, `MiB`, `g`,
/// ...), or `max`.
pub fn bytes_value(value: &str) -> Result<u64, String> {
    crate::zoo::common::parse_bytes("", "", value).map_err(|_| "not a byte count".to_string())
}

/// What growth may use, when a policy sizes a segment or decides to give memory back.
pub struct Room<'a> {
    /// Bytes reserved now.
    pub reserved: u64,
    /// The memory fraction's cap on reserved bytes, if one is set.
    pub allowed: Option<u64>,
    device: &'a dyn Device,
}

impl std::fmt::Debug for Room<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Room")
            .field("reserved", &self.reserved)
            .field("allowed", &self.allowed)
            .finish()
    }
}

impl Room<'_> {
    /// The device's free memory now (`cudaMemGetInfo`: a device call, so only on demand).
    pub fn device_free(&self) -> u64 {
        self.device.mem_info().free_bytes
    }

    /// The device's total memory.
    pub fn device_total(&self) -> u64 {
        self.device.mem_info().total_bytes
    }

    /// Bytes that may still be reserved under the memory fraction (`u64::MAX` without one).
    pub fn headroom(&self) -> u64 {
        self.allowed.map_or(u64::MAX, |allowed| allowed.saturating_sub(self.reserved))
    }
}

/// What a policy's own search ([`Rules::find`], [`Rules::empty_cache`]) may do besides cutting
/// chunks: the device calls (segments, page maps, address reservations), each made through the
/// books, so that events and counters stay right whatever the search does.
#[derive(Debug)]
pub struct Cx<'a, 'e, T> {
    pub tiling: &'a mut Tiling<T>,
    books: &'a mut Books,
    env: &'a mut Env<'e>,
}

impl<T: Copy> Cx<'_, '_, T> {
    /// A new segment of `size` bytes for `stream` (`cudaMalloc`, within the memory fraction),
    /// in the tiling as one free chunk tagged `tag`: its base.
    pub fn reserve(&mut self, size: u64, stream: StreamId, tag: T) -> Option<u64> {
        let base = self.books.device_malloc(self.env, size, stream)?;
        self.tiling.add_segment(base, size, stream, tag);
        Some(base)
    }

    /// Map physical pages at `[addr, addr+size)` of an address reservation (`cuMemMap`, within
    /// the memory fraction), in the tiling as an expandable segment of `pool`, one free chunk
    /// tagged `tag`.
    pub fn map(&mut self, (addr, size): (u64, u64), stream: StreamId, pool: Pool, tag: T) -> bool {
        if !self.books.device_map(self.env, (addr, size), stream, pool) {
            return false;
        }
        self.tiling.add_segment_in(addr, size, stream, pool, true, tag);
        true
    }

    /// The free chunk at `addr` leaves the tiling (its segment splits around it) and its pages
    /// are unmapped (`cuMemUnmap`).
    pub fn unmap(&mut self, addr: u64) {
        let Some(seg) = self.tiling.seg_of(addr).and_then(|base| self.tiling.seg(base).copied())
        else {
            return;
        };
        if let Some(size) = self.tiling.cut_out(addr) {
            self.books.device_unmap(self.env, (addr, size), seg.stream, seg.pool);
        }
    }

    /// Reserve `size` bytes of address space aligned to `alignment` (`cuMemAddressReserve`).
    pub fn reserve_address(&mut self, size: u64, alignment: u64) -> Option<u64> {
        self.env.device.reserve_address(size, alignment).ok()
    }

    /// Give an address reservation back (`cuMemAddressFree`).
    pub fn release_address(&mut self, addr: u64, size: u64) {
        self.env.device.release_address(addr, size);
    }

    /// Give the wholly free segment at `base` back to the device (`cudaFree`).
    pub fn unreserve(&mut self, base: u64) -> Option<Seg> {
        let seg = self.tiling.remove_segment(base)?;
        self.books.device_free(self.env, base, seg.size, seg.stream);
        Some(seg)
    }

    /// Bytes reserved now.
    pub fn reserved(&self) -> u64 {
        self.books.reserved()
    }

    /// What growth may use now: reserved bytes, the memory fraction's cap, the device.
    pub fn room(&self) -> Room<'_> {
        Room {
            reserved: self.books.reserved(),
            allowed: self.books.allowed_bytes,
            device: &*self.env.device,
        }
    }

    /// Count a synchronization of every stream (`num_sync_all_streams`).
    pub fn synced(&mut self) {
        self.books.stats.num_sync_all_streams += 1;
    }

    /// Count a retry after cached memory went back (`num_alloc_retries`).
    pub fn retried(&mut self) {
        self.books.stats.num_alloc_retries += 1;
    }
}

/// What goes back to the device when a free leaves a segment wholly free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Nothing: the segment stays cached.
    Nothing,
    /// That segment.
    This,
    /// Every wholly free segment but the `n` lowest-addressed.
    KeepingFirst(usize),
}

/// The decisions of a policy built on the kit. Why this shape: across the zoo, what differs
/// between allocators is where a request lands, how big a new segment is, what a freed block
/// merges with and when memory goes back to the device; everything else is shared, and a
/// policy that states only these cannot get the statistics or the events wrong.
///
/// A simple policy answers [`Rules::place`] (which free chunk a block goes to) and takes the
/// defaults. A policy with its own index over the free chunks (free lists by size, orders)
/// overrides [`Rules::take`], [`Rules::give_back`], [`Rules::added`] and [`Rules::removing`]
/// instead, which hand it the tiling to keep in step with, and may tag chunks (`Tag`).
pub trait Rules: Default + Clone + std::fmt::Debug + 'static {
    /// The name `allocsim --policy` takes.
    const NAME: &'static str;
    /// The settings `key:value,...` strings may set.
    const SETTINGS: &'static [Setting<Self>];
    /// What the policy remembers per chunk (`()` for most).
    type Tag: Copy + Default + std::fmt::Debug;

    /// The block a request of `size` bytes gets: at least `size` (saturate: a request whose
    /// rounding overflows is refused).
    fn block_size(&self, size: u64) -> u64 {
        rounded_request(size, 512)
    }

    /// Whether a block of `block` bytes is refused outright, without asking the device.
    /// Default: no.
    fn refuses(&self, block: u64) -> bool {
        let _ = block;
        false
    }

    /// Whether a block of `block` bytes gets a segment of its own, the block rounded up to
    /// 2 MiB and handed out whole, that goes back to the device when the block is freed; the
    /// policy's other hooks never see it. Default: no.
    fn dedicated(&self, block: u64) -> bool {
        let _ = block;
        false
    }

    /// The segment to reserve when no free chunk takes a block of `block` bytes (at least
    /// `block`; the kit makes sure), or `None` to not grow.
    fn segment_size(
        &mut self,
        tiling: &Tiling<Self::Tag>,
        block: u64,
        room: &Room<'_>,
    ) -> Option<u64> {
        let _ = (tiling, room);
        Some(round_up(block, PAGE_2MIB))
    }

    /// A smaller segment to try when the device refused `refused` bytes for a block of `block`
    /// bytes. Default: none.
    fn smaller_segment(&mut self, block: u64, refused: u64) -> Option<u64> {
        let _ = (block, refused);
        None
    }

    /// The free chunk a block of `block` bytes for `stream` goes to, by its address; `None`
    /// reserves a new segment. The chunk must be free and at least `block` bytes (the kit
    /// checks, and reserves a segment instead of trusting a wrong answer). Default: none, for
    /// a policy that overrides [`Rules::take`].
    fn place(&self, tiling: &Tiling<Self::Tag>, block: u64, stream: StreamId) -> Option<u64> {
        let _ = (tiling, block, stream);
        None
    }

    /// Find a free chunk for a block of `block` bytes on `stream`, cut to `block` (or left
    /// whole), growing and giving cached memory back as the policy does: its address, or `None`
    /// for an OOM. Default: [`Rules::take`]; else a new segment ([`Rules::segment_size`],
    /// [`Rules::smaller_segment`]); else, if [`Rules::may_release`], every wholly free segment
    /// goes back and the growth is tried once more. A policy whose search reaches further
    /// overrides this alone.
    fn find(
        &mut self,
        cx: &mut Cx<'_, '_, Self::Tag>,
        block: u64,
        stream: StreamId,
    ) -> Option<u64> {
        find_or_grow(self, cx, block, stream)
    }

    /// Take a free chunk of at least `block` bytes for `stream` and cut it to `block` (or
    /// leave it whole: the block granted is the chunk): its address. Default:
    /// [`Rules::place`], then the cut.
    fn take(
        &mut self,
        tiling: &mut Tiling<Self::Tag>,
        block: u64,
        stream: StreamId,
    ) -> Option<u64> {
        let addr = self.place(tiling, block, stream)?;
        tiling.get(addr).filter(|c| c.is_free() && c.size >= block)?;
        tiling.split(addr, block, Self::Tag::default());
        Some(addr)
    }

    /// Take a block of `block` bytes from the segment just reserved for it at `base` (one free
    /// chunk, already [`Rules::added`], and the only one that takes the block). Default: as
    /// [`Rules::take`] takes it, or, for a policy that takes nothing, the segment's first
    /// `block` bytes.
    fn take_from(
        &mut self,
        tiling: &mut Tiling<Self::Tag>,
        base: u64,
        block: u64,
        stream: StreamId,
    ) -> Option<u64> {
        self.take(tiling, block, stream).or_else(|| {
            tiling.split(base, block, Self::Tag::default());
            Some(base)
        })
    }

    /// A new segment is in the tiling at `base`, one free chunk. Default: nothing to index.
    fn added(&mut self, tiling: &mut Tiling<Self::Tag>, base: u64) {
        let _ = (tiling, base);
    }

    /// The block of a completed free is free again: release it in the tiling and merge as the
    /// policy merges (`deferred`: the free waited for other streams' work). Default: merge with
    /// the free chunks beside it.
    fn give_back(&mut self, tiling: &mut Tiling<Self::Tag>, block: &Live, deferred: bool) {
        let _ = deferred;
        tiling.release(block.addr, Self::Tag::default());
        tiling.coalesce(block.addr, |_| true, |_, _, _| {});
    }

    /// The wholly free segment at `base` is about to go back to the device. Default: nothing
    /// to unindex.
    fn removing(&mut self, tiling: &mut Tiling<Self::Tag>, base: u64) {
        let _ = (tiling, base);
    }

    /// A reservation was refused and `free` bytes sit in wholly free segments: whether to give
    /// them back and try once more. Default: yes.
    fn may_release(&mut self, block: u64, free: u64, room: &Room<'_>) -> bool {
        let _ = (block, free, room);
        true
    }

    /// A free left the segment at `base` wholly free: what goes back to the device now.
    /// Default: nothing; it stays cached until `empty_cache`, or until a reservation is
    /// refused.
    fn on_segment_free(&mut self, tiling: &Tiling<Self::Tag>, base: u64) -> Release {
        let _ = (tiling, base);
        Release::Nothing
    }

    /// `empty_cache`: give back what the policy does not keep. Default: every wholly free
    /// segment.
    fn empty_cache(&mut self, cx: &mut Cx<'_, '_, Self::Tag>) {
        let free: Vec<u64> = cx.tiling.wholly_free_segments().collect();
        release(self, cx, &free);
    }

    /// After a settings string applied (`previous` is what was in force, `started` whether any
    /// segment was ever reserved): refuse combinations that make no sense, or put back what
    /// cannot change once memory is in use. On an error nothing changes.
    fn check(&mut self, previous: &Self, started: bool) -> Result<(), String> {
        let _ = (previous, started);
        Ok(())
    }
}

/// An [`Allocator`] made of [`Rules`] and the shared bookkeeping.
#[derive(Debug, Default)]
pub struct Kit<R: Rules> {
    pub rules: R,
    books: Books,
    tiling: Tiling<R::Tag>,
}

impl<R: Rules> Kit<R> {
    pub fn from_conf(conf: &str) -> Result<Self, ConfigError> {
        let mut kit = Kit::<R>::default();
        kit.set_settings(conf)?;
        Ok(kit)
    }

    /// The rules, and the context their hooks work in.
    fn parts<'a, 'e>(&'a mut self, env: &'a mut Env<'e>) -> (&'a mut R, Cx<'a, 'e, R::Tag>) {
        (&mut self.rules, Cx { tiling: &mut self.tiling, books: &mut self.books, env })
    }

    /// The block of a completed free is free memory again.
    fn take_back(&mut self, env: &mut Env<'_>, block: Live, deferred: bool) {
        let (rules, mut cx) = self.parts(env);
        let base = cx.tiling.seg_of(block.addr);
        if let Some(base) = base.filter(|&b| cx.tiling.seg(b).is_some_and(|s| s.dedicated)) {
            cx.tiling.release(block.addr, R::Tag::default());
            cx.unreserve(base);
        } else {
            rules.give_back(cx.tiling, &block, deferred);
        }
        if let Some(base) = base.filter(|&b| cx.tiling.seg(b).is_some_and(Seg::is_wholly_free)) {
            match rules.on_segment_free(cx.tiling, base) {
                Release::Nothing => {}
                Release::This => release(rules, &mut cx, &[base]),
                Release::KeepingFirst(n) => {
                    let free: Vec<u64> = cx.tiling.wholly_free_segments().skip(n).collect();
                    release(rules, &mut cx, &free);
                }
            }
        }
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }
}

/// The free chunks of a tiling by (their segment's stream, size, address): best fit within a
/// stream in O(log n), for a policy that keeps it through its hooks (`best_fit`).
#[derive(Debug, Clone, Default)]
pub struct FreeIndex {
    free: std::collections::BTreeSet<(StreamId, u64, u64)>,
}

impl FreeIndex {
    fn key<T: Copy>(tiling: &Tiling<T>, addr: u64) -> Option<(StreamId, u64, u64)> {
        let chunk = tiling.get(addr)?;
        let stream = tiling.seg(tiling.seg_of(addr)?)?.stream;
        Some((stream, chunk.size, addr))
    }

    /// Index the chunk at `addr`, if it is free.
    pub fn index<T: Copy>(&mut self, tiling: &Tiling<T>, addr: u64) {
        if tiling.get(addr).is_some_and(|c| c.is_free()) {
            self.free.extend(Self::key(tiling, addr));
        }
    }

    /// Take the chunk at `addr` out of the index.
    pub fn unindex<T: Copy>(&mut self, tiling: &Tiling<T>, addr: u64) {
        if let Some(key) = Self::key(tiling, addr) {
            self.free.remove(&key);
        }
    }

    /// The smallest free chunk of `stream` that holds `block` (the lowest address among
    /// equals), cut to size.
    pub fn take<T: Copy + Default>(
        &mut self,
        tiling: &mut Tiling<T>,
        block: u64,
        stream: StreamId,
    ) -> Option<u64> {
        let &(s, size, addr) = self.free.range((stream, block, 0)..).next()?;
        if s != stream {
            return None;
        }
        self.free.remove(&(s, size, addr));
        if let Some(rest) = tiling.split(addr, block, T::default()) {
            self.index(tiling, rest);
        }
        Some(addr)
    }

    /// The block at `addr` is free again: released and merged with its free neighbours.
    pub fn give_back<T: Copy + Default>(&mut self, tiling: &mut Tiling<T>, addr: u64) {
        tiling.release(addr, T::default());
        let at = tiling.coalesce(addr, |_| true, |tiling, a, _| self.unindex(tiling, a));
        self.index(tiling, at);
    }
}

/// Coalescing free lists, one per key (a stream, or who may reuse a block): each its free
/// chunks by (size, address), a chunk on the list its tag names. For a policy whose search is
/// its own (RMM's stream-ordered pool, a `cudaMallocAsync` pool); a list stays, empty, once
/// made, as RMM's do.
#[derive(Debug, Clone)]
pub struct FreeLists<K> {
    lists: std::collections::BTreeMap<K, std::collections::BTreeSet<(u64, u64)>>,
}

impl<K> Default for FreeLists<K> {
    fn default() -> Self {
        FreeLists { lists: std::collections::BTreeMap::new() }
    }
}

impl<K: Ord + Copy> FreeLists<K> {
    /// The smallest chunk of at least `size` bytes on a list that `usable` accepts (the
    /// lowest address, then the lowest key, among equals): (size, address, key).
    pub fn best_fit(&self, size: u64, usable: impl Fn(K) -> bool) -> Option<(u64, u64, K)> {
        let firsts = self.lists.iter().filter(|(&key, _)| usable(key));
        firsts
            .filter_map(|(&key, set)| set.range((size, 0)..).next().map(|&(s, a)| (s, a, key)))
            .min()
    }

    /// [`FreeLists::best_fit`] on `key`'s list alone, taken off it: its address.
    pub fn take(&mut self, key: K, size: u64) -> Option<u64> {
        let list = self.lists.get_mut(&key)?;
        let &(s, addr) = list.range((size, 0)..).next()?;
        list.remove(&(s, addr));
        Some(addr)
    }

    pub fn insert(&mut self, key: K, (size, addr): (u64, u64)) {
        self.lists.entry(key).or_default().insert((size, addr));
    }

    pub fn remove(&mut self, key: K, (size, addr): (u64, u64)) {
        if let Some(list) = self.lists.get_mut(&key) {
            list.remove(&(size, addr));
        }
    }

    /// The free chunk at `addr`, tagged for `key`'s list, joins it, merging with the chunks
    /// beside it that carry the same tag.
    pub fn merge_in<T: Copy + PartialEq>(&mut self, tiling: &mut Tiling<T>, addr: u64, key: K) {
        tiling.merge_alike(addr, self.lists.entry(key).or_default());
    }

    /// The keys of the lists, in order.
    pub fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.lists.keys().copied()
    }

    /// `key`'s list goes: the addresses of its chunks, in address order.
    pub fn remove_list(&mut self, key: K) -> Option<Vec<u64>> {
        let mut addrs: Vec<u64> = self.lists.remove(&key)?.into_iter().map(|(_, a)| a).collect();
        addrs.sort_unstable();
        Some(addrs)
    }
}

/// [`Rules::find`]'s default: a free chunk cut to `block`, growing and then releasing what is
/// cached if need be.
pub fn find_or_grow<R: Rules>(
    rules: &mut R,
    cx: &mut Cx<'_, '_, R::Tag>,
    block: u64,
    stream: StreamId,
) -> Option<u64> {
    // No free chunk holds the block: skip the policy's search (a request that cannot fit
    // stays O(log n), however many chunks there are).
    if !rules.dedicated(block) && cx.tiling.largest_free_chunk() >= block {
        if let Some(addr) = rules.take(cx.tiling, block, stream) {
            return Some(addr);
        }
    }
    if let Some(addr) = grow(rules, cx, block, stream) {
        return Some(addr);
    }
    // Refused: what is cached and wholly free goes back, and one more try.
    let free: Vec<u64> = cx.tiling.wholly_free_segments().collect();
    let bytes = free.iter().filter_map(|&b| cx.tiling.seg(b)).map(|s| s.size).sum();
    if free.is_empty() || !rules.may_release(block, bytes, &cx.room()) {
        return None;
    }
    release(rules, cx, &free);
    cx.retried();
    grow(rules, cx, block, stream)
}

/// Reserve a segment for a block of `block` bytes, trying smaller ones as the rules say, and
/// take the block from it; or, for a dedicated block, its own segment.
fn grow<R: Rules>(
    rules: &mut R,
    cx: &mut Cx<'_, '_, R::Tag>,
    block: u64,
    stream: StreamId,
) -> Option<u64> {
    if rules.dedicated(block) {
        let base = cx.reserve(round_up(block, PAGE_2MIB), stream, R::Tag::default())?;
        cx.tiling.dedicate(base);
        return Some(base);
    }
    let mut size = rules.segment_size(cx.tiling, block, &cx.room())?.max(block);
    loop {
        if let Some(base) = cx.reserve(size, stream, R::Tag::default()) {
            rules.added(cx.tiling, base);
            return rules.take_from(cx.tiling, base, block, stream);
        }
        match rules.smaller_segment(block, size) {
            Some(smaller) if smaller >= block && smaller < size => size = smaller,
            _ => return None,
        }
    }
}

/// Give these wholly free segments back to the device, each unindexed first.
pub fn release<R: Rules>(rules: &mut R, cx: &mut Cx<'_, '_, R::Tag>, free: &[u64]) {
    for &base in free {
        rules.removing(cx.tiling, base);
        cx.unreserve(base);
    }
}

impl<R: Rules> Allocator for Kit<R> {
    fn name(&self) -> &str {
        R::NAME
    }

    fn malloc(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        size: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo> {
        let block = self.rules.block_size(size);
        let refused = block < size || self.rules.refuses(block);
        let found = if refused {
            None
        } else {
            let (rules, mut cx) = self.parts(env);
            rules.find(&mut cx, block, stream)
        };
        let Some(addr) = found else {
            self.books.sync_inactive_split(self.tiling.inactive_split());
            return Err(self.books.oom(env, id, block, stream, self.tiling.largest_free()));
        };
        self.tiling.take(addr, id);
        self.books.sync_inactive_split(self.tiling.inactive_split());
        let block = self.tiling.get(addr).map_or(block, |c| c.size);
        Ok(self.books.grant(env, id, (addr, block), size, stream))
    }

    fn free(&mut self, env: &mut Env<'_>, id: AllocId) {
        if let Some(block) = self.books.free_requested(env, id) {
            self.take_back(env, block, false);
        }
    }

    fn record_stream(&mut self, id: AllocId, stream: StreamId) {
        self.books.record_stream(id, stream);
    }

    fn free_completed(&mut self, env: &mut Env<'_>, id: AllocId) {
        if let Some(block) = self.books.free_completed(env, id) {
            self.take_back(env, block, true);
        }
    }

    fn set_memory_fraction(&mut self, env: &mut Env<'_>, fraction: f64) -> Result<(), ConfigError> {
        self.books.set_fraction(env, fraction)
    }

    fn stats(&self) -> MemoryStats {
        self.books.stats.clone()
    }

    fn reset_peak_stats(&mut self) {
        self.books.stats.reset_peak();
    }

    fn empty_cache(&mut self, env: &mut Env<'_>) {
        let (rules, mut cx) = self.parts(env);
        rules.empty_cache(&mut cx);
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }

    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        let mut rules = self.rules.clone();
        let started = self.books.stats.num_device_alloc > 0;
        let result = parse_conf(R::NAME, conf).and_then(|pairs| {
            for (key, value) in pairs {
                let Some(setting) = R::SETTINGS.iter().find(|s| s.key == key) else {
                    let known: Vec<&str> = R::SETTINGS.iter().map(|s| s.key).collect();
                    return Err(crate::zoo::common::unknown_key(R::NAME, &key, &known));
                };
                setting.apply.to(&mut rules, &value).map_err(|problem| {
                    ConfigError(format!("policy {}: {key}:{}: {problem}", R::NAME, quoted(&value)))
                })?;
            }
            rules
                .check(&self.rules, started)
                .map_err(|problem| ConfigError(format!("policy {}: {problem}", R::NAME)))
        });
        // A bad string changes nothing.
        if result.is_ok() {
            self.rules = rules;
        }
        result
    }

    fn snapshot(&self) -> Vec<SnapshotSegment> {
        self.tiling.snapshot(&self.books)
    }

    fn free_space(&self) -> FreeSpace {
        self.tiling.free_space(&self.books)
    }
}
