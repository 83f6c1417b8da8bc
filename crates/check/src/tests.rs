use super::*;
use crate::ViolationKind as K;
use allocsim_core::{AllocId, OomInfo, Pool, StreamId, MIB};

const S: StreamId = StreamId(0);
const BASE: u64 = 0x7f00_0000_0000;

fn seg(addr: u64, size: u64) -> Event {
    Event::SegmentAlloc { addr, size, stream: S, pool: Pool::for_size(size) }
}
fn seg_free(addr: u64, size: u64) -> Event {
    Event::SegmentFree { addr, size, stream: S, pool: Pool::for_size(size) }
}
fn map(addr: u64, size: u64) -> Event {
    Event::SegmentMap { addr, size, stream: S, pool: Pool::Large }
}
fn unmap(addr: u64, size: u64) -> Event {
    Event::SegmentUnmap { addr, size, stream: S, pool: Pool::Large }
}
fn alloc(id: u64, addr: u64, size: u64, requested: u64) -> Event {
    Event::Alloc { id: AllocId(id), addr, size, requested, stream: S, pool: Pool::for_size(size) }
}
fn free_req(id: u64, addr: u64, size: u64, requested: u64) -> Event {
    Event::FreeRequested { id: AllocId(id), addr, size, requested }
}
fn free_done(id: u64, addr: u64, size: u64, requested: u64) -> Event {
    Event::FreeCompleted { id: AllocId(id), addr, size, requested }
}
fn oom(id: u64, size: u64) -> Event {
    Event::Oom { id: AllocId(id), size, stream: S, info: OomInfo::default() }
}

/// (event index, kind) of every violation in `events`, one op per event, stats unchecked.
fn run_with(cfg: CheckConfig, events: &[Event]) -> Vec<(u64, K)> {
    let mut c = Checker::new(CheckConfig { check_stats: false, ..cfg });
    for (i, e) in events.iter().enumerate() {
        c.on_event(i as u64, i as u64, e);
    }
    c.finish().violations.iter().map(|v| (v.event_index, v.kind)).collect()
}

fn run(events: &[Event]) -> Vec<(u64, K)> {
    run_with(CheckConfig::default(), events)
}

/// A valid run over whole segments and an expandable range: every rule is kept.
fn valid_events() -> Vec<Event> {
    let (m, big) = (BASE + (1 << 30), 20 * MIB);
    vec![
        seg(BASE, 2 * MIB),
        alloc(1, BASE, 512, 100),
        alloc(2, BASE + 512, 1024, 1024),
        free_req(1, BASE, 512, 100),
        free_done(1, BASE, 512, 100),
        alloc(3, BASE, 512, 512), // reuses the completed block's place
        map(m, big),
        map(m + big, big),
        alloc(4, m + big - 4096, 8192, 8000), // across two adjacent maps
        free_req(2, BASE + 512, 1024, 1024),
        oom(5, 60 * MIB),
        free_done(2, BASE + 512, 1024, 1024),
        unmap(m + 2 * MIB, 16 * MIB), // pages free of blocks, inside the first map
        free_req(4, m + big - 4096, 8192, 8000),
        free_done(4, m + big - 4096, 8192, 8000),
        unmap(m + 18 * MIB, 22 * MIB), // across both maps
        free_req(3, BASE, 512, 512),
        free_done(3, BASE, 512, 512),
        seg_free(BASE, 2 * MIB),
        unmap(m, 2 * MIB),
    ]
}

#[test]
fn a_valid_stream_has_no_violations() {
    assert_eq!(run(&valid_events()), vec![]);
}

#[test]
fn blocks_must_lie_in_a_live_segment() {
    let v = run(&[
        alloc(1, BASE, 512, 512),
        seg(BASE, 2 * MIB),
        alloc(2, BASE + 2 * MIB - 512, 1024, 1024),
        map(BASE + 2 * MIB, 2 * MIB), // adjacent to the segment, but a different kind of range
        free_req(2, BASE + 2 * MIB - 512, 1024, 1024),
        free_done(2, BASE + 2 * MIB - 512, 1024, 1024),
        alloc(3, BASE + 2 * MIB - 512, 1024, 1024),
    ]);
    assert_eq!(
        v,
        vec![(0, K::BlockOutsideSegment), (2, K::BlockOutsideSegment), (6, K::BlockOutsideSegment)]
    );
}

#[test]
fn live_blocks_must_not_overlap_until_the_free_completes() {
    let v = run(&[
        seg(BASE, 2 * MIB),
        alloc(1, BASE, 1024, 1024),
        alloc(2, BASE + 512, 1024, 1024),
        free_req(1, BASE, 1024, 1024),
        alloc(3, BASE, 512, 512), // still active: the free is pending
        free_done(1, BASE, 1024, 1024),
        alloc(4, BASE, 512, 512),
        free_req(2, BASE + 512, 1024, 1024), // the overlapping block frees without noise
        free_done(2, BASE + 512, 1024, 1024),
    ]);
    assert_eq!(v, vec![(2, K::BlockOverlap), (4, K::BlockOverlap)]);
}

