//! The statistics the events imply, and their comparison with what the allocator reports.
//!
//! Only the counters that events determine are compared (per pool, by the events' `pool`
//! fields): `allocation` and `allocated_bytes` live from `Alloc` to `FreeRequested`; `active`,
//! `active_bytes` and `requested_bytes` from `Alloc` to `FreeCompleted`; `reserved_bytes` from
//! `SegmentAlloc`/`SegmentMap` to `SegmentFree`/`SegmentUnmap`; `segment` from `SegmentAlloc`
//! to `SegmentFree` only (mappings never count, as in PyTorch); `num_ooms`,
//! `num_device_alloc`, `num_device_free` count events. `inactive_split*` and `oversize_*`
//! depend on policy internals (how blocks are split, `max_split_size`), so for them, as for
//! every stat, only self-consistency is checked: `peak >= current` and
//! `allocated - freed == current`.
//!
//! A stat that goes wrong usually stays wrong for the rest of the run, so each check reports
//! when it starts to fail and again only after it has agreed in between: one violation per
//! episode, not one per op.

use crate::Sink;
use crate::ViolationKind as K;
use allocsim_core::{MemoryStats, Pool, Stat, StatArray};

const POOLS: [&str; 3] = ["all", "small_pool", "large_pool"];
/// 9 stat arrays x 3 pools x 3 checks, 2 single stats x 2 checks, 3 counters.
const CHECKS: usize = 9 * 3 * 3 + 2 * 2 + 3;

/// Per pool: index 0 is `all`, 1 `small_pool`, 2 `large_pool`.
type PoolValues = [i64; 3];

#[derive(Debug)]
pub(crate) struct Implied {
    allocation: PoolValues,
    allocated_bytes: PoolValues,
    active: PoolValues,
    active_bytes: PoolValues,
    requested_bytes: PoolValues,
    reserved_bytes: PoolValues,
    segment: PoolValues,
    num_ooms: i64,
    num_device_alloc: i64,
    num_device_free: i64,
    /// Per check: failing when last checked (and so already reported).
    failing: [bool; CHECKS],
}

fn add(values: &mut PoolValues, pool: Pool, delta: i64) {
    values[0] += delta;
    values[if pool == Pool::Small { 1 } else { 2 }] += delta;
}

fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl Default for Implied {
    fn default() -> Self {
        Implied {
            allocation: [0; 3],
            allocated_bytes: [0; 3],
            active: [0; 3],
            active_bytes: [0; 3],
            requested_bytes: [0; 3],
            reserved_bytes: [0; 3],
            segment: [0; 3],
            num_ooms: 0,
            num_device_alloc: 0,
            num_device_free: 0,
            failing: [false; CHECKS],
        }
    }
}

impl Implied {
    pub(crate) fn alloc(&mut self, pool: Pool, size: u64, requested: u64) {
        add(&mut self.allocation, pool, 1);
        add(&mut self.allocated_bytes, pool, signed(size));
        add(&mut self.active, pool, 1);
        add(&mut self.active_bytes, pool, signed(size));
        add(&mut self.requested_bytes, pool, signed(requested));
    }

    pub(crate) fn free_requested(&mut self, pool: Pool, size: u64) {
        add(&mut self.allocation, pool, -1);
        add(&mut self.allocated_bytes, pool, -signed(size));
    }

    pub(crate) fn free_completed(&mut self, pool: Pool, size: u64, requested: u64) {
        add(&mut self.active, pool, -1);
        add(&mut self.active_bytes, pool, -signed(size));
        add(&mut self.requested_bytes, pool, -signed(requested));
    }

    /// A device reservation (+1) or release (-1); `whole` for segments, false for mappings.
    pub(crate) fn device(&mut self, pool: Pool, size: u64, sign: i64, whole: bool) {
        add(&mut self.reserved_bytes, pool, sign * signed(size));
        if whole {
            add(&mut self.segment, pool, sign);
        }
        if sign > 0 {
            self.num_device_alloc += 1;
        } else {
            self.num_device_free += 1;
        }
    }

    /// The counters of device calls and OOMs start where the allocator's do.
    pub(crate) fn start_counters(&mut self, stats: &MemoryStats) {
        self.num_ooms = stats.num_ooms;
        self.num_device_alloc = stats.num_device_alloc;
        self.num_device_free = stats.num_device_free;
    }

