//! `allocsim._allocsim`: the Python package's door into the `allocsim` library. Each function
//! builds the library's typed request from keyword arguments, runs it with the GIL released
//! (on a thread with a stack of its own: the calling Python thread's may be 64 KiB) and hands
//! back the result as the JSON the CLI's `--json` prints, its text and whether it is a
//! failure; the Python side (`allocsim/__init__.py`) wraps those in its classes. Nothing here
//! is process-wide: calls from several threads run side by side.

mod session;

use allocsim::{Context, Loaded, Output};
// The simulated device's CUDA runtime: linked in so that its C symbols are exported.
use allocsim_cuda as _;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;

pyo3::create_exception!(
    _allocsim,
    Failure,
    pyo3::exceptions::PyException,
    "A failed call: args are (kind, message); the package raises its own class for the kind."
);

/// The stack a call runs on (the `allocsim` binary's main thread has 8 MiB; a replay
/// overflowed a 64 KiB Python thread's).
const CALL_STACK_BYTES: usize = 16 << 20;

/// Run `f` with the GIL released, on a thread of its own, and turn its error into [`Failure`].
fn call<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<T, allocsim::Error> + Send,
) -> PyResult<T> {
    let result = py.detach(|| {
        std::thread::scope(|scope| {
            let thread = std::thread::Builder::new()
                .name("allocsim call".into())
                .stack_size(CALL_STACK_BYTES)
                .spawn_scoped(scope, f)
                .map_err(|e| ("error", format!("starting the call's thread: {e}")))?;
            match thread.join() {
                Ok(result) => result.map_err(|e| (kind(&e), e.to_string())),
                Err(_) => Err(("error", "the call panicked (a bug: please report it)".into())),
            }
        })
    });
    result.map_err(|(kind, message)| Failure::new_err((kind, message)))
}

/// The name of an error's kind, as the package's exception table has it.
fn kind(e: &allocsim::Error) -> &'static str {
    use allocsim::ErrorKind::*;
    match e.kind() {
        Trace => "trace",
        Settings => "settings",
        Usage => "usage",
        Io => "io",
        Other => "error",
    }
}

/// A trace read once (`allocsim.load`): every call given it uses it as it is.
#[derive(Debug)]
#[pyclass(module = "allocsim._allocsim", frozen)]
struct Trace {
    loaded: Arc<Loaded>,
}

#[pymethods]
impl Trace {
    /// The path (or `workload:` spec) it was read from.
    #[getter]
    fn path(&self) -> PathBuf {
        self.loaded.path.clone()
    }

    /// What `allocsim info --json` says of it, as JSON.
    fn info(&self, py: Python<'_>) -> PyResult<String> {
        let path = self.loaded.path.clone();
        let cx = Context { loaded: vec![self.loaded.clone()], ..Context::default() };
        let output = call(py, || {
            Ok(allocsim::info::run(&allocsim::info::Args { trace: path, more: Vec::new() }, &cx)?)
        })?;
        Ok(output.json.map(|j| j.to_string()).unwrap_or_default())
    }

    fn __len__(&self) -> usize {
        self.loaded.trace.ops.len()
    }

    /// The ops from `start` to `stop` (Python's slice rules for non-negative bounds), each a
    /// dict: `action` and the op's fields (`id`, `size`, `stream`, `addr`, `pool`, ...).
    #[pyo3(signature = (start=0, stop=None))]
    fn ops<'py>(
        &self,
        py: Python<'py>,
        start: usize,
        stop: Option<usize>,
    ) -> PyResult<Bound<'py, PyList>> {
        let ops = &self.loaded.trace.ops;
        let stop = stop.unwrap_or(ops.len()).min(ops.len());
        let items = ops[start.min(stop)..stop].iter().map(|op| op_dict(py, op));
        PyList::new(py, items.collect::<PyResult<Vec<_>>>()?)
    }

    /// The stack of the entry op `index` came from, innermost frame first, as (filename,
    /// line, name) tuples; empty when the recording kept none.
    fn stack(&self, index: u64) -> Vec<(String, u32, String)> {
        let t = &self.loaded.trace;
        let Ok(i) = t.op_stacks.binary_search_by_key(&index, |&(op, _)| op) else {
            return Vec::new();
        };
        let frames = &t.stacks[t.op_stacks[i].1 as usize].frames;
        frames.iter().map(|f| (f.filename.to_string(), f.line, f.name.to_string())).collect()
    }
}

