//! One run, set up from a trace and options: the glue every front end shares (the CLI, the
//! integration tests, the comparison grid, the benchmarks), so that they all mean the same
//! thing by "replay this trace under this policy".

use allocsim_check::{CheckConfig, CheckReport, Checker};
use allocsim_core::{
    Allocator, ConfigError, Device, DeviceCalls, DynDevice, Env, Event, MemoryStats, Op, OpSource,
    RecordedEvent, RecordedKind, SnapshotSegment, StartState, Trace, TraceMeta,
};
use allocsim_policies::PolicyVisitor;
use allocsim_replay::{
    CheckObserver, Divergence, Engine, Fidelity, Metrics, MetricsReport, Observer, OomRecord,
    OpOutcome, Skipped,
};
use allocsim_sim::{Fault, Placement, RecordedDevice, RecordedFeed, SimConfig, SimDevice};

/// Which device a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// Follow the recording when the run reproduces it (the PyTorch policy under the trace's
    /// own settings), the model otherwise.
    #[default]
    Auto,
    /// The modelled device: free memory from total, free-at-start and what is reserved.
    Sim,
    /// Follow the recording's device calls and addresses, falling back to the model from the
    /// first call the recording does not show.
    Recorded,
}

/// Everything that decides a run besides the trace.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub policy: String,
    /// A settings string in the policy's syntax; overrides the trace's (which is PyTorch's and
    /// so only applies to the `pytorch` policy).
    pub alloc_conf: Option<String>,
    pub memory_fraction: Option<f64>,
    pub device: DeviceChoice,
    pub device_total_bytes: Option<u64>,
    pub device_free_bytes: Option<u64>,
    /// Run the independent checker over every event and the stats after every op.
    pub check: bool,
    /// Compare the run with the trace's recording, event for event.
    pub fidelity: bool,
    /// Seeds the simulated device's random choices (fault injection).
    pub seed: u64,
    /// Faults the simulated device injects (a run with faults never follows a recording).
    pub faults: Vec<Fault>,
    /// How the modelled device places segments (a run that follows a recording takes the
    /// recorded addresses while it does).
    pub placement: Placement,
    /// Stop at the first OOM and keep no other metrics (`RunReport::metrics` holds that OOM
    /// alone, and `snapshot` is empty unless other observers watch the run): all that each
    /// step of a capacity bisection asks, hundreds of times a question.
    pub until_oom: bool,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub policy: String,
    /// `recorded` or `sim`.
    pub device: &'static str,
    pub alloc_conf: String,
    pub memory_fraction: Option<f64>,
    pub device_total_bytes: u64,
    pub device_free_bytes: u64,
    pub ops_run: u64,
    pub metrics: MetricsReport,
    pub stats: MemoryStats,
    pub skipped: Skipped,
    pub device_calls: DeviceCalls,
    pub device_notes: Vec<String>,
    pub check: Option<CheckReport>,
    pub fidelity: Option<Result<u64, Divergence>>,
    pub snapshot: Vec<SnapshotSegment>,
    /// How a recording that starts mid-run was started from.
    pub start: StartedFrom,
}

/// How a run began.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StartedFrom {
    /// An empty allocator: the recording starts at the allocator's first call.
    #[default]
    Empty,
    /// The policy took the recording's state at its first entry as it is. Cumulative
    /// statistics are exact when the statistics at that moment were known (`stats_known`);
    /// otherwise they count from there, the live blocks at the start counted once as
    /// allocated.
    Seeded { stats_known: bool },
    /// The policy laid the live blocks out itself, by `ops` allocations run before the
    /// recorded ops (op indices count them), because it does not take a state (`why`).
    LaidOut { ops: u64, why: String },
}

impl StartedFrom {
    /// A line for the report; `None` for a run from empty.
    pub fn note(&self) -> Option<String> {
        match self {
            StartedFrom::Empty => None,
            StartedFrom::Seeded { stats_known: true } => Some(
                "the history starts mid-run: the allocator started from the state at its first \
                 entry, with the statistics recorded at that moment"
                    .to_string(),
            ),
            StartedFrom::Seeded { stats_known: false } => Some(
                "the history starts mid-run: the allocator started from the state at its first \
                 entry; cumulative statistics (allocated, freed, peak, num_*) count since the \
                 history began, the blocks alive then counted once as allocated"
                    .to_string(),
            ),
            StartedFrom::LaidOut { ops, why } => Some(format!(
                "the history starts mid-run: its live blocks were laid out by this policy, \
                 {ops} ops (their allocations) before the first recorded op ({why}); \
                 statistics count them"
            )),
        }
    }
}

