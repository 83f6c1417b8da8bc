//! The done criterion of the PyTorch clone: every bundled PyTorch 2.11 recording, replayed
//! under its own settings on a device that follows the recording, gives every
//! `torch.cuda.memory_stats()` key PyTorch reported and the same sequence of device-level
//! events (`segment_alloc`/`segment_free`/`segment_map`/`segment_unmap`/`oom`, action and size).
//!
//! Beyond that criterion it also holds every trace entry (allocations and frees, with their
//! addresses) and the final snapshot's blocks to the recording. A failure prints the first
//! diverging event with its op, and every stat that differs.
//! Slow in debug builds; run with `cargo test --release -p allocsim-policies --test real_traces`.

use allocsim_core::{AllocId, Allocator, Env, Event, Op, SnapshotSegment, Trace};
use allocsim_policies::pytorch::PyTorchAllocator;
use allocsim_sim::{RecordedDevice, SimConfig, SimDevice};
use allocsim_trace::pickle::Value;
use std::collections::HashSet;
use std::path::PathBuf;

fn trace_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../traces/pytorch-2.11-h100")
        .join(format!("{name}.pickle.gz"))
}

/// What one replay produced, next to what the recording shows.
struct Replay {
    events: Vec<Event>,
    /// The op during which each event happened.
    event_ops: Vec<u64>,
    stats: Vec<(String, i64)>,
    snapshot: Vec<SnapshotSegment>,
    device_note: Option<String>,
}

fn replay(trace: &Trace) -> Replay {
    let meta = &trace.meta;
    let mut alloc = PyTorchAllocator::from_conf(meta.alloc_conf.as_deref().unwrap_or(""))
        .expect("recorded conf");
    let mut cfg = SimConfig::default();
    if let Some(total) = meta.device_total_bytes {
        cfg.total_bytes = total;
    }
    if let Some(free) = meta.device_free_bytes {
        cfg.free_bytes = free;
    }
    let mut device = RecordedDevice::new(&trace.recorded, SimDevice::new(cfg));
    let (mut events, mut event_ops) = (Vec::new(), Vec::new());
    let mut failed: HashSet<AllocId> = HashSet::new();
    for (i, op) in trace.ops.iter().enumerate() {
        allocsim_core::Device::begin_op(&mut device, i as u64);
        let mut env = Env::new(&mut device, &mut events);
        if i == 0 {
            if let Some(fraction) = meta.memory_fraction {
                alloc.set_memory_fraction(&mut env, fraction).expect("recorded fraction");
            }
        }
        match op {
            Op::Alloc { id, size, stream }
                if alloc.malloc(&mut env, *id, *size, *stream).is_err() =>
            {
                failed.insert(*id);
            }
            Op::FreeRequested { id } if !failed.contains(id) => alloc.free(&mut env, *id),
            Op::FreeCompleted { id } if !failed.contains(id) => alloc.free_completed(&mut env, *id),
            Op::RecordStream { id, stream } if !failed.contains(id) => {
                alloc.record_stream(*id, *stream)
            }
            Op::EmptyCache => alloc.empty_cache(&mut env),
            Op::SetMemoryFraction { fraction } => {
                alloc.set_memory_fraction(&mut env, *fraction).expect("fraction")
            }
            Op::SetAllocatorSettings { conf } => alloc.set_settings(conf).expect("settings"),
            _ => {}
        }
        event_ops.resize(events.len(), i as u64);
    }
    let device_note = device.divergence().map(|d| d.to_string());
    Replay {
        events,
        event_ops,
        stats: alloc.stats().flat(),
        snapshot: alloc.snapshot(),
        device_note,
    }
}

/// Every difference between the replay and the recording, first event divergence first.
fn differences(trace: &Trace, run: &Replay) -> Vec<String> {
    let mut out = Vec::new();
    let recorded: Vec<_> = trace.recorded.iter().filter(|e| e.kind.is_segment_event()).collect();
    let simulated: Vec<_> =
        run.events.iter().zip(&run.event_ops).filter(|(e, _)| e.is_segment_event()).collect();
    let first = recorded
        .iter()
        .zip(&simulated)
        .position(|(r, (s, _))| r.kind.action() != s.action() || r.size != event_size(s));
    if let Some(i) =
        first.or((recorded.len() != simulated.len()).then(|| recorded.len().min(simulated.len())))
    {
        let want = recorded.get(i).map(|r| format!("{} {} (op {})", r.kind.action(), r.size, r.op));
        let got =
            simulated.get(i).map(|(s, op)| format!("{} {} (op {op})", s.action(), event_size(s)));
        out.push(format!(
            "segment event {i} of {}/{}: recorded {want:?}, replayed {got:?}",
            recorded.len(),
            simulated.len()
        ));
    }
    if out.is_empty() {
        out.extend(first_full_event_difference(trace, run));
    }
    match &trace.meta.expected_stats {
        None => out.push("no expected stats in the trace".into()),
        Some(expected) => {
            for (key, want) in expected {
                let got = run.stats.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
                if got != Some(*want) {
                    out.push(format!("{key}: recorded {want}, replayed {got:?}"));
                }
            }
        }
    }
    if !out.is_empty() {
        if let Some(note) = &run.device_note {
            out.push(format!("device: {note}"));
        }
    }
    out
}

