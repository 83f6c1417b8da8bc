//! `allocsim compare TRACE... --policy all|a,b,c`: the policy x trace grid.

use crate::output::outln;
use allocsim_bound::Bound;
use allocsim_core::text::quoted;
use allocsim_core::Allocator;
use allocsim_run::{compare, GridCell, RunOptions};
use anyhow::{bail, Context};
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Traces to compare on (any format `replay` reads).
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// `all`, or a comma-separated list of columns, each a policy under its defaults (`bfc`) or
    /// under settings in its own syntax (`pytorch[expandable_segments:True]`,
    /// `pytorch[max_split_size_mb:128,roundup_power2_divisions:4]`). `pytorch` alone replays a
    /// recording under the settings it was recorded with.
    #[arg(long, default_value = "all")]
    pub policy: String,
    /// Cap reserved memory at this fraction of the device total, in every column.
    #[arg(long)]
    pub memory_fraction: Option<f64>,
    /// Device memory, total and free at start (bytes, or `40GiB`, `40GB`, `4e10`). Default:
    /// each trace's own device.
    #[arg(long, value_parser = crate::output::parse_size)]
    pub device_total: Option<u64>,
    /// Skip the minimum-feasible-capacity bisection (about 16 more runs per cell).
    #[arg(long)]
    pub no_capacity: bool,
    /// Also write a self-contained HTML report (timelines, segment map at peak, table).
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub jobs: Option<usize>,
}

