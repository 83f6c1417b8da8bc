//! Test helper for the policies: a trivial bump [`Device`], a shadow model that rebuilds the
//! memory map from a policy's events alone and checks it after every op, and seeded random op
//! programs through every registered policy but `pytorch`; every call also goes to
//! `allocsim-check`'s `Checker`, and both must agree.

use allocsim_core::{
    AllocId, Allocator, BlockState, CallKind, Device, DeviceCalls, DeviceError, Env, Event,
    Granted, MemInfo, OomInfo, Pool, StreamId, GIB,
};
use std::collections::BTreeMap;

/// Hands out addresses upwards from a high base, 2 MiB aligned, and never reuses them; refuses
/// once `capacity` bytes are reserved or mapped. Checks that frees match what it gave.
#[derive(Debug)]
pub(crate) struct BumpDevice {
    next: u64,
    used: u64,
    pub capacity: u64,
    segments: BTreeMap<u64, u64>,
    ranges: BTreeMap<u64, u64>,
    mapped: BTreeMap<u64, u64>,
    calls: DeviceCalls,
}

impl BumpDevice {
    pub fn new(capacity: u64) -> Self {
        BumpDevice {
            next: 0x7f00_0000_0000,
            used: 0,
            capacity,
            segments: BTreeMap::new(),
            ranges: BTreeMap::new(),
            mapped: BTreeMap::new(),
            calls: DeviceCalls::default(),
        }
    }

    fn bump(&mut self, size: u64, alignment: u64) -> u64 {
        let align = alignment.max(2 << 20);
        let addr = self.next.div_ceil(align) * align;
        self.next = addr + size.div_ceil(2 << 20) * (2 << 20);
        addr
    }

    fn take(&mut self, kind: CallKind, size: u64) -> Result<(), DeviceError> {
        if size > self.capacity - self.used {
            self.calls.record(kind, false, 0);
            return Err(DeviceError::OutOfMemory {
                requested: size,
                free: self.capacity - self.used,
            });
        }
        self.used += size;
        self.calls.record(kind, true, 0);
        Ok(())
    }
}

impl Device for BumpDevice {
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        assert!(size > 0, "cudaMalloc of 0 bytes");
        self.take(CallKind::Malloc, size)?;
        let addr = self.bump(size, 0);
        self.segments.insert(addr, size);
        Ok(addr)
    }

    fn free(&mut self, addr: u64, size: u64) {
        assert_eq!(
            self.segments.remove(&addr),
            Some(size),
            "free of {addr:#x}+{size} not a segment"
        );
        self.used -= size;
        self.calls.record(CallKind::Free, true, 0);
    }

    fn reserve_address(&mut self, size: u64, alignment: u64) -> Result<u64, DeviceError> {
        let addr = self.bump(size, alignment);
        self.ranges.insert(addr, size);
        self.calls.record(CallKind::ReserveAddress, true, 0);
        Ok(addr)
    }

    fn release_address(&mut self, addr: u64, size: u64) {
        assert_eq!(self.ranges.remove(&addr), Some(size), "release of unknown range {addr:#x}");
        assert!(self.mapped.range(addr..addr + size).next().is_none(), "release of a mapped range");
        self.calls.record(CallKind::ReleaseAddress, true, 0);
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let inside =
            self.ranges.range(..=addr).next_back().is_some_and(|(&b, &s)| addr + size <= b + s);
        assert!(inside, "map of {addr:#x}+{size} outside reserved ranges");
        let overlaps =
            self.mapped.range(..addr + size).next_back().is_some_and(|(&b, &s)| b + s > addr);
        assert!(!overlaps, "map of {addr:#x}+{size} over mapped pages");
        self.take(CallKind::Map, size)?;
        self.mapped.insert(addr, size);
        Ok(())
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        // Unmaps may cover several maps or parts of one: split mapped pieces to match.
        let pieces: Vec<(u64, u64)> = self
            .mapped
            .range(..addr + size)
            .filter(|(&b, &s)| b + s > addr)
            .map(|(&b, &s)| (b, s))
            .collect();
        let covered: u64 =
            pieces.iter().map(|&(b, s)| (b + s).min(addr + size) - b.max(addr)).sum();
        assert_eq!(covered, size, "unmap of {addr:#x}+{size} not wholly mapped");
        for (b, s) in pieces {
            self.mapped.remove(&b);
            if b < addr {
                self.mapped.insert(b, addr - b);
            }
            if b + s > addr + size {
                self.mapped.insert(addr + size, b + s - (addr + size));
            }
        }
        self.used -= size;
        self.calls.record(CallKind::Unmap, true, 0);
    }

    fn mem_info(&self) -> MemInfo {
        MemInfo { free_bytes: self.capacity - self.used, total_bytes: self.capacity }
    }

    fn calls(&self) -> &DeviceCalls {
        &self.calls
    }
}

