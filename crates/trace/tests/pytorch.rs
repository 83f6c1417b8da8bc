//! PyTorch snapshot conversion on hand-built snapshots: the op/recorded mapping rules one by
//! one, the mid-run and multi-device tolerances, the sidecar, and every kind of bad input.

mod common;

use allocsim_core::{
    AllocId, BlockState, MemPoolId, Op, PoolAction, RecordedEvent, RecordedKind as K, StreamId,
    Trace,
};
use allocsim_trace::pickle::{self, Value};
use allocsim_trace::{pytorch, read_trace, read_trace_with, ReadOptions, TraceError};
use common::{entry, snapshot, write_pickle};

const MAX: StreamId = StreamId(u64::MAX);

/// The snapshot's trace, read whole; checked against the trace `allocsim replay` reads
/// ([`slim_read_agrees`]).
fn read(entries: Vec<Value>, segments: Vec<Value>) -> Trace {
    let dir = common::scratch("pt");
    let path = write_pickle(&dir, "t.pickle", &snapshot(entries, segments, "conf"));
    let trace = read_trace(&path).unwrap_or_else(|e| panic!("{e}"));
    slim_read_agrees(&path, &trace);
    trace
}

/// Read without stacks, times and the program's recorded events (`ReadOptions::events`),
/// `path` gives the ops, state at the start and warnings of `whole`, and of its recording
/// every device event and OOM, and the count; every event where the private pools' inference
/// needs them. Returns how many bytes of the file that read took.
fn slim_read_agrees(path: &std::path::Path, whole: &Trace) -> u64 {
    let bytes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let slim = ReadOptions {
        stacks: false,
        times: false,
        events: false,
        // Packed from the third op on: the replay is handed ops sent plain, then packed.
        packed_ops: Some(2),
        bytes_read: Some(bytes.clone()),
        ..ReadOptions::default()
    };
    let read = pytorch::read_snapshot_replaying(path, &slim, |o| o.ops.collect::<Vec<_>>());
    let read = read.unwrap();
    let ops = read.packed.as_ref().map_or_else(|| read.trace.ops.clone(), |p| p.to_vec());
    if let Some(fed) = &read.replay {
        assert_eq!(fed, &whole.ops, "the replay beside the reading got every op");
    }
    let t = read.trace;
    assert_eq!((&ops, &t.start, &t.warnings), (&whole.ops, &whole.start, &whole.warnings));
    assert_eq!(read.recorded_len, whole.recorded.len() as u64);
    let pools = whole.ops.iter().any(|op| matches!(op, Op::Pool { .. }));
    if pools {
        assert_eq!(t.recorded, whole.recorded, "every event, for the pools' inference");
    } else {
        let device = |r: &&RecordedEvent| r.kind.is_segment_event() || r.kind == K::Oom;
        let kept: Vec<_> = t.recorded.iter().filter(device).collect();
        assert_eq!(kept, whole.recorded.iter().filter(device).collect::<Vec<_>>());
        let program = [K::Alloc, K::FreeRequested];
        assert!(t.recorded.iter().all(|r| !program.contains(&r.kind)), "{:?}", t.recorded);
    }
    packed_read_agrees(path, whole);
    bytes.load(std::sync::atomic::Ordering::Relaxed)
}

/// Read with the ops packed and the events counted (what `allocsim info` and `capacity` read,
/// `ReadOptions::packed_ops`), `path` gives the ops, distinct stacks and warnings of `whole`,
/// and its recording's count of each kind of event.
fn packed_read_agrees(path: &std::path::Path, whole: &Trace) {
    let opts = ReadOptions {
        op_stacks: false,
        times: false,
        events: false,
        // Packed from the third op on: the ops before are sent plain.
        packed_ops: Some(2),
        ..ReadOptions::default()
    };
    let read = pytorch::read_snapshot_packed(path, &opts).unwrap();
    let ops = match &read.packed {
        Some(packed) => {
            assert!(read.trace.ops.is_empty());
            packed.to_vec()
        }
        None => read.trace.ops.clone(),
    };
    assert_eq!(ops, whole.ops);
    assert_eq!(read.ops_len(), whole.ops.len());
    assert_eq!((&read.trace.stacks, &read.trace.warnings), (&whole.stacks, &whole.warnings));
    assert!(read.trace.op_stacks.is_empty() && read.trace.op_times.is_empty());
    let mut counts = std::collections::BTreeMap::new();
    for r in &whole.recorded {
        *counts.entry(r.kind.action()).or_insert(0u64) += 1;
    }
    assert_eq!(read.recorded_counts, counts);
}

fn read_err(root: &Value) -> String {
    let dir = common::scratch("pt-err");
    let path = write_pickle(&dir, "bad.pickle", root);
    let e = read_trace(&path).expect_err("must fail");
    let msg = e.to_string();
    assert!(msg.contains("bad.pickle"), "names the file: {msg}");
    msg
}

fn alloc(id: u64, size: u64, stream: u64) -> Op {
    Op::Alloc { id: AllocId(id), size, stream: StreamId(stream) }
}

fn rec(op: u64, kind: K, addr: u64, size: u64) -> RecordedEvent {
    RecordedEvent { op, kind, addr, size, stream: StreamId(0) }
}

#[test]
fn alloc_and_direct_free_share_one_op() {
    let t = read(
        vec![
            entry("segment_alloc", 0x1000, 2 << 20, 0),
            entry("alloc", 0x1000, 100, 0),
            entry("free_requested", 0x1000, 100, 0),
            entry("free_completed", 0x1000, 100, 0),
        ],
        vec![],
    );
    assert_eq!(t.ops, vec![alloc(0, 100, 0), Op::FreeRequested { id: AllocId(0) }]);
    assert_eq!(
        t.recorded,
        vec![
            rec(0, K::SegmentAlloc, 0x1000, 2 << 20),
            rec(0, K::Alloc, 0x1000, 100),
            rec(1, K::FreeRequested, 0x1000, 100),
            rec(1, K::FreeCompleted, 0x1000, 100),
        ]
    );
    assert_eq!(t.meta.source_format, "pytorch-snapshot");
    assert_eq!(t.meta.alloc_conf.as_deref(), Some("conf"));
    assert!(t.warnings.is_empty());
}

