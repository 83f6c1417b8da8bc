//! `allocsim workload [SPEC] [--out FILE]`: list the live workloads, or build one and write it.

use crate::input::WORKLOAD_PREFIX;
use crate::output::{bytes, emit, outln};
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct WorkloadArgs {
    /// A workload spec, `NAME?key=value&...`; without one, list the workloads and their
    /// parameters with defaults.
    pub spec: Option<String>,
    /// Write the workload as a trace to this file (the extension picks the format, as for
    /// `convert`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn workload(args: WorkloadArgs) -> anyhow::Result<ExitCode> {
    if let Some(out) = &args.out {
        crate::output::check_trace_output(out, &[])?;
    }
    let Some(spec) = args.spec else {
        let mut out = String::new();
        outln!(
            out,
            "Live workloads; name one as `workload:NAME?key=value&...` wherever a TRACE is expected."
        );
        for (name, what) in allocsim_workloads::names() {
            outln!(out, "\n{name}: {what}");
            let params = allocsim_workloads::parameters(name).unwrap_or_default();
            let line: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            outln!(out, "  parameters (defaults): {}", line.join(" "));
        }
        emit(&out)?;
        return Ok(ExitCode::SUCCESS);
    };
    let spec = spec.strip_prefix(WORKLOAD_PREFIX).unwrap_or(&spec);
    let trace = allocsim_workloads::trace(spec)?;
    let (mut live, mut peak, mut sizes) = (0u64, 0u64, std::collections::HashMap::new());
    for op in &trace.ops {
        match *op {
            allocsim_core::Op::Alloc { id, size, .. }
            | allocsim_core::Op::AllocAt { id, size, .. } => {
                sizes.insert(id, size);
                live += size;
                peak = peak.max(live);
            }
            allocsim_core::Op::FreeRequested { id } => live -= sizes.remove(&id).unwrap_or(0),
            _ => {}
        }
    }
    // The spec as given, escaped (`emit`), as every command shows its input.
    emit(&format!("workload {spec}: {} ops, peak live {}\n", trace.ops.len(), bytes(peak)))?;
    if let Some(out) = &args.out {
        allocsim_trace::write_trace(&trace, out)
            .with_context(|| format!("writing {}", out.display()))?;
        emit(&format!("wrote {}\n", out.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