#[derive(Debug, Clone, Copy)]
struct Blk {
    id: AllocId,
    size: u64,
    requested: u64,
    pool: Pool,
    freed: bool,
}

/// Counters as the events imply them: (small, large) per stat.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Expected {
    allocation: [i64; 2],
    active: [i64; 2],
    allocated_bytes: [i64; 2],
    active_bytes: [i64; 2],
    requested_bytes: [i64; 2],
    reserved_bytes: [i64; 2],
    segment: [i64; 2],
    num_device_alloc: i64,
    num_device_free: i64,
    num_ooms: i64,
}

fn ix(pool: Pool) -> usize {
    match pool {
        Pool::Small => 0,
        Pool::Large => 1,
    }
}

/// The memory map rebuilt from events only.
#[derive(Debug, Default)]
struct Shadow {
    /// Device memory: whole segments and mapped ranges, by address.
    memory: BTreeMap<u64, (u64, Pool)>,
    blocks: BTreeMap<u64, Blk>,
    where_is: BTreeMap<AllocId, u64>,
    expected: Expected,
}

impl Shadow {
    fn apply(&mut self, e: &Event) -> Result<(), String> {
        match *e {
            Event::SegmentAlloc { addr, size, pool, .. }
            | Event::SegmentMap { addr, size, pool, .. } => {
                if self
                    .memory
                    .range(..addr + size)
                    .next_back()
                    .is_some_and(|(&b, &(s, _))| b + s > addr)
                {
                    return Err(format!(
                        "segment {addr:#x}+{size} overlaps device memory already held"
                    ));
                }
                self.memory.insert(addr, (size, pool));
                self.expected.reserved_bytes[ix(pool)] += size as i64;
                // As allocsim-check counts: a map is a device alloc, not a segment.
                self.expected.num_device_alloc += 1;
                if matches!(e, Event::SegmentAlloc { .. }) {
                    self.expected.segment[ix(pool)] += 1;
                }
            }
            Event::SegmentFree { addr, size, pool, .. } => {
                if self.memory.remove(&addr) != Some((size, pool)) {
                    return Err(format!("segment_free {addr:#x}+{size} is not a live segment"));
                }
                if self.overlaps_block(addr, size) {
                    return Err(format!("segment_free {addr:#x}+{size} with live blocks inside"));
                }
                self.expected.reserved_bytes[ix(pool)] -= size as i64;
                self.expected.segment[ix(pool)] -= 1;
                self.expected.num_device_free += 1;
            }
            Event::SegmentUnmap { addr, size, pool, .. } => {
                // Unmaps may take part of a mapped range, or several adjacent ones.
                let end = addr + size;
                let pieces: Vec<(u64, u64, Pool)> = self
                    .memory
                    .range(..end)
                    .filter(|(&b, &(s, _))| b + s > addr)
                    .map(|(&b, &(s, p))| (b, s, p))
                    .collect();
                let covered: u64 =
                    pieces.iter().map(|&(b, s, _)| (b + s).min(end) - b.max(addr)).sum();
                if covered != size || pieces.iter().any(|&(_, _, p)| p != pool) {
                    return Err(format!(
                        "segment_unmap {addr:#x}+{size} is not mapped in {pool:?}"
                    ));
                }
                if self.overlaps_block(addr, size) {
                    return Err(format!("segment_unmap {addr:#x}+{size} with live blocks inside"));
                }
                for (b, s, p) in pieces {
                    self.memory.remove(&b);
                    if b < addr {
                        self.memory.insert(b, (addr - b, p));
                    }
                    if b + s > end {
                        self.memory.insert(end, (b + s - end, p));
                    }
                }
                self.expected.reserved_bytes[ix(pool)] -= size as i64;
                self.expected.num_device_free += 1;
            }
            Event::Alloc { id, addr, size, requested, pool, .. } => {
                if self.where_is.contains_key(&id) {
                    return Err(format!("alloc of live id {id:?}"));
                }
                if addr % 256 != 0 || size < requested || size == 0 {
                    return Err(format!(
                        "alloc {id:?} at {addr:#x}+{size} for {requested}: misaligned or short"
                    ));
                }
                if pool != Pool::for_size(size) {
                    return Err(format!("alloc {id:?} of {size} in pool {pool:?}"));
                }
                if self.overlaps_block(addr, size) {
                    return Err(format!("alloc {id:?} at {addr:#x}+{size} overlaps a live block"));
                }
                if !self.covered(addr, size) {
                    return Err(format!("alloc {id:?} at {addr:#x}+{size} outside device memory"));
                }
                self.blocks.insert(addr, Blk { id, size, requested, pool, freed: false });
                self.where_is.insert(id, addr);
                let p = ix(pool);
                self.expected.allocation[p] += 1;
                self.expected.active[p] += 1;
                self.expected.allocated_bytes[p] += size as i64;
                self.expected.active_bytes[p] += size as i64;
                self.expected.requested_bytes[p] += requested as i64;
            }
            Event::FreeRequested { id, addr, size, requested } => {
                let b = self.where_is.get(&id).and_then(|a| self.blocks.get_mut(a));
                let Some(b) = b.filter(|b| !b.freed && b.size == size && b.requested == requested)
                else {
                    return Err(format!(
                        "free_requested {id:?} {addr:#x}+{size} does not match a live block"
                    ));
                };
                b.freed = true;
                self.expected.allocation[ix(b.pool)] -= 1;
                self.expected.allocated_bytes[ix(b.pool)] -= size as i64;
            }
            Event::FreeCompleted { id, addr, size, .. } => {
                let b = self.where_is.remove(&id).and_then(|a| self.blocks.remove(&a));
                let Some(b) = b.filter(|b| b.freed && b.size == size && b.id == id) else {
                    return Err(format!(
                        "free_completed {id:?} {addr:#x}+{size} without free_requested"
                    ));
                };
                self.expected.active[ix(b.pool)] -= 1;
                self.expected.active_bytes[ix(b.pool)] -= size as i64;
                self.expected.requested_bytes[ix(b.pool)] -= b.requested as i64;
            }
            Event::Oom { .. } => self.expected.num_ooms += 1,
        }
        Ok(())
    }