#[test]
fn deferred_free_gets_record_stream_and_free_completed() {
    let t = read(
        vec![
            entry("alloc", 0xa00, 10, 0),
            entry("alloc", 0xb00, 20, 0),
            entry("free_requested", 0xa00, 10, 0),
            entry("alloc", 0xc00, 30, 0),
            entry("free_completed", 0xa00, 10, 0),
        ],
        vec![],
    );
    let a = AllocId(0);
    assert_eq!(
        t.ops,
        vec![
            alloc(0, 10, 0),
            alloc(1, 20, 0),
            Op::RecordStream { id: a, stream: MAX },
            Op::FreeRequested { id: a },
            alloc(2, 30, 0),
            Op::FreeCompleted { id: a },
        ]
    );
    let kinds: Vec<(u64, K)> = t.recorded.iter().map(|r| (r.op, r.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            (0, K::Alloc),
            (1, K::Alloc),
            (3, K::FreeRequested),
            (4, K::Alloc),
            (5, K::FreeCompleted)
        ]
    );
    assert_eq!(pytorch::UNKNOWN_STREAM, MAX);
}

/// A deferred completion that empties every pending free right before an `oom` (or in an
/// attempt that frees segments) was `synchronize_and_free_events` in that allocation's release
/// path: it is recorded on the allocation's op and is no op of its own, so that a replay's
/// lookup still finds the block pending, as PyTorch's did. One before a plain `alloc` was
/// polled at the start of the `malloc`: an `Op::FreeCompleted` before it.
#[test]
fn completions_in_the_release_path_belong_to_the_allocation() {
    let t = read(
        vec![
            entry("alloc", 0xa00, 10, 0),
            entry("free_requested", 0xa00, 10, 0),
            entry("alloc", 0xc00, 30, 0),
            entry("free_completed", 0xa00, 10, 0),
            entry("oom", 0, 40, 0),
            entry("alloc", 0xb00, 20, 0),
            entry("free_requested", 0xb00, 20, 0),
            entry("free_completed", 0xb00, 20, 0),
            entry("alloc", 0xd00, 50, 0),
            entry("free_requested", 0xd00, 50, 0),
            entry("alloc", 0xe00, 60, 0),
            entry("free_completed", 0xd00, 50, 0),
            entry("alloc", 0xd00, 50, 0),
        ],
        vec![],
    );
    let (a, d) = (AllocId(0), AllocId(4));
    assert_eq!(
        t.ops,
        vec![
            alloc(0, 10, 0),
            Op::RecordStream { id: a, stream: MAX },
            Op::FreeRequested { id: a },
            alloc(1, 30, 0),
            alloc(2, 40, 0),
            alloc(3, 20, 0),
            Op::FreeRequested { id: AllocId(3) },
            alloc(4, 50, 0),
            Op::RecordStream { id: d, stream: MAX },
            Op::FreeRequested { id: d },
            alloc(5, 60, 0),
            Op::FreeCompleted { id: d },
            alloc(6, 50, 0),
        ]
    );
    let kinds: Vec<(u64, K)> = t.recorded.iter().map(|r| (r.op, r.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            (0, K::Alloc),
            (2, K::FreeRequested),
            (3, K::Alloc),
            (4, K::FreeCompleted),
            (4, K::Oom),
            (5, K::Alloc),
            (6, K::FreeRequested),
            (6, K::FreeCompleted),
            (7, K::Alloc),
            (9, K::FreeRequested),
            (10, K::Alloc),
            (11, K::FreeCompleted),
            (12, K::Alloc),
        ]
    );
}

#[test]
fn a_free_never_completed_still_gets_record_stream() {
    let t = read(
        vec![
            entry("alloc", 0xb00, 10, 0),
            entry("free_requested", 0xb00, 10, 0),
            entry("free_completed", 0xb00, 10, 0),
            entry("alloc", 0xa00, 10, 0),
            entry("free_requested", 0xa00, 10, 0),
        ],
        vec![],
    );
    assert_eq!(
        t.ops[2..],
        [
            alloc(1, 10, 0),
            Op::RecordStream { id: AllocId(1), stream: MAX },
            Op::FreeRequested { id: AllocId(1) }
        ]
    );
}

#[test]
fn oom_is_a_failed_alloc_with_the_device_frees_before_it() {
    let t = read(
        vec![
            entry("segment_free", 0x5000, 4 << 20, 0),
            entry("segment_free", 0x9000, 2 << 20, 0),
            entry("oom", 123_456, 8 << 20, 7),
            // The failed id never becomes live: a later block at any address is a new id.
            entry("alloc", 0x5000, 64, 0),
        ],
        vec![],
    );
    assert_eq!(t.ops, vec![alloc(0, 8 << 20, 7), alloc(1, 64, 0)]);
    assert_eq!(t.recorded[0], rec(0, K::SegmentFree, 0x5000, 4 << 20));
    assert_eq!(t.recorded[1].op, 0);
    let oom = t.recorded[2];
    assert_eq!(
        (oom.op, oom.kind, oom.addr, oom.size, oom.stream),
        (0, K::Oom, 123_456, 8 << 20, StreamId(7))
    );
    assert_eq!(t.recorded[3].op, 1);
}

#[test]
fn retry_path_device_events_belong_to_the_allocation() {
    let t = read(
        vec![
            entry("segment_free", 0x5000, 4 << 20, 0),
            entry("segment_alloc", 0x7000, 8 << 20, 0),
            entry("alloc", 0x7000, 8 << 20, 0),
        ],
        vec![],
    );
    assert_eq!(t.ops.len(), 1);
    assert!(t.recorded.iter().all(|r| r.op == 0));
    assert!(t.warnings.is_empty());
}

