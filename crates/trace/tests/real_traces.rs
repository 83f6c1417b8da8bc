//! Every bundled PyTorch 2.11 H100 trace reads, and its counts agree with what Python's
//! `pickle.load` shows (the table was taken with Python from the same files).

mod common;

use allocsim_core::{AllocId, Op, RecordedKind, StreamId, Trace};
use allocsim_trace::{read_trace, read_trace_with, ReadOptions};
use std::collections::{BTreeSet, HashMap};

struct Expected {
    name: &'static str,
    entries: usize,
    alloc: usize,
    oom: usize,
    free_requested: usize,
    free_completed: usize,
    segment_grow: usize,
    segment_shrink: usize,
    streams: &'static [u64],
    stacks: usize,
    ops_with_stack: usize,
    conf: &'static str,
}

const fn e(
    name: &'static str,
    counts: [usize; 7],
    streams: &'static [u64],
    stacks: usize,
    ops_with_stack: usize,
    conf: &'static str,
) -> Expected {
    let [entries, alloc, oom, free_requested, free_completed, segment_grow, segment_shrink] =
        counts;
    Expected {
        name,
        entries,
        alloc,
        oom,
        free_requested,
        free_completed,
        segment_grow,
        segment_shrink,
        streams,
        stacks,
        ops_with_stack,
        conf,
    }
}

/// From Python: entries, alloc, oom, free_requested, free_completed, segment_alloc+map,
/// segment_free+unmap; the streams; distinct non-empty stacks and ops carrying one.
const EXPECTED: &[Expected] = &[
    e("gpt2_train", [18668, 6179, 0, 6176, 6176, 137, 0], &[0], 48, 5674, ""),
    e("resnet50_train", [10754, 3552, 0, 3549, 3549, 104, 0], &[0], 0, 0, ""),
    e("synthetic_default", [45785, 15183, 16, 15183, 15183, 156, 64], &[0], 0, 0, ""),
    e(
        "synthetic_gc",
        [29114, 9328, 726, 9328, 9328, 214, 190],
        &[0],
        0,
        0,
        "garbage_collection_threshold:0.5",
    ),
    e(
        "synthetic_maxsplit",
        [47706, 15197, 0, 15197, 15197, 1341, 774],
        &[0],
        0,
        0,
        "max_split_size_mb:32",
    ),
    e(
        "synthetic_multistream",
        [45760, 15142, 1, 15142, 15142, 210, 123],
        &[0, 416367472, 470798272],
        0,
        0,
        "",
    ),
    e("synthetic_oom", [28490, 9038, 1021, 9038, 9038, 189, 166], &[0], 0, 0, ""),
    e(
        "synthetic_roundup",
        [45711, 15200, 0, 15200, 15200, 101, 10],
        &[0],
        0,
        0,
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    ),
    e("varlen_train", [34720, 11495, 0, 11492, 11492, 241, 0], &[0], 0, 0, ""),
    e(
        "varlen_train_expandable",
        [34679, 11495, 0, 11492, 11492, 200, 0],
        &[0],
        0,
        0,
        "expandable_segments:True",
    ),
];

fn count_ops(t: &Trace, action: &str) -> usize {
    t.ops.iter().filter(|o| o.action() == action).count()
}

fn count_recorded(t: &Trace, kind: RecordedKind) -> usize {
    t.recorded.iter().filter(|r| r.kind == kind).count()
}

/// Ids are introduced once by an Alloc and every other op names a known id; recorded events
/// point at ops of the right kind.
fn check_consistency(t: &Trace) {
    let mut introduced: HashMap<AllocId, usize> = HashMap::new();
    for (i, op) in t.ops.iter().enumerate() {
        match op {
            Op::Alloc { id, .. } => assert!(introduced.insert(*id, i).is_none(), "id reused"),
            Op::FreeRequested { id } | Op::FreeCompleted { id } | Op::RecordStream { id, .. } => {
                assert!(introduced.contains_key(id), "op {i} names an unknown id")
            }
            _ => {}
        }
    }
    for r in &t.recorded {
        let op = &t.ops[r.op as usize];
        match r.kind {
            RecordedKind::Alloc | RecordedKind::Oom | RecordedKind::SegmentAlloc => {
                assert!(matches!(op, Op::Alloc { .. }), "{r:?} on {op:?}")
            }
            RecordedKind::FreeRequested => assert!(matches!(op, Op::FreeRequested { .. })),
            _ => {}
        }
    }
    assert!(t.op_stacks.windows(2).all(|w| w[0].0 < w[1].0), "op_stacks sorted");
    assert!(t
        .op_stacks
        .iter()
        .all(|&(op, s)| (op as usize) < t.ops.len() && (s as usize) < t.stacks.len()));
}