/// The H100 80GB of the shared recordings: `totalGlobalMem`, and what the driver reported free
/// at start with one CUDA context open.
pub const H100_TOTAL_BYTES: u64 = 85_017_493_504;
pub const H100_FREE_BYTES: u64 = 84_465_090_560;

/// What a run takes from a trace besides its ops.
#[derive(Clone, Copy)]
struct Head<'t> {
    meta: &'t TraceMeta,
    start: Option<&'t StartState>,
    /// The state at the start may be seeded: the run is the recording's own (a what-if lays
    /// the live blocks out instead, as its settings and device would have).
    seedable: bool,
    /// The recording, or (streaming) at least its device events.
    recorded: &'t [RecordedEvent],
    /// Where the device events come from instead, as a snapshot is read.
    feed: Option<&'t RecordedFeed>,
    has_recording: bool,
    /// The whole trace, when it lies in memory: what the offline policy is planned from.
    whole: Option<&'t Trace>,
}

impl<'t> Head<'t> {
    fn of(trace: &'t Trace) -> Self {
        Head {
            meta: &trace.meta,
            start: trace.start.as_ref(),
            seedable: true,
            recorded: &trace.recorded,
            feed: None,
            has_recording: !trace.recorded.is_empty(),
            whole: Some(trace),
        }
    }
}

/// Replay `trace` as `opts` say, with `extra` observers watching too.
pub fn run_trace(
    trace: &Trace,
    opts: &RunOptions,
    extra: &mut [&mut dyn Observer],
    progress: impl FnMut(u64),
) -> Result<RunReport, ConfigError> {
    run_head(Head::of(trace), &trace.ops, opts, extra, progress)
}

/// Replay a trace whose ops stream in (from `allocsim_trace::native::read_native_ops`, say)
/// instead of lying in memory: `head` is the trace without its ops, whose `recorded` may hold
/// only the device events (segment events and ooms) of a recording of `recorded_len` events;
/// `ops` yields the ops. The fidelity comparison needs the whole recording, so
/// `opts.fidelity` is refused.
pub fn run_trace_streamed(
    head: &Trace,
    recorded_len: u64,
    ops: impl OpSource,
    opts: &RunOptions,
    extra: &mut [&mut dyn Observer],
    progress: impl FnMut(u64),
) -> Result<RunReport, ConfigError> {
    streamable(opts)?;
    let head = Head { has_recording: recorded_len > 0, whole: None, ..Head::of(head) };
    run_head(head, ops, opts, extra, progress)
}

/// Replay a snapshot's ops while it is read (`allocsim_trace::pytorch::read_snapshot_replaying`):
/// `head` is what is known of the trace before its end (meta and start; no ops), `feed` gets
/// the recorded device events of each op before the op comes out of `ops`. The fidelity
/// comparison needs the whole recording, so `opts.fidelity` is refused.
///
/// `None`, running nothing, for a run that follows the recording under a policy that may
/// reserve address space (expandable segments, the zoo's page maps): the recorded device
/// places a reservation by looking ahead in the recording, further than the feed may reach.
pub fn run_trace_fed(
    head: &Trace,
    feed: RecordedFeed,
    ops: impl OpSource,
    opts: &RunOptions,
    extra: &mut [&mut dyn Observer],
    progress: impl FnMut(u64),
) -> Option<Result<RunReport, ConfigError>> {
    if let Err(e) = streamable(opts) {
        return Some(Err(e));
    }
    let conf = opts.alloc_conf.as_ref().or(head.meta.alloc_conf.as_ref());
    let expandable = allocsim_policies::pytorch::Config::parse(conf.map_or("", |c| c))
        .map_or(true, |c| c.expandable_segments);
    let reserves = opts.policy != "pytorch" || expandable;
    if reserves && follows_recording(opts, &head.meta, true) {
        return None;
    }
    let head = Head { feed: Some(&feed), has_recording: true, whole: None, ..Head::of(head) };
    Some(run_head(head, ops, opts, extra, progress))
}

/// A run of ops that come as they are read cannot compare itself with the whole recording.
fn streamable(opts: &RunOptions) -> Result<(), ConfigError> {
    match opts.fidelity {
        true => Err(ConfigError(
            "the fidelity comparison needs the whole recording, not a stream of ops".to_string(),
        )),
        false => Ok(()),
    }
}