#[test]
fn unexplained_device_frees_become_empty_cache() {
    let t = read(
        vec![
            entry("alloc", 0xa00, 10, 0),
            entry("alloc", 0xb00, 20, 0),
            entry("free_requested", 0xa00, 10, 0),
            entry("free_completed", 0xa00, 10, 0),
            entry("segment_free", 0xa00, 2 << 20, 0),
            entry("segment_free", 0xc00, 2 << 20, 0),
            entry("free_requested", 0xb00, 20, 0),
            entry("free_completed", 0xb00, 20, 0),
            entry("segment_unmap", 0xb00, 2 << 20, 0),
        ],
        vec![],
    );
    assert_eq!(
        t.ops,
        vec![
            alloc(0, 10, 0),
            alloc(1, 20, 0),
            Op::FreeRequested { id: AllocId(0) },
            Op::EmptyCache,
            Op::FreeRequested { id: AllocId(1) },
            Op::EmptyCache,
        ]
    );
    let tags: Vec<u64> = t.recorded.iter().map(|r| r.op).collect();
    assert_eq!(tags, vec![0, 1, 2, 2, 3, 3, 4, 4, 5]);
    assert!(
        t.warnings.iter().any(|w| w.contains("2 empty_cache ops were inferred")),
        "{:?}",
        t.warnings
    );
}

/// Found by the `writers` fuzz target: the streamed reader took the stacks its reading
/// thread interned before it adopted the one of the `empty_cache` inferred at the very end,
/// so that op's stack was no stack of the trace (and a debug build panicked). Both readers
/// now give the same stacks.
#[test]
fn a_final_inferred_empty_cache_keeps_its_own_stack() {
    let with_frames = |e: Value, name: &str| {
        let Value::Dict(pairs) = e else { unreachable!() };
        let mut pairs = (*pairs).clone();
        let frame = Value::str_dict([
            ("filename", Value::str("f.py")),
            ("name", Value::str(name)),
            ("line", Value::Int(1)),
        ]);
        pairs.push((Value::str("frames"), Value::list(vec![frame])));
        Value::dict(pairs)
    };
    let entries = vec![
        with_frames(entry("alloc", 0xa00, 10, 0), "a"),
        with_frames(entry("free_requested", 0xa00, 10, 0), "a"),
        with_frames(entry("free_completed", 0xa00, 10, 0), "a"),
        with_frames(entry("segment_free", 0xa00, 2 << 20, 0), "only_at_the_end"),
    ];
    let dir = common::scratch("pt-final-run");
    let path = write_pickle(&dir, "t.pickle", &snapshot(entries, vec![], ""));
    let streamed = read_trace(&path).unwrap();
    let generic = read_trace_with(&path, &ReadOptions { streaming: false, ..Default::default() });
    let generic = generic.unwrap();
    assert_eq!(streamed.ops.last(), Some(&Op::EmptyCache));
    let names = |t: &Trace| -> Vec<String> {
        t.op_stacks.iter().map(|&(_, s)| t.stacks[s as usize].frames[0].name.clone()).collect()
    };
    assert_eq!(names(&generic), ["a", "a", "only_at_the_end"]);
    assert_eq!(names(&streamed), names(&generic));
}

/// An inferred `empty_cache` takes the time of its run's first device free, also in a trace
/// without stacks.
#[test]
fn an_inferred_empty_cache_has_its_first_device_free_time() {
    let entries = [
        ("alloc", 0xa00, 10),
        ("free_requested", 0xa00, 10),
        ("free_completed", 0xa00, 10),
        ("segment_free", 0xa00, 2 << 20),
        ("segment_free", 0xc00, 2 << 20),
        ("alloc", 0xd00, 30),
    ];
    let timed = entries.iter().enumerate().map(|(i, &(action, addr, size))| {
        let Value::Dict(pairs) = entry(action, addr, size, 0) else { unreachable!() };
        let mut pairs = (*pairs).clone();
        pairs.push((Value::str("time_us"), Value::Int(1000 + i as i64)));
        Value::dict(pairs)
    });
    let t = read(timed.collect(), vec![]);
    assert_eq!(t.ops[2], Op::EmptyCache);
    assert_eq!(t.op_times, vec![(0, 1000), (1, 1001), (2, 1003), (3, 1005)]);
}

#[test]
fn snapshot_entries_are_skipped() {
    let t = read(
        vec![
            entry("alloc", 0xa00, 10, 0),
            entry("snapshot", 0, 10, 0),
            entry("free_requested", 0xa00, 10, 0),
            entry("free_completed", 0xa00, 10, 0),
        ],
        vec![],
    );
    // The snapshot entry does not separate a free from its completion.
    assert_eq!(t.ops, vec![alloc(0, 10, 0), Op::FreeRequested { id: AllocId(0) }]);
    assert_eq!(t.recorded.len(), 3);
}

#[test]
fn history_started_mid_run_starts_from_the_reconstructed_state() {
    const MIB: i64 = 1 << 20;
    let (small, large) = (0x10000, 0x2000_0000);
    let t = read(
        vec![
            // Allocated from the free block after the large block alive at the start: that
            // block ends here (3 MiB requested, 3.5 MiB with the remainder left unsplit).
            entry("alloc", large + 7 * MIB / 2, 2 * MIB, 0),
            // Freed without being allocated in the history.
            entry("free_requested", large, 3 * MIB, 0),
            entry("free_completed", large, 3 * MIB, 0),
            // Its free was requested before the history: only the completion is here.
            entry("free_completed", small + 0x200, 32, 5),
            entry("free_requested", large + 7 * MIB / 2, 2 * MIB, 0),
            entry("free_completed", large + 7 * MIB / 2, 2 * MIB, 0),
            // A segment the history never reserved, freed by an empty_cache before an alloc.
            entry("segment_free", large, 20 * MIB, 0),
            entry("alloc", small + 0x400, 10, 5),
        ],
        vec![common::segment(
            small,
            5,
            vec![
                common::block(small, 512, 500, "active_allocated"),
                common::block(small + 0x200, 512, 32, "inactive"),
                common::block(small + 0x400, 512, 10, "active_allocated"),
                common::block(small + 0x600, 2 * MIB - 0x600, 0, "inactive"),
            ],
        )],
    );
    assert_eq!(
        t.ops,
        vec![
            alloc(3, 2 << 20, 0),
            Op::FreeRequested { id: AllocId(0) },
            Op::FreeCompleted { id: AllocId(1) },
            Op::FreeRequested { id: AllocId(3) },
            Op::EmptyCache,
            alloc(4, 10, 5),
        ]
    );
    let start = t.start.as_ref().expect("a state at the start");
    let layout: Vec<Vec<(u64, u64, u64, BlockState)>> = start
        .segments
        .iter()
        .map(|s| s.blocks.iter().map(|b| (b.address, b.size, b.requested_size, b.state)).collect())
        .collect();
    let (small, large, mib) = (small as u64, large as u64, MIB as u64);
    assert_eq!(
        layout,
        vec![
            vec![
                (small, 512, 500, BlockState::ActiveAllocated),
                (small + 0x200, 512, 32, BlockState::ActivePendingFree),
                (small + 0x400, 2 * mib - 0x400, 0, BlockState::Inactive),
            ],
            vec![
                (large, 7 * mib / 2, 3 * mib, BlockState::ActiveAllocated),
                (large + 7 * mib / 2, 33 * mib / 2, 0, BlockState::Inactive),
            ],
        ]
    );
    assert_eq!(start.segments[0].pool, allocsim_core::Pool::Small);
    assert_eq!(start.segments[1].pool, allocsim_core::Pool::Large);
    assert_eq!(
        start.ids,
        vec![(small, AllocId(2)), (small + 0x200, AllocId(1)), (large, AllocId(0))]
    );
    assert!(t.warnings.iter().any(|w| w.contains("starts mid-run")), "{:?}", t.warnings);
}

