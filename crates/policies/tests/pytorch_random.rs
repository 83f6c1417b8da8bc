//! Random programs through the PyTorch clone, watched after every op by two oracles:
//! PyTorch's `_check_memory_stat_consistency` (stats derivable from the snapshot) and the
//! independent `allocsim-check` checker (events alone: no overlap, containment, stats), and
//! the `active` statistics rebuilt from the events, peaks and totals included (the policy
//! derives them from `allocation` until a free first waits on another stream).
//! Swarm style: each seed picks its own settings, op weights and device size, and some seeds
//! change the settings while running. A failure prints the seed and op to reproduce it.

mod pytorch_support;

use allocsim_check::{CheckConfig, Checker};
use allocsim_core::{AllocId, Allocator, Event, Pool, StatArray, MIB};
use pytorch_support::{stat_consistency_errors, Harness, Rng};
use std::collections::HashMap;

const CONFS: [&str; 7] = [
    "",
    "max_split_size_mb:20",
    "max_split_size_mb:64,max_non_split_rounding_mb:30",
    "expandable_segments:True",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "garbage_collection_threshold:0.6",
    "expandable_segments:True,max_split_size_mb:40,roundup_power2_divisions:4",
];

fn random_size(rng: &mut Rng) -> u64 {
    match rng.below(10) {
        0..=4 => 1 + rng.below(MIB),
        5..=7 => MIB + rng.below(9 * MIB),
        8 => 10 * MIB + rng.below(90 * MIB),
        _ => 100 * MIB + rng.below(400 * MIB),
    }
}

struct Program {
    h: Harness,
    checker: Checker,
    rng: Rng,
    live: Vec<AllocId>,
    recorded: Vec<AllocId>,
    pending: Vec<AllocId>,
    events_seen: usize,
    /// `active` and `active_bytes` as the events imply them, and each live block's pool.
    active: (StatArray, StatArray),
    pools: HashMap<AllocId, Pool>,
    expandable_seen: bool,
    seed: u64,
}

impl Program {
    fn new(seed: u64) -> Program {
        let mut rng = Rng::new(seed);
        let conf = CONFS[rng.below(CONFS.len() as u64) as usize];
        let total = (1 + rng.below(4)) << 30;
        let mut h = Harness::new(conf, total);
        if rng.below(3) == 0 {
            h.set_fraction(0.3 + rng.below(60) as f64 / 100.0).unwrap();
        }
        let checker = Checker::new(CheckConfig::new(total));
        Program {
            h,
            checker,
            rng,
            live: vec![],
            recorded: vec![],
            pending: vec![],
            events_seen: 0,
            active: Default::default(),
            pools: HashMap::new(),
            expandable_seen: false,
            seed,
        }
    }

    fn step(&mut self, op: u64) {
        let r = self.rng.below(100);
        if r < 45 || self.live.is_empty() {
            let size = random_size(&mut self.rng);
            let stream = [0, 0, 0, 11, 7][self.rng.below(5) as usize];
            if let Ok((id, _)) = self.h.malloc_on(size, stream) {
                self.live.push(id);
            }
        } else if r < 85 {
            let id = self.live.swap_remove(self.rng.below(self.live.len() as u64) as usize);
            self.h.free(id);
            if let Some(pos) = self.recorded.iter().position(|&x| x == id) {
                self.recorded.swap_remove(pos);
                self.pending.push(id);
            }
        } else if r < 91 {
            let id = self.live[self.rng.below(self.live.len() as u64) as usize];
            self.h.record_stream(id, [0, 7, 11, 13][self.rng.below(4) as usize]);
            if !self.recorded.contains(&id) {
                self.recorded.push(id);
            }
        } else if r < 96 && !self.pending.is_empty() {
            let id = self.pending.swap_remove(self.rng.below(self.pending.len() as u64) as usize);
            self.h.free_completed(id);
        } else if r < 98 {
            self.h.empty_cache();
            self.pending.clear();
        } else {
            let conf = CONFS[self.rng.below(CONFS.len() as u64) as usize];
            self.h.settings(conf).unwrap();
        }
        self.check(op);
    }

