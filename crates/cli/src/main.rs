//! The `allocsim` binary: the command line over the `allocsim` library. It parses arguments,
//! runs the library's call for the command, prints what it gives back (text, or `--json`) and
//! turns it into an exit status; nothing else.

mod fuzz;

use allocsim::{capacity, Context, Output};
use allocsim_core::text::{cut_lines, terminal_safe};
use clap::Parser;
use std::process::ExitCode;

/// Simulate GPU memory allocators and replay recorded allocation traces through them.
#[derive(Debug, Parser)]
#[command(name = "allocsim", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// For a PyTorch snapshot of several GPUs: read the trace of `device_traces[N]`. Default:
    /// the one GPU whose trace has entries (a snapshot where several have is refused).
    #[arg(long, global = true, value_name = "N")]
    cuda_device: Option<usize>,
    /// Most memory the pickle reader may hold while reading a snapshot (its stack, memo and
    /// the values it builds; not the trace it makes). A guard against decompression bombs;
    /// raise it for a trusted snapshot that needs more. Sizes as `2GiB`, `2e9`.
    #[arg(long, global = true, value_name = "SIZE", value_parser = allocsim::parse_size,
          default_value_t = allocsim_trace::pickle::DEFAULT_MAX_HELD_BYTES)]
    max_reader_memory: u64,
}

