//! allocsim's API: everything a front end asks of allocsim, as typed requests and results.
//!
//! Each command is a module with an `Args` (the request: plain public fields, which also derive
//! `clap::Args`, so the CLI's flag and the API's field are one definition with one default and
//! one help text) and a `run(&Args, &Context)` that returns an [`Output`]: the result as the
//! JSON object `--json` prints (keys are the interface scripts rely on) and as text, the lines
//! meant for stderr, and whether it is a failure (checker violations, a recording the replay
//! parts from). Nothing here prints, exits or reads the environment; every setting a call uses
//! is in its request or its [`Context`], so calls from many threads run side by side.
//!
//! Front ends: the `allocsim` binary (`crates/cli`: parsing, printing, exit codes), the Python
//! package (`crates/python`), the PyTorch allocator library (`crates/torch`, over
//! [`Session`]) and the estimator (over the Python package's `Session`).

pub mod bound;
pub mod capacity;
mod capacity_model;
pub mod compare;
pub mod convert;
pub mod diff;
pub mod explain_oom;
mod export;
pub mod fidelity;
mod gpu;
mod html;
pub mod info;
mod input;
pub mod job;
pub mod output;
mod per_rank;
pub mod replay;
pub mod report;
pub mod validate;
pub mod workload;

pub use allocsim_run::Session;
pub use export::write_snapshot;
pub use input::{trace_name, RunArgs, WORKLOAD_PREFIX};
pub use output::{memory_summary, parse_size};
pub use report::page_reads_back;

use allocsim_core::Trace;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A trace read once and kept, for callers that run many commands on it (the Python
/// package's `Trace`): a command given a [`Context`] holding it uses it instead of reading
/// its path again.
#[derive(Debug)]
pub struct Loaded {
    /// The path (or `workload:` spec) it was read from, as commands name it.
    pub path: PathBuf,
    pub trace: Trace,
}

/// Read `path` (any trace format, or a `workload:NAME?key=value` spec) with `read`'s options.
pub fn load(path: &Path, read: &allocsim_trace::ReadOptions) -> Result<Loaded, Error> {
    let cx = Context { read: read.clone(), ..Context::default() };
    let trace = input::load_trace(path, &cx)?;
    Ok(Loaded { path: path.to_path_buf(), trace })
}

/// What a call runs with besides its request: how trace files are read, traces already
/// loaded, and whether to draw progress bars on stderr (the CLI on a terminal).
#[derive(Debug, Default, Clone)]
pub struct Context {
    pub read: allocsim_trace::ReadOptions,
    /// Traces already read: a request naming one of these paths uses it as it is.
    pub loaded: Vec<Arc<Loaded>>,
    /// Draw progress bars on stderr for long reads and runs (when stderr is a terminal).
    pub progress: bool,
}

impl Context {
    /// The trace a request names: the loaded one of that path, else read now.
    pub fn trace(&self, path: &Path) -> anyhow::Result<Cow<'_, Trace>> {
        match self.preloaded(path) {
            Some(l) => Ok(Cow::Borrowed(&l.trace)),
            None => Ok(Cow::Owned(input::load_trace(path, self)?)),
        }
    }

    /// The loaded trace of `path`, if the caller gave one.
    pub fn preloaded(&self, path: &Path) -> Option<&Loaded> {
        self.loaded.iter().find(|l| l.path == path).map(|l| &**l)
    }
}

/// What a command gives back.
#[derive(Debug, Default)]
pub struct Output {
    /// The result as the JSON object `--json` prints; `None` for a command that has no JSON
    /// form (`fidelity`, `report`, `convert`).
    pub json: Option<serde_json::Value>,
    /// The result for people, as the command prints it without `--json`.
    pub text: String,
    /// Lines for stderr: files written, what a conversion did, timings beside JSON.
    pub notes: Vec<String>,
    /// The command ran, and what it found is a failure: checker violations, a replay that
    /// parts from its recording, a validation that differs. The CLI exits 1.
    pub failed: bool,
}

impl Output {
    fn text(text: String) -> Output {
        Output { text, ..Output::default() }
    }

    fn both(json: serde_json::Value, text: String) -> Output {
        Output { json: Some(json), text, ..Output::default() }
    }
}

/// What kind of failure an [`Error`] is, for the front end that shows it (the Python
/// package's exception classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A file that cannot be read as a trace: the message names the file and the place.
    Trace,
    /// An allocator setting or policy refused.
    Settings,
    /// A request that cannot be run as given (a size that is none, a flag's value).
    Usage,
    /// A file that is not there, may not be opened or is no regular file, or a failed write.
    Io,
    Other,
}

/// A call that failed: what went wrong, with its causes, and its [`ErrorKind`].
#[derive(Debug)]
pub struct Error(anyhow::Error);

impl Error {
    /// A request refused before any work (a malformed size, a value out of range).
    pub fn usage(message: impl std::fmt::Display) -> Error {
        Error(anyhow::Error::new(UsageError(message.to_string())))
    }

    pub fn kind(&self) -> ErrorKind {
        use std::io::ErrorKind::{IsADirectory, NotFound, PermissionDenied};
        let unopenable = |c: &(dyn std::error::Error + 'static)| {
            let io = match c.downcast_ref::<allocsim_trace::TraceError>() {
                Some(allocsim_trace::TraceError::NotAFile { .. }) => return true,
                Some(allocsim_trace::TraceError::Io { error, .. }) => Some(error),
                _ => c.downcast_ref::<std::io::Error>(),
            };
            io.is_some_and(|io| matches!(io.kind(), NotFound | PermissionDenied | IsADirectory))
        };
        if self.0.chain().any(unopenable) {
            return ErrorKind::Io;
        }
        for cause in self.0.chain() {
            if cause.is::<allocsim_trace::TraceError>() {
                return ErrorKind::Trace;
            }
            if cause.is::<allocsim_core::ConfigError>() {
                return ErrorKind::Settings;
            }
            if cause.is::<UsageError>() {
                return ErrorKind::Usage;
            }
            if cause.is::<std::io::Error>() {
                return ErrorKind::Io;
            }
        }
        ErrorKind::Other
    }
}

impl std::fmt::Display for Error {
    /// The message and its causes on one line, escaped for a terminal: it may quote a file's
    /// strings.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&allocsim_core::text::terminal_safe(&format!("{:#}", self.0)))
    }
}

impl std::error::Error for Error {}

impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Error {
        Error(e)
    }
}

#[derive(Debug)]
struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Write `bytes` to `path` whole or not at all (`allocsim_trace::atomic`).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let mut out = allocsim_trace::atomic::AtomicFile::create(path)?;
    out.write_all(bytes)
        .and_then(|()| out.commit())
        .with_context(|| format!("writing {}", path.display()))
}

/// Requests with the defaults the command line gives them: `A` parsed from `argv` (its
/// positional arguments; the program name is not included). For front ends that build a
/// request from a few named values and want every other field as the CLI would set it.
pub fn request<A: clap::Args + clap::FromArgMatches>(
    argv: &[&std::ffi::OsStr],
) -> Result<A, Error> {
    let command = A::augment_args(clap::Command::new("allocsim").no_binary_name(true));
    let matches = command
        .try_get_matches_from(argv)
        .map_err(|e| Error::usage(allocsim_core::text::cut_lines(&e.render().to_string())))?;
    A::from_arg_matches(&matches).map_err(|e| Error::usage(e.render()))
}