/// Whether a run follows the recording's device calls ([`DeviceChoice`]).
fn follows_recording(opts: &RunOptions, meta: &TraceMeta, has_recording: bool) -> bool {
    match opts.device {
        DeviceChoice::Recorded => true,
        DeviceChoice::Sim => false,
        DeviceChoice::Auto => {
            has_recording && opts.policy == "pytorch" && !changes_the_run(opts, meta)
        }
    }
}

/// Whether `opts` replay a recording as anything but itself: other settings, memory fraction,
/// device sizes, or injected faults (the policy aside: a recording is the PyTorch policy's).
pub fn changes_the_run(opts: &RunOptions, meta: &TraceMeta) -> bool {
    opts.alloc_conf.as_ref().is_some_and(|c| Some(c) != meta.alloc_conf.as_ref())
        || !opts.faults.is_empty()
        || opts.memory_fraction.is_some_and(|f| Some(f) != meta.memory_fraction)
        || opts.device_total_bytes.is_some_and(|t| Some(t) != meta.device_total_bytes)
        || opts.device_free_bytes.is_some_and(|f| Some(f) != meta.device_free_bytes)
}

fn run_head(
    mut trace: Head<'_>,
    ops: impl OpSource,
    opts: &RunOptions,
    extra: &mut [&mut dyn Observer],
    progress: impl FnMut(u64),
) -> Result<RunReport, ConfigError> {
    let meta = trace.meta;
    let total = opts.device_total_bytes.or(meta.device_total_bytes).unwrap_or(H100_TOTAL_BYTES);
    let free =
        opts.device_free_bytes.or(meta.device_free_bytes).unwrap_or(H100_FREE_BYTES.min(total));
    let sim = SimDevice::new(SimConfig {
        total_bytes: total,
        free_bytes: free,
        seed: opts.seed,
        faults: opts.faults.clone(),
        placement: opts.placement,
        recorded_segments: match opts.placement {
            Placement::Recorded => recorded_segments(trace.recorded),
            _ => Vec::new(),
        },
        ..SimConfig::default()
    });
    trace.seedable = !changes_the_run(opts, meta);
    if follows_recording(opts, meta, trace.has_recording) {
        let mut device = match trace.feed {
            Some(feed) => RecordedDevice::fed(feed.clone(), sim),
            None => RecordedDevice::new(trace.recorded, sim),
        };
        run_on(trace, ops, opts, &mut device, "recorded", total, free, extra, progress)
    } else {
        let mut device = sim;
        run_on(trace, ops, opts, &mut device, "sim", total, free, extra, progress)
    }
}

/// Where the recording's segments lay, `(start, size)` in its order: what
/// [`Placement::Recorded`] places by. A run fed as it is read has none yet.
fn recorded_segments(recorded: &[RecordedEvent]) -> Vec<(u64, u64)> {
    let segments = recorded.iter().filter(|e| e.kind == RecordedKind::SegmentAlloc);
    segments.map(|e| (e.addr, e.size)).collect()
}

/// Replay `trace` as `opts` say on a device the caller built (a real GPU, say), so this crate
/// needs to know nothing of it. `opts.device`, `device_total_bytes` and `device_free_bytes` do
/// not apply: the report gives the device's own `mem_info` at the start, under `device_name`.
pub fn run_trace_on(
    trace: &Trace,
    opts: &RunOptions,
    device: &mut dyn Device,
    device_name: &'static str,
    extra: &mut [&mut dyn Observer],
    progress: impl FnMut(u64),
) -> Result<RunReport, ConfigError> {
    let mem = device.mem_info();
    let (total, free) = (mem.total_bytes, mem.free_bytes);
    let head = Head::of(trace);
    let mut device = DynDevice(device);
    run_on(head, &trace.ops, opts, &mut device, device_name, total, free, extra, progress)
}

