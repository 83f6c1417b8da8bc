//! `allocsim explain-oom TRACE [--policy P]`.

use crate::input::progress_bar;
use crate::output::{bytes, counted, outln};
use allocsim_core::Trace;
use allocsim_replay::OomExplainer;
use allocsim_run::{run_trace, DeviceChoice, RunOptions};
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace (any format `replay` reads).
    trace: PathBuf,
    /// The policy to explain.
    #[arg(long, default_value = "pytorch")]
    policy: String,
    /// Allocator settings in the policy's syntax. Default: the trace's.
    #[arg(long)]
    alloc_conf: Option<String>,
    /// Device memory, total and free at start (bytes, or `40GiB`, `40GB`, `4e10`). Default: the
    /// trace's own device.
    #[arg(long, value_parser = crate::output::parse_size)]
    device_total: Option<u64>,
    /// Explain at most this many OOMs.
    #[arg(long, default_value_t = 20)]
    limit: usize,
}

/// The stack of the op that allocated a fence, as "name (file:line)" lines, innermost first.
fn stack_of(trace: &Trace, op: u64) -> Vec<String> {
    let Ok(i) = trace.op_stacks.binary_search_by_key(&op, |&(o, _)| o) else {
        return Vec::new();
    };
    let stack = &trace.stacks[trace.op_stacks[i].1 as usize];
    stack.frames.iter().take(6).map(|f| format!("{} ({}:{})", f.name, f.filename, f.line)).collect()
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let trace = crate::input::load_trace(&args.trace)?;
    let opts = RunOptions {
        policy: args.policy.clone(),
        alloc_conf: args.alloc_conf.clone(),
        device: DeviceChoice::Auto,
        device_total_bytes: args.device_total,
        device_free_bytes: args.device_total,
        ..RunOptions::default()
    };
    let mut explainer = OomExplainer::default();
    let report =
        run_trace(&trace, &opts, &mut [&mut explainer], progress_bar(trace.ops.len() as u64))
            .with_context(|| format!("setting up the {} policy", args.policy))?;
    let mut out = String::new();
    outln!(
        out,
        "{}: {} under {} on the {} device",
        args.trace.display(),
        counted(explainer.explanations.len() as u64, "OOM", "OOMs"),
        args.policy,
        report.device
    );
    for e in explainer.explanations.iter().take(args.limit) {
        let i = &e.info;
        outln!(out, "\nOOM at op {}: {} requested (rounded)", e.op_index, bytes(i.rounded_bytes));
        outln!(
            out,
            "  device free: {} of {}",
            bytes(i.device_free_bytes),
            bytes(i.device_total_bytes)
        );
        if let Some(allowed) = i.allowed_bytes {
            outln!(out, "  allowed by the memory fraction: {}", bytes(allowed));
        }
        outln!(
            out,
            "  allocated: {}; reserved: {}",
            bytes(i.allocated_bytes),
            bytes(i.reserved_bytes)
        );
        outln!(out, "  reserved but unallocated: {}", bytes(i.cached_bytes()));
        for r in &e.largest_free {
            outln!(
                out,
                "  largest free block in the {}: {} at {:#x}",
                r.pool.stats_name().replace('_', " "),
                bytes(r.size),
                r.addr
            );
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
                for frame in f.alloc_op.map(|op| stack_of(&trace, op)).unwrap_or_default() {
                    outln!(out, "      {frame}");
                }
            }
        }
    }
    if explainer.explanations.len() > args.limit {
        outln!(out, "\n... and {} more (--limit)", explainer.explanations.len() - args.limit);
    }
    if args.policy == "pytorch" && !explainer.explanations.is_empty() {
        settings_that_avoid(&mut out, &trace, &opts, &explainer, args.limit)?;
    }
    crate::output::emit(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// For each OOM explained, the settings `allocsim advise` tries under which that op does not
/// fail on the same device (the ops replayed as recorded).
fn settings_that_avoid(
    out: &mut String,
    trace: &Trace,
    opts: &RunOptions,
    explainer: &OomExplainer,
    limit: usize,
) -> anyhow::Result<()> {
    use rayon::prelude::*;
    let own = opts.alloc_conf.clone().or(trace.meta.alloc_conf.clone()).unwrap_or_default();
    let failing: Vec<(&str, Vec<u64>)> = crate::capacity::ADVISE_SETTINGS
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
    outln!(out, "\nSettings that avoid each OOM (PYTORCH_CUDA_ALLOC_CONF, same device):");
    for e in explainer.explanations.iter().take(limit) {
        let avoid: Vec<&str> = failing
            .iter()
            .filter(|(_, ooms)| !ooms.contains(&e.op_index))
            .map(|(conf, _)| crate::output::conf_label(conf))
            .collect();
        let list =
            if avoid.is_empty() { "none of those tried".to_string() } else { avoid.join("  |  ") };
        outln!(out, "  op {}: {list}", e.op_index);
    }
    let clean: Vec<&str> = failing
        .iter()
        .filter(|(_, ooms)| ooms.is_empty())
        .map(|(conf, _)| crate::output::conf_label(conf))
        .collect();
    if !clean.is_empty() {
        outln!(out, "  no OOM at all under: {}", clean.join("  |  "));
    }
    Ok(())
}
