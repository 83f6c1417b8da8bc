//! `allocsim convert IN OUT`.

use anyhow::Context;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace to read.
    pub input: PathBuf,
    /// Where to write; the extension picks the format. An existing file is replaced only once
    /// the new one is completely written.
    pub output: PathBuf,
}

pub fn run(args: &Args, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    crate::output::check_trace_output(&args.output, &[&args.input])?;
    let trace = cx.trace(&args.input)?;
    allocsim_trace::write_trace(&trace, &args.output)
        .with_context(|| format!("converting {}", args.input.display()))?;
    // No output format holds a mid-run history's state at its start: `write_trace` lays its
    // live blocks out as allocations before the recorded ops.
    let laid_out = trace.start.as_ref().map_or(0, |start| start.prologue().len());
    let mut notes = vec![format!(
        "wrote {} ({} ops, {} recorded events)",
        args.output.display(),
        trace.ops.len() + laid_out,
        trace.recorded.len()
    )];
    if laid_out > 0 {
        notes.push(format!(
            "  the history starts mid-run: its live blocks are the first {laid_out} ops"
        ));
    }
    Ok(crate::Output { notes, ..crate::Output::default() })
}
