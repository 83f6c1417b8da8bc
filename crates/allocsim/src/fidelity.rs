//! `allocsim fidelity TRACE [--truth STATS.json]`.

use crate::output::{comparable, outln, read_stats_json, recorded_differences};
use allocsim_run::{run_trace, DeviceChoice, RunOptions};
use anyhow::bail;
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A PyTorch snapshot with its trace (history recorded with `enabled="all"`).
    pub trace: PathBuf,
    /// Further ranks' traces: with them, or a folder or a pattern (`run/rank*.pickle.gz`) as
    /// TRACE, the command answers per rank and for the job.
    pub more: Vec<PathBuf>,
    /// `torch.cuda.memory_stats()` of the recorded run, as JSON: either the flat dict or an
    /// object with a `memory_stats` member. Default: the trace's sidecar NAME.json, if any.
    #[arg(long)]
    pub truth: Option<PathBuf>,
    /// The policy that should reproduce the recording.
    #[arg(long, default_value = "pytorch")]
    pub policy: String,
    /// Follow the recording's addresses and refusals (the default) or use the modelled device.
    #[arg(long)]
    pub model: bool,
    /// With `--model`: how the modelled device places segments (`driver`, `recorded`,
    /// `jittered:SEED`, `descending`, `lowest`).
    #[arg(long, value_parser = allocsim_sim::Placement::parse, default_value = "driver")]
    pub placement: allocsim_sim::Placement,
    /// `torch.cuda.memory_stats()` when a history that starts mid-run began, as JSON (the flat
    /// dict, or an object with a `memory_stats` member). Default: the sidecar's
    /// `meta.memory_stats_at_history_start`, if any.
    #[arg(long, value_name = "FILE")]
    pub stats_at_start: Option<PathBuf>,
}

pub fn run(args: &Args, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    if let Some(paths) = crate::job::paths(&args.trace, &args.more)? {
        let job = crate::job::load(&paths, cx)?;
        if args.truth.is_some() || args.stats_at_start.is_some() {
            bail!(
                "--truth and --stats-at-start give one run's statistics, and a job has {} ranks: \
                 each rank's sidecar gives its own",
                job.ranks.len()
            );
        }
        let outs = job.each(|r, cx| {
            run(&Args { trace: r.path.clone(), more: Vec::new(), ..args.clone() }, cx)
        })?;
        return crate::per_rank::fidelity(&job, outs);
    }
    let mut trace = cx.trace(&args.trace)?;
    if let Some(path) = &args.truth {
        trace.to_mut().meta.expected_stats = Some(read_stats_json(path)?);
    }
    if let Some(path) = &args.stats_at_start {
        trace.to_mut().meta.stats_at_start = Some(read_stats_json(path)?);
    }
    if trace.recorded.is_empty() {
        bail!(
            "{}: fidelity needs a PyTorch memory snapshot (or a trace converted from one), whose \
             recorded allocator events a replay is compared with; this trace has none. Record \
             one as the README's \"Recording a snapshot\" shows, or run `allocsim replay` on \
             this one",
            args.trace.display()
        );
    }
    let opts = RunOptions {
        policy: args.policy.clone(),
        device: if args.model { DeviceChoice::Sim } else { DeviceChoice::Recorded },
        fidelity: true,
        placement: args.placement,
        ..RunOptions::default()
    };
    let report = run_trace(&trace, &opts, &mut [], |_| {})?;
    let mut out = String::new();
    let mut exact = true;
    match report.fidelity.clone().unwrap_or(Ok(0)) {
        Ok(n) => outln!(out, "events: exact ({n} events, every action, size, segment and offset)"),
        Err(d) => {
            exact = false;
            outln!(out, "events: diverged at recorded event {} (op {})", d.event_index, d.op_index);
            outln!(out, "  expected:  {}", d.expected.as_deref().unwrap_or("(end of recording)"));
            outln!(out, "  simulated: {}", d.simulated.as_deref().unwrap_or("(end of simulation)"));
        }
    }
    for note in &report.device_notes {
        outln!(out, "  device: {note}");
    }
    // The one warning of the reading that bears on every figure here.
    if let Some(note) = crate::input::version_note(&trace.meta) {
        outln!(out, "  version: {note}");
    }
    if let Some(note) = report.start.note() {
        outln!(out, "  start: {note}");
    }
    match &trace.meta.expected_stats {
        Some(expected) => {
            let mut d = recorded_differences(&report, expected);
            // Without the capture's record of the calls, an `empty_cache()` that freed nothing
            // is not in the trace: the recording does not determine this count.
            let undetermined = (!trace.meta.calls_recorded)
                .then(|| d.iter().position(|(k, a, b)| k == SYNCS && a > b))
                .flatten()
                .map(|i| d.remove(i));
            let compared = comparable(&report, expected).count();
            let held = compared - usize::from(undetermined.is_some());
            if d.is_empty() && compared < expected.len() {
                outln!(
                    out,
                    "memory_stats: exact ({held} current values; cumulative values are \
                     compared with --stats-at-start)"
                );
            } else if d.is_empty() {
                outln!(out, "memory_stats: exact ({held} of {} keys)", expected.len());
            } else {
                exact = false;
                outln!(out, "memory_stats: {} keys differ", d.len());
                for (k, a, b) in &d {
                    outln!(out, "  {k}: recorded {}, simulated {}", shown(*a), shown(*b));
                }
            }
            if let Some((k, a, b)) = undetermined {
                outln!(
                    out,
                    "  {k}: not determined by this recording (recorded {}, the trace shows {}): \
                     an empty_cache() that frees nothing, as torch.cuda.graph makes before each \
                     capture, leaves no trace entry; allocsim.capture records every call",
                    shown(a),
                    shown(b)
                );
            }
        }
        None => outln!(out, "memory_stats: no recorded statistics to compare (use --truth)"),
    }
    outln!(out, "{}", if exact { "exact" } else { "not exact" });
    Ok(crate::Output { failed: !exact, ..crate::Output::text(out) })
}

/// The statistic an `empty_cache()` that frees nothing counts and a snapshot does not show.
const SYNCS: &str = "num_sync_all_streams";

/// A statistic's value as the text shows it: the number, or "absent".
fn shown(value: Option<i64>) -> String {
    value.map_or_else(|| "absent".to_string(), |v| v.to_string())
}
