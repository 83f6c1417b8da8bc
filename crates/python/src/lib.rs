//! `allocsim._allocsim`: the Python package's door into the command-line tool's library. Every
//! Python function runs an `allocsim` command in-process ([`allocsim_cli::execute`]) and reads
//! the JSON it would print, so the package and the CLI cannot disagree: there is no second
//! implementation to drift.

mod session;

// The simulated device's CUDA runtime: linked in so that its C symbols are exported.
use allocsim_cuda as _;
use pyo3::prelude::*;
use std::process::ExitCode;
use std::sync::Mutex;

/// Commands read the reader options the command line set (a process-wide setting), so calls
/// from several Python threads take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// What kind of failure an error is, for the Python exception it becomes: `trace` (a file
/// that cannot be read as a trace: the message names the file and the place), `settings` (an
/// allocator setting or policy refused), `usage` (arguments the command line refuses), `io`
/// (a file that is not there, may not be opened or is no regular file, or a write that
/// failed), or `error`.
fn kind(e: &anyhow::Error) -> &'static str {
    use std::io::ErrorKind::{IsADirectory, NotFound, PermissionDenied};
    let unopenable = |c: &(dyn std::error::Error + 'static)| {
        let io = match c.downcast_ref::<allocsim_trace::TraceError>() {
            Some(allocsim_trace::TraceError::NotAFile { .. }) => return true,
            Some(allocsim_trace::TraceError::Io { error, .. }) => Some(error),
            _ => c.downcast_ref::<std::io::Error>(),
        };
        io.is_some_and(|io| matches!(io.kind(), NotFound | PermissionDenied | IsADirectory))
    };
    if e.chain().any(unopenable) {
        return "io";
    }
    for cause in e.chain() {
        if cause.is::<allocsim_trace::TraceError>() {
            return "trace";
        }
        if cause.is::<allocsim_core::ConfigError>() {
            return "settings";
        }
        if cause.is::<std::io::Error>() {
            return "io";
        }
    }
    "error"
}

/// The stack a command runs on: the calling Python thread's may be as small as 64 KiB
/// (`threading.stack_size`), where a replay overflowed it; the `allocsim` binary's main
/// thread has 8 MiB.
const COMMAND_STACK_BYTES: usize = 16 << 20;

/// Run `allocsim ARGV...` (without the program name) and return (exit status, what it wrote
/// to stdout, `None`) or, when it fails, (1, "", (kind, message)). The command runs on a
/// thread of its own ([`COMMAND_STACK_BYTES`]) while this one waits.
#[pyfunction]
fn run(py: Python<'_>, argv: Vec<String>) -> (i32, String, Option<(String, String)>) {
    py.detach(move || {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let failed = |message: String| (1, String::new(), Some(("error".into(), message)));
        let command = std::thread::Builder::new()
            .name("allocsim command".into())
            .stack_size(COMMAND_STACK_BYTES)
            .spawn(move || run_command(argv));
        match command.map(|thread| thread.join()) {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => failed("the command panicked (a bug: please report it)".into()),
            Err(e) => failed(format!("starting the command's thread: {e}")),
        }
    })
}

fn run_command(argv: Vec<String>) -> (i32, String, Option<(String, String)>) {
    let args = std::iter::once("allocsim".to_string()).chain(argv);
    let cli = match <allocsim_cli::Cli as clap::Parser>::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            return (2, String::new(), Some(("usage".into(), allocsim_cli::usage_message(&e))))
        }
    };
    let (result, out) = allocsim_cli::capturing_stdout(|| allocsim_cli::execute(cli));
    match result {
        Ok(code) => (i32::from(code != ExitCode::SUCCESS), out, None),
        // Escaped as the CLI escapes its messages: Python prints an exception's text raw.
        Err(e) => {
            let message = allocsim_core::text::terminal_safe(&format!("{e:#}")).into_owned();
            (1, out, Some((kind(&e).into(), message)))
        }
    }
}

/// Every policy name, in the order reports list them.
#[pyfunction]
fn policies() -> Vec<&'static str> {
    allocsim_policies::names()
}

#[pymodule]
fn _allocsim(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(policies, m)?)?;
    m.add_class::<session::Session>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