#[test]
fn blocks_alive_at_the_end_and_allocated_in_the_history_need_nothing() {
    let t = read(
        vec![entry("alloc", 0x10000, 500, 0)],
        vec![common::segment(
            0x10000,
            0,
            vec![common::block(0x10000, 512, 500, "active_allocated")],
        )],
    );
    assert_eq!(t.ops, vec![alloc(0, 500, 0)]);
    assert!(t.warnings.is_empty());
}

/// A snapshot whose `device_traces` holds these lists, one per GPU, each of allocations of
/// 10 bytes at the given addresses.
fn several_devices(addrs: &[&[i64]]) -> Value {
    let mut root = snapshot(vec![], vec![], "");
    let Value::Dict(pairs) = &mut root else { panic!() };
    let pairs = std::rc::Rc::get_mut(pairs).unwrap();
    let lists =
        addrs.iter().map(|a| Value::list(a.iter().map(|&a| entry("alloc", a, 10, 0)).collect()));
    pairs[1].1 = Value::list(lists.collect());
    root
}

#[test]
fn the_device_with_a_trace_is_read() {
    let dir = common::scratch("devices");
    let only_1 = write_pickle(&dir, "one.pickle", &several_devices(&[&[], &[0xa00, 0xc00]]));
    let t = read_trace(&only_1).unwrap();
    assert_eq!(t.ops.len(), 2, "device 1's trace");
    assert!(t.warnings[0].contains("device 1"), "{:?}", t.warnings);

    let both = write_pickle(&dir, "both.pickle", &several_devices(&[&[0xa00], &[], &[0xb00]]));
    let e = read_trace(&both).expect_err("two devices have traces").to_string();
    assert!(
        e.contains("both.pickle") && e.contains("[0, 2]") && e.contains("--cuda-device"),
        "{e}"
    );
    let pick =
        |d| read_trace_with(&both, &ReadOptions { cuda_device: Some(d), ..Default::default() });
    for d in [0, 2] {
        let t = pick(d).unwrap();
        assert_eq!(t.ops.len(), 1);
        assert_eq!(t.recorded[0].addr, if d == 0 { 0xa00 } else { 0xb00 });
    }
    let e = pick(1).expect_err("device 1 is empty").to_string();
    assert!(e.contains("device 1 has no trace entries") && e.contains("[0, 2]"), "{e}");
    // The streaming reader and the generic one agree.
    let generic = ReadOptions { streaming: false, cuda_device: Some(2), ..Default::default() };
    common::assert_same(&pick(2).unwrap(), &read_trace_with(&both, &generic).unwrap());
}

#[test]
fn stacks_are_deduplicated() {
    let frames = |line: i64| {
        Value::list(vec![Value::str_dict([
            ("name", Value::str("f")),
            ("filename", Value::str("a.py")),
            ("line", Value::Int(line)),
        ])])
    };
    let with = |e: Value, f: Value| {
        let Value::Dict(p) = e else { panic!() };
        let mut p = (*p).clone();
        p.push((Value::str("frames"), f));
        Value::dict(p)
    };
    let shared = frames(3);
    let t = read(
        vec![
            with(entry("alloc", 0xa00, 10, 0), shared.clone()),
            with(entry("alloc", 0xb00, 10, 0), shared),
            // Equal content, another object: still one stack.
            with(entry("alloc", 0xc00, 10, 0), frames(3)),
            with(entry("alloc", 0xd00, 10, 0), frames(4)),
            with(entry("alloc", 0xe00, 10, 0), Value::list(vec![])),
        ],
        vec![],
    );
    assert_eq!(t.stacks.len(), 2);
    assert_eq!(t.op_stacks, vec![(0, 0), (1, 0), (2, 0), (3, 1)]);
    assert_eq!(t.stacks[1].frames[0].line, 4);
    let dir = common::scratch("nostacks");
    let path = write_pickle(
        &dir,
        "t.pickle",
        &snapshot(vec![with(entry("alloc", 1, 1, 0), frames(1))], vec![], ""),
    );
    let t =
        read_trace_with(&path, &ReadOptions { stacks: false, ..ReadOptions::default() }).unwrap();
    assert!(t.stacks.is_empty() && t.op_stacks.is_empty());
}