/// A command's request and the choice between its text and its JSON.
#[derive(Debug, clap::Args)]
struct Json<A: clap::Args> {
    #[command(flatten)]
    args: A,
    /// Print one JSON document instead of the text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Summarise a trace: events by action, streams, peak live bytes, settings, warnings.
    Info(Json<allocsim::info::Args>),
    /// Replay a trace through a policy on a device and report statistics and metrics.
    Replay(Json<allocsim::replay::Args>),
    /// Replay a PyTorch recording in lockstep with itself and report "exact" or where it parts.
    Fidelity(allocsim::fidelity::Args),
    /// Run every policy on every trace and compare peaks, fragmentation, OOMs, device calls and
    /// minimum feasible capacity.
    Compare(Json<allocsim::compare::Args>),
    /// The smallest free memory at the start (as `torch.cuda.mem_get_info()` reports it) on
    /// which the recorded program completes without an OOM: a point and a band.
    Capacity(Json<capacity::Args>),
    /// Replay a recording under the PYTORCH_CUDA_ALLOC_CONF settings people try and rank them:
    /// peak reserved, memory needed (with its band), OOMs on a given card, fragmentation.
    Advise(Json<capacity::AdviseArgs>),
    /// The least memory any allocator needs for a trace, what one that knows every lifetime
    /// reaches, and the policy's headroom over both.
    Bound(Json<allocsim::bound::Args>),
    /// Two runs, or two settings of one run, side by side: peaks, fragmentation, OOMs,
    /// capacity, the allocations by stack whose bytes at the peak changed most, the segments at
    /// each peak, and the first op where the op streams part.
    Diff(Json<allocsim::diff::Args>),
    /// Explain each OOM: free memory, largest free block per pool, reserved but unallocated,
    /// and the live blocks fencing the largest free region, with their allocation stacks.
    ExplainOom(Json<allocsim::explain_oom::Args>),
    /// One trace as one self-contained HTML page: the memory timeline stacked per allocation,
    /// OOM and empty_cache marks, the segment map over time, memory_summary and the settings
    /// table.
    Report(allocsim::report::Args),
    /// Convert a trace between formats, chosen by extension (.pickle[.gz], .csv, .allocsim,
    /// .allocsim.json).
    Convert(allocsim::convert::Args),
    /// Replay on a real GPU and on the simulated device with the same policy, compare every
    /// decision and the pattern checks, and print a verdict with the first difference.
    Validate(Json<allocsim::validate::Args>),
    /// List the live workloads (transformer training, LLM inference, CNN training), or build
    /// one from a spec and write it out as a trace.
    Workload(allocsim::workload::WorkloadArgs),
    /// Seeded swarm testing: generated programs under every oracle for every policy, printing
    /// the seed and the command that reproduces a failure (TigerBeetle's VOPR style).
    Fuzz(fuzz::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => usage_exit(e),
    };
    // Ctrl-C, SIGTERM and SIGHUP (the `termination` feature) leave no half-written file: the
    // writes in progress remove their temporary files.
    let _ = ctrlc::set_handler(|| {
        allocsim_trace::atomic::remove_temporaries();
        std::process::exit(130);
    });
    let mut read =
        allocsim_trace::ReadOptions { cuda_device: cli.cuda_device, ..Default::default() };
    read.limits.max_held_bytes = cli.max_reader_memory;
    let cx = Context { read, progress: true, ..Context::default() };
    let result = match &cli.command {
        Command::Fuzz(args) => fuzz::run(args, &cx),
        command => run(command, &cx).and_then(print),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // The message may quote a file's strings: a terminal sees them escaped.
            eprintln!("error: {}", terminal_safe(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// The library's call for `command`, and whether its JSON is wanted.
fn run(command: &Command, cx: &Context) -> anyhow::Result<(Output, bool)> {
    fn text(o: anyhow::Result<Output>) -> anyhow::Result<(Output, bool)> {
        o.map(|o| (o, false))
    }
    fn json<A: clap::Args>(
        j: &Json<A>,
        f: impl FnOnce(&A) -> anyhow::Result<Output>,
    ) -> anyhow::Result<(Output, bool)> {
        f(&j.args).map(|o| (o, j.json))
    }
    match command {
        Command::Info(j) => json(j, |a| allocsim::info::run(a, cx)),
        Command::Replay(j) => json(j, |a| allocsim::replay::run(a, cx)),
        Command::Fidelity(a) => text(allocsim::fidelity::run(a, cx)),
        Command::Compare(j) => json(j, |a| allocsim::compare::run(a, cx)),
        Command::Capacity(j) => json(j, |a| capacity::run(a, cx)),
        Command::Advise(j) => json(j, |a| capacity::advise(a, cx)),
        Command::Bound(j) => json(j, |a| allocsim::bound::run(a, cx)),
        Command::Diff(j) => json(j, |a| allocsim::diff::run(a, cx)),
        Command::ExplainOom(j) => json(j, |a| allocsim::explain_oom::run(a, cx)),
        Command::Report(a) => text(allocsim::report::run(a, cx)),
        Command::Convert(a) => text(allocsim::convert::run(a, cx)),
        Command::Validate(j) => json(j, |a| allocsim::validate::run(a, cx)),
        Command::Workload(a) => text(allocsim::workload::run(a)),
        Command::Fuzz(_) => unreachable!("fuzz prints as it goes"),
    }
}

/// Print a command's result, its JSON or its text, and its notes on stderr. The process ends
/// next: the result's memory goes back to the kernel with it, and freeing it first (tens of
/// MB for a large trace, page by page) is time the user waits for nothing.
fn print((output, json): (Output, bool)) -> anyhow::Result<ExitCode> {
    for line in &output.notes {
        note(line);
    }
    match (&output.json, json) {
        (Some(value), true) => emit(&(serde_json::to_string_pretty(value)? + "\n"))?,
        _ => emit(&output.text)?,
    }
    let code = if output.failed { ExitCode::FAILURE } else { ExitCode::SUCCESS };
    std::mem::forget(output);
    Ok(code)
}

/// Write a finished report to stdout, every character a terminal could act on escaped
/// ([`terminal_safe`]: a trace's strings reach the report). A reader that went away is not
/// an error.
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(terminal_safe(text).as_bytes()).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// A line for stderr, escaped as [`emit`] escapes stdout.
fn note(line: &str) {
    eprintln!("{}", terminal_safe(line));
}

/// Print clap's answer to a command line it did not run (an error, or `--help` and
/// `--version`, which are not cut) and end the process with clap's exit status. clap quotes a
/// refused value whole (a 120 KB `--device-free`), so long lines are cut, and the text is
/// escaped for the terminal.
fn usage_exit(e: clap::Error) -> ! {
    use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
    if matches!(e.kind(), DisplayHelp | DisplayVersion) {
        e.exit()
    }
    eprint!("{}", terminal_safe(&cut_lines(&e.render().to_string())));
    std::process::exit(e.exit_code())
}
