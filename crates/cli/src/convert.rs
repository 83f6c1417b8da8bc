//! `allocsim convert IN OUT`.

use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace to read.
    input: PathBuf,
    /// Where to write; the extension picks the format. An existing file is replaced only once
    /// the new one is completely written.
    output: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let trace = crate::read_trace(&args.input)?;
    allocsim_trace::write_trace(&trace, &args.output)
        .with_context(|| format!("converting {}", args.input.display()))?;
    eprintln!(
        "wrote {} ({} ops, {} recorded events)",
        args.output.display(),
        trace.ops.len(),
        trace.recorded.len()
    );
    Ok(ExitCode::SUCCESS)
}
