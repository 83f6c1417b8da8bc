//! What every zoo policy shares: the bookkeeping of live allocations, statistics and events
//! ([`Books`]), and the `key:value,key:value` settings syntax ([`parse_conf`]).
//!
//! The books are the only place that pushes events and updates statistics, so the order of
//! events and the meaning of each counter is the same for every policy:
//! - `SegmentAlloc` is pushed when the device grants a segment, before the `Alloc` it serves;
//! - `free` pushes `FreeRequested`, and `FreeCompleted` at once unless the block was used on
//!   another stream (`record_stream`), in which case `free_completed` pushes it later; the
//!   policy gets the block back only with `FreeCompleted`, so memory is never reused early;
//! - `Oom` is pushed once, when every path of a policy failed.

use allocsim_core::text::quoted;
use allocsim_core::{
    AllocId, ConfigError, Env, Event, Granted, MemoryStats, OomInfo, Pool, StreamId,
};
use std::collections::BTreeMap;

/// `rmm::CUDA_ALLOCATION_ALIGNMENT`, BFC's `kMinAllocationSize`.
pub const ALIGN_256: u64 = 256;
/// What `cudaMalloc` rounds segments to.
pub const PAGE_2MIB: u64 = 2 << 20;

/// `value` rounded up to a multiple of `to` (a power of two or not), saturating.
pub fn round_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to).saturating_mul(to)
}

/// A request rounded up to `align`, with 0 treated as 1 byte: every policy hands out a
/// non-empty block for a 0-byte request, so ids stay one-to-one with blocks.
pub fn rounded_request(size: u64, align: u64) -> u64 {
    round_up(size.max(1), align)
}

/// One live allocation: from `Alloc` until its `FreeCompleted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Live {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub stream: StreamId,
    pub pool: Pool,
    /// The program freed it; it waits for `free_completed`.
    pub pending: bool,
    /// `record_stream` named a stream other than the allocation stream.
    pub other_stream_uses: bool,
}

/// Statistics, live allocations and the memory cap, shared by every zoo policy.
#[derive(Debug, Default)]
pub struct Books {
    pub stats: MemoryStats,
    pub live: BTreeMap<AllocId, Live>,
    /// Cap on reserved bytes from `set_memory_fraction`.
    pub allowed_bytes: Option<u64>,
}

impl Books {
    pub fn reserved(&self) -> u64 {
        self.stats.reserved_bytes.all.current as u64
    }

    pub fn allocated(&self) -> u64 {
        self.stats.allocated_bytes.all.current as u64
    }

    /// Whether `extra` more reserved bytes stay within the memory fraction.
    pub fn within_cap(&self, extra: u64) -> bool {
        self.allowed_bytes.is_none_or(|allowed| self.reserved().saturating_add(extra) <= allowed)
    }