    fn overlaps_block(&self, addr: u64, size: u64) -> bool {
        self.blocks.range(..addr + size).next_back().is_some_and(|(&b, k)| b + k.size > addr)
    }

    /// Whether `[addr, addr+size)` lies in device memory (contiguous mapped ranges count).
    fn covered(&self, addr: u64, size: u64) -> bool {
        let mut at = addr;
        while at < addr + size {
            match self.memory.range(..=at).next_back() {
                Some((&b, &(s, _))) if b + s > at => at = b + s,
                _ => return false,
            }
        }
        true
    }
}

/// A policy on a bump device, checked against its own events after every call.
pub(crate) struct Rig {
    pub device: BumpDevice,
    pub events: Vec<Event>,
    pub policy: Box<dyn Allocator>,
    shadow: Shadow,
    seen: usize,
    checks: u64,
    checker: allocsim_check::Checker,
    pub label: String,
}

impl std::fmt::Debug for Rig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rig").field("label", &self.label).finish_non_exhaustive()
    }
}

impl Rig {
    pub fn new(name: &str, conf: Option<&str>, capacity: u64) -> Rig {
        let policy = crate::by_name(name, conf).unwrap_or_else(|e| panic!("{name}: {e}"));
        Rig::with_policy(name, policy, capacity)
    }