    /// A segment (`whole`) or mapped range alive when the run starts: reserved, but no device
    /// call of this run.
    pub(crate) fn start_segment(&mut self, pool: Pool, size: u64, whole: bool) {
        add(&mut self.reserved_bytes, pool, signed(size));
        if whole {
            add(&mut self.segment, pool, 1);
        }
    }

    pub(crate) fn oom(&mut self) {
        self.num_ooms += 1;
    }

    /// Compare `stats` with the events; report each check that starts failing.
    pub(crate) fn check(&mut self, sink: &mut Sink, stats: &MemoryStats) {
        let arrays: [(&str, &StatArray, Option<PoolValues>); 9] = [
            ("allocation", &stats.allocation, Some(self.allocation)),
            ("segment", &stats.segment, Some(self.segment)),
            ("active", &stats.active, Some(self.active)),
            ("inactive_split", &stats.inactive_split, None),
            ("allocated_bytes", &stats.allocated_bytes, Some(self.allocated_bytes)),
            ("reserved_bytes", &stats.reserved_bytes, Some(self.reserved_bytes)),
            ("active_bytes", &stats.active_bytes, Some(self.active_bytes)),
            ("inactive_split_bytes", &stats.inactive_split_bytes, None),
            ("requested_bytes", &stats.requested_bytes, Some(self.requested_bytes)),
        ];
        let mut slot = 0;
        for (name, array, implied) in arrays {
            for (p, stat) in
                [&array.all, &array.small_pool, &array.large_pool].into_iter().enumerate()
            {
                let key = || format!("{name}.{}", POOLS[p]);
                let expected = implied.map(|values| values[p]);
                self.check_stat(sink, &mut slot, &key, stat, expected);
            }
        }
        let singles = [
            ("oversize_allocations", &stats.oversize_allocations),
            ("oversize_segments", &stats.oversize_segments),
        ];
        for (name, stat) in singles {
            self.check_self_consistent(sink, &mut slot, &|| name.to_string(), stat);
        }
        let counters = [
            ("num_ooms", stats.num_ooms, self.num_ooms),
            ("num_device_alloc", stats.num_device_alloc, self.num_device_alloc),
            ("num_device_free", stats.num_device_free, self.num_device_free),
        ];
        for (name, reported, implied) in counters {
            let msg = || format!("{name}: events imply {implied}, allocator reports {reported}");
            self.expect(sink, &mut slot, reported == implied, K::StatMismatch, &msg);
        }
    }

    fn check_stat(
        &mut self,
        sink: &mut Sink,
        slot: &mut usize,
        key: &dyn Fn() -> String,
        stat: &Stat,
        expected: Option<i64>,
    ) {
        let ok = expected.is_none_or(|e| e == stat.current);
        let msg = || {
            let e = expected.unwrap_or_default();
            format!("{}.current: events imply {e}, allocator reports {}", key(), stat.current)
        };
        self.expect(sink, slot, ok, K::StatMismatch, &msg);
        self.check_self_consistent(sink, slot, key, stat);
    }

    fn check_self_consistent(
        &mut self,
        sink: &mut Sink,
        slot: &mut usize,
        key: &dyn Fn() -> String,
        stat: &Stat,
    ) {
        let (current, peak) = (stat.current, stat.peak);
        let msg =
            || format!("{}: expected peak >= current, peak {peak} < current {current}", key());
        self.expect(sink, slot, peak >= current, K::StatInconsistent, &msg);
        let net = stat.allocated - stat.freed;
        let msg = || {
            let (a, f) = (stat.allocated, stat.freed);
            format!("{}: expected allocated - freed == current, {a} - {f} != {current}", key())
        };
        self.expect(sink, slot, net == current, K::StatInconsistent, &msg);
    }

    fn expect(
        &mut self,
        sink: &mut Sink,
        slot: &mut usize,
        ok: bool,
        kind: K,
        msg: &dyn Fn() -> String,
    ) {
        let failing = &mut self.failing[*slot];
        *slot += 1;
        if !ok && !*failing {
            sink.report(kind, msg());
        }
        *failing = !ok;
    }
}