#[test]
fn every_real_trace_reads_and_matches_python() {
    for x in EXPECTED {
        let path = common::traces_dir().join(format!("{}.pickle.gz", x.name));
        let t = read_trace(&path).unwrap_or_else(|e| panic!("{e}"));
        let n = x.name;
        assert_eq!(count_ops(&t, "alloc"), x.alloc + x.oom, "{n}: alloc ops = alloc + oom");
        assert_eq!(count_ops(&t, "free_requested"), x.free_requested, "{n}");
        // No deferred frees and no unexplained device frees in these recordings.
        assert_eq!(count_ops(&t, "free_completed"), 0, "{n}");
        assert_eq!(count_ops(&t, "record_stream"), 0, "{n}");
        assert_eq!(count_ops(&t, "empty_cache"), 0, "{n}");
        assert_eq!(t.ops.len(), x.alloc + x.oom + x.free_requested, "{n}");
        assert_eq!(t.recorded.len(), x.entries, "{n}: recorded = entries (no snapshot entries)");
        assert_eq!(count_recorded(&t, RecordedKind::Alloc), x.alloc, "{n}");
        assert_eq!(count_recorded(&t, RecordedKind::Oom), x.oom, "{n}");
        assert_eq!(count_recorded(&t, RecordedKind::FreeCompleted), x.free_completed, "{n}");
        let grow = count_recorded(&t, RecordedKind::SegmentAlloc)
            + count_recorded(&t, RecordedKind::SegmentMap);
        let shrink = count_recorded(&t, RecordedKind::SegmentFree)
            + count_recorded(&t, RecordedKind::SegmentUnmap);
        assert_eq!((grow, shrink), (x.segment_grow, x.segment_shrink), "{n}");
        let streams: BTreeSet<u64> = t.recorded.iter().map(|r| r.stream.0).collect();
        assert_eq!(streams, x.streams.iter().copied().collect(), "{n}");
        assert_eq!(t.stacks.len(), x.stacks, "{n}: distinct stacks");
        assert_eq!(t.op_stacks.len(), x.ops_with_stack, "{n}");
        assert!(t.warnings.is_empty(), "{n}: {:?}", t.warnings);
        check_consistency(&t);

        // Meta: the sidecar fills what the pickle lacks.
        assert_eq!(t.meta.source_format, "pytorch-snapshot");
        assert_eq!(t.meta.alloc_conf.as_deref(), Some(x.conf), "{n}");
        assert_eq!(t.meta.device_total_bytes, Some(85017493504));
        assert_eq!(t.meta.device_free_bytes, Some(84465090560));
        let stats = t.meta.expected_stats.as_ref().expect("memory_stats");
        assert_eq!(stats.len(), 122, "{n}");
        assert!(stats.windows(2).all(|w| w[0].0 < w[1].0));
        let stat = |k: &str| stats.iter().find(|(key, _)| key == k).map(|(_, v)| *v);
        assert_eq!(stat("num_ooms"), Some(x.oom as i64), "{n}");
    }
}

/// A snapshot written from a bundled recording keeps its clock: no entry's `time_us` is before
/// the one before it (the recordings' never are), also where the conversion added ops (pool
/// releases, `empty_cache` calls read from the recording).
#[test]
fn written_snapshots_keep_the_recordings_clock() {
    for path in common::real_traces() {
        let trace = read_trace(&path).unwrap();
        let snapshot = allocsim_trace::pytorch::trace_to_snapshot(&trace).unwrap();
        let entries = snapshot.get("device_traces").and_then(|t| t.as_seq()?.first()?.as_seq());
        let times: Vec<i64> = entries
            .unwrap()
            .iter()
            .map(|e| e.get("time_us").and_then(|t| t.as_int()).unwrap())
            .collect();
        let back = times.windows(2).position(|w| w[1] < w[0]);
        assert_eq!(back, None, "{}: time_us goes back after entry {back:?}", path.display());
    }
}

#[test]
fn memory_fraction_and_oom_fields() {
    let t = read_trace(common::traces_dir().join("synthetic_oom.pickle.gz")).unwrap();
    assert_eq!(t.meta.memory_fraction, Some(0.05));
    // An oom's op is a failed Alloc whose id is never freed.
    let oom = t.recorded.iter().find(|r| r.kind == RecordedKind::Oom).unwrap();
    let Op::Alloc { id, size, .. } = t.ops[oom.op as usize] else { panic!() };
    assert_eq!(size, oom.size);
    assert!(!t.ops.iter().any(|o| matches!(o, Op::FreeRequested { id: f } if *f == id)));

    let t = read_trace(common::traces_dir().join("synthetic_default.pickle.gz")).unwrap();
    let oom = t.recorded.iter().find(|r| r.kind == RecordedKind::Oom).unwrap();
    // device_traces[0] of synthetic_default: the first oom has device_free 660799488 and
    // size 2666133504, after three segment_free entries tagged with the same op.
    assert_eq!((oom.addr, oom.size, oom.stream), (660799488, 2666133504, StreamId(0)));
    let i = t.recorded.iter().position(|r| r == oom).unwrap();
    for r in &t.recorded[i - 3..i] {
        assert_eq!((r.kind, r.op), (RecordedKind::SegmentFree, oom.op));
    }
}

#[test]
fn without_sidecar_and_without_stacks() {
    let path = common::traces_dir().join("gpt2_train.pickle.gz");
    let opts = ReadOptions { stacks: false, ..ReadOptions::without_sidecar() };
    let t = read_trace_with(&path, &opts).unwrap();
    assert!(t.stacks.is_empty() && t.op_stacks.is_empty());
    assert_eq!(t.meta.alloc_conf.as_deref(), Some(""), "from allocator_settings");
    assert_eq!(t.meta.expected_stats, None);
    assert_eq!(t.meta.device_total_bytes, None);
    let frame = &read_trace(&path).unwrap().stacks[0].frames[0];
    assert_eq!(frame.name, "<lambda>");
    assert!(frame.filename.ends_with("torch/nn/modules/module.py"));
    assert_eq!(frame.line, 1097);
}
