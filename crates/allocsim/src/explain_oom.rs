//! `allocsim explain-oom TRACE [--policy P]`.

use crate::input::progress_bar;
use crate::output::{bytes, counted, outln};
use allocsim_core::Trace;
use allocsim_replay::{OomExplainer, OomExplanation};
use allocsim_run::{run_trace, DeviceChoice, RunOptions};
use anyhow::Context;
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The trace (any format `replay` reads).
    pub trace: PathBuf,
    /// Further ranks' traces: with them, or a folder or a pattern (`run/rank*.pickle.gz`) as
    /// TRACE, each rank's OOMs are explained and the job says which ranks have any.
    pub more: Vec<PathBuf>,
    #[command(flatten)]
    pub run: crate::input::RunArgs,
    /// Explain at most this many OOMs.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
}

/// The stack of the op that allocated a fence, as "name (file:line)" lines, innermost first.
fn stack_of(trace: &Trace, op: u64) -> Vec<String> {
    let Ok(i) = trace.op_stacks.binary_search_by_key(&op, |&(o, _)| o) else {
        return Vec::new();
    };
    let stack = &trace.stacks[trace.op_stacks[i].1 as usize];
    stack.frames.iter().take(6).map(|f| format!("{} ({}:{})", f.name, f.filename, f.line)).collect()
}

pub fn run(args: &Args, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    if let Some(paths) = crate::job::paths(&args.trace, &args.more)? {
        let job = crate::job::load(&paths, cx)?;
        let outs = job.each(|r, cx| {
            run(&Args { trace: r.path.clone(), more: Vec::new(), ..args.clone() }, cx)
        })?;
        return crate::per_rank::explain_oom(&job, outs);
    }
    let trace = cx.trace(&args.trace)?;
    let opts = args.run.options();
    let mut explainer = OomExplainer::default();
    let report = run_trace(
        &trace,
        &opts,
        &mut [&mut explainer],
        progress_bar(cx, "explain", trace.ops.len() as u64),
    )
    .with_context(|| {
        format!(
            "{}: setting up the {} policy",
            args.trace.display(),
            allocsim_core::text::excerpt(&args.run.policy)
        )
    })?;
    let shown = &explainer.explanations[..explainer.explanations.len().min(args.limit)];
    let avoiding = if args.run.policy == "pytorch" && !shown.is_empty() {
        Some(settings_that_avoid(&trace, &opts)?)
    } else {
        None
    };
    let json = serde_json::json!({
            "trace": args.trace.display().to_string(),
            "policy": args.run.policy,
            "device": report.device,
            "ooms": explainer.explanations.len(),
            "explained": shown.iter().map(|e| explanation_json(&trace, e, avoiding.as_ref())).collect::<Vec<_>>(),
            "no_oom_under": avoiding.as_ref().map(|a| a.clean.clone()),
    });
    let text = {
        let mut out = String::new();
        outln!(
            out,
            "{}: {} under {} on the {} device",
            args.trace.display(),
            counted(explainer.explanations.len() as u64, "OOM", "OOMs"),
            args.run.policy,
            report.device
        );
        for e in shown {
            explanation_text(&mut out, &trace, e);
        }
        if explainer.explanations.len() > args.limit {
            outln!(out, "\n... and {} more (--limit)", explainer.explanations.len() - args.limit);
        }
        if let Some(avoiding) = &avoiding {
            outln!(out, "\nSettings that avoid each OOM (PYTORCH_CUDA_ALLOC_CONF, same device):");
            for e in shown {
                let list = avoiding.of(e.op_index).join("  |  ");
                let list = if list.is_empty() { "none of those tried".to_string() } else { list };
                outln!(out, "  op {}: {list}", e.op_index);
            }
            if !avoiding.clean.is_empty() {
                outln!(out, "  no OOM at all under: {}", avoiding.clean.join("  |  "));
            }
        }
        out
    };
    Ok(crate::Output::both(json, text))
}