/// Issue 49 item 4: a recording of a later PyTorch reads. Its sidecar's `meta.torch` is kept,
/// and keys the reader does not know, at every level a snapshot has, are passed over (the
/// names here stand for any a later release adds: none of 2.12-2.13's release notes names one).
#[test]
fn a_later_releases_snapshot_and_sidecar_read() {
    let dir = common::scratch("later-release");
    let with_extra = |v: Value, extra: &str| {
        let Value::Dict(pairs) = v else { panic!("a dict") };
        let mut pairs = (*pairs).clone();
        pairs.push((Value::str(extra), Value::list(vec![Value::Int(1)])));
        Value::dict(pairs)
    };
    let plain = snapshot(
        vec![entry("segment_alloc", 0x7000_0000, 2 << 20, 0), entry("alloc", 0x7000_0000, 512, 0)],
        vec![],
        "",
    );
    let extended = {
        let e1 = with_extra(entry("segment_alloc", 0x7000_0000, 2 << 20, 0), "new_entry_key");
        let e2 = with_extra(entry("alloc", 0x7000_0000, 512, 0), "new_entry_key");
        let seg = with_extra(
            common::segment(
                0x7000_0000,
                0,
                vec![
                    with_extra(
                        common::block(0x7000_0000, 512, 512, "active_allocated"),
                        "new_block_key",
                    ),
                    common::block(0x7000_0200, (2 << 20) - 512, 0, "inactive"),
                ],
            ),
            "new_segment_key",
        );
        with_extra(snapshot(vec![e1, e2], vec![seg], ""), "new_top_level_key")
    };
    let a = read_trace(write_pickle(&dir, "plain.pickle", &plain)).unwrap();
    let path = write_pickle(&dir, "later.pickle", &extended);
    std::fs::write(
        dir.join("later.json"),
        r#"{"meta": {"torch": "2.13.0+cu130", "total_memory": 1000},
            "memory_stats": {"num_oom_rejections": 0, "num_ooms": 0}}"#,
    )
    .unwrap();
    let b = read_trace(&path).unwrap();
    assert_eq!(a.ops, b.ops);
    assert_eq!(a.recorded, b.recorded);
    assert_eq!(b.meta.recorded_with.as_deref(), Some("2.13.0+cu130"));
    assert_eq!(
        b.meta.expected_stats,
        Some(vec![("num_oom_rejections".into(), 0), ("num_ooms".into(), 0)])
    );
    assert_eq!(a.meta.recorded_with, None);

    std::fs::write(dir.join("later.json"), r#"{"meta": {"torch": 2.13}}"#).unwrap();
    let e = read_trace(&path).unwrap_err().to_string();
    assert!(e.contains("meta.torch") && e.contains("a version string"), "{e}");
}