    fn check(&mut self, op: u64) {
        let seed = self.seed;
        for (i, ev) in self.h.events.iter().enumerate().skip(self.events_seen) {
            self.checker.on_event(i as u64, op, ev);
            match *ev {
                Event::Alloc { id, size, pool, .. } => {
                    self.pools.insert(id, pool);
                    self.active.0.increase(pool, 1);
                    self.active.1.increase(pool, size);
                }
                Event::FreeCompleted { id, size, .. } => {
                    let pool = self.pools.remove(&id).expect("completed free of a live block");
                    self.active.0.decrease(pool, 1);
                    self.active.1.decrease(pool, size);
                }
                _ => {}
            }
        }
        self.events_seen = self.h.events.len();
        let stats = self.h.stats();
        self.checker.on_stats(self.events_seen as u64, op, &stats);
        assert!(
            self.checker.violations().is_empty(),
            "seed {seed} op {op}: checker: {:#?}",
            self.checker.violations()
        );
        assert_eq!(
            (stats.active, stats.active_bytes),
            self.active,
            "seed {seed} op {op}: active statistics against the events"
        );
        let errors = stat_consistency_errors(&stats, &self.h.snapshot());
        assert!(errors.is_empty(), "seed {seed} op {op}: {errors:#?}");
        assert_eq!(
            self.h.alloc.total_allocated_memory(),
            stats.reserved_bytes.all.current as u64,
            "seed {seed} op {op}: total_allocated_memory vs reserved"
        );
        assert_eq!(
            self.h.dev.reserved_bytes(),
            self.h.alloc.total_allocated_memory(),
            "seed {seed} op {op}: device"
        );
        // With expandable segments the check uses the segment size but maps whole pages, so
        // PyTorch itself can end above the cap (docs/pytorch-caching-allocator.md §6); only cudaMalloc runs are held.
        self.expandable_seen |= self.h.alloc.config().expandable_segments;
        if let (Some(allowed), false) =
            (self.h.alloc.allowed_memory_maximum(), self.expandable_seen)
        {
            assert!(
                self.h.dev.reserved_bytes() <= allowed,
                "seed {seed} op {op}: fraction exceeded"
            );
        }
        let space = self.h.alloc.free_space();
        let inactive: u64 = self
            .h
            .snapshot()
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| !b.state.is_active())
            .map(|b| b.size)
            .max()
            .unwrap_or(0);
        assert_eq!(space.largest_free_block_bytes, inactive, "seed {seed} op {op}: free_space");
    }

    /// Free everything, complete everything, empty the cache: nothing may stay reserved.
    fn drain(&mut self, op: u64) {
        for id in std::mem::take(&mut self.live) {
            self.h.free(id);
        }
        for id in std::mem::take(&mut self.pending) {
            self.h.free_completed(id);
        }
        self.h.empty_cache();
        self.check(op);
        assert_eq!(
            self.h.stats().reserved_bytes.all.current,
            0,
            "seed {}: reserved after drain",
            self.seed
        );
        assert_eq!(self.h.dev.reserved_bytes(), 0);
    }
}

#[test]
fn random_programs_keep_pytorchs_invariants() {
    // Also makes sure the generator reaches the paths the invariants are meant to cover.
    let (mut ooms, mut retries, mut unmaps, mut frees) = (0, 0, 0, 0);
    for seed in 0..40 {
        let mut p = Program::new(seed);
        let ops = 400;
        for op in 0..ops {
            p.step(op);
        }
        let s = p.h.stats();
        ooms += s.num_ooms;
        retries += s.num_alloc_retries;
        frees += s.num_device_free;
        unmaps += p.h.segment_events().iter().filter(|e| e.0 == "segment_unmap").count();
        p.drain(ops);
    }
    assert!(
        ooms > 0 && retries > 0 && unmaps > 0 && frees > 0,
        "{ooms} {retries} {unmaps} {frees}"
    );
}