/// One op as a dict: its `action` and its fields.
fn op_dict<'py>(py: Python<'py>, op: &allocsim_core::Op) -> PyResult<Bound<'py, PyDict>> {
    use allocsim_core::Op;
    let d = PyDict::new(py);
    let (action, id, size, stream) = match op {
        Op::Alloc { id, size, stream } => ("alloc", Some(id), Some(size), Some(stream)),
        Op::AllocAt { id, size, stream, addr } => {
            d.set_item("addr", addr)?;
            ("alloc_at", Some(id), Some(size), Some(stream))
        }
        Op::FreeRequested { id } => ("free_requested", Some(id), None, None),
        Op::FreeCompleted { id } => ("free_completed", Some(id), None, None),
        Op::RecordStream { id, stream } => ("record_stream", Some(id), None, Some(stream)),
        Op::EmptyCache => ("empty_cache", None, None, None),
        Op::SetMemoryFraction { fraction } => {
            d.set_item("fraction", fraction)?;
            ("set_memory_fraction", None, None, None)
        }
        Op::SetAllocatorSettings { conf } => {
            d.set_item("conf", conf)?;
            ("set_allocator_settings", None, None, None)
        }
        Op::Pool { pool, action } => {
            d.set_item("pool", (pool.0, pool.1))?;
            d.set_item("pool_action", format!("{action:?}"))?;
            ("pool", None, None, None)
        }
    };
    d.set_item("action", action)?;
    if let Some(id) = id {
        d.set_item("id", id.0)?;
    }
    if let Some(size) = size {
        d.set_item("size", size)?;
    }
    if let Some(stream) = stream {
        d.set_item("stream", stream.0)?;
    }
    Ok(d)
}

/// A trace argument: a loaded [`Trace`], or a path read for this call alone.
#[derive(Debug, FromPyObject)]
enum TraceArg {
    Loaded(Py<Trace>),
    Path(PathBuf),
}

/// A trace argument, or a job's: a list of them, one per rank.
#[derive(Debug, FromPyObject)]
enum TracesArg {
    One(TraceArg),
    Job(Vec<TraceArg>),
}

impl TracesArg {
    /// The paths the request names (a job's every rank), and the context holding the loaded.
    fn resolve(&self, py: Python<'_>) -> PyResult<(Vec<PathBuf>, Context)> {
        match self {
            TracesArg::One(t) => Ok(TraceArg::resolve(std::slice::from_ref(t), py)),
            TracesArg::Job(ts) if ts.is_empty() => {
                Err(usage("trace=[]: a job of no traces: give each rank's trace".into()))
            }
            TracesArg::Job(ts) => Ok(TraceArg::resolve(ts, py)),
        }
    }
}

impl TraceArg {
    /// The path the request names, and the context that holds the trace if it is loaded.
    fn resolve(traces: &[TraceArg], py: Python<'_>) -> (Vec<PathBuf>, Context) {
        let mut loaded = Vec::new();
        let paths = traces
            .iter()
            .map(|t| match t {
                TraceArg::Loaded(t) => {
                    let t = t.bind(py).get();
                    loaded.push(t.loaded.clone());
                    t.loaded.path.clone()
                }
                TraceArg::Path(p) => p.clone(),
            })
            .collect();
        (paths, Context { loaded, ..Context::default() })
    }
}

/// An argument refused: the package raises `UsageError` (a `ValueError`).
fn usage(message: String) -> PyErr {
    Failure::new_err(("usage", message))
}

/// A size argument: an int of bytes, or a string as the CLI takes it (`"40GiB"`, `"4e10"`).
fn size(name: &str, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(v) = value.filter(|v| !v.is_none()) else { return Ok(None) };
    let refused = |why: String| usage(format!("{name}={why}"));
    if v.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!("{name}: expected a size in bytes, not a bool")));
    }
    if let Ok(n) = v.extract::<i128>() {
        return u64::try_from(n)
            .map(Some)
            .map_err(|_| refused(format!("{n}: not a size in bytes (0 to 2**64 - 1)")));
    }
    if let Ok(f) = v.extract::<f64>() {
        if f.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&f) {
            return Ok(Some(f as u64));
        }
        return Err(refused(format!("{f}: not a whole number of bytes from 0 to 2**64 - 1")));
    }
    if let Ok(s) = v.extract::<String>() {
        return allocsim::parse_size(&s).map(Some).map_err(|e| usage(format!("{name}: {e}")));
    }
    Err(PyTypeError::new_err(format!(
        "{name}: expected a size as an int of bytes or a string such as \"40GiB\", not {}",
        v.get_type().name()?
    )))
}