#[test]
fn alignment_size_and_zero_sizes() {
    let bfc = CheckConfig { alignment_bytes: 256, ..CheckConfig::default() };
    let events = [seg(BASE, 2 * MIB), alloc(1, BASE + 256, 256, 256)];
    assert_eq!(run_with(bfc, &events), vec![]);
    assert_eq!(run(&events), vec![(1, K::Misaligned)]);
    let v = run(&[
        seg(BASE, 2 * MIB),
        alloc(1, BASE, 512, 513),
        alloc(2, BASE + 512, 0, 0),
        seg(BASE + 2 * MIB, 0),
        map(BASE + 4 * MIB, 0),
    ]);
    assert_eq!(
        v,
        vec![(1, K::BlockTooSmall), (2, K::ZeroSize), (3, K::ZeroSize), (4, K::ZeroSize)]
    );
}

#[test]
fn frees_must_name_a_live_allocation_as_allocated() {
    let v = run(&[
        seg(BASE, 2 * MIB),
        alloc(1, BASE, 512, 512),
        alloc(1, BASE + 512, 512, 512),
        free_req(9, BASE, 512, 512),
        free_done(1, BASE, 512, 512),
        alloc(2, BASE, 512, 400),
        free_req(2, BASE, 512, 512),
        free_req(2, BASE, 512, 400),
        free_done(2, BASE + 512, 512, 400),
        free_done(2, BASE, 512, 400),
    ]);
    assert_eq!(
        v,
        vec![
            (2, K::DuplicateAllocId),
            (3, K::UnknownFree),
            (4, K::CompletedBeforeRequested),
            (6, K::FreeMismatch),
            (7, K::DoubleFree),
            (8, K::FreeMismatch),
            (9, K::UnknownFree),
        ]
    );
}

#[test]
fn segments_must_be_empty_when_freed_or_unmapped() {
    let m = BASE + (1 << 30);
    let v = run(&[
        seg(BASE, 2 * MIB),
        alloc(1, BASE + 4096, 512, 512),
        seg_free(BASE, 2 * MIB),
        map(m, 4 * MIB),
        alloc(2, m + 3 * MIB, 512, 512),
        unmap(m, 2 * MIB), // the block is in the other page: fine
        unmap(m + 2 * MIB, 2 * MIB),
    ]);
    assert_eq!(v, vec![(2, K::SegmentFreedWithLiveBlock), (6, K::SegmentFreedWithLiveBlock)]);
}

#[test]
fn segments_and_mappings_must_not_overlap() {
    let v = run(&[
        seg(BASE, 20 * MIB),
        seg(BASE + 18 * MIB, 20 * MIB),
        map(BASE + 19 * MIB, 2 * MIB),
        map(BASE + 20 * MIB, 2 * MIB),
        map(BASE + 21 * MIB, 2 * MIB),
        seg(BASE + 22 * MIB, 2 * MIB),
        seg_free(BASE + 18 * MIB, 20 * MIB), // the rejected segment: no second report
    ]);
    assert_eq!(v, vec![(1, K::SegmentOverlap), (2, K::SegmentOverlap), (4, K::SegmentOverlap)]);
}

#[test]
fn frees_and_unmaps_must_name_live_ranges() {
    let v = run(&[
        seg(BASE, 20 * MIB),
        seg_free(BASE + 2 * MIB, 2 * MIB),
        seg_free(BASE, 2 * MIB),
        map(BASE + (1 << 30), 4 * MIB),
        unmap(BASE + (1 << 30) + 2 * MIB, 4 * MIB),
        unmap(BASE + (1 << 30), 0),
    ]);
    assert_eq!(
        v,
        vec![
            (1, K::UnknownSegment),
            (2, K::UnknownSegment),
            (4, K::UnknownSegment),
            (5, K::UnknownSegment)
        ]
    );
}

#[test]
fn reserved_memory_must_fit_the_device() {
    let small = CheckConfig::new(30 * MIB);
    let v = run_with(
        small,
        &[seg(BASE, 20 * MIB), map(BASE + (1 << 30), 8 * MIB), map(BASE + (2 << 30), 4 * MIB)],
    );
    assert_eq!(v, vec![(2, K::ReservedExceedsDevice)]);
}

#[test]
fn violations_are_capped_but_all_counted() {
    let cfg = CheckConfig { max_stored_violations: 3, ..CheckConfig::default() };
    let events: Vec<Event> = (0..10).map(|i| free_req(i, BASE, 512, 512)).collect();
    let mut c = Checker::new(cfg);
    for (i, e) in events.iter().enumerate() {
        c.on_event(i as u64, 0, e);
    }
    assert_eq!((c.violations().len(), c.total_violations()), (3, 10));
    let report = c.finish();
    assert!(!report.is_ok());
    assert!(report.to_string().contains("10 violations (the first 3 kept)"), "{report}");
    assert!(report.violations[2].to_string().starts_with("event 2 (op 0): unknown-free:"));
}

