//! `allocsim`: the command-line front end, as a library so that other front ends (the Python
//! package) run the very same commands. The only crate that prints, reads the environment or
//! uses `anyhow`; every command is a thin layer over the library crates.

mod bound;
mod capacity;
mod compare;
mod convert;
mod explain_oom;
mod export;
mod fidelity;
mod fuzz;
mod gpu;
mod html;
mod info;
mod input;
mod output;
mod replay;
mod report;
mod validate;
mod workload;

pub use export::write_snapshot;
pub use output::memory_summary;
pub use report::{page_reads_back, report_page_target};

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Simulate GPU memory allocators and replay recorded allocation traces through them.
#[derive(Debug, Parser)]
#[command(name = "allocsim", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// For a PyTorch snapshot of several GPUs: read the trace of `device_traces[N]`. Default:
    /// the one GPU whose trace has entries (a snapshot where several have is refused).
    #[arg(long, global = true, value_name = "N")]
    cuda_device: Option<usize>,
    /// Most memory the pickle reader may hold while reading a snapshot (its stack, memo and
    /// the values it builds; not the trace it makes). A guard against decompression bombs;
    /// raise it for a trusted snapshot that needs more. Sizes as `2GiB`, `2e9`.
    #[arg(long, global = true, value_name = "SIZE", value_parser = output::parse_size,
          default_value_t = allocsim_trace::pickle::DEFAULT_MAX_HELD_BYTES)]
    max_reader_memory: u64,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Summarise a trace: events by action, streams, peak live bytes, settings, warnings.
    Info(info::Args),
    /// Replay a trace through a policy on a device and report statistics and metrics.
    Replay(replay::Args),
    /// Replay a PyTorch recording in lockstep with itself and report "exact" or where it parts.
    Fidelity(fidelity::Args),
    /// Run every policy on every trace and compare peaks, fragmentation, OOMs, device calls and
    /// minimum feasible capacity.
    Compare(compare::Args),
    /// The smallest free memory at the start (as `torch.cuda.mem_get_info()` reports it) on
    /// which the recorded program completes without an OOM: a point and a band.
    Capacity(capacity::Args),
    /// Replay a recording under the PYTORCH_CUDA_ALLOC_CONF settings people try and rank them:
    /// peak reserved, memory needed (with its band), OOMs on a given card, fragmentation.
    Advise(capacity::AdviseArgs),
    /// The least memory any allocator needs for a trace, what one that knows every lifetime
    /// reaches, and the policy's headroom over both.
    Bound(bound::Args),
    /// Explain each OOM: free memory, largest free block per pool, reserved but unallocated,
    /// and the live blocks fencing the largest free region, with their allocation stacks.
    ExplainOom(explain_oom::Args),
    /// One trace as one self-contained HTML page: the memory timeline stacked per allocation,
    /// OOM and empty_cache marks, the segment map over time, memory_summary and the settings
    /// table.
    Report(report::Args),
    /// Convert a trace between formats, chosen by extension (.pickle[.gz], .csv, .allocsim,
    /// .allocsim.json).
    Convert(convert::Args),
    /// Replay on a real GPU and on the simulated device with the same policy, compare every
    /// decision and the pattern checks, and print a verdict with the first difference.
    Validate(validate::Args),
    /// List the live workloads (transformer training, LLM inference, CNN training), or build
    /// one from a spec and write it out as a trace.
    Workload(workload::WorkloadArgs),
    /// Seeded swarm testing: generated programs under every oracle for every policy, printing
    /// the seed and the command that reproduces a failure (TigerBeetle's VOPR style).
    Fuzz(fuzz::Args),
}

/// A command line clap refused, as the user sees it: clap quotes a refused value whole (a
/// 120 KB `--device-free`), so long lines are cut, and the text is escaped for the terminal.
pub fn usage_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    allocsim_core::text::terminal_safe(&allocsim_core::text::cut_lines(&text)).into_owned()
}

/// Print clap's answer to a command line it did not run (an error, or `--help` and
/// `--version`, which are not cut) and end the process with clap's exit status.
pub fn usage_exit(e: clap::Error) -> ! {
    use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
    if matches!(e.kind(), DisplayHelp | DisplayVersion) {
        e.exit()
    }
    eprint!("{}", usage_message(&e));
    std::process::exit(e.exit_code())
}

/// Write `bytes` to `path` whole or not at all (`allocsim_trace::atomic`).
pub fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let mut out = allocsim_trace::atomic::AtomicFile::create(path)?;
    out.write_all(bytes)
        .and_then(|()| out.commit())
        .with_context(|| format!("writing {}", path.display()))
}

/// Set by the `allocsim` binary, whose process ends with the command: see [`at_exit`].
static PROCESS_ENDS_WITH_COMMAND: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Tell the commands that the process ends when they return (the `allocsim` binary does; the
/// Python module, which runs many commands in one process, does not).
pub fn process_ends_with_command() {
    PROCESS_ENDS_WITH_COMMAND.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Drop `value`, unless the process ends with this command: then its memory goes back to the
/// kernel with the process, and freeing it first (tens of MB for a large trace, handed back
/// page by page) is time the user waits for nothing: 3 ms after the Llama snapshot's replay,
/// longer than printing its report.
pub fn at_exit<T>(value: T) {
    if PROCESS_ENDS_WITH_COMMAND.load(std::sync::atomic::Ordering::Relaxed) {
        std::mem::forget(value);
    }
}

/// Run a parsed command line: what `allocsim` does between parsing its arguments and
/// printing an error. Trace files are read with the command line's reader options.
pub fn execute(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut opts =
        allocsim_trace::ReadOptions { cuda_device: cli.cuda_device, ..Default::default() };
    opts.limits.max_held_bytes = cli.max_reader_memory;
    input::set_read_options(opts);
    match cli.command {
        Command::Info(args) => info::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Fidelity(args) => fidelity::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Capacity(args) => capacity::run(args),
        Command::Advise(args) => capacity::advise(args),
        Command::Bound(args) => bound::run(args),
        Command::ExplainOom(args) => explain_oom::run(args),
        Command::Report(args) => report::run(args),
        Command::Validate(args) => validate::run(args),
        Command::Workload(args) => workload::workload(args),
        Command::Fuzz(args) => fuzz::run(args),
    }
}

/// Run `f` with the reports commands write to stdout kept instead: what `f` returned, and
/// the text. For front ends that run commands in-process; other output (progress, warnings on
/// stderr) is unchanged.
pub fn capturing_stdout<T>(f: impl FnOnce() -> T) -> (T, String) {
    output::capture(f)
}