/// A request with the CLI's defaults for every field, naming `paths`.
fn request<A: clap::Args + clap::FromArgMatches>(paths: &[PathBuf]) -> PyResult<A> {
    let argv: Vec<&OsStr> =
        std::iter::once(OsStr::new("--")).chain(paths.iter().map(|p| p.as_os_str())).collect();
    allocsim::request(&argv).map_err(|e| Failure::new_err(("usage", e.to_string())))
}

/// What a call gives Python: (JSON text or None, text, failed).
type Returned = (Option<String>, String, bool);

fn returned(output: Output) -> Returned {
    (output.json.map(|j| j.to_string()), output.text, output.failed)
}

/// Read a trace once, for every later call.
#[pyfunction]
#[pyo3(signature = (path, cuda_device=None, max_reader_memory=None))]
fn load(
    py: Python<'_>,
    path: PathBuf,
    cuda_device: Option<usize>,
    max_reader_memory: Option<&Bound<'_, PyAny>>,
) -> PyResult<Trace> {
    let mut read = allocsim_trace::ReadOptions { cuda_device, ..Default::default() };
    if let Some(limit) = size("max_reader_memory", max_reader_memory)? {
        read.limits.max_held_bytes = limit;
    }
    let loaded = call(py, || allocsim::load(&path, &read))?;
    Ok(Trace { loaded: Arc::new(loaded) })
}

#[pyfunction]
#[pyo3(signature = (trace, policy="pytorch", alloc_conf=None, device_free=None, device_total=None,
                    memory_fraction=None, device="auto", check=false, seed=0))]
#[allow(clippy::too_many_arguments)]
fn replay(
    py: Python<'_>,
    trace: TraceArg,
    policy: &str,
    alloc_conf: Option<String>,
    device_free: Option<&Bound<'_, PyAny>>,
    device_total: Option<&Bound<'_, PyAny>>,
    memory_fraction: Option<f64>,
    device: &str,
    check: bool,
    seed: u64,
) -> PyResult<Returned> {
    use allocsim::replay::DeviceArg;
    let (paths, cx) = TraceArg::resolve(std::slice::from_ref(&trace), py);
    let mut args: allocsim::replay::Args = request(&paths)?;
    args.policy = policy.into();
    args.alloc_conf = alloc_conf;
    args.device_free = size("device_free", device_free)?;
    args.device_total = size("device_total", device_total)?;
    args.memory_fraction = fraction(memory_fraction)?;
    args.device = match device {
        "auto" => DeviceArg::Auto,
        "sim" => DeviceArg::Sim,
        "recorded" => DeviceArg::Recorded,
        "cuda" => DeviceArg::Cuda,
        other => {
            return Err(usage(format!(
                "device={}: expected \"auto\", \"sim\", \"recorded\" or \"cuda\"",
                allocsim_core::text::quoted(other)
            )))
        }
    };
    args.check = check;
    args.seed = seed;
    call(py, || Ok(returned(allocsim::replay::run(&args, &cx)?)))
}

/// A memory fraction: from 0 to 1.
fn fraction(f: Option<f64>) -> PyResult<Option<f64>> {
    match f {
        Some(f) if !(0.0..=1.0).contains(&f) => {
            Err(usage(format!("memory_fraction={f}: expected a fraction from 0 to 1")))
        }
        f => Ok(f),
    }
}

#[pyfunction]
#[pyo3(signature = (traces, policies="all", memory_fraction=None, device_total=None,
                    capacity=true, html=None, jobs=None))]