pub(crate) fn explanation_text(out: &mut String, trace: &Trace, e: &OomExplanation) {
    let i = &e.info;
    outln!(out, "\nOOM at op {}: {} requested (rounded)", e.op_index, bytes(i.rounded_bytes));
    for frame in stack_of(trace, e.op_index) {
        outln!(out, "    {frame}");
    }
    outln!(out, "  device free: {} of {}", bytes(i.device_free_bytes), bytes(i.device_total_bytes));
    if i.rounded_bytes > i.device_total_bytes {
        outln!(
            out,
            "  this request alone is larger than the device's total memory: no allocator and no \
             setting serves it on this device"
        );
    }
    if let Some(allowed) = i.allowed_bytes {
        outln!(out, "  allowed by the memory fraction: {}", bytes(allowed));
    }
    outln!(out, "  allocated: {}; reserved: {}", bytes(i.allocated_bytes), bytes(i.reserved_bytes));
    outln!(out, "  reserved but unallocated: {}", bytes(i.cached_bytes()));
    for r in &e.largest_free {
        let pool = r.pool.stats_name().replace('_', " ");
        outln!(out, "  largest free block in the {pool}: {} at {:#x}", bytes(r.size), r.addr);
        for f in &r.fences {
            let origin = match (f.id, f.alloc_op) {
                (Some(id), Some(op)) => format!("allocation {} from op {op}", id.0),
                _ => "allocated before the trace began".to_string(),
            };
            outln!(
                out,
                "    fenced by a live block of {} at {:#x}: {origin}",
                bytes(f.size),
                f.addr
            );
            for frame in f.alloc_op.map(|op| stack_of(trace, op)).unwrap_or_default() {
                outln!(out, "      {frame}");
            }
        }
    }
}

fn explanation_json(
    trace: &Trace,
    e: &OomExplanation,
    avoiding: Option<&Avoiding>,
) -> serde_json::Value {
    let i = &e.info;
    let regions: Vec<_> = e
        .largest_free
        .iter()
        .map(|r| {
            let fences: Vec<_> = r
                .fences
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "address": f.addr,
                        "size": f.size,
                        "allocation_id": f.id.map(|id| id.0),
                        "alloc_op": f.alloc_op,
                        "frames": f.alloc_op.map(|op| stack_of(trace, op)).unwrap_or_default(),
                    })
                })
                .collect();
            serde_json::json!({
                "pool": r.pool.stats_name(),
                "address": r.addr,
                "size": r.size,
                "fences": fences,
            })
        })
        .collect();
    serde_json::json!({
        "op": e.op_index,
        "rounded_bytes": i.rounded_bytes,
        "frames": stack_of(trace, e.op_index),
        "device_free_bytes": i.device_free_bytes,
        "device_total_bytes": i.device_total_bytes,
        "allowed_bytes": i.allowed_bytes,
        "allocated_bytes": i.allocated_bytes,
        "reserved_bytes": i.reserved_bytes,
        "reserved_but_unallocated_bytes": i.cached_bytes(),
        "largest_free": regions,
        "avoided_by": avoiding.map(|a| a.of(e.op_index)),
    })
}

/// The `allocsim advise` settings, each with the ops at which it still OOMs on the same device.
struct Avoiding {
    failing: Vec<(&'static str, Vec<u64>)>,
    /// The settings under which nothing OOMs.
    clean: Vec<&'static str>,
}

impl Avoiding {
    /// The settings under which the op does not fail.
    fn of(&self, op: u64) -> Vec<&'static str> {
        let avoid = self.failing.iter().filter(|(_, ooms)| !ooms.contains(&op));
        avoid.map(|(conf, _)| crate::output::conf_label(conf)).collect()
    }
}

/// For each OOM explained, the settings `allocsim advise` tries under which that op does not
/// fail on the same device (the ops replayed as recorded).
fn settings_that_avoid(trace: &Trace, opts: &RunOptions) -> anyhow::Result<Avoiding> {
    use rayon::prelude::*;
    let own = opts.alloc_conf.clone().or(trace.meta.alloc_conf.clone()).unwrap_or_default();
    let failing: Vec<(&'static str, Vec<u64>)> = crate::capacity::ADVISE_SETTINGS
        .par_iter()
        .filter(|conf| **conf != own)
        .map(|conf| {
            let run = RunOptions {
                alloc_conf: Some(conf.to_string()),
                device: DeviceChoice::Sim,
                ..opts.clone()
            };
            let report = run_trace(trace, &run, &mut [], |_| {})?;
            Ok((*conf, report.metrics.ooms.iter().map(|o| o.op_index).collect()))
        })
        .collect::<anyhow::Result<_>>()?;
    let clean = failing
        .iter()
        .filter(|(_, ooms)| ooms.is_empty())
        .map(|(conf, _)| crate::output::conf_label(conf))
        .collect();
    Ok(Avoiding { failing, clean })
}