/// Runs events op by op, keeping PyTorch-style statistics the way a policy would.
struct StatsRun {
    checker: Checker,
    stats: MemoryStats,
    events: u64,
    op: u64,
}

impl StatsRun {
    fn new() -> Self {
        StatsRun {
            checker: Checker::new(CheckConfig::default()),
            stats: MemoryStats::default(),
            events: 0,
            op: 0,
        }
    }

    fn event(&mut self, e: Event) {
        let s = &mut self.stats;
        match e {
            Event::SegmentAlloc { size, pool, .. } | Event::SegmentMap { size, pool, .. } => {
                if matches!(e, Event::SegmentAlloc { .. }) {
                    s.segment.increase(pool, 1);
                }
                s.reserved_bytes.increase(pool, size);
                s.num_device_alloc += 1;
            }
            Event::SegmentFree { size, pool, .. } | Event::SegmentUnmap { size, pool, .. } => {
                if matches!(e, Event::SegmentFree { .. }) {
                    s.segment.decrease(pool, 1);
                }
                s.reserved_bytes.decrease(pool, size);
                s.num_device_free += 1;
            }
            Event::Alloc { size, requested, pool, .. } => {
                s.allocation.increase(pool, 1);
                s.allocated_bytes.increase(pool, size);
                s.active.increase(pool, 1);
                s.active_bytes.increase(pool, size);
                s.requested_bytes.increase(pool, requested);
            }
            Event::FreeRequested { size, .. } => {
                s.allocation.decrease(Pool::for_size(size), 1);
                s.allocated_bytes.decrease(Pool::for_size(size), size);
            }
            Event::FreeCompleted { size, requested, .. } => {
                s.active.decrease(Pool::for_size(size), 1);
                s.active_bytes.decrease(Pool::for_size(size), size);
                s.requested_bytes.decrease(Pool::for_size(size), requested);
            }
            Event::Oom { .. } => s.num_ooms += 1,
        }
        self.checker.on_event(self.events, self.op, &e);
        self.events += 1;
    }

    fn end_op(&mut self) {
        self.checker.on_stats(self.events, self.op, &self.stats);
        self.op += 1;
    }
}

#[test]
fn statistics_that_match_the_events_pass() {
    let mut r = StatsRun::new();
    for e in valid_events() {
        r.event(e);
        r.end_op();
    }
    let report = r.checker.finish();
    assert!(report.is_ok(), "{report}");
    assert_eq!((report.events_checked, report.stats_checked), (20, 20));
}

#[test]
fn a_wrong_statistic_is_reported_once_per_episode() {
    let mut r = StatsRun::new();
    r.event(seg(BASE, 2 * MIB));
    r.end_op();
    r.event(alloc(1, BASE, 512, 100));
    r.stats.requested_bytes.small_pool.current = 99; // the policy miscounts
    r.end_op();
    r.end_op(); // still wrong: no second report
    r.stats.requested_bytes.small_pool.current = 100;
    r.end_op();
    r.stats.num_device_alloc = 5;
    r.stats.reserved_bytes.large_pool.peak = -1;
    r.end_op();
    let v: Vec<(u64, u64, K, String)> = r
        .checker
        .finish()
        .violations
        .into_iter()
        .map(|v| (v.event_index, v.op_index, v.kind, v.message))
        .collect();
    let kinds: Vec<(u64, u64, K)> = v.iter().map(|x| (x.0, x.1, x.2)).collect();
    assert_eq!(
        kinds,
        vec![
            (2, 1, K::StatMismatch),
            (2, 1, K::StatInconsistent),
            (2, 4, K::StatInconsistent),
            (2, 4, K::StatMismatch),
        ]
    );
    assert_eq!(
        v[0].3,
        "requested_bytes.small_pool.current: events imply 100, allocator reports 99"
    );
    assert!(v[1].3.contains("allocated - freed == current"), "{}", v[1].3);
    assert!(v[2].3.contains("reserved_bytes.large_pool: expected peak >= current"), "{}", v[2].3);
    assert_eq!(v[3].3, "num_device_alloc: events imply 1, allocator reports 5");
}

#[test]
fn maps_count_as_reserved_but_not_as_segments() {
    let mut r = StatsRun::new();
    r.event(map(BASE, 20 * MIB));
    r.stats.segment.increase(Pool::Large, 1); // a policy counting maps as segments
    r.end_op();
    let v = r.checker.finish().violations;
    assert_eq!(v.len(), 2, "{v:?}"); // segment.all and segment.large_pool
    assert!(v.iter().all(|v| v.kind == K::StatMismatch && v.message.starts_with("segment.")));
}
