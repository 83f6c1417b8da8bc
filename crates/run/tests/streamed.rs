//! A run whose ops stream from a native file, or from a snapshot as it is read, reports exactly
//! what a run of the whole trace in memory reports, on the recorded device and on the model;
//! an observer list and a single observer see the same run; the timeline's samples need no
//! run length; and the engine's id bookkeeping skips what it must.

use allocsim_core::{AllocId, DynAllocator, Op, StreamId, Trace};
use allocsim_replay::{replay, replay_with, EventLog, Observer};
use allocsim_run::{run_trace, run_trace_streamed, DeviceChoice, RunOptions, RunReport};
use allocsim_sim::{SimConfig, SimDevice};
use std::path::PathBuf;

fn traces() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces")
}

fn same(a: &RunReport, b: &RunReport, what: &str) {
    assert_eq!(a.device, b.device, "{what}");
    assert_eq!(a.ops_run, b.ops_run, "{what}");
    assert_eq!(a.metrics, b.metrics, "{what}");
    assert_eq!(a.stats, b.stats, "{what}");
    assert_eq!(a.skipped, b.skipped, "{what}");
    assert_eq!(a.device_calls, b.device_calls, "{what}");
    assert_eq!(a.device_notes, b.device_notes, "{what}");
    assert_eq!(a.snapshot, b.snapshot, "{what}");
    assert_eq!(
        a.check.as_ref().map(|c| c.total_violations()),
        b.check.as_ref().map(|c| c.total_violations()),
        "{what}"
    );
}