/// Stronger than the criterion: every trace entry (allocations and frees too) at the same
/// address with the size PyTorch records (the request for `alloc`/`free_*`). `oom` entries
/// carry the driver's free memory instead of an address, which the model cannot know exactly.
fn first_full_event_difference(trace: &Trace, run: &Replay) -> Option<String> {
    let simulated: Vec<(&str, u64, u64)> = run
        .events
        .iter()
        .map(|e| match *e {
            Event::Alloc { addr, requested, .. }
            | Event::FreeRequested { addr, requested, .. }
            | Event::FreeCompleted { addr, requested, .. } => (e.action(), addr, requested),
            Event::Oom { size, .. } => ("oom", 0, size),
            _ => (e.action(), event_addr(e), event_size(e)),
        })
        .collect();
    let recorded: Vec<(&str, u64, u64)> = trace
        .recorded
        .iter()
        .map(|r| {
            let addr = if r.kind == allocsim_core::RecordedKind::Oom { 0 } else { r.addr };
            (r.kind.action(), addr, r.size)
        })
        .collect();
    let i = recorded.iter().zip(&simulated).position(|(r, s)| r != s).or_else(|| {
        (recorded.len() != simulated.len()).then(|| recorded.len().min(simulated.len()))
    })?;
    Some(format!(
        "trace entry {i} of {}/{} (op {:?}): recorded {:?}, replayed {:?}",
        recorded.len(),
        simulated.len(),
        run.event_ops.get(i),
        recorded.get(i),
        simulated.get(i)
    ))
}

fn event_addr(e: &Event) -> u64 {
    match *e {
        Event::SegmentAlloc { addr, .. }
        | Event::SegmentFree { addr, .. }
        | Event::SegmentMap { addr, .. }
        | Event::SegmentUnmap { addr, .. }
        | Event::Alloc { addr, .. }
        | Event::FreeRequested { addr, .. }
        | Event::FreeCompleted { addr, .. } => addr,
        Event::Oom { .. } => 0,
    }
}

fn event_size(e: &Event) -> u64 {
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

/// The final `segments` of the recording, block by block, as
/// (segment address, expandable, block address, size, requested_size, state).
type BlockRow = (u64, bool, u64, u64, u64, String);

fn recorded_segments(name: &str) -> Vec<BlockRow> {
    let file = std::fs::File::open(trace_path(name)).expect("trace file");
    let gz = flate2::read::MultiGzDecoder::new(std::io::BufReader::new(file));
    let root = allocsim_trace::pickle::from_reader(gz).expect("pickle");
    let int = |v: &Value, k: &str| v.get(k).and_then(Value::as_int).expect("int field") as u64;
    let mut rows = Vec::new();
    for seg in root.get("segments").and_then(Value::as_seq).expect("segments") {
        let expandable = matches!(seg.get("is_expandable"), Some(Value::Bool(true)));
        for b in seg.get("blocks").and_then(Value::as_seq).expect("blocks") {
            let state = b.get("state").and_then(Value::as_str).expect("state").to_string();
            let row = (
                int(seg, "address"),
                expandable,
                int(b, "address"),
                int(b, "size"),
                int(b, "requested_size"),
                state,
            );
            rows.push(row);
        }
    }
    rows
}

fn replayed_segments(run: &Replay) -> Vec<BlockRow> {
    let mut rows = Vec::new();
    for seg in &run.snapshot {
        for b in &seg.blocks {
            let row = (
                seg.address,
                seg.is_expandable,
                b.address,
                b.size,
                b.requested_size,
                b.state.name().to_string(),
            );
            rows.push(row);
        }
    }
    rows
}

/// The snapshot PyTorch dumped at the end, against ours: layout, states and the stale
/// `requested_size` of free blocks.
fn snapshot_difference(name: &str, run: &Replay) -> Option<String> {
    let (want, got) = (recorded_segments(name), replayed_segments(run));
    let i = want
        .iter()
        .zip(&got)
        .position(|(w, g)| w != g)
        .or_else(|| (want.len() != got.len()).then(|| want.len().min(got.len())))?;
    Some(format!(
        "final snapshot block {i} of {}/{}: recorded {:?}, replayed {:?}",
        want.len(),
        got.len(),
        want.get(i),
        got.get(i)
    ))
}

fn check(name: &str) {
    let trace = allocsim_trace::read_trace(trace_path(name)).expect("bundled trace reads");
    let run = replay(&trace);
    let mut diffs = differences(&trace, &run);
    diffs.extend(snapshot_difference(name, &run));
    assert!(diffs.is_empty(), "{name} is not exact:\n  {}", diffs.join("\n  "));
}

macro_rules! real_trace_tests {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { check(stringify!($name)); })*
    };
}

real_trace_tests!(
    gpt2_train,
    resnet50_train,
    synthetic_default,
    synthetic_gc,
    synthetic_maxsplit,
    synthetic_multistream,
    synthetic_oom,
    synthetic_roundup,
    varlen_train,
    varlen_train_expandable,
);
