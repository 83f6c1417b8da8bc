//! What `validate` prints: the verdict's text and its JSON.

use super::*;
use crate::output::outln;
use allocsim_core::text::quoted;

pub(super) fn calls_line(r: &RunReport) -> String {
    let calls: Vec<String> = CallKind::ALL
        .iter()
        .filter(|&&k| r.device_calls.get(k).calls > 0)
        .map(|&k| {
            let c = r.device_calls.get(k);
            let refused =
                if c.failed > 0 { format!(", {} refused", c.failed) } else { String::new() };
            format!("{} {} ({:.3} ms{refused})", c.calls, k.name(), c.time_ns as f64 / 1e6)
        })
        .collect();
    format!("{} [{}]", r.device_calls.total_calls(), calls.join(", "))
}

/// The verdict as text; the caller prints it through `output::emit`, which escapes what came
/// from the trace (its settings, the device's notes).
pub(super) fn print(
    args: &Args,
    trace: &Trace,
    hw: &HardwareRun,
    model: &Comparison,
    following: &Following,
    violations: u64,
    verdict: &str,
) -> String {
    let r = &hw.report;
    let mut out = String::new();
    outln!(out, "allocsim validate {} --policy {}", args.input.display(), args.policy);
    outln!(out, "  hardware: {}", hw.description);
    outln!(
        out,
        "    {} total, {} free at start; policy settings {}{}",
        bytes(r.device_total_bytes),
        bytes(r.device_free_bytes),
        quoted(&r.alloc_conf),
        r.memory_fraction.map(|f| format!(", memory fraction {f}")).unwrap_or_default()
    );
    outln!(
        out,
        "    ops: {} of {}  events: {}  wall time: {:.3} s ({:.2} us/op)",
        r.ops_run,
        trace.ops.len(),
        r.metrics.events,
        hw.wall.as_secs_f64(),
        per_op_us(hw.wall, r.ops_run)
    );
    outln!(out, "    device calls: {}", calls_line(r));
    outln!(
        out,
        "    peak reserved {}, peak allocated {}",
        bytes(r.metrics.peak_reserved_bytes),
        bytes(r.metrics.peak_allocated_bytes)
    );
    let ooms: Vec<u64> = r.metrics.ooms.iter().map(|o| o.op_index).collect();
    outln!(
        out,
        "    OOMs: {} (simulated: {}){}",
        ooms.len(),
        model.ooms_simulated.len(),
        if ooms == model.ooms_simulated { ", at the same ops" } else { ", at DIFFERENT ops" }
    );
    for note in &r.device_notes {
        outln!(out, "    device note: {note}");
    }
    outln!(out, "    checker: {violations} violations");
    match &hw.patterns {
        Some(p) => outln!(
            out,
            "    patterns: {} blocks filled ({}), {} verified ({} at release), {} read-modify-write touches; {} corrupted words, {} overlapping allocations{}",
            p.blocks_filled,
            bytes(p.bytes_filled),
            p.blocks_verified,
            p.verified_at_release,
            p.touches,
            p.mismatched_words,
            p.overlapping_allocs,
            p.first_mismatch
                .map(|m| format!("; first: allocation {} word {} expected {:#x} found {:#x}", m.id.0, m.word, m.expected, m.found))
                .unwrap_or_default()
        ),
        None => outln!(out, "    patterns: not run"),
    }
    outln!(out, "  simulated, modelled device sized from the hardware: {}", model.summary());
    outln!(
        out,
        "  simulated, answered as the hardware answered each device call: {}",
        following.comparison.summary()
    );
    outln!(out, "    device calls: {}", following.calls_summary());
    outln!(out, "    {}", following.free_memory);
    outln!(out, "  verdict: {verdict}");
    out
}

pub(super) fn comparison_json(c: &Comparison) -> serde_json::Value {
    serde_json::json!({
        "exact": c.exact(),
        "events_compared": c.events.as_ref().ok(),
        "first_difference": c.events.as_ref().err().map(|d| serde_json::json!({
            "event": d.event_index, "op": d.op_index, "hardware": d.expected, "simulated": d.simulated,
        })),
        "stats_differences": c.stats.iter().map(|(k, h, s)| serde_json::json!({"key": k, "hardware": h, "simulated": s})).collect::<Vec<_>>(),
        "ooms": c.ooms_simulated.len(),
        "summary": c.summary(),
    })
}

pub(super) fn following_json(f: &Following) -> serde_json::Value {
    let mut value = comparison_json(&f.comparison);
    value["logged_calls"] = f.logged_calls.into();
    value["followed_calls"] = f.followed_calls.into();
    value["followed_all"] = f.followed_all().into();
    value["calls_summary"] = f.calls_summary().into();
    value["left"] = f.left.clone().into();
    value["unreached"] = f.unreached.clone().into();
    value["free_memory"] = f.free_memory.clone().into();
    value
}

pub(super) fn json(
    args: &Args,
    trace: &Trace,
    hw: &HardwareRun,
    model: &Comparison,
    following: &Following,
    violations: u64,
    verdict: &str,
) -> serde_json::Value {
    let r = &hw.report;
    let calls = crate::output::device_calls_json(&r.device_calls);
    serde_json::json!({
        "input": args.input.display().to_string(),
        "policy": args.policy,
        "hardware": hw.description,
        "alloc_conf": r.alloc_conf,
        "memory_fraction": r.memory_fraction,
        "device_total_bytes": r.device_total_bytes,
        "device_free_bytes": r.device_free_bytes,
        "ops": trace.ops.len(),
        "ops_run": r.ops_run,
        "events": r.metrics.events,
        "wall_s": hw.wall.as_secs_f64(),
        "us_per_op": per_op_us(hw.wall, r.ops_run),
        "device_calls": calls,
        "device_call_time_ns": r.device_calls.total_time_ns(),
        "device_notes": r.device_notes,
        "peak_reserved_bytes": r.metrics.peak_reserved_bytes,
        "peak_allocated_bytes": r.metrics.peak_allocated_bytes,
        "ooms": r.metrics.ooms.len(),
        "checker_violations": violations,
        "patterns": hw.patterns.as_ref().map(|p| serde_json::json!({
            "blocks_filled": p.blocks_filled,
            "bytes_filled": p.bytes_filled,
            "blocks_verified": p.blocks_verified,
            "verified_at_release": p.verified_at_release,
            "touches": p.touches,
            "mismatched_words": p.mismatched_words,
            "overlapping_allocs": p.overlapping_allocs,
            "unknown_frees": p.unknown_frees,
        })),
        "model": comparison_json(model),
        "following_device_calls": following_json(following),
        "verdict": verdict,
    })
}
