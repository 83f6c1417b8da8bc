//! `allocsim fuzz --seed S --iters N [--policy P]`: a seeded swarm run in the manner of
//! TigerBeetle's VOPR. Iteration `i` draws a program from seed `S + i` (its own swarm shape:
//! kinds switched off, weights, device, hot sizes, settings) and runs it under every oracle of
//! `allocsim-testgen` for every policy, or one. On the first failure it shrinks the program,
//! writes it as a trace file and prints the commands that reproduce the run and the minimal
//! case. `--trace FILE` runs every oracle on one trace file: what those commands run.

use allocsim::output::counted;
use allocsim_testgen::oracles::{check_trace_catching, formats, Failure, Oracle};
use allocsim_testgen::shrink::shrink;
use allocsim_testgen::suite::{reproduce_command, save_case};
use allocsim_testgen::{from_seed, Limits, Program};
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;

/// A line of the report on stdout through `output::emit`, which escapes what came from a file
/// or a flag (a trace's name, a policy's settings, a failure quoting either). A failure to
/// write stdout ends the command.
macro_rules! say {
    ($($arg:tt)*) => {
        crate::emit(&(format!($($arg)*) + "\n"))?
    };
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The first seed; iteration i runs seed S+i. Default: one from the clock, printed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// How many programs to run.
    #[arg(long, default_value_t = 1000)]
    pub iters: u64,
    /// Only this policy, `NAME` or `NAME[SETTINGS]`. Default: every policy, under its defaults
    /// and under each of its test settings.
    #[arg(long)]
    pub policy: Option<String>,
    /// At most this many steps per program.
    #[arg(long, default_value_t = 200)]
    pub steps: usize,
    /// Never request 1 EiB or more (by default a few requests up to u64::MAX are made, as a
    /// corrupt trace may hold).
    #[arg(long)]
    pub no_absurd_sizes: bool,
    /// Where a failing case's minimized trace is written.
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
    /// Run every oracle on this trace file instead of generating programs.
    #[arg(long, conflicts_with = "seed")]
    pub trace: Option<PathBuf>,
}

/// The last panic's message and place, kept by a quiet panic hook: shrinking runs hundreds of
/// failing cases, and a panic's location is worth more in the report than on stderr each time.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = Some(info.to_string());
        }
    }));
}

/// Every oracle for `policy` on `trace` (with both format round trips), with a panic's place
/// added to its message.
fn oracles(policy: &str, program_trace: &allocsim_core::Trace) -> Result<(), Failure> {
    let result = check_trace_catching(policy, program_trace).and_then(|()| {
        formats::roundtrip_native(program_trace)
            .map_err(|mut f| {
                f.policy = policy.to_string();
                f
            })
            .and_then(|()| formats::roundtrip_snapshot(policy, program_trace))
    });
    result.map_err(|mut f| {
        if f.oracle == Oracle::Panic {
            if let Some(place) = LAST_PANIC.lock().ok().and_then(|mut l| l.take()) {
                f.message = place;
            }
        }
        f
    })
}

/// The policies to run: every one under its defaults and its test settings, or the one named.
fn policies(only: &Option<String>) -> anyhow::Result<Vec<String>> {
    let Some(spec) = only else {
        return Ok(allocsim_policies::POLICIES.iter().flat_map(|p| p.test_specs()).collect());
    };
    let (name, conf) = allocsim_policies::parse_spec(spec);
    allocsim_policies::by_name(name, conf)?;
    Ok(vec![spec.clone()])
}

pub fn run(args: &Args, cx: &allocsim::Context) -> anyhow::Result<ExitCode> {
    let policies = policies(&args.policy)?;
    quiet_panics();
    if let Some(path) = &args.trace {
        let trace = allocsim::load(path, &cx.read)?.trace;
        let mut failed = false;
        for policy in &policies {
            match oracles(policy, &trace) {
                Ok(()) => say!("{policy}: every oracle holds on {}", path.display()),
                Err(f) => {
                    failed = true;
                    say!("{f}");
                }
            }
        }
        return Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS });
    }
    let base = args.seed.unwrap_or_else(clock_seed);
    let limits = Limits {
        max_steps: args.steps.max(1),
        absurd_sizes: !args.no_absurd_sizes,
        ..Limits::default()
    };
    say!(
        "allocsim fuzz: seeds {base}..{} ({}) x {}",
        base.wrapping_add(args.iters),
        counted(args.iters, "program", "programs"),
        counted(policies.len() as u64, "policy", "policies")
    );
    let mut ops = 0u64;
    for i in 0..args.iters {
        let seed = base.wrapping_add(i);
        let program = from_seed(seed, &limits);
        let trace = program.trace();
        ops += trace.ops.len() as u64;
        for policy in &policies {
            if let Err(failure) = oracles(policy, &trace) {
                return report(args, seed, &program, failure);
            }
        }
        if (i + 1) % 1000 == 0 {
            crate::note(&format!("  {} programs, {ops} ops: no failures", i + 1));
        }
    }
    say!("ok: {} programs, {ops} ops, every oracle held for {}", args.iters, policies.join(", "));
    Ok(ExitCode::SUCCESS)
}

fn report(args: &Args, seed: u64, program: &Program, failure: Failure) -> anyhow::Result<ExitCode> {
    let policy = failure.policy.clone();
    say!("FAIL seed {seed}, policy {policy}: {failure}");
    say!("shrinking...");
    let (small, small_failure) = shrink(program, &failure, |p| oracles(&policy, &p.trace()).err());
    let plain = |c: char| if c.is_ascii_alphanumeric() { c } else { '_' };
    let stem = format!("allocsim-fuzz-{seed}-{}", policy.chars().map(plain).collect::<String>());
    let path = save_case(&args.out, &stem, &small)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("writing the minimal case to {}", args.out.display()))?;
    let mut steps =
        if args.steps == 200 { String::new() } else { format!(" --steps {}", args.steps) };
    if args.no_absurd_sizes {
        steps.push_str(" --no-absurd-sizes");
    }
    say!("minimal failure: {small_failure}");
    say!("minimal program ({} ops):\n{small}", small.ops().len());
    say!("written to {}", path.display());
    say!("reproduce the run:  allocsim fuzz --seed {seed} --iters 1 --policy {policy}{steps}");
    say!("reproduce the case: {}", reproduce_command(&small_failure, &path));
    Ok(ExitCode::FAILURE)
}

/// A seed for runs that did not name one (printed, so the run can be repeated).
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