#[test]
fn sidecar_fills_meta_and_wins_on_alloc_conf() {
    let dir = common::scratch("sidecar");
    let path = write_pickle(&dir, "run.pickle", &snapshot(vec![], vec![], "from-pickle"));
    std::fs::write(
        dir.join("run.json"),
        r#"{"meta": {"alloc_conf": "from-sidecar", "memory_fraction": 0.5, "total_memory": 1000,
            "free_at_start": 900, "gpu": "x"}, "memory_stats": {"b.x": 2, "a.y": -1}}"#,
    )
    .unwrap();
    let t = read_trace(&path).unwrap();
    assert_eq!(t.meta.alloc_conf.as_deref(), Some("from-sidecar"));
    assert_eq!(t.meta.memory_fraction, Some(0.5));
    assert_eq!(t.meta.device_total_bytes, Some(1000));
    assert_eq!(t.meta.device_free_bytes, Some(900));
    assert_eq!(t.meta.expected_stats, Some(vec![("a.y".into(), -1), ("b.x".into(), 2)]));
    let t = read_trace_with(&path, &ReadOptions::without_sidecar()).unwrap();
    assert_eq!(t.meta.alloc_conf.as_deref(), Some("from-pickle"));
    assert_eq!(t.meta.expected_stats, None);

    for (meta, place) in [
        (r#"{"total_memory": "lots"}"#, "meta.total_memory"),
        (r#"{"outside_profile": [[1, 2], [3]]}"#, "meta.outside_profile"),
        (r#"{"outside_profile": [[1, -2]]}"#, "meta.outside_profile"),
    ] {
        std::fs::write(dir.join("run.json"), format!(r#"{{"meta": {meta}}}"#)).unwrap();
        let e = read_trace(&path).unwrap_err();
        assert!(matches!(e, TraceError::Sidecar { .. }));
        assert!(e.to_string().contains("run.json") && e.to_string().contains(place), "{e}");
    }
    assert_eq!(pytorch::sidecar_path(&dir.join("x.pickle.gz")), Some(dir.join("x.json")));
}

#[test]
fn gzip_is_told_by_content_not_name() {
    let dir = common::scratch("gz");
    let bytes = pickle::to_vec(&snapshot(vec![entry("alloc", 1, 1, 0)], vec![], "")).unwrap();
    let path = dir.join("really-gzipped.pickle");
    std::fs::write(&path, common::gzip(&bytes)).unwrap();
    assert_eq!(read_trace(&path).unwrap().ops.len(), 1);
    let path = dir.join("no-extension");
    std::fs::write(&path, common::gzip(&bytes)).unwrap();
    assert_eq!(read_trace(&path).unwrap().ops.len(), 1);
}

#[test]
fn truncated_gzip_is_an_error() {
    let dir = common::scratch("gz-trunc");
    let bytes = pickle::to_vec(&snapshot(vec![entry("alloc", 1, 1, 0); 200], vec![], "")).unwrap();
    let gz = common::gzip(&bytes);
    // Cut in the middle of the data, and cut only the trailer (the pickle itself is whole).
    for cut in [gz.len() / 2, gz.len() - 4] {
        let path = dir.join("t.pickle.gz");
        std::fs::write(&path, &gz[..cut]).unwrap();
        let e = read_trace(&path).expect_err("truncated gzip");
        assert!(matches!(e, TraceError::Pickle { .. }), "{e}");
        assert!(e.to_string().contains("t.pickle.gz"), "{e}");
    }
}

#[test]
fn empty_file_and_not_a_pickle() {
    let dir = common::scratch("empty");
    let path = dir.join("e.pickle");
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(read_trace(&path), Err(TraceError::Empty { .. })));
    std::fs::write(&path, b"hello, world").unwrap();
    let e = read_trace(&path).unwrap_err();
    assert!(e.to_string().contains("not a pickle"), "{e}");
    std::fs::write(&path, common::gzip(b"")).unwrap();
    let e = read_trace(&path).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
}

#[test]
fn malicious_pickle_file_is_refused() {
    let dir = common::scratch("evil");
    let path = dir.join("evil.pickle.gz");
    let evil = b"\x80\x04\x95\x22\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\
                 \x93\x94\x8c\x07echo hi\x94\x85\x94R\x94.";
    std::fs::write(&path, common::gzip(evil)).unwrap();
    let msg = read_trace(&path).unwrap_err().to_string();
    assert!(
        msg.contains("evil.pickle.gz") && msg.contains("byte 28") && msg.contains("STACK_GLOBAL"),
        "{msg}"
    );
}

#[test]
fn unknown_action_names_the_entry() {
    let msg =
        read_err(&snapshot(vec![entry("alloc", 1, 1, 0), entry("bogus", 1, 1, 0)], vec![], ""));
    assert!(msg.contains("device_traces[0][1].action") && msg.contains("bogus"), "{msg}");
}

#[test]
fn wrong_types_name_the_entry_and_field() {
    let bad_size = Value::str_dict([
        ("action", Value::str("alloc")),
        ("addr", Value::Int(1)),
        ("size", Value::str("big")),
        ("stream", Value::Int(0)),
    ]);
    let msg = read_err(&snapshot(vec![entry("alloc", 2, 1, 0), bad_size], vec![], ""));
    assert!(msg.contains("device_traces[0][1].size") && msg.contains("expected an int"), "{msg}");

    let msg = read_err(&snapshot(vec![Value::list(vec![])], vec![], ""));
    assert!(msg.contains("device_traces[0][0]") && msg.contains("expected a dict"), "{msg}");

    // Issue 50: a None read "expected an int, got None None".
    let none_size = Value::str_dict([
        ("action", Value::str("alloc")),
        ("addr", Value::Int(1)),
        ("size", Value::None),
        ("stream", Value::Int(0)),
    ]);
    let msg = read_err(&snapshot(vec![none_size], vec![], ""));
    assert!(msg.ends_with("device_traces[0][0].size: expected an int, got None"), "{msg}");

    let msg = read_err(&Value::str_dict([("device_traces", Value::Int(3))]));
    assert!(msg.contains("device_traces") && msg.contains("expected a list"), "{msg}");

    let msg = read_err(&Value::list(vec![]));
    assert!(msg.contains("top level"), "{msg}");

    let msg = read_err(&Value::str_dict([("segments", Value::list(vec![]))]));
    assert!(msg.contains("device_traces") && msg.contains("missing"), "{msg}");

    let no_addr = Value::str_dict([("action", Value::str("alloc")), ("size", Value::Int(1))]);
    let msg = read_err(&snapshot(vec![no_addr], vec![], ""));
    assert!(msg.contains("device_traces[0][0].addr: missing"), "{msg}");

    let seg = Value::str_dict([("blocks", Value::list(vec![Value::Int(1)]))]);
    let msg = read_err(&snapshot(vec![], vec![seg], ""));
    assert!(msg.contains("segments[0].blocks[0]"), "{msg}");
}

/// Issue 50: a LONG1 of 9 bytes in [2^63, 2^64) read as a negative i64, and `time_us` = -1
/// was taken. Negative times are refused, however written.
#[test]
fn negative_times_are_errors() {
    let with_time = |time: Value| {
        let Value::Dict(pairs) = entry("alloc", 0xa00, 10, 0) else { unreachable!() };
        let mut pairs = (*pairs).clone();
        pairs.push((Value::str("time_us"), time));
        Value::dict(pairs)
    };
    // 2^64 - 1 as CPython pickles it: LONG1, 9 bytes, the last 0.
    let mut bytes =
        pickle::to_vec(&snapshot(vec![with_time(Value::Int(0x0102_0304))], vec![], "")).unwrap();
    let time = [b'J', 4, 3, 2, 1];
    let at = bytes.windows(5).position(|w| w == time).expect("the time's BININT");
    let wide = [0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0];
    bytes.splice(at..at + 5, wide);
    let dir = common::scratch("pt-time");
    let path = dir.join("wide.pickle");
    std::fs::write(&path, &bytes).unwrap();
    for streaming in [true, false] {
        let opts = ReadOptions { streaming, ..Default::default() };
        let msg = read_trace_with(&path, &opts).expect_err("a negative time").to_string();
        assert!(
            msg.ends_with(
                "device_traces[0][0].time_us: expected a time in µs (0 to 2^63 - 1), got -1"
            ),
            "{msg}"
        );
    }
    let msg = read_err(&snapshot(vec![with_time(Value::Int(-5))], vec![], ""));
    assert!(msg.contains("time_us: expected a time in µs"), "{msg}");
    let zero =
        write_pickle(&dir, "ok.pickle", &snapshot(vec![with_time(Value::Int(0))], vec![], ""));
    assert_eq!(read_trace(zero).unwrap().op_times, [(0, 0)]);
}

#[test]
fn negative_and_absurd_sizes_are_errors() {
    let msg = read_err(&snapshot(vec![entry("alloc", 1, -1, 0)], vec![], ""));
    assert!(msg.contains("device_traces[0][0].size") && msg.contains("negative size -1"), "{msg}");
    let msg = read_err(&snapshot(vec![entry("alloc", 1, (1 << 62) + 1, 0)], vec![], ""));
    assert!(msg.contains("larger than 2^62"), "{msg}");
    let msg = read_err(&snapshot(vec![entry("oom", -5, 1, 0)], vec![], ""));
    assert!(msg.contains("device_traces[0][0].device_free"), "{msg}");
}

#[test]
fn inconsistent_histories_are_errors() {
    let msg =
        read_err(&snapshot(vec![entry("alloc", 1, 1, 0), entry("alloc", 1, 1, 0)], vec![], ""));
    assert!(msg.contains("device_traces[0][1]") && msg.contains("still live"), "{msg}");
    let msg = read_err(&snapshot(
        vec![entry("alloc", 1, 1, 0), entry("free_completed", 1, 1, 0)],
        vec![],
        "",
    ));
    assert!(msg.contains("without free_requested"), "{msg}");
}

#[test]
fn frees_without_completions_complete_at_once() {
    // `skip_actions=["free_completed"]` leaves no completions at all.
    let t = read(
        vec![entry("alloc", 1, 1, 0), entry("free_requested", 1, 1, 0), entry("alloc", 1, 1, 0)],
        vec![],
    );
    assert_eq!(t.ops, vec![alloc(0, 1, 0), Op::FreeRequested { id: AllocId(0) }, alloc(1, 1, 0)]);
    assert!(t.warnings[0].contains("no free_completed"));
}

#[test]
fn mutated_snapshots_never_panic() {
    // Whatever a corrupted file still unpickles to, conversion gives a trace or an error.
    let frames = Value::list(vec![Value::str_dict([
        ("name", Value::str("f")),
        ("filename", Value::str("a.py")),
        ("line", Value::Int(3)),
    ])]);
    let mut with_frames = entry("alloc", 0xa00, 10, 0);
    if let Value::Dict(p) = &mut with_frames {
        std::rc::Rc::get_mut(p).unwrap().push((Value::str("frames"), frames));
    }
    let root = snapshot(
        vec![
            entry("segment_alloc", 0xa00, 4096, 0),
            with_frames,
            entry("alloc", 0xb00, 20, 1),
            entry("free_requested", 0xa00, 10, 0),
            entry("segment_free", 0x5000, 4096, 0),
            entry("oom", 5, 4096, 0),
            entry("free_completed", 0xa00, 10, 0),
            entry("snapshot", 0, 0, 0),
        ],
        vec![common::segment(0xb00, 1, vec![common::block(0xb00, 512, 20, "active_allocated")])],
        "conf",
    );
    let good = pickle::to_vec(&root).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut converted = 0;
    for _ in 0..3000 {
        let mut bytes = good.clone();
        for _ in 0..3 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let i = (state % bytes.len() as u64) as usize;
            bytes[i] = (state >> 40) as u8;
        }
        if let Ok(v) = pickle::from_slice(&bytes) {
            let _ = pytorch::snapshot_to_trace(&v, std::path::Path::new("m.pickle"), true);
            converted += 1;
        }
    }
    assert!(converted > 100, "the mutations left enough parseable pickles ({converted})");
}

/// `segment` (as `common::segment` makes it) in the private pool `(0, n)`.
fn in_pool(mut segment: Value, n: i64) -> Value {
    let Value::Dict(pairs) = &mut segment else { panic!("a segment is a dict") };
    std::rc::Rc::get_mut(pairs).unwrap().push((
        Value::str("segment_pool_id"),
        Value::Tuple(std::rc::Rc::new(vec![Value::Int(0), Value::Int(n)])),
    ));
    segment
}

#[test]
fn private_pools_are_inferred_from_segments_and_release_order() {
    const MIB: i64 = 1 << 20;
    let (a, b, c, d) = (0x1000_0000, 0x2000_0000, 0x3000_0000, 0x9000_0000);
    let pool_segment = in_pool(
        common::segment(d, 0, vec![common::block(d, 20 * MIB, 4 * MIB, "active_allocated")]),
        2,
    );
    let t = read(
        vec![
            entry("segment_alloc", a, 20 * MIB, 0),
            entry("alloc", a, 4 * MIB, 0),
            // A pool the history releases: its small and large segment.
            entry("segment_alloc", b, 2 * MIB, 0),
            entry("alloc", b, 1000, 0),
            entry("segment_alloc", c, 20 * MIB, 0),
            entry("alloc", c, 4 * MIB, 0),
            // The pool alive at the end.
            entry("segment_alloc", d, 20 * MIB, 0),
            entry("alloc", d, 4 * MIB, 0),
            entry("free_requested", b, 1000, 0),
            entry("free_completed", b, 1000, 0),
            entry("free_requested", c, 4 * MIB, 0),
            entry("free_completed", c, 4 * MIB, 0),
            entry("free_requested", a, 4 * MIB, 0),
            entry("free_completed", a, 4 * MIB, 0),
            // Released small pool first: a private pool. Then the default pools.
            entry("segment_free", b, 2 * MIB, 0),
            entry("segment_free", c, 20 * MIB, 0),
            entry("segment_free", a, 20 * MIB, 0),
        ],
        vec![pool_segment],
    );
    let pool = |n, action| Op::Pool { pool: MemPoolId(0, n), action };
    assert_eq!(
        t.ops,
        vec![
            alloc(0, 4 << 20, 0),
            pool(1, PoolAction::BeginAllocate),
            alloc(1, 1000, 0),
            alloc(2, 4 << 20, 0),
            pool(1, PoolAction::EndAllocate),
            pool(2, PoolAction::BeginAllocate),
            alloc(3, 4 << 20, 0),
            pool(2, PoolAction::EndAllocate),
            Op::FreeRequested { id: AllocId(1) },
            Op::FreeRequested { id: AllocId(2) },
            Op::FreeRequested { id: AllocId(0) },
            pool(1, PoolAction::Release),
            Op::EmptyCache,
        ]
    );
    let frees: Vec<(u64, u64)> =
        t.recorded.iter().filter(|e| e.kind == K::SegmentFree).map(|e| (e.addr, e.op)).collect();
    assert_eq!(frees, vec![(b as u64, 11), (c as u64, 11), (a as u64, 12)]);
    assert!(t.warnings.iter().any(|w| w.contains("(0, 1) were released")), "{:?}", t.warnings);
}

/// Read for a replay (`ReadOptions::events` off), a snapshot whose final segments show a
/// private pool keeps every event from its start, in one read of the file; one whose pool
/// only its release shows is read again with them, since the pools' inference needs them.
#[test]
fn a_replays_read_keeps_every_event_where_the_pools_need_them() {
    const MIB: i64 = 1 << 20;
    let (a, b) = (0x1000_0000, 0x2000_0000);
    let entries = || {
        vec![
            entry("segment_alloc", a, 20 * MIB, 0),
            entry("alloc", a, 4 * MIB, 0),
            entry("segment_alloc", b, 2 * MIB, 0),
            entry("alloc", b, 1000, 0),
            entry("free_requested", b, 1000, 0),
            entry("free_completed", b, 1000, 0),
            entry("free_requested", a, 4 * MIB, 0),
            entry("free_completed", a, 4 * MIB, 0),
            // Released small pool first: a private pool. Then the default pools.
            entry("segment_free", b, 2 * MIB, 0),
            entry("segment_free", a, 20 * MIB, 0),
        ]
    };
    let dir = common::scratch("pt-pools");
    let released = write_pickle(&dir, "released.pickle", &snapshot(entries(), vec![], "conf"));
    let segment = in_pool(common::segment(0x9000_0000, 0, vec![]), 2);
    let alive = write_pickle(&dir, "alive.pickle", &snapshot(entries(), vec![segment], "conf"));
    for (path, reads) in [(released, 2), (alive, 1)] {
        let whole = read_trace(&path).unwrap();
        assert!(whole.ops.iter().any(|op| matches!(op, Op::Pool { .. })), "{:?}", whole.ops);
        let size = std::fs::metadata(&path).unwrap().len();
        assert_eq!(slim_read_agrees(&path, &whole), reads * size, "{}", path.display());
    }
}

/// A pool that only its release shows (none is alive at the end) still has its checkpoint
/// restores placed: the allocation that tiles its emptied segment again is `AllocAt`.
#[test]
fn a_released_pool_alone_still_has_its_restores_placed() {
    const MIB: i64 = 1 << 20;
    let (a, b, c) = (0x1000_0000, 0x2000_0000, 0x3000_0000);
    let t = read(
        vec![
            entry("segment_alloc", a, 20 * MIB, 0),
            entry("alloc", a, 4 * MIB, 0),
            entry("segment_alloc", b, 2 * MIB, 0),
            entry("alloc", b, 2 * MIB, 0),
            entry("free_requested", b, 2 * MIB, 0),
            entry("free_completed", b, 2 * MIB, 0),
            // The emptied segment handed out whole again: a checkpoint restore.
            entry("alloc", b, 2 * MIB, 0),
            entry("segment_alloc", c, 20 * MIB, 0),
            entry("alloc", c, 4 * MIB, 0),
            entry("free_requested", b, 2 * MIB, 0),
            entry("free_completed", b, 2 * MIB, 0),
            entry("free_requested", c, 4 * MIB, 0),
            entry("free_completed", c, 4 * MIB, 0),
            entry("free_requested", a, 4 * MIB, 0),
            entry("free_completed", a, 4 * MIB, 0),
            // Released small pool first: a private pool. Then the default pools.
            entry("segment_free", b, 2 * MIB, 0),
            entry("segment_free", c, 20 * MIB, 0),
            entry("segment_free", a, 20 * MIB, 0),
        ],
        vec![],
    );
    assert!(t.warnings.iter().any(|w| w.contains("(0, 1) were released")), "{:?}", t.warnings);
    let placed: Vec<&Op> = t.ops.iter().filter(|op| matches!(op, Op::AllocAt { .. })).collect();
    assert_eq!(
        placed,
        vec![&Op::AllocAt { id: AllocId(2), size: 2 << 20, stream: StreamId(0), addr: b as u64 }],
        "{:?}",
        t.ops
    );
}

/// Addresses at the end of the address space (negative ints) and the largest sizes a
/// snapshot may give reach the mid-run reconstruction and the pool inference without
/// overflowing.
#[test]
fn extreme_addresses_in_a_mid_run_history_do_not_overflow() {
    let (big, top) = (1i64 << 62, -4096i64);
    let entries = vec![
        entry("free_requested", top, big, 0),
        entry("free_completed", top, big, 0),
        entry("free_completed", i64::MAX - 512, big, 0),
        entry("segment_free", -(1 << 21), big, 0),
    ];
    let segments = vec![common::segment(
        -(1 << 40),
        0,
        vec![common::block(-(1 << 40), big, big, "active_allocated")],
    )];
    // No state an allocator could be in has blocks past the end of the address space: the
    // reconstruction says so rather than seeding a policy with it.
    let e = read_err(&snapshot(entries, segments, "conf"));
    assert!(e.contains("cannot be rebuilt"), "{e}");
}

/// A pool of large segments only, released by the same `empty_cache` right after the default
/// pools: its walk is no second default walk (those are small) and goes from no small segment
/// to a large one, so only its allocations tell it apart: several, and all those of their
/// time, went into its segment. Found with no pool alive at the end, when the pool inference
/// first reads the segments alone.
#[test]
fn a_released_pool_of_large_segments_is_told_by_its_allocations() {
    const MIB: i64 = 1 << 20;
    let (p, a) = (0x1000_0000, 0x3000_0000);
    let t = read(
        vec![
            entry("segment_alloc", a, 20 * MIB, 0),
            entry("alloc", a, 4 * MIB, 0),
            // Two allocations into a segment of their own: a context.
            entry("segment_alloc", p, 20 * MIB, 0),
            entry("alloc", p, 4 * MIB, 0),
            entry("alloc", p + 4 * MIB, 4 * MIB, 0),
            entry("alloc", a + 4 * MIB, 4 * MIB, 0),
            entry("free_requested", p, 4 * MIB, 0),
            entry("free_completed", p, 4 * MIB, 0),
            entry("free_requested", p + 4 * MIB, 4 * MIB, 0),
            entry("free_completed", p + 4 * MIB, 4 * MIB, 0),
            entry("free_requested", a, 4 * MIB, 0),
            entry("free_completed", a, 4 * MIB, 0),
            entry("free_requested", a + 4 * MIB, 4 * MIB, 0),
            entry("free_completed", a + 4 * MIB, 4 * MIB, 0),
            // The default large pool's walk, then the private pool's (a lower key).
            entry("segment_free", a, 20 * MIB, 0),
            entry("segment_free", p, 20 * MIB, 0),
        ],
        vec![],
    );
    assert!(t.warnings.iter().any(|w| w.contains("(0, 1) were released")), "{:?}", t.warnings);
    let pool = |action| Op::Pool { pool: MemPoolId(0, 1), action };
    let free = |id| Op::FreeRequested { id: AllocId(id) };
    assert_eq!(
        t.ops,
        vec![
            alloc(0, 4 << 20, 0),
            pool(PoolAction::BeginAllocate),
            alloc(1, 4 << 20, 0),
            alloc(2, 4 << 20, 0),
            pool(PoolAction::EndAllocate),
            alloc(3, 4 << 20, 0),
            free(1),
            free(2),
            free(0),
            free(3),
            pool(PoolAction::Release),
            Op::EmptyCache,
        ]
    );
}