#[allow(clippy::too_many_arguments)]
fn run_on<D: Device>(
    trace: Head<'_>,
    ops: impl OpSource,
    opts: &RunOptions,
    device: &mut D,
    device_name: &'static str,
    total: u64,
    free: u64,
    extra: &mut [&mut dyn Observer],
    progress: impl FnMut(u64),
) -> Result<RunReport, ConfigError> {
    let alloc_conf = match (&opts.alloc_conf, opts.policy.as_str()) {
        (Some(conf), _) => conf.clone(),
        (None, "pytorch") => trace.meta.alloc_conf.clone().unwrap_or_default(),
        (None, _) => String::new(),
    };
    let run = Run { trace, opts, device_name, alloc_conf, total, free };
    // Every policy is called directly, through the loop built for its own type.
    let conf = run.alloc_conf.clone();
    let whole = run.trace.whole;
    let replay = Replay { run, ops, device, extra, progress };
    if opts.policy == crate::offline::OFFLINE {
        return replay.visit(crate::offline::policy(whole, &conf)?);
    }
    let recorded = opts.alloc_conf.is_none() && !conf.is_empty();
    allocsim_policies::visit_policy(&opts.policy, &conf, replay).map_err(|e| {
        if !recorded {
            return e;
        }
        let place = "the recorded allocator settings (a snapshot's allocator_settings, a trace's \
                     meta.alloc_conf)";
        ConfigError(format!("{place}: {}", e.0))
    })?
}

/// The replay loop, handed the policy as its own type by `visit_policy`.
struct Replay<'r, 'x, 'y, 't, 'o, I, D, P> {
    run: Run<'t, 'o>,
    ops: I,
    device: &'r mut D,
    extra: &'x mut [&'y mut dyn Observer],
    progress: P,
}

impl<I, D, P> PolicyVisitor for Replay<'_, '_, '_, '_, '_, I, D, P>
where
    I: OpSource,
    D: Device,
    P: FnMut(u64),
{
    type Output = Result<RunReport, ConfigError>;

    fn visit<A: Allocator + 'static>(self, mut allocator: A) -> Self::Output {
        self.run.replay(self.ops, &mut allocator, self.device, self.extra, self.progress)
    }
}

/// What `run_on` settled before choosing how to call the allocator.
struct Run<'t, 'o> {
    trace: Head<'t>,
    opts: &'o RunOptions,
    device_name: &'static str,
    alloc_conf: String,
    total: u64,
    free: u64,
}

impl Run<'_, '_> {
    fn replay<A: Allocator, D: Device>(
        self,
        ops: impl OpSource,
        allocator: &mut A,
        device: &mut D,
        extra: &mut [&mut dyn Observer],
        progress: impl FnMut(u64),
    ) -> Result<RunReport, ConfigError> {
        let Run { trace, opts, device_name, alloc_conf, total, free } = self;
        let memory_fraction = opts.memory_fraction.or(trace.meta.memory_fraction);
        if let Some(fraction) = memory_fraction {
            let mut events = Vec::new();
            let mut env = Env::new(device, &mut events);
            allocator.set_memory_fraction(&mut env, fraction)?;
        }

        let mut observers = RunObservers {
            metrics: Metrics::new(),
            checker: opts.check.then(|| {
                CheckObserver::new(Checker::new(CheckConfig {
                    device_total_bytes: total,
                    alignment_bytes: allocator.block_alignment(),
                    ..CheckConfig::default()
                }))
            }),
            fidelity: opts.fidelity.then(|| Fidelity::new(trace.recorded)),
            extra,
            until_oom: opts.until_oom,
        };
        // Metrics alone is the common case (`allocsim replay`, the grid): replay with it directly,
        // without a check per event for observers that are not there; a bisection's step
        // (`until_oom`) with only the OOM watch, the prologue of a laid-out start included.
        let metrics_only = observers.checker.is_none()
            && observers.fidelity.is_none()
            && observers.extra.is_empty();
        let question_only = metrics_only && opts.until_oom;
        let mut first_oom = FirstOom::default();
        let mut engine = Engine::new(allocator, device);
        let mut started = StartedFrom::Empty;
        if let Some(start) = trace.start {
            let stats = trace.meta.stats_at_start.as_ref().map(|flat| {
                let mut stats = MemoryStats::default();
                for (key, value) in flat {
                    stats.set_flat(key, *value);
                }
                stats
            });
            let seeded = if trace.seedable {
                engine.seed(start, stats.as_ref())
            } else {
                Err("a what-if: the state is the recorded settings' layout".to_string())
            };
            started = match seeded {
                Ok(()) => {
                    observers.on_start(start, engine.allocator());
                    StartedFrom::Seeded { stats_known: stats.is_some() }
                }
                Err(why) => {
                    let prologue = start.prologue();
                    if question_only {
                        engine.run(&prologue, &mut first_oom, |_| {});
                    } else {
                        engine.run(&prologue, &mut observers, |_| {});
                    }
                    StartedFrom::LaidOut { ops: prologue.len() as u64, why }
                }
            };
        }
        let ops_run = if question_only {
            // An OOM laying out the start already answers the question.
            if first_oom.0.is_some() {
                0
            } else {
                engine.run(ops, &mut first_oom, progress)
            }
        } else if metrics_only {
            engine.run(ops, &mut observers.metrics, progress)
        } else {
            engine.run(ops, &mut observers, progress)
        };
        let skipped = engine.skipped();
        drop(engine);

        Ok(RunReport {
            policy: opts.policy.clone(),
            device: device_name,
            alloc_conf,
            memory_fraction,
            device_total_bytes: total,
            device_free_bytes: free,
            ops_run,
            metrics: if question_only {
                MetricsReport {
                    ooms: first_oom.0.into_iter().collect(),
                    ..MetricsReport::default()
                }
            } else {
                observers.metrics.finish()
            },
            stats: allocator.stats(),
            skipped,
            device_calls: device.calls().clone(),
            // The allocator's settings it does not model are the run's to know as well.
            device_notes: device.notes().into_iter().chain(allocator.notes()).collect(),
            check: observers.checker.map(|c| c.checker.finish()),
            fidelity: observers.fidelity.map(Fidelity::finish),
            // A bisection's step asks nothing of the memory map (tens of thousands of segments,
            // hundreds of times a question, on a trace of many streams).
            snapshot: if question_only { Vec::new() } else { allocator.snapshot() },
            start: started,
        })
    }
}