/// The columns `--policy` names: policies, each with settings in brackets or not.
fn policies(spec: &str) -> anyhow::Result<Vec<String>> {
    if spec == "all" {
        return Ok(allocsim_policies::names().iter().map(|s| s.to_string()).collect());
    }
    // Split at the commas outside brackets: settings have commas of their own.
    let (mut columns, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in spec.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                columns.push(spec[start..i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    columns.push(spec[start..].trim().to_string());
    for column in &columns {
        let (name, conf) = allocsim_policies::parse_spec(column);
        if name.contains(['[', ']']) || depth != 0 {
            bail!("policies {}: {} is not NAME or NAME[SETTINGS]", quoted(spec), quoted(column));
        }
        // The offline policy is planned from each trace (`allocsim_run::offline_policy`);
        // here only its settings, none, are checked.
        let known = match name {
            allocsim_run::OFFLINE => {
                allocsim_policies::offline::Offline::new(0, []).set_settings(conf.unwrap_or(""))
            }
            _ => allocsim_policies::by_name(name, conf).map(drop),
        };
        known.with_context(|| format!("policy column {}", quoted(column)))?;
    }
    Ok(columns)
}

pub fn run(args: &Args, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    if let Some(path) = &args.html {
        let inputs: Vec<&std::path::Path> = args.traces.iter().map(|t| t.as_path()).collect();
        crate::output::check_output(path, &inputs)?;
    }
    let policies = policies(&args.policy)?;
    let mut traces = Vec::new();
    for path in &args.traces {
        traces.push((crate::input::trace_name(path), cx.trace(path)?));
    }
    // A pool of this call's own when `jobs` says how many: the process's other calls keep
    // theirs.
    let pool = match args.jobs {
        Some(jobs) => Some(rayon::ThreadPoolBuilder::new().num_threads(jobs).build()?),
        None => None,
    };
    let base = RunOptions {
        device_total_bytes: args.device_total,
        device_free_bytes: args.device_total,
        memory_fraction: args.memory_fraction,
        check: true,
        ..RunOptions::default()
    };
    let cells = (traces.len() * policies.len()) as u64;
    let bar = cx.progress.then(|| crate::input::bar("compare", cells, "cells"));
    let grid = || {
        compare(&traces, &policies, &base, !args.no_capacity, || {
            if let Some(bar) = &bar {
                bar.inc(1)
            }
        })
    };
    let cells = match &pool {
        Some(pool) => pool.install(grid),
        None => grid(),
    }
    .context("running the comparison grid")?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // Each trace's bound and offline placement (`allocsim bound`): the headroom column.
    let bounds: HashMap<&str, Bound> =
        traces.iter().map(|(name, trace)| (name.as_str(), allocsim_bound::bound(trace))).collect();
    let mut notes = Vec::new();
    if let Some(path) = &args.html {
        let html = crate::html::report(&traces, &cells, &base)?;
        crate::write_atomically(path, html.as_bytes())?;
        notes.push(format!("wrote {}", path.display()));
    }
    let rows: Vec<serde_json::Value> =
        cells.iter().map(|c| row(c, &bounds[c.trace.as_str()])).collect();
    let violations: u64 =
        cells.iter().map(|c| c.report.check.as_ref().map_or(0, |r| r.total_violations())).sum();
    Ok(crate::Output {
        json: Some(serde_json::Value::Array(rows)),
        text: tables(&cells, &bounds),
        notes,
        failed: violations > 0,
    })
}

fn row(c: &GridCell, b: &Bound) -> serde_json::Value {
    let m = &c.report.metrics;
    serde_json::json!({
        "bound_bytes": b.bound_bytes,
        "offline_bytes": b.offline.map(|(bytes, _)| bytes),
        "headroom_bytes": b.headroom(m.peak_reserved_bytes),
        "trace": c.trace,
        "policy": c.policy,
        "alloc_conf": c.report.alloc_conf,
        "device": c.report.device,
        "peak_allocated_bytes": m.peak_allocated_bytes,
        "peak_reserved_bytes": m.peak_reserved_bytes,
        "fragmentation_at_peak": m.fragmentation_at_peak,
        "ooms": m.ooms.len(),
        "device_calls": c.report.device_calls.total_calls(),
        "device_call_time_ns": c.report.device_calls.total_time_ns(),
        "min_feasible_capacity_bytes": c.min_feasible_capacity_bytes,
        "checker_violations": c.report.check.as_ref().map_or(0, |r| r.total_violations()),
    })
}

fn gib(n: u64) -> String {
    format!("{:.3}", n as f64 / (1u64 << 30) as f64)
}

fn tables(cells: &[GridCell], bounds: &HashMap<&str, Bound>) -> String {
    let w = cells.iter().map(|c| c.policy.len()).max().unwrap_or(0).max(14);
    let mut out = String::new();
    let mut current = "";
    for c in cells {
        if c.trace != current {
            current = &c.trace;
            let b = &bounds[current];
            outln!(out, "\n{current}");
            let offline = b.offline.map_or("not computed".into(), |(o, _)| format!("{}Gi", gib(o)));
            outln!(
                out,
                "  bound {}Gi, offline placement {offline} (allocsim bound)",
                gib(b.bound_bytes)
            );
            outln!(
                out,
                "  {:<w$} {:>8} {:>12} {:>12} {:>10} {:>8} {:>6} {:>8} {:>11} {:>14} {:>6}",
                "policy",
                "device",
                "peak alloc",
                "peak rsrvd",
                "headroom",
                "frag",
                "OOMs",
                "calls",
                "call time",
                "min capacity",
                "viol."
            );
        }
        let m = &c.report.metrics;
        let headroom = bounds[c.trace.as_str()].headroom(m.peak_reserved_bytes);
        outln!(
            out,
            "  {:<w$} {:>8} {:>10}Gi {:>10}Gi {:>10} {:>7.2}% {:>6} {:>8} {:>9.1}ms {:>14} {:>6}",
            c.policy,
            c.report.device,
            gib(m.peak_allocated_bytes),
            gib(m.peak_reserved_bytes),
            headroom.map_or("-".into(), |h| {
                format!("{:.1}%", 100.0 * h as f64 / m.peak_reserved_bytes.max(1) as f64)
            }),
            100.0 * m.fragmentation_at_peak,
            m.ooms.len(),
            c.report.device_calls.total_calls(),
            c.report.device_calls.total_time_ns() as f64 / 1e6,
            c.min_feasible_capacity_bytes.map_or("-".to_string(), |b| format!("{}Gi", gib(b))),
            c.report.check.as_ref().map_or(0, |r| r.total_violations()),
        );
    }
    outln!(
        out,
        "\ndevice: `recorded` follows the recording's device calls and addresses (the PyTorch \
         policy under the recording's own settings), `sim` is the modelled device; min capacity \
         is always bisected on the model, and is the allocator's own: `allocsim capacity` adds \
         the memory the run takes outside the allocator (CUDA context growth, kernels, library \
         workspaces), as free memory at the start must hold it; headroom is the share of peak \
         reserved above the offline placement"
    );
    out
}