#[allow(clippy::too_many_arguments)]
fn compare(
    py: Python<'_>,
    traces: Vec<TraceArg>,
    policies: &str,
    memory_fraction: Option<f64>,
    device_total: Option<&Bound<'_, PyAny>>,
    capacity: bool,
    html: Option<PathBuf>,
    jobs: Option<usize>,
) -> PyResult<Returned> {
    if traces.is_empty() {
        return Err(usage("traces: expected at least one trace".into()));
    }
    if jobs == Some(0) {
        return Err(usage("jobs=0: expected 1 or more worker threads".into()));
    }
    let (paths, cx) = TraceArg::resolve(&traces, py);
    let mut args: allocsim::compare::Args = request(&paths)?;
    args.policy = policies.into();
    args.memory_fraction = fraction(memory_fraction)?;
    args.device_total = size("device_total", device_total)?;
    args.no_capacity = !capacity;
    args.html = html;
    args.jobs = jobs;
    call(py, || Ok(returned(allocsim::compare::run(&args, &cx)?)))
}

#[pyfunction]
#[pyo3(signature = (trace, alloc_conf=None, policy="pytorch", outside=None))]
fn capacity(
    py: Python<'_>,
    trace: TracesArg,
    alloc_conf: Option<String>,
    policy: &str,
    outside: Option<&Bound<'_, PyAny>>,
) -> PyResult<Returned> {
    let (paths, cx) = trace.resolve(py)?;
    let mut args: allocsim::capacity::Args = request(&paths)?;
    args.alloc_conf = alloc_conf;
    args.policy = policy.into();
    args.model.outside = size("outside", outside)?;
    call(py, || Ok(returned(allocsim::capacity::run(&args, &cx)?)))
}

#[pyfunction]
#[pyo3(signature = (trace, device_free=None, outside=None))]
fn advise(
    py: Python<'_>,
    trace: TracesArg,
    device_free: Option<&Bound<'_, PyAny>>,
    outside: Option<&Bound<'_, PyAny>>,
) -> PyResult<Returned> {
    let (paths, cx) = trace.resolve(py)?;
    let mut args: allocsim::capacity::AdviseArgs = request(&paths)?;
    args.device_free = size("device_free", device_free)?;
    args.model.outside = size("outside", outside)?;
    call(py, || Ok(returned(allocsim::capacity::advise(&args, &cx)?)))
}

#[pyfunction]
#[pyo3(signature = (trace, policy="pytorch", alloc_conf=None))]
fn bound(
    py: Python<'_>,
    trace: TraceArg,
    policy: &str,
    alloc_conf: Option<String>,
) -> PyResult<Returned> {
    let (paths, cx) = TraceArg::resolve(std::slice::from_ref(&trace), py);
    let mut args: allocsim::bound::Args = request(&paths)?;
    args.policy = policy.into();
    args.alloc_conf = alloc_conf;
    call(py, || Ok(returned(allocsim::bound::run(&args, &cx)?)))
}

#[pyfunction]
#[pyo3(signature = (a, b=None, policy="pytorch", alloc_conf=None, b_policy=None,
                    b_alloc_conf=None, device_total=None, capacity=true, html=None))]
#[allow(clippy::too_many_arguments)]
fn diff(
    py: Python<'_>,
    a: TraceArg,
    b: Option<TraceArg>,
    policy: &str,
    alloc_conf: Option<String>,
    b_policy: Option<String>,
    b_alloc_conf: Option<String>,
    device_total: Option<&Bound<'_, PyAny>>,
    capacity: bool,
    html: Option<PathBuf>,
) -> PyResult<Returned> {
    let traces: Vec<TraceArg> = std::iter::once(a).chain(b).collect();
    let (paths, cx) = TraceArg::resolve(&traces, py);
    let mut args: allocsim::diff::Args = request(&paths)?;
    args.policy = policy.into();
    args.alloc_conf = alloc_conf;
    args.b_policy = b_policy;
    args.b_alloc_conf = b_alloc_conf;
    args.device_total = size("device_total", device_total)?;
    args.no_capacity = !capacity;
    args.html = html;
    call(py, || Ok(returned(allocsim::diff::run(&args, &cx)?)))
}

/// The replay `explain_oom` and `report` make: policy, settings, device size.
fn run_args(
    run: &mut allocsim::RunArgs,
    policy: &str,
    alloc_conf: Option<String>,
    device_total: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    run.policy = policy.into();
    run.alloc_conf = alloc_conf;
    run.device_total = size("device_total", device_total)?;
    Ok(())
}

