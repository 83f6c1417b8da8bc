//! A run written as `allocsim.capture` writes a recording, read back: the snapshot (the run's
//! events as trace entries, its memory map at the end with each segment's pool) and the
//! sidecar (the `empty_cache()` calls with the allocations and frees counted before each, and
//! `memory_stats()` at the end). The conversion infers the pool contexts and places the calls
//! from those alone; replayed on the device that follows the recording, the PyTorch policy
//! must give back every event and every statistic.

use super::failure::{Failure, Oracle};
use super::run::run_options;
use allocsim_core::{Op, RecordedKind, Trace};
use allocsim_replay::Recorder;
use allocsim_run::{run_trace, DeviceChoice, RunOptions, H100_TOTAL_BYTES};
use allocsim_trace::{read_trace_with, ReadOptions};
use std::path::{Path, PathBuf};

fn fail(policy: &str, op: Option<u64>, message: String) -> Failure {
    Failure::new(Oracle::RoundTrip, policy, op, message)
}

/// The sidecar's `meta.calls`: each `empty_cache` of `trace` with the successful allocations
/// and the frees before it (`allocation.all.allocated` and `.freed` at the call).
fn calls(trace: &Trace, recorded: &[allocsim_core::RecordedEvent]) -> Vec<serde_json::Value> {
    let failed: std::collections::HashSet<u64> =
        recorded.iter().filter(|e| e.kind == RecordedKind::Oom).map(|e| e.op).collect();
    let (mut allocations, mut frees) = (0u64, 0u64);
    let mut calls = Vec::new();
    for (k, op) in trace.ops.iter().enumerate() {
        match op {
            Op::Alloc { .. } | Op::AllocAt { .. } if !failed.contains(&(k as u64)) => {
                allocations += 1
            }
            Op::FreeRequested { .. } => frees += 1,
            Op::EmptyCache => calls.push(serde_json::json!({
                "call": "empty_cache", "allocations": allocations, "frees": frees
            })),
            _ => {}
        }
    }
    calls
}

/// A folder of this process and thread's own.
fn scratch() -> PathBuf {
    std::env::temp_dir().join(format!(
        "allocsim-capture-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ))
}

/// Run `trace` (a program of ops only) under the PyTorch policy, write it as a capture, read
/// that back and replay it: every event and statistic as the run made them.
pub fn capture_replays_exactly(policy: &str, trace: &Trace) -> Result<(), Failure> {
    let dir = scratch();
    std::fs::create_dir_all(&dir).map_err(|e| fail(policy, None, format!("{e}")))?;
    let result = write_and_replay(policy, trace, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn write_and_replay(policy: &str, trace: &Trace, dir: &Path) -> Result<(), Failure> {
    let mut recorder = Recorder::default();
    let opts = RunOptions { device: DeviceChoice::Sim, ..run_options(policy) };
    let run = run_trace(trace, &opts, &mut [&mut recorder], |_| {})
        .map_err(|e| fail(policy, None, format!("the run: {e}")))?;
    let path = dir.join("run.pickle");
    let conf = trace.meta.alloc_conf.as_deref().unwrap_or("");
    let calls = calls(trace, &recorder.events);
    allocsim::write_snapshot(&path, trace, recorder.events, &run.snapshot, "pytorch", conf)
        .map_err(|e| fail(policy, None, format!("writing the snapshot: {e:#}")))?;
    let stats: serde_json::Map<String, serde_json::Value> =
        run.stats.flat().into_iter().map(|(k, v)| (k, v.into())).collect();
    let total = trace.meta.device_total_bytes.unwrap_or(H100_TOTAL_BYTES);
    let sidecar = serde_json::json!({
        "meta": { "alloc_conf": conf, "total_memory": total, "calls": calls },
        "memory_stats": stats,
    });
    std::fs::write(dir.join("run.json"), sidecar.to_string())
        .map_err(|e| fail(policy, None, format!("writing the sidecar: {e}")))?;
    let back = read_trace_with(&path, &ReadOptions::default())
        .map_err(|e| fail(policy, None, format!("reading the capture back: {e}")))?;
    let opts = RunOptions { policy: policy.to_string(), fidelity: true, ..RunOptions::default() };
    let replay = run_trace(&back, &opts, &mut [], |_| {})
        .map_err(|e| fail(policy, None, format!("replaying the capture: {e}")))?;
    let ops = || back.ops.iter().map(crate::program::format_op).collect::<Vec<_>>().join("; ");
    match replay.fidelity {
        Some(Ok(n)) if n == back.recorded.len() as u64 => {}
        other => {
            return Err(fail(policy, None, format!("events: {other:?}; ops read back: {}", ops())))
        }
    }
    let (want, got) = (run.stats.flat(), replay.stats.flat());
    if let Some((k, v)) = want.iter().zip(&got).find(|(a, b)| a != b).map(|(a, _)| a) {
        let ours = got.iter().find(|(g, _)| g == k).map(|(_, v)| *v);
        return Err(fail(
            policy,
            None,
            format!("{k}: the run counted {v}, its capture replays to {ours:?}; ops: {}", ops()),
        ));
    }
    Ok(())
}
