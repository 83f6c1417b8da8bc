//! `allocsim bound TRACE`: the least memory any allocator needs for the trace, what one that
//! knows every lifetime in advance reaches, and how far the policy is from them.

use crate::output::{bytes, outln};
use allocsim_run::{run_trace, RunOptions};
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace (any format `replay` reads).
    pub trace: PathBuf,
    /// The policy held against the bound.
    #[arg(long, default_value = "pytorch")]
    pub policy: String,
    /// Its settings (for pytorch, a PYTORCH_CUDA_ALLOC_CONF string). Default: the trace's.
    #[arg(long)]
    pub alloc_conf: Option<String>,
}

pub fn run(args: &Args, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    let trace = cx.trace(&args.trace)?;
    let b = allocsim_bound::bound(&trace);
    let opts = RunOptions {
        policy: args.policy.clone(),
        alloc_conf: args.alloc_conf.clone(),
        ..RunOptions::default()
    };
    let report = run_trace(&trace, &opts, &mut [], |_| {})?;
    let policy = report.stats.reserved_bytes.all.peak.max(0) as u64;
    let (bound, offline) = (b.bound_bytes, b.offline.map(|(bytes, _)| bytes));
    // Negative where the policy needs less: see `Bound::headroom`.
    let headroom = |best: u64| policy as i64 - best as i64;
    let percent = |best: u64| 100.0 * headroom(best) as f64 / policy.max(1) as f64;
    let j = json!({
            "trace": args.trace.display().to_string(),
            "allocations": b.allocations,
            "peak_live_bytes": b.peak_live_bytes,
            "bound_bytes": bound,
            "offline_bytes": offline,
            "offline_order": b.offline.map(|(_, order)| order),
            "policy": report.policy,
            "alloc_conf": report.alloc_conf,
            "policy_peak_reserved_bytes": policy,
            "headroom_over_offline_bytes": b.headroom(policy),
            "headroom_over_bound_bytes": headroom(bound),
    });
    let signed = |b: i64| {
        if b < 0 {
            format!("-{}", bytes(b.unsigned_abs()))
        } else {
            bytes(b as u64)
        }
    };
    let mut out = String::new();
    outln!(out, "{} allocations", b.allocations);
    outln!(out, "bound (peak live bytes, in whole pages):  {}", bytes(bound));
    match b.offline {
        Some((offline, order)) => outln!(
            out,
            "offline placement (every lifetime known): {} (order: {})",
            bytes(offline),
            order
        ),
        None => outln!(
            out,
            "offline placement: not computed (too many allocations live at once); the bound stands"
        ),
    }
    let conf = allocsim_core::text::quoted(&report.alloc_conf);
    outln!(out, "{} {conf} peak reserved: {}", report.policy, bytes(policy));
    if let Some(offline) = offline {
        outln!(
            out,
            "headroom over the offline placement: {} ({:.1} %)",
            signed(headroom(offline)),
            percent(offline)
        );
    }
    outln!(out, "headroom over the bound: {} ({:.1} %)", signed(headroom(bound)), percent(bound));
    Ok(crate::Output::both(j, out))
}
