//! `allocsim replay`'s work without the CLI around it, for profiling: read a trace (or stream
//! a native one), replay it under its own settings with the metrics observer, print a line.
//!
//! `cargo run --release -p allocsim-benches --bin replay-probe -- TRACE`

use allocsim_run::{run_trace, run_trace_streamed, RunOptions};
use allocsim_trace::{native, Format};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: replay-probe TRACE");
        return ExitCode::FAILURE;
    };
    let opts = RunOptions { policy: "pytorch".into(), ..RunOptions::default() };
    let report = if Format::from_path(&path) == Some(Format::Native) {
        let mut stream = match native::read_native_ops(&path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        let ops = stream.ops.plain();
        let r = run_trace_streamed(&stream.head, stream.recorded_len, ops, &opts, &mut [], |_| {});
        if let Some(e) = stream.ops.take_error() {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
        r
    } else {
        match allocsim_trace::read_trace(&path) {
            Ok(trace) => run_trace(&trace, &opts, &mut [], |_| {}),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    match report {
        Ok(r) => {
            println!(
                "{} ops, {} events, peak reserved {} B, device {}",
                r.ops_run, r.metrics.events, r.metrics.peak_reserved_bytes, r.device
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