    /// Ask the device for a segment of `size` bytes (`cudaMalloc`), respecting the cap. On
    /// success the segment is counted and `SegmentAlloc` pushed.
    pub fn device_malloc(&mut self, env: &mut Env<'_>, size: u64, stream: StreamId) -> Option<u64> {
        if size == 0 || !self.within_cap(size) {
            return None;
        }
        let addr = env.device.malloc(size).ok()?;
        let pool = Pool::for_size(size);
        self.stats.num_device_alloc += 1;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, size);
        env.events.emit(Event::SegmentAlloc { addr, size, stream, pool });
        Some(addr)
    }

    /// Give a segment back to the device (`cudaFree`) and push `SegmentFree`.
    pub fn device_free(&mut self, env: &mut Env<'_>, addr: u64, size: u64, stream: StreamId) {
        env.device.free(addr, size);
        let pool = Pool::for_size(size);
        self.stats.num_device_free += 1;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size);
        env.events.emit(Event::SegmentFree { addr, size, stream, pool });
    }

    /// Map physical pages at `[addr, addr+size)` of a reservation, respecting the cap; on
    /// success counted (a device alloc, not a segment, as `allocsim-check` counts it) and
    /// `SegmentMap` pushed.
    pub fn device_map(
        &mut self,
        env: &mut Env<'_>,
        (addr, size): (u64, u64),
        stream: StreamId,
        pool: Pool,
    ) -> bool {
        if size == 0 || !self.within_cap(size) || env.device.map(addr, size).is_err() {
            return false;
        }
        self.stats.num_device_alloc += 1;
        self.stats.reserved_bytes.increase(pool, size);
        env.events.emit(Event::SegmentMap { addr, size, stream, pool });
        true
    }

    /// Unmap `[addr, addr+size)` and push `SegmentUnmap`.
    pub fn device_unmap(
        &mut self,
        env: &mut Env<'_>,
        (addr, size): (u64, u64),
        stream: StreamId,
        pool: Pool,
    ) {
        env.device.unmap(addr, size);
        self.stats.num_device_free += 1;
        self.stats.reserved_bytes.decrease(pool, size);
        env.events.emit(Event::SegmentUnmap { addr, size, stream, pool });
    }

    /// Record a block handed out for `id` and push `Alloc`.
    pub fn grant(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        (addr, size): (u64, u64),
        requested: u64,
        stream: StreamId,
    ) -> Granted {
        let pool = Pool::for_size(size);
        self.stats.allocation.increase(pool, 1);
        self.stats.active.increase(pool, 1);
        self.stats.allocated_bytes.increase(pool, size);
        self.stats.active_bytes.increase(pool, size);
        self.stats.requested_bytes.increase(pool, requested);
        env.events.emit(Event::Alloc { id, addr, size, requested, stream, pool });
        let live =
            Live { addr, size, requested, stream, pool, pending: false, other_stream_uses: false };
        self.live.insert(id, live);
        Granted { addr, size }
    }

    /// The program frees `id`: pushes `FreeRequested`, and completes the free at once unless
    /// the block has uses on other streams. Returns the block when its memory is free again.
    pub fn free_requested(&mut self, env: &mut Env<'_>, id: AllocId) -> Option<Live> {
        let b = self.live.get_mut(&id)?;
        if b.pending {
            return None;
        }
        b.pending = true;
        let Live { addr, size, requested, pool, other_stream_uses, .. } = *b;
        env.events.emit(Event::FreeRequested { id, addr, size, requested });
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        if other_stream_uses {
            None
        } else {
            self.complete(env, id)
        }
    }

    /// The other streams' work on `id` finished: complete its pending free, if it has one.
    pub fn free_completed(&mut self, env: &mut Env<'_>, id: AllocId) -> Option<Live> {
        if self.live.get(&id).is_some_and(|b| b.pending) {
            self.complete(env, id)
        } else {
            None
        }
    }

    fn complete(&mut self, env: &mut Env<'_>, id: AllocId) -> Option<Live> {
        let block = self.live.remove(&id)?;
        let Live { addr, size, requested, pool, .. } = block;
        env.events.emit(Event::FreeCompleted { id, addr, size, requested });
        self.stats.active.decrease(pool, 1);
        self.stats.active_bytes.decrease(pool, size);
        self.stats.requested_bytes.decrease(pool, requested);
        Some(block)
    }

    pub fn record_stream(&mut self, id: AllocId, stream: StreamId) {
        if let Some(b) = self.live.get_mut(&id) {
            b.other_stream_uses |= b.stream != stream;
        }
    }

    /// Every path failed: count it, push `Oom` and explain.
    pub fn oom(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        rounded: u64,
        stream: StreamId,
        largest_free: (u64, u64),
    ) -> OomInfo {
        let mem = env.device.mem_info();
        let info = OomInfo {
            rounded_bytes: rounded,
            device_free_bytes: mem.free_bytes,
            device_total_bytes: mem.total_bytes,
            allowed_bytes: self.allowed_bytes,
            allocated_bytes: self.allocated(),
            reserved_bytes: self.reserved(),
            largest_free_small_bytes: largest_free.0,
            largest_free_large_bytes: largest_free.1,
        };
        self.stats.num_ooms += 1;
        env.events.emit(Event::Oom { id, size: rounded, stream, info });
        info
    }

    /// `set_per_process_memory_fraction`: the cap applies to later growth; nothing already
    /// reserved is released.
    pub fn set_fraction(&mut self, env: &mut Env<'_>, fraction: f64) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(ConfigError(format!("memory fraction {fraction} is not in [0, 1]")));
        }
        let total = env.device.mem_info().total_bytes;
        self.allowed_bytes = (fraction < 1.0).then_some((fraction * total as f64) as u64);
        Ok(())
    }

    /// Bring `inactive_split` / `inactive_split_bytes` to `now` (count, bytes) per pool.
    pub fn sync_inactive_split(&mut self, now: [(u64, u64); 2]) {
        for (pool, (count, bytes)) in [Pool::Small, Pool::Large].into_iter().zip(now) {
            let count_delta = count as i64 - self.stats.inactive_split.pool(pool).current;
            self.stats.inactive_split.apply(pool, count_delta);
            let bytes_delta = bytes as i64 - self.stats.inactive_split_bytes.pool(pool).current;
            self.stats.inactive_split_bytes.apply(pool, bytes_delta);
        }
    }
}