#[test]
fn streamed_runs_report_what_whole_runs_report() {
    let dir = std::env::temp_dir().join(format!("allocsim-replay-streamed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in [
        "pytorch-2.11-h100/synthetic_oom.pickle.gz",
        "pytorch-2.11-h100/varlen_train_expandable.pickle.gz",
        "pytorch-2.11-h100-extra/varlen_train_tuned.pickle.gz",
    ] {
        let trace = allocsim_trace::read_trace(traces().join(name)).unwrap();
        let path = dir.join("t.allocsim");
        allocsim_trace::write_trace(&trace, &path).unwrap();
        for (policy, device, check) in [
            ("pytorch", DeviceChoice::Auto, true),
            ("pytorch", DeviceChoice::Sim, false),
            ("bfc", DeviceChoice::Auto, true),
        ] {
            let opts = RunOptions { policy: policy.into(), device, check, ..RunOptions::default() };
            let whole = run_trace(&trace, &opts, &mut [], |_| {}).unwrap();
            let stream = allocsim_trace::native::read_native_ops(&path).unwrap();
            let ops = stream.ops.map(Result::unwrap);
            let streamed =
                run_trace_streamed(&stream.head, stream.recorded_len, ops, &opts, &mut [], |_| {})
                    .unwrap();
            same(&whole, &streamed, &format!("{name} {policy} {device:?}"));
        }
        let fidelity = RunOptions { fidelity: true, ..RunOptions::default() };
        let stream = allocsim_trace::native::read_native_ops(&path).unwrap();
        let refused = run_trace_streamed(
            &stream.head,
            1,
            stream.ops.map(Result::unwrap),
            &fidelity,
            &mut [],
            |_| {},
        );
        assert!(refused.unwrap_err().0.contains("whole recording"));
        // The offline policy is planned from every op before the first: not from a stream.
        let offline = RunOptions { policy: allocsim_run::OFFLINE.into(), ..RunOptions::default() };
        let stream = allocsim_trace::native::read_native_ops(&path).unwrap();
        let ops = stream.ops.map(Result::unwrap);
        let refused = run_trace_streamed(&stream.head, 1, ops, &offline, &mut [], |_| {});
        assert!(refused.unwrap_err().0.contains("whole trace"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A snapshot replayed while it is read reports what a replay of the finished trace does,
/// under its own settings and what-ifs; and the replay's result is kept exactly when the
/// history is complete (no pools, mid-run start or settings it could not know before the end).
/// Read as `allocsim replay` reads it, with only the device events of its recording (and no
/// stacks or times), the trace replays as the whole one does too.
#[test]
fn snapshots_replayed_as_they_are_read_report_what_whole_runs_report() {
    use allocsim_trace::{pytorch::read_snapshot_replaying, ReadOptions};
    let slim = ReadOptions { stacks: false, times: false, events: false, ..Default::default() };
    let options = [
        RunOptions { policy: "pytorch".into(), check: true, ..RunOptions::default() },
        RunOptions { policy: "pytorch".into(), device: DeviceChoice::Sim, ..RunOptions::default() },
        RunOptions {
            policy: "pytorch".into(),
            alloc_conf: Some("max_split_size_mb:64".into()),
            device_free_bytes: Some(8 << 30),
            ..RunOptions::default()
        },
        RunOptions { policy: "bfc".into(), ..RunOptions::default() },
    ];
    // (trace, history complete, private pools: their inference reads every event)
    for (name, complete, pools) in [
        ("pytorch-2.11-h100/gpt2_train.pickle.gz", true, false),
        ("pytorch-2.11-h100/synthetic_oom.pickle.gz", true, false),
        ("pytorch-2.11-h100-extra/synthetic_pending_frees.pickle.gz", true, false),
        ("pytorch-2.11-h100-user/c_ring.pickle.gz", false, false),
        ("pytorch-2.11-h100-user/d_mempool.pickle.gz", false, true),
    ] {
        let path = traces().join(name);
        let trace = allocsim_trace::read_trace(&path).unwrap();
        for opts in &options {
            let whole = run_trace(&trace, opts, &mut [], |_| {}).unwrap();
            let what = format!("{name} {opts:?}");
            let read = read_snapshot_replaying(&path, &slim, |o| {
                let head = Trace { meta: o.meta, ..Trace::default() };
                allocsim_run::run_trace_fed(&head, o.recorded, o.ops, opts, &mut [], |_| {})
            })
            .unwrap();
            let kept = read.replay.flatten().map(|fed| same(&whole, &fed.unwrap(), &what));
            assert_eq!(kept.is_some(), complete, "{what}");
            assert_eq!(read.recorded_len, trace.recorded.len() as u64, "{what}");
            let kept_all = read.trace.recorded.len() == trace.recorded.len();
            assert_eq!(kept_all, pools, "{what}: every event kept");
            let (ops, len) = (&read.trace.ops, read.recorded_len);
            let slim_run = run_trace_streamed(&read.trace, len, ops, opts, &mut [], |_| {});
            same(&whole, &slim_run.unwrap(), &format!("{what}, device events only"));
        }
    }
}

fn log_of(trace: &Trace, list: bool) -> String {
    let mut allocator = allocsim_policies::by_name("pytorch", None).unwrap();
    let mut device = SimDevice::new(SimConfig::default());
    let mut log = EventLog::new(Vec::new());
    if list {
        let mut observers: Vec<&mut dyn Observer> = vec![&mut log];
        replay(&trace.ops, &mut *allocator, &mut device, &mut observers, |_| {});
    } else {
        replay_with(&trace.ops, &mut DynAllocator(&mut *allocator), &mut device, &mut log, |_| {});
    }
    String::from_utf8(log.finish().unwrap()).unwrap()
}

#[test]
fn one_observer_or_a_list_see_the_same_run() {
    let trace = allocsim_trace::read_trace(traces().join("pytorch-2.11-h100/gpt2_train.pickle.gz"))
        .unwrap();
    let (a, b) = (log_of(&trace, true), log_of(&trace, false));
    assert!(a.lines().count() > 10_000);
    assert_eq!(a, b);
}

#[test]
fn ids_dense_and_sparse_are_kept_apart() {
    let id = AllocId;
    let s = StreamId(0);
    let big = u64::MAX - 1;
    let ops = vec![
        Op::Alloc { id: id(3), size: 1 << 20, stream: s },
        Op::Alloc { id: id(big), size: 1 << 20, stream: s },
        Op::Alloc { id: id(3), size: 1 << 20, stream: s }, // duplicate of a live id
        Op::FreeRequested { id: id(big) },
        Op::FreeRequested { id: id(big) },     // already freed
        Op::FreeRequested { id: id(1 << 40) }, // never allocated
        Op::Alloc { id: id(9), size: 1 << 60, stream: s }, // refused before rounding: OOM
        Op::FreeRequested { id: id(9) },       // free of a failed allocation
        Op::FreeRequested { id: id(3) },
        Op::Alloc { id: id(big), size: 512, stream: s }, // a freed id may come back
    ];
    let trace = Trace { ops, ..Trace::default() };
    let opts = RunOptions { policy: "pytorch".into(), ..RunOptions::default() };
    let r = run_trace(&trace, &opts, &mut [], |_| {}).unwrap();
    assert_eq!(r.skipped.duplicate_allocs, 1);
    assert_eq!(r.skipped.of_unknown_ids, 2);
    assert_eq!(r.skipped.of_failed_allocs, 1);
    assert_eq!(r.metrics.ooms.len(), 1);
    assert_eq!(r.stats.allocation.all.current, 1);
}

/// A run `until_oom` stops at the first OOM a full run has, with the same state there, and
/// with and without other observers; one that fits reports no OOM.
#[test]
fn until_oom_stops_where_the_first_oom_is() {
    let trace = allocsim_trace::read_trace(traces().join("pytorch-2.11-h100/gpt2_train.pickle.gz"))
        .unwrap();
    for free in [4u64 << 30, 80 << 30] {
        let full = RunOptions {
            policy: "pytorch".into(),
            device: DeviceChoice::Sim,
            device_free_bytes: Some(free),
            ..RunOptions::default()
        };
        let whole = run_trace(&trace, &full, &mut [], |_| {}).unwrap();
        assert_eq!(whole.metrics.ooms.is_empty(), free > 8 << 30, "7.5 GiB fit, 4 GiB do not");
        let question = RunOptions { until_oom: true, ..full.clone() };
        let first = run_trace(&trace, &question, &mut [], |_| {}).unwrap();
        let mut log = EventLog::new(Vec::new());
        let watched = run_trace(&trace, &question, &mut [&mut log], |_| {}).unwrap();
        match whole.metrics.ooms.first() {
            Some(oom) => {
                assert_eq!(first.metrics.ooms, vec![oom.clone()], "{free}: the first OOM alone");
                assert_eq!(first.ops_run, oom.op_index + 1, "{free}: stopped at its op");
                assert_eq!(watched.metrics.ooms.first(), Some(oom), "{free}: with an observer");
                assert_eq!(first.ops_run, watched.ops_run, "{free}");
                assert_eq!(first.stats, watched.stats, "{free}: the same state there");
            }
            None => {
                assert!(first.metrics.ooms.is_empty() && watched.metrics.ooms.is_empty());
                assert_eq!(first.ops_run, whole.ops_run, "{free}: a run that fits runs whole");
                assert_eq!(first.stats, whole.stats, "{free}");
            }
        }
    }
}

/// A start laid out by allocations (a what-if of a history that starts mid-run) that already
/// runs out of memory answers `until_oom` with that OOM, as a full run reports it first.
#[test]
fn until_oom_counts_an_oom_laying_out_the_start() {
    let trace =
        allocsim_trace::read_trace(traces().join("pytorch-2.11-h100-user/c_ring.pickle.gz"))
            .unwrap();
    let full = RunOptions {
        policy: "pytorch".into(),
        alloc_conf: Some("expandable_segments:True".into()),
        device: DeviceChoice::Sim,
        device_free_bytes: Some(64 << 20),
        ..RunOptions::default()
    };
    let whole = run_trace(&trace, &full, &mut [], |_| {}).unwrap();
    let prologue = match whole.start {
        allocsim_run::StartedFrom::LaidOut { ops, .. } => ops,
        ref other => panic!("a what-if of a mid-run history is laid out, not {other:?}"),
    };
    let first_oom = whole.metrics.ooms.first().expect("64 MiB is too little").clone();
    assert!(first_oom.op_index < prologue, "the OOM comes while laying out the start");
    let question = RunOptions { until_oom: true, ..full };
    let answer = run_trace(&trace, &question, &mut [], |_| {}).unwrap();
    assert_eq!(answer.metrics.ooms, vec![first_oom]);
    assert_eq!(answer.ops_run, 0, "no recorded op runs after it");
}

/// The timeline samples every `stride`-th op from op 0, `stride` the smallest power of two
/// that leaves at most 2,000 samples, then the last op: found as the run goes, without its
/// length known.
#[test]
fn the_timeline_samples_every_power_of_two_th_op() {
    let opts = RunOptions { policy: "pytorch".into(), ..RunOptions::default() };
    for n in [1, 1999, 2000, 2001, 4000, 4001, 9_999, 64_001] {
        let ops = (0..n)
            .map(|i| match i % 2 {
                0 => Op::Alloc { id: AllocId(i / 2), size: 512 * (1 + i % 7), stream: StreamId(0) },
                _ => Op::FreeRequested { id: AllocId(i / 2) },
            })
            .collect();
        let trace = Trace { ops, ..Trace::default() };
        let report = run_trace(&trace, &opts, &mut [], |_| {}).unwrap();
        let stride = (0..).map(|k| 1u64 << k).find(|s| n <= 2000 * s).unwrap();
        let mut expected: Vec<u64> = (0..n).step_by(stride as usize).collect();
        if expected.last() != Some(&(n - 1)) {
            expected.push(n - 1);
        }
        let got: Vec<u64> = report.metrics.timeline.iter().map(|p| p.op_index).collect();
        assert_eq!(got, expected, "{n} ops");
    }
}

/// The capacity of a snapshot read with its ops packed from the first (`allocsim capacity`:
/// each run of the bisections streams them) is the capacity of the whole trace.
#[test]
fn capacity_over_packed_ops_is_the_whole_traces() {
    use allocsim_run::{capacity, capacity_of, CapacityOptions, Runs};
    use allocsim_trace::{pytorch, ReadOptions};
    let mut packed_runs = 0;
    for name in [
        "pytorch-2.11-h100/gpt2_train.pickle.gz",
        "pytorch-2.11-h100/synthetic_oom.pickle.gz",
        "pytorch-2.11-h100-extra/varlen_train_tuned.pickle.gz",
    ] {
        let path = traces().join(name);
        // Without the sidecar: its free memory at the start has the ops unpacked (for the
        // `empty_cache` inference).
        let whole = allocsim_trace::read_trace_with(&path, &ReadOptions::without_sidecar());
        let whole = whole.unwrap();
        let opts = ReadOptions {
            sidecar: false,
            stacks: false,
            times: false,
            events: false,
            packed_ops: Some(0),
            ..ReadOptions::default()
        };
        let read = pytorch::read_snapshot_packed(&path, &opts).unwrap();
        let run = RunOptions { policy: "pytorch".to_string(), ..RunOptions::default() };
        let options = CapacityOptions { run, outside_bytes: 0, floor_bytes: 0, jitters: 2 };
        let packed = match &read.packed {
            Some(ops) => {
                packed_runs += 1;
                let runs = Runs::Packed { head: &read.trace, ops, recorded_len: read.recorded_len };
                capacity_of(runs, &options).unwrap()
            }
            None => capacity(&read.trace, &options).unwrap(),
        };
        assert_eq!(packed, capacity(&whole, &options).unwrap(), "{name}");
    }
    assert!(packed_runs > 0, "some trace's ops came packed");
}
