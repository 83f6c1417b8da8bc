//! `allocsim capacity TRACE`: the smallest free memory the recorded program needs, and
//! `allocsim advise TRACE`: the settings people try, ranked.

use crate::output::{bytes, emit, outln, parse_size};
use allocsim_core::Trace;
use allocsim_replay::{capacity, Capacity, CapacityOptions, RunOptions, OUTSIDE_ALLOCATOR_BYTES};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

/// Seeded jittered placements the band is taken over, besides descending.
const JITTERS: u32 = 16;

/// What both commands take besides the trace.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// Memory the run takes outside the caching allocator (CUDA context growth, lazily loaded
    /// kernels, library workspaces), as bytes or `256MiB`. Default: the sidecar's
    /// `meta.outside_allocator_bytes` (recorded by validation/fit.py), else 246 MiB, measured
    /// on an H100 with PyTorch 2.11 (docs/capacity.md).
    #[arg(long, value_parser = parse_size)]
    outside: Option<u64>,
    /// Print one JSON object instead of the text.
    #[arg(long)]
    json: bool,
}

impl ModelArgs {
    /// The outside memory, and where the figure came from.
    fn outside(&self, trace: &Trace) -> (u64, &'static str) {
        match (self.outside, trace.meta.outside_allocator_bytes) {
            (Some(b), _) => (b, "--outside"),
            (None, Some(b)) => (b, "measured in the recording (sidecar)"),
            (None, None) => (OUTSIDE_ALLOCATOR_BYTES, "the H100 / PyTorch 2.11 model"),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace (any format `replay` reads).
    trace: PathBuf,
    /// Allocator settings in the policy's syntax (for pytorch: a PYTORCH_CUDA_ALLOC_CONF
    /// string). Default: the trace's own.
    #[arg(long)]
    alloc_conf: Option<String>,
    /// The policy.
    #[arg(long, default_value = "pytorch")]
    policy: String,
    #[command(flatten)]
    model: ModelArgs,
}

fn options(policy: &str, alloc_conf: Option<String>, outside: u64) -> CapacityOptions {
    CapacityOptions {
        run: RunOptions { policy: policy.to_string(), alloc_conf, ..RunOptions::default() },
        outside_bytes: outside,
        jitters: JITTERS,
    }
}

fn capacity_json(c: &Capacity) -> serde_json::Value {
    json!({
        "capacity_bytes": c.capacity_bytes,
        "capacity_low_bytes": c.low_bytes,
        "capacity_high_bytes": c.high_bytes,
        "outside_allocator_bytes": c.outside_bytes,
        "searched_up_to_bytes": c.searched_up_to_bytes,
        "per_placement": c.placements.iter().map(|p| json!({
            "placement": format!("{:?}", p.placement),
            "capacity_bytes": p.capacity_bytes,
        })).collect::<Vec<_>>(),
    })
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let trace = crate::read_trace(&args.trace)?;
    let (outside, source) = args.model.outside(&trace);
    let conf = args.alloc_conf.clone();
    let shown_conf = conf.clone().or(trace.meta.alloc_conf.clone()).unwrap_or_default();
    let c = capacity(&trace, &options(&args.policy, conf, outside))?;
    let mut out = String::new();
    if args.model.json {
        let mut j = capacity_json(&c);
        j["trace"] = json!(args.trace.display().to_string());
        j["policy"] = json!(args.policy);
        j["alloc_conf"] = json!(shown_conf);
        j["outside_allocator_source"] = json!(source);
        outln!(out, "{}", serde_json::to_string_pretty(&j)?);
        emit(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!(out, "allocsim capacity {}", args.trace.display());
    outln!(out, "  policy: {} (settings {shown_conf:?})", args.policy);
    match c.capacity_bytes {
        Some(p) => {
            outln!(out, "  needs free at start: {}", bytes(p));
            outln!(
                out,
                "  band: [{}, {}]",
                c.low_bytes.map_or("-".into(), bytes),
                c.high_bytes.map_or("more than the device".into(), bytes)
            );
        }
        None => outln!(out, "  does not fit in {} free", bytes(c.searched_up_to_bytes)),
    }
    outln!(out, "  of which outside the allocator: {} ({source})", bytes(outside));
    outln!(
        out,
        "  (free at start: what torch.cuda.mem_get_info() reports once the CUDA context exists;"
    );
    outln!(
        out,
        "   the band is the spread over {} driver address placements, see docs/capacity.md)",
        JITTERS + 1
    );
    emit(&out)?;
    Ok(ExitCode::SUCCESS)
}