    /// A rig around a policy built elsewhere (one not registered, say).
    pub fn with_policy(name: &str, policy: Box<dyn Allocator>, capacity: u64) -> Rig {
        Rig {
            device: BumpDevice::new(capacity),
            events: Vec::new(),
            policy,
            shadow: Shadow::default(),
            seen: 0,
            checks: 0,
            checker: allocsim_check::Checker::new(allocsim_check::CheckConfig {
                alignment_bytes: 256,
                ..allocsim_check::CheckConfig::new(capacity)
            }),
            label: name.to_string(),
        }
    }

    fn env(&mut self) -> (&mut dyn Allocator, Env<'_>) {
        (self.policy.as_mut(), Env::new(&mut self.device, &mut self.events))
    }

    pub fn malloc(&mut self, id: u64, size: u64, stream: u64) -> Result<Granted, OomInfo> {
        let (p, mut env) = self.env();
        let r = p.malloc(&mut env, AllocId(id), size, StreamId(stream));
        match (&r, self.events.last()) {
            (Ok(g), Some(Event::Alloc { id: i, addr, size, .. })) => {
                assert!(
                    *i == AllocId(id) && *addr == g.addr && *size == g.size,
                    "{}: Ok without its Alloc",
                    self.label
                )
            }
            (Err(_), Some(Event::Oom { id: i, .. })) => {
                assert_eq!(*i, AllocId(id), "{}: Oom for another id", self.label)
            }
            _ => panic!("{}: malloc of id {id} did not end with Alloc or Oom", self.label),
        }
        self.check();
        r
    }

    pub fn free(&mut self, id: u64) {
        let (p, mut env) = self.env();
        p.free(&mut env, AllocId(id));
        self.check();
    }

    pub fn record_stream(&mut self, id: u64, stream: u64) {
        self.policy.record_stream(AllocId(id), StreamId(stream));
    }

    pub fn free_completed(&mut self, id: u64) {
        let (p, mut env) = self.env();
        p.free_completed(&mut env, AllocId(id));
        self.check();
    }

    pub fn empty_cache(&mut self) {
        let (p, mut env) = self.env();
        p.empty_cache(&mut env);
        self.check();
    }

    pub fn set_fraction(&mut self, fraction: f64) {
        let (p, mut env) = self.env();
        p.set_memory_fraction(&mut env, fraction).unwrap();
        self.check();
    }

    pub fn reserved(&self) -> u64 {
        self.policy.stats().reserved_bytes.all.current as u64
    }

    /// Apply new events to the shadow, then compare stats and snapshot with it.
    pub fn check(&mut self) {
        for (i, e) in self.events.iter().enumerate().skip(self.seen) {
            if let Err(msg) = self.shadow.apply(e) {
                panic!("{}: event {e:?}: {msg}", self.label);
            }
            self.checker.on_event(i as u64, self.checks, e);
        }
        self.seen = self.events.len();
        self.checker.on_stats(self.seen as u64, self.checks, &self.policy.stats());
        if let Some(v) = self.checker.violations().first() {
            panic!("{}: allocsim-check: {v}", self.label);
        }
        // Stats every call; the O(blocks) snapshot comparison on a sample of calls.
        self.checks += 1;
        let snapshot = self.checks < 64 || self.checks & 15 == 0;
        let result =
            self.check_stats().and_then(|_| if snapshot { self.check_snapshot() } else { Ok(()) });
        if let Err(msg) = result {
            panic!("{}: after {} events: {msg}", self.label, self.seen);
        }
    }

    fn check_stats(&self) -> Result<(), String> {
        let s = self.policy.stats();
        let pair = |a: &allocsim_core::StatArray| [a.small_pool.current, a.large_pool.current];
        let got = Expected {
            allocation: pair(&s.allocation),
            active: pair(&s.active),
            allocated_bytes: pair(&s.allocated_bytes),
            active_bytes: pair(&s.active_bytes),
            requested_bytes: pair(&s.requested_bytes),
            reserved_bytes: pair(&s.reserved_bytes),
            segment: pair(&s.segment),
            num_device_alloc: s.num_device_alloc,
            num_device_free: s.num_device_free,
            num_ooms: s.num_ooms,
        };
        if got != self.shadow.expected {
            return Err(format!("stats {got:?}\n  events imply {:?}", self.shadow.expected));
        }
        let a = s.allocated_bytes.all;
        if a.current != got.allocated_bytes[0] + got.allocated_bytes[1] || a.peak < a.current {
            return Err(format!("allocated_bytes.all {a:?} disagrees with its pools"));
        }
        Ok(())
    }

