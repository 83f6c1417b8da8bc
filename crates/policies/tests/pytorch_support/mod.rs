//! Test-only helpers for the PyTorch clone: a harness that owns the test device
//! ([`SimDevice::for_tests`]), allocator and event log, and PyTorch's
//! `_check_memory_stat_consistency`.
#![allow(dead_code)]

use allocsim_core::{
    AllocId, Allocator, ConfigError, Env, Event, Granted, MemoryStats, OomInfo, SnapshotSegment,
    StreamId,
};
use allocsim_policies::pytorch::PyTorchAllocator;
use allocsim_sim::{CostModel, SimConfig, SimDevice};

/// Allocator + device + event log, with PyTorch-flavoured helpers.
#[derive(Debug)]
pub struct Harness {
    pub alloc: PyTorchAllocator,
    pub dev: SimDevice,
    pub events: Vec<Event>,
    next_id: u64,
}

impl Harness {
    pub fn new(conf: &str, total: u64) -> Self {
        Harness::with_free(conf, total, total)
    }

    /// A device of `total` bytes of which only `free` are free at the start (others hold the
    /// rest).
    pub fn with_free(conf: &str, total: u64, free: u64) -> Self {
        let config = SimConfig {
            cost: CostModel::zero(),
            free_bytes: free,
            ..SimConfig::with_total_bytes(total)
        };
        Harness {
            alloc: PyTorchAllocator::from_conf(conf).expect("valid conf"),
            dev: SimDevice::new(config),
            events: Vec::new(),
            next_id: 0,
        }
    }

    fn env(&mut self) -> (Env<'_>, &mut PyTorchAllocator) {
        // The previous call kept the device's contract (no unknown frees, no double maps).
        assert_eq!(self.dev.errors(), &[] as &[String], "device contract");
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