#[pyfunction]
#[pyo3(signature = (trace, policy="pytorch", alloc_conf=None, device_total=None, limit=20))]
fn explain_oom(
    py: Python<'_>,
    trace: TracesArg,
    policy: &str,
    alloc_conf: Option<String>,
    device_total: Option<&Bound<'_, PyAny>>,
    limit: usize,
) -> PyResult<Returned> {
    let (paths, cx) = trace.resolve(py)?;
    let mut args: allocsim::explain_oom::Args = request(&paths)?;
    run_args(&mut args.run, policy, alloc_conf, device_total)?;
    args.limit = limit;
    call(py, || Ok(returned(allocsim::explain_oom::run(&args, &cx)?)))
}

#[pyfunction]
fn fidelity(py: Python<'_>, trace: TracesArg) -> PyResult<Returned> {
    let (paths, cx) = trace.resolve(py)?;
    let args: allocsim::fidelity::Args = request(&paths)?;
    call(py, || Ok(returned(allocsim::fidelity::run(&args, &cx)?)))
}

/// Write the report page; returns the path written.
#[pyfunction]
#[pyo3(signature = (trace, out=None, policy="pytorch", alloc_conf=None, device_total=None,
                    advice=true))]
fn report(
    py: Python<'_>,
    trace: TracesArg,
    out: Option<PathBuf>,
    policy: &str,
    alloc_conf: Option<String>,
    device_total: Option<&Bound<'_, PyAny>>,
    advice: bool,
) -> PyResult<PathBuf> {
    let (paths, cx) = trace.resolve(py)?;
    let mut args: allocsim::report::Args = request(&paths)?;
    run_args(&mut args.run, policy, alloc_conf, device_total)?;
    args.no_advice = !advice;
    // A job's page is named after its first rank, `NAME_job.html`.
    let job = allocsim::job::paths(&args.trace, &args.more).is_ok_and(|j| j.is_some());
    let default = match job {
        true => allocsim::report::default_job_out(&paths[0]),
        false => allocsim::report::default_out(&paths[0]),
    };
    args.out = Some(out.unwrap_or(default));
    let written = args.out.clone().unwrap_or_default();
    call(py, || allocsim::report::run(&args, &cx).map_err(Into::into))?;
    Ok(written)
}

/// Write `trace` to `out`, in the format its extension names.
#[pyfunction]
fn convert(py: Python<'_>, trace: TraceArg, out: PathBuf) -> PyResult<()> {
    let (paths, cx) = TraceArg::resolve(std::slice::from_ref(&trace), py);
    let args = allocsim::convert::Args { input: paths[0].clone(), output: out };
    call(py, || allocsim::convert::run(&args, &cx).map(drop).map_err(Into::into))
}

/// A live workload: its name, what it is, its parameters with their defaults.
type Workload = (&'static str, &'static str, Vec<(String, String)>);

/// The live workloads.
#[pyfunction]
fn workloads() -> Vec<Workload> {
    allocsim_workloads::names()
        .iter()
        .map(|&(name, what)| {
            let params = allocsim_workloads::parameters(name).unwrap_or_default();
            let params = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            (name, what, params)
        })
        .collect()
}

/// Why `policy` refuses the settings `conf`, or `None` if it takes them.
#[pyfunction]
fn settings_refused(policy: &str, conf: &str) -> Option<String> {
    allocsim_policies::by_name(policy, Some(conf)).err().map(|e| e.to_string())
}

/// Every policy name, in the order reports list them.
#[pyfunction]
fn policies() -> Vec<&'static str> {
    allocsim_policies::names()
}

#[pymodule]
fn _allocsim(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Failure", m.py().get_type::<Failure>())?;
    m.add_class::<Trace>()?;
    for f in [
        wrap_pyfunction!(load, m)?,
        wrap_pyfunction!(replay, m)?,
        wrap_pyfunction!(compare, m)?,
        wrap_pyfunction!(capacity, m)?,
        wrap_pyfunction!(advise, m)?,
        wrap_pyfunction!(bound, m)?,
        wrap_pyfunction!(explain_oom, m)?,
        wrap_pyfunction!(diff, m)?,
        wrap_pyfunction!(fidelity, m)?,
        wrap_pyfunction!(report, m)?,
        wrap_pyfunction!(convert, m)?,
        wrap_pyfunction!(workloads, m)?,
        wrap_pyfunction!(policies, m)?,
        wrap_pyfunction!(settings_refused, m)?,
    ] {
        m.add_function(f)?;
    }
    m.add_class::<session::Session>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