/// Split a `key:value,key:value` settings string into pairs (keys lowercased, both trimmed).
/// Empty entries are skipped, so `""` and `"a:1,"` are fine.
pub fn parse_conf(policy: &str, conf: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut pairs = Vec::new();
    for entry in conf.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((key, value)) = entry.split_once(':') else {
            return Err(ConfigError(format!(
                "policy {policy}: setting {} is not of the form key:value",
                quoted(entry)
            )));
        };
        pairs.push((key.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    Ok(pairs)
}

/// A byte count: digits with an optional binary suffix (`k`/`kib`, `m`/`mib`, `g`/`gib`,
/// `t`/`tib`, any case), or `max` for `u64::MAX`.
pub fn parse_bytes(policy: &str, key: &str, value: &str) -> Result<u64, ConfigError> {
    let bad =
        || ConfigError(format!("policy {policy}: {key}:{} is not a byte count", quoted(value)));
    let v = value.to_ascii_lowercase();
    if v == "max" {
        return Ok(u64::MAX);
    }
    let digits_end = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, suffix) = v.split_at(digits_end);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match suffix.trim() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

/// A setting's value read by `parse` (after lowercasing), or an error that says what it should
/// have been.
pub(crate) fn parse_value<T>(
    value: &str,
    what: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T, String> {
    parse(&value.trim().to_ascii_lowercase()).ok_or_else(|| format!("not {what}"))
}

pub fn unknown_key(policy: &str, key: &str, known: &[&str]) -> ConfigError {
    ConfigError(format!(
        "policy {policy}: unknown setting {}; known: {}",
        quoted(key),
        known.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_syntax() {
        let pairs = parse_conf("p", " a:1 , B:2MiB,").unwrap();
        assert_eq!(pairs, vec![("a".into(), "1".into()), ("b".into(), "2MiB".into())]);
        assert!(parse_conf("p", "novalue").is_err());
        assert_eq!(parse_bytes("p", "k", "2MiB").unwrap(), 2 << 20);
        assert_eq!(parse_bytes("p", "k", "3g").unwrap(), 3 << 30);
        assert_eq!(parse_bytes("p", "k", "max").unwrap(), u64::MAX);
        assert!(parse_bytes("p", "k", "12xb").is_err());
        assert!(parse_bytes("p", "k", "").is_err());
        assert!(parse_bytes("p", "k", "99999999999999999999").is_err());
    }

    #[test]
    fn rounding() {
        assert_eq!(rounded_request(0, 256), 256);
        assert_eq!(rounded_request(257, 256), 512);
        // Saturates instead of overflowing: the device then refuses the request.
        assert_eq!(round_up(u64::MAX, 256), u64::MAX);
    }
}
