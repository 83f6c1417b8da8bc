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
//! A policy that keeps its own indexes for speed (bins, bitmaps; the zoo's) uses [`Books`] and
//! [`Tiling`] directly and implements [`Allocator`] itself.

pub use crate::zoo::common::{round_up, rounded_request, Books, Live, ALIGN_256, PAGE_2MIB};
pub use crate::zoo::tiling::{Chunk, Seg, Tiling};

use crate::zoo::common::parse_conf;
use allocsim_core::{
    AllocId, Allocator, ConfigError, Env, FreeSpace, Granted, OomInfo, SnapshotSegment, StreamId,
};

/// One setting of a policy: its key in `key:value,...` strings, what it means, and how a value
/// applies (an error says what is wrong with the value; the kit names policy and key).
#[derive(Debug)]
pub struct Setting<R> {
    pub key: &'static str,
    pub help: &'static str,
    pub apply: fn(&mut R, &str) -> Result<(), String>,
}

/// A setting's value as a byte count: digits with an optional binary suffix (`k`, `MiB`, `g`,
/// ...), or `max`.
pub fn bytes_value(value: &str) -> Result<u64, String> {
    crate::zoo::common::parse_bytes("", "", value).map_err(|_| "not a byte count".to_string())
}

/// The decisions of a policy built on the kit. Why this shape: across the zoo, what differs
/// between allocators is where a request lands, how big a new segment is, whether freed
/// memory coalesces and when it goes back to the device; everything else is shared, and a
/// policy that states only these cannot get the statistics or the events wrong.
pub trait Rules: Default + Clone + std::fmt::Debug + 'static {
    /// The name `allocsim --policy` takes.
    const NAME: &'static str;
    /// The settings `key:value,...` strings may set.
    const SETTINGS: &'static [Setting<Self>];

    /// The block a request of `size` bytes gets: at least `size` (saturate: a request whose
    /// rounding overflows is refused).
    fn block_size(&self, size: u64) -> u64 {
        rounded_request(size, 512)
    }

    /// The segment to reserve when no free chunk takes a block of `block` bytes (at least
    /// `block`; the kit makes sure).
    fn segment_size(&self, block: u64) -> u64 {
        round_up(block, PAGE_2MIB)
    }

    /// The free chunk a block of `block` bytes for `stream` goes to, by its address; `None`
    /// reserves a new segment. The chunk must be free and at least `block` bytes (the kit
    /// checks, and reserves a segment instead of trusting a wrong answer).
    fn place(&self, tiling: &Tiling<()>, block: u64, stream: StreamId) -> Option<u64>;

    /// Whether a freed chunk merges with the free chunks beside it. Default: yes.
    fn coalesces(&self) -> bool {
        true
    }

    /// Whether a segment goes back to the device as soon as it is wholly free. Default: no; it
    /// stays cached until `empty_cache`, or until a reservation is refused.
    fn returns_free_segments(&self) -> bool {
        false
    }
}

/// An [`Allocator`] made of [`Rules`] and the shared bookkeeping.
#[derive(Debug, Default)]
pub struct Kit<R: Rules> {
    pub rules: R,
    books: Books,
    tiling: Tiling<()>,
}

impl<R: Rules> Kit<R> {
    pub fn from_conf(conf: &str) -> Result<Self, ConfigError> {
        let mut kit = Kit::<R>::default();
        kit.set_settings(conf)?;
        Ok(kit)
    }

    /// Reserve a segment for a block of `block` bytes: its base, the block's chunk.
    fn grow(&mut self, env: &mut Env<'_>, block: u64, stream: StreamId) -> Option<u64> {
        let size = self.rules.segment_size(block).max(block);
        let base = self.books.device_malloc(env, size, stream)?;
        self.tiling.add_segment(base, size, stream, ());
        Some(base)
    }

    /// Give every wholly free segment back to the device; whether there was one.
    fn release_free_segments(&mut self, env: &mut Env<'_>) -> bool {
        let free: Vec<(u64, StreamId)> = self
            .tiling
            .segments()
            .filter(|(_, s)| s.is_wholly_free())
            .map(|(base, s)| (base, s.stream))
            .collect();
        let released = !free.is_empty();
        for (base, stream) in free {
            if let Some(seg) = self.tiling.remove_segment(base) {
                self.books.device_free(env, base, seg.size, stream);
            }
        }
        released
    }

    /// The placement the rules chose, if it is a free chunk big enough.
    fn placed(&self, block: u64, stream: StreamId) -> Option<u64> {
        let addr = self.rules.place(&self.tiling, block, stream)?;
        self.tiling.get(addr).filter(|c| c.is_free() && c.size >= block).map(|_| addr)
    }

    /// The block of a completed free is free memory again.
    fn take_back(&mut self, env: &mut Env<'_>, block: Live, _deferred: bool) {
        let mut addr = block.addr;
        self.tiling.release(addr, ());
        if self.rules.coalesces() {
            self.tiling.merge_next(addr);
            if let Some((prev, chunk)) = self.tiling.prev(addr) {
                if chunk.is_free() && self.tiling.merge_next(prev) {
                    addr = prev;
                }
            }
        }
        if self.rules.returns_free_segments() {
            let base = self.tiling.seg_of(addr);
            if let Some((base, seg)) = base.and_then(|b| Some((b, *self.tiling.seg(b)?))) {
                if seg.is_wholly_free() && self.tiling.remove_segment(base).is_some() {
                    self.books.device_free(env, base, seg.size, seg.stream);
                }
            }
        }
        self.books.sync_inactive_split(self.tiling.inactive_split());
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
        let addr = if block < size {
            None
        } else if let Some(addr) = self.placed(block, stream) {
            Some(addr)
        } else if let Some(base) = self.grow(env, block, stream) {
            Some(base)
        } else if self.release_free_segments(env) {
            // Refused: what was cached and wholly free went back; one more try.
            self.grow(env, block, stream)
        } else {
            None
        };
        let Some(addr) = addr else {
            self.books.sync_inactive_split(self.tiling.inactive_split());
            return Err(self.books.oom(env, id, block, stream, self.tiling.largest_free()));
        };
        self.tiling.split(addr, block, ());
        self.tiling.take(addr, id);
        self.books.sync_inactive_split(self.tiling.inactive_split());
        Ok(self.books.grant(env, id, (addr, block), size, stream))
    }

    crate::zoo::common::books_glue!();

    fn empty_cache(&mut self, env: &mut Env<'_>) {
        let _ = self.release_free_segments(env);
        self.books.sync_inactive_split(self.tiling.inactive_split());
    }

    fn set_settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        let mut rules = self.rules.clone();
        let result = parse_conf(R::NAME, conf).and_then(|pairs| {
            for (key, value) in pairs {
                let Some(setting) = R::SETTINGS.iter().find(|s| s.key == key) else {
                    let known: Vec<&str> = R::SETTINGS.iter().map(|s| s.key).collect();
                    return Err(crate::zoo::common::unknown_key(R::NAME, &key, &known));
                };
                (setting.apply)(&mut rules, &value).map_err(|problem| {
                    ConfigError(format!("policy {}: {key}:{value}: {problem}", R::NAME))
                })?;
            }
            Ok(())
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
        let (small, large) = self.tiling.largest_free();
        let stats = &self.books.stats;
        let cached = stats.reserved_bytes.all.current - stats.active_bytes.all.current;
        FreeSpace { cached_bytes: cached.max(0) as u64, largest_free_block_bytes: small.max(large) }
    }
}