    fn check_snapshot(&self) -> Result<(), String> {
        let s = self.policy.stats();
        let mut reserved = 0;
        let mut split = [(0i64, 0i64); 2];
        for seg in self.policy.snapshot() {
            reserved += seg.total_size;
            if !self.shadow.covered(seg.address, seg.total_size) {
                return Err(format!("snapshot segment {:#x} is not device memory", seg.address));
            }
            let mut at = seg.address;
            for b in &seg.blocks {
                if b.address != at || b.size == 0 {
                    return Err(format!(
                        "snapshot blocks of {:#x} do not tile it at {at:#x}",
                        seg.address
                    ));
                }
                at += b.size;
                let shadow = self.shadow.blocks.get(&b.address).filter(|k| k.size == b.size);
                let ok = match b.state {
                    BlockState::Inactive => !self.shadow.overlaps_block(b.address, b.size),
                    BlockState::ActiveAllocated => shadow.is_some_and(|k| !k.freed),
                    BlockState::ActivePendingFree => shadow.is_some_and(|k| k.freed),
                };
                if !ok {
                    return Err(format!(
                        "snapshot block {:#x}+{} {:?} disagrees with events",
                        b.address, b.size, b.state
                    ));
                }
                if b.state == BlockState::Inactive && seg.blocks.len() > 1 {
                    let p = ix(Pool::for_size(b.size));
                    split[p].0 += 1;
                    split[p].1 += b.size as i64;
                }
            }
            if at != seg.address + seg.total_size {
                return Err(format!("snapshot blocks of {:#x} do not reach its end", seg.address));
            }
        }
        if reserved as i64 != s.reserved_bytes.all.current {
            return Err(format!(
                "snapshot holds {reserved} bytes, reserved_bytes {}",
                s.reserved_bytes.all.current
            ));
        }
        let got = [
            (s.inactive_split.small_pool.current, s.inactive_split_bytes.small_pool.current),
            (s.inactive_split.large_pool.current, s.inactive_split_bytes.large_pool.current),
        ];
        if got != split {
            return Err(format!("inactive_split {got:?}, snapshot shows {split:?}"));
        }
        let live_bytes: u64 = self.shadow.blocks.values().map(|b| b.size).sum();
        let space = self.policy.free_space();
        if space.cached_bytes + live_bytes != reserved {
            return Err(format!("free_space {space:?} + live {live_bytes} != reserved {reserved}"));
        }
        Ok(())
    }
}

/// SplitMix64: a seeded generator small enough to keep here.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Log-uniform in `[1, max]`.
    pub fn log_size(&mut self, max: u64) -> u64 {
        ((max as f64).ln() * self.unit()).exp().clamp(1.0, max as f64) as u64
    }
}

/// What a random program did, for tests that want some OOMs and some reuse.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Outcome {
    pub allocs: u64,
    pub ooms: u64,
    pub empty_caches: u64,
}

const STREAMS: [u64; 4] = [0, 7, 13, 21];

