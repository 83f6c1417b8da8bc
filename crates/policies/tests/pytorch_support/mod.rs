//! Test-only helpers for the PyTorch clone: a tiny device with a byte budget, a harness that
//! owns device, allocator and event log, and PyTorch's `_check_memory_stat_consistency`.
#![allow(dead_code)]

use allocsim_core::{
    AllocId, Allocator, CallKind, ConfigError, Device, DeviceCalls, DeviceError, Env, Event,
    Granted, MemInfo, MemoryStats, OomInfo, SnapshotSegment, StreamId, MIB,
};
use allocsim_policies::pytorch::PyTorchAllocator;
use std::collections::BTreeMap;

/// A device with `capacity` bytes: segments and mapped pages come out of it; addresses are
/// handed out upwards with a gap so that segments never touch.
#[derive(Debug)]
pub struct TestDevice {
    pub total: u64,
    pub capacity: u64,
    pub used: u64,
    next_addr: u64,
    next_va: u64,
    pub segments: BTreeMap<u64, u64>,
    pub mapped: BTreeMap<u64, u64>,
    calls: DeviceCalls,
}

impl TestDevice {
    pub fn new(total: u64) -> Self {
        TestDevice {
            total,
            capacity: total,
            used: 0,
            next_addr: 0x7f00_0000_0000,
            next_va: 0x1000_0000_0000,
            segments: BTreeMap::new(),
            mapped: BTreeMap::new(),
            calls: DeviceCalls::default(),
        }
    }

    fn take(&mut self, size: u64) -> Result<(), DeviceError> {
        if self.used + size > self.capacity {
            return Err(DeviceError::OutOfMemory {
                requested: size,
                free: self.capacity - self.used,
            });
        }
        self.used += size;
        Ok(())
    }
}

impl Device for TestDevice {
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        let ok = self.take(size);
        self.calls.record(CallKind::Malloc, ok.is_ok(), 0);
        ok?;
        let addr = self.next_addr;
        self.next_addr += size.div_ceil(2 * MIB) * 2 * MIB + 2 * MIB;
        self.segments.insert(addr, size);
        Ok(addr)
    }

    fn free(&mut self, addr: u64, size: u64) {
        assert_eq!(self.segments.remove(&addr), Some(size), "cudaFree of an unknown segment");
        self.used -= size;
        self.calls.record(CallKind::Free, true, 0);
    }

    fn reserve_address(&mut self, size: u64, alignment: u64) -> Result<u64, DeviceError> {
        let align = alignment.max(2 * MIB);
        let addr = self.next_va.div_ceil(align) * align;
        self.next_va = addr + size + align;
        self.calls.record(CallKind::ReserveAddress, true, 0);
        Ok(addr)
    }

    fn release_address(&mut self, addr: u64, size: u64) {
        assert!(self.mapped.range(addr..addr + size).next().is_none(), "released a mapped range");
        self.calls.record(CallKind::ReleaseAddress, true, 0);
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let ok = self.take(size);
        self.calls.record(CallKind::Map, ok.is_ok(), 0);
        ok?;
        assert!(self.mapped.range(addr..addr + size).next().is_none(), "double map");
        self.mapped.insert(addr, size);
        Ok(())
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        // A range may cover several earlier maps, or part of one.
        let mut cut = Vec::new();
        for (&a, &s) in self.mapped.range(..addr + size) {
            if a + s > addr {
                cut.push((a, s));
            }
        }
        for (a, s) in cut {
            self.mapped.remove(&a);
            if a < addr {
                self.mapped.insert(a, addr - a);
            }
            if a + s > addr + size {
                self.mapped.insert(addr + size, a + s - addr - size);
            }
        }
        self.used -= size;
        self.calls.record(CallKind::Unmap, true, 0);
    }

    fn mem_info(&self) -> MemInfo {
        MemInfo { free_bytes: self.capacity - self.used, total_bytes: self.total }
    }

    fn calls(&self) -> &DeviceCalls {
        &self.calls
    }
}

