//! `allocsim fidelity TRACE [--truth STATS.json]`.

use crate::output::{outln, stat_differences};
use allocsim_replay::{run_trace, DeviceChoice, RunOptions};
use anyhow::{bail, Context};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A PyTorch snapshot with its trace (history recorded with `enabled="all"`).
    trace: PathBuf,
    /// `torch.cuda.memory_stats()` of the recorded run, as JSON: either the flat dict or an
    /// object with a `memory_stats` member. Default: the trace's sidecar NAME.json, if any.
    #[arg(long)]
    truth: Option<PathBuf>,
    /// The policy that should reproduce the recording.
    #[arg(long, default_value = "pytorch")]
    policy: String,
    /// Follow the recording's addresses and refusals (the default) or use the modelled device.
    #[arg(long)]
    model: bool,
}

fn read_truth(path: &PathBuf) -> anyhow::Result<Vec<(String, i64)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("parsing {} as JSON", path.display()))?;
    let stats = json.get("memory_stats").unwrap_or(&json);
    let Some(map) = stats.as_object() else {
        bail!("{}: expected an object of memory_stats keys", path.display());
    };
    map.iter()
        .map(|(k, v)| match v.as_i64() {
            Some(n) => Ok((k.clone(), n)),
            None => bail!("{}: memory_stats key {k:?} is not an integer", path.display()),
        })
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut trace = allocsim_trace::read_trace(&args.trace)?;
    if let Some(path) = &args.truth {
        trace.meta.expected_stats = Some(read_truth(path)?);
    }
    if trace.recorded.is_empty() {
        bail!("{}: the trace records no allocator events to compare with", args.trace.display());
    }
    let opts = RunOptions {
        policy: args.policy.clone(),
        device: if args.model { DeviceChoice::Sim } else { DeviceChoice::Recorded },
        fidelity: true,
        ..RunOptions::default()
    };
    let report = run_trace(&trace, &opts, &mut [], |_| {})?;
    let mut out = String::new();
    let mut exact = true;
    match report.fidelity.unwrap_or(Ok(0)) {
        Ok(n) => outln!(out, "events: exact ({n} events, every action, size and segment offset)"),
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
    match &trace.meta.expected_stats {
        Some(expected) => {
            let d = stat_differences(&report.stats, expected);
            if d.is_empty() {
                outln!(out, "memory_stats: exact ({} keys)", expected.len());
            } else {
                exact = false;
                outln!(out, "memory_stats: {} keys differ", d.len());
                for (k, a, b) in &d {
                    outln!(out, "  {k}: recorded {a:?}, simulated {b:?}");
                }
            }
        }
        None => outln!(out, "memory_stats: no recorded statistics to compare (use --truth)"),
    }
    outln!(out, "{}", if exact { "exact" } else { "not exact" });
    crate::output::emit(&out)?;
    Ok(if exact { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