/// A seeded random program of `ops` ops over several streams, checked after every op.
pub(crate) fn random_program(
    name: &str,
    conf: Option<&str>,
    seed: u64,
    ops: u64,
    capacity: u64,
) -> Outcome {
    let mut rig = Rig::new(name, conf, capacity);
    rig.label = format!("{name} (conf {conf:?}, seed {seed})");
    let mut rng = Rng::new(seed);
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut pending: Vec<u64> = Vec::new();
    let mut out = Outcome::default();
    for next_id in 0..ops {
        let roll = rng.below(1000);
        if roll < 500 || live.is_empty() {
            let stream = STREAMS[rng.below(4) as usize];
            let size = rng.log_size(GIB);
            out.allocs += 1;
            match rig.malloc(next_id, size, stream) {
                Ok(_) => live.push((next_id, stream)),
                Err(_) => out.ooms += 1,
            }
        } else if roll < 900 {
            let (id, stream) = live.swap_remove(rng.below(live.len() as u64) as usize);
            if rng.below(5) == 0 {
                let other = STREAMS[rng.below(4) as usize];
                rig.record_stream(id, other);
                if other != stream {
                    pending.push(id);
                }
            }
            rig.free(id);
        } else if roll < 980 {
            if !pending.is_empty() {
                let id = pending.swap_remove(rng.below(pending.len() as u64) as usize);
                rig.free_completed(id);
            }
        } else if roll < 995 {
            out.empty_caches += 1;
            rig.empty_cache();
        } else {
            let fraction = if rng.below(2) == 0 { 1.0 } else { 0.3 + 0.7 * rng.unit() };
            rig.set_fraction(fraction);
        }
    }
    // Drain: every block freed and completed, then the cache emptied.
    for (id, _) in live {
        rig.free(id);
    }
    for id in pending {
        rig.free_completed(id);
    }
    rig.empty_cache();
    rig.checks = 0;
    rig.check();
    assert_eq!(rig.policy.stats().allocated_bytes.all.current, 0, "{}", rig.label);
    out
}

/// A policy's defaults and its registered test settings, for the random programs.
pub(crate) fn configs(name: &str) -> Vec<Option<&'static str>> {
    let policy = crate::POLICIES.iter().find(|p| p.name == name);
    std::iter::once(None)
        .chain(policy.into_iter().flat_map(|p| p.test_settings.iter().map(|s| Some(*s))))
        .collect()
}

/// Random programs through every config of `name`; some must OOM, most must not.
fn random_programs(name: &str) {
    for conf in configs(name) {
        let mut total = Outcome::default();
        for seed in 1..=3u64 {
            let o = random_program(name, conf, seed * 7919, 3000, 8 * GIB);
            total.allocs += o.allocs;
            total.ooms += o.ooms;
            total.empty_caches += o.empty_caches;
        }
        assert!(total.ooms > 0 && total.ooms < total.allocs / 2, "{name} {conf:?}: {total:?}");
    }
}

/// Every registered policy but `pytorch` (which has its own suites), through random programs.
#[test]
fn random_programs_of_every_policy() {
    for policy in crate::POLICIES.iter().filter(|p| p.name != "pytorch") {
        random_programs(policy.name);
    }
}

/// Sizes at the edges and bad settings: an OOM or an error, never a panic.
#[test]
fn extreme_requests_and_bad_settings_never_panic() {
    for name in crate::names().into_iter().filter(|&n| n != "pytorch") {
        let mut rig = Rig::new(name, None, 8 * GIB);
        let sizes = [0, 1, u64::MAX, u64::MAX - 511, 1 << 62, (1 << 40) + 1, 9 * GIB, 255, 257];
        for (id, size) in sizes.into_iter().enumerate() {
            let _ = rig.malloc(id as u64, size, 0);
        }
        rig.set_fraction(0.0);
        let _ = rig.malloc(100, 1 << 20, 3);
        rig.set_fraction(1.0);
        rig.empty_cache();
        for conf in ["nonsense", "a:b:c", "x:1", ":", "min_block:3", "headroom:-1"] {
            assert!(rig.policy.set_settings(conf).is_err(), "{name} accepted {conf:?}");
        }
        let mut device = BumpDevice::new(GIB);
        let mut events = Vec::new();
        let mut env = Env::new(&mut device, &mut events);
        assert!(rig.policy.set_memory_fraction(&mut env, f64::NAN).is_err());
        assert!(rig.policy.set_memory_fraction(&mut env, -0.5).is_err());
    }
}

#[test]
fn bump_device_refuses_past_capacity() {
    let mut d = BumpDevice::new(4 << 20);
    let a = d.malloc(2 << 20).unwrap();
    assert!(d.malloc(3 << 20).is_err());
    d.free(a, 2 << 20);
    assert!(d.malloc(4 << 20).is_ok());
}