/// Allocator + device + event log, with PyTorch-flavoured helpers.
#[derive(Debug)]
pub struct Harness {
    pub alloc: PyTorchAllocator,
    pub dev: TestDevice,
    pub events: Vec<Event>,
    next_id: u64,
}

impl Harness {
    pub fn new(conf: &str, total: u64) -> Self {
        Harness {
            alloc: PyTorchAllocator::from_conf(conf).expect("valid conf"),
            dev: TestDevice::new(total),
            events: Vec::new(),
            next_id: 0,
        }
    }

    fn env(&mut self) -> (Env<'_>, &mut PyTorchAllocator) {
        (Env::new(&mut self.dev, &mut self.events), &mut self.alloc)
    }

    pub fn malloc_on(&mut self, size: u64, stream: u64) -> Result<(AllocId, Granted), OomInfo> {
        let id = AllocId(self.next_id);
        self.next_id += 1;
        let (mut env, a) = self.env();
        a.malloc(&mut env, id, size, StreamId(stream)).map(|g| (id, g))
    }

    pub fn malloc(&mut self, size: u64) -> Result<(AllocId, Granted), OomInfo> {
        self.malloc_on(size, 0)
    }

    /// Allocate and expect success.
    pub fn alloc(&mut self, size: u64) -> AllocId {
        self.malloc(size).expect("allocation should succeed").0
    }

    pub fn free(&mut self, id: AllocId) {
        let (mut env, a) = self.env();
        a.free(&mut env, id);
    }

    pub fn free_completed(&mut self, id: AllocId) {
        let (mut env, a) = self.env();
        a.free_completed(&mut env, id);
    }

    pub fn record_stream(&mut self, id: AllocId, stream: u64) {
        self.alloc.record_stream(id, StreamId(stream));
    }

    pub fn empty_cache(&mut self) {
        let (mut env, a) = self.env();
        a.empty_cache(&mut env);
    }

    pub fn set_fraction(&mut self, fraction: f64) -> Result<(), ConfigError> {
        let (mut env, a) = self.env();
        a.set_memory_fraction(&mut env, fraction)
    }

    pub fn settings(&mut self, conf: &str) -> Result<(), ConfigError> {
        self.alloc.set_settings(conf)
    }

    pub fn stats(&self) -> MemoryStats {
        self.alloc.stats()
    }

    pub fn stat(&self, key: &str) -> i64 {
        self.stats()
            .flat()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .expect("known stat key")
    }

    pub fn snapshot(&self) -> Vec<SnapshotSegment> {
        self.alloc.snapshot()
    }

    /// The (action, size) sequence of device-level events since the start.
    pub fn segment_events(&self) -> Vec<(&'static str, u64)> {
        self.events
            .iter()
            .filter(|e| e.is_segment_event())
            .map(|e| (e.action(), event_size(e)))
            .collect()
    }
}

pub fn event_size(e: &Event) -> u64 {
    match *e {
        Event::SegmentAlloc { size, .. }
        | Event::SegmentFree { size, .. }
        | Event::SegmentMap { size, .. }
        | Event::SegmentUnmap { size, .. }
        | Event::Alloc { size, .. }
        | Event::FreeRequested { size, .. }
        | Event::FreeCompleted { size, .. }
        | Event::Oom { size, .. } => size,
    }
}

/// `_check_memory_stat_consistency` (test_cuda_multigpu.py): the stats derivable from the
/// snapshot must equal the reported ones; the oracle every front end shares.
pub fn stat_consistency_errors(stats: &MemoryStats, snapshot: &[SnapshotSegment]) -> Vec<String> {
    allocsim_testgen::oracles::stat_consistency(snapshot, stats, true)
}
/// A small deterministic generator (xorshift64*), so tests need no dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}