/// The run's own observers and the caller's, as one observer: the metrics always, the checker
/// and the fidelity comparison when asked for, each called directly; then the caller's.
struct RunObservers<'r, 'a, 'b> {
    metrics: Metrics,
    checker: Option<CheckObserver>,
    fidelity: Option<Fidelity<'r>>,
    extra: &'a mut [&'b mut dyn Observer],
    /// Stop at the first OOM ([`RunOptions::until_oom`]).
    until_oom: bool,
}

/// The first OOM of a run, which stops it.
#[derive(Default)]
struct FirstOom(Option<OomRecord>);

impl Observer for FirstOom {
    #[inline]
    fn on_event(&mut self, _: u64, op_index: u64, event: &Event) -> bool {
        if let Event::Oom { info, .. } = event {
            self.0 = Some(OomRecord { op_index, info: *info });
        }
        self.0.is_none()
    }
}

impl Observer for RunObservers<'_, '_, '_> {
    fn on_start(&mut self, start: &StartState, allocator: &dyn Allocator) {
        self.metrics.on_start(start, allocator);
        if let Some(c) = self.checker.as_mut() {
            c.on_start(start, allocator);
        }
        if let Some(f) = self.fidelity.as_mut() {
            f.on_start(start, allocator);
        }
        self.extra.on_start(start, allocator);
    }

    #[inline]
    fn on_event(&mut self, event_index: u64, op_index: u64, event: &Event) -> bool {
        let mut keep_going = self.metrics.on_event(event_index, op_index, event);
        if let Some(c) = self.checker.as_mut() {
            keep_going &= c.on_event(event_index, op_index, event);
        }
        if let Some(f) = self.fidelity.as_mut() {
            keep_going &= f.on_event(event_index, op_index, event);
        }
        if !self.extra.is_empty() {
            keep_going &= self.extra.on_event(event_index, op_index, event);
        }
        keep_going && !(self.until_oom && matches!(event, Event::Oom { .. }))
    }

    #[inline]
    fn on_op(
        &mut self,
        op_index: u64,
        op: &Op,
        outcome: &OpOutcome,
        allocator: &dyn Allocator,
        device: &dyn Device,
    ) -> bool {
        let mut keep_going = self.metrics.on_op(op_index, op, outcome, allocator, device);
        if let Some(c) = self.checker.as_mut() {
            keep_going &= c.on_op(op_index, op, outcome, allocator, device);
        }
        if let Some(f) = self.fidelity.as_mut() {
            keep_going &= f.on_op(op_index, op, outcome, allocator, device);
        }
        if !self.extra.is_empty() {
            keep_going &= self.extra.on_op(op_index, op, outcome, allocator, device);
        }
        keep_going
    }
}
