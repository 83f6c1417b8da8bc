//! The runs `validate` compares: on the hardware (or a stand-in), on the model, and on the
//! model following the hardware's answers, and how two of them compare.

use super::*;

pub(super) struct PatternObserver {
    pub(super) patterns: Rc<RefCell<Patterns>>,
}

impl Observer for PatternObserver {
    fn on_event(&mut self, _event_index: u64, _op: u64, event: &Event) -> bool {
        let mut p = self.patterns.borrow_mut();
        match *event {
            Event::Alloc { id, addr, size, .. } => p.on_alloc(id, addr, size),
            Event::FreeRequested { id, .. } => p.on_free(id),
            _ => {}
        }
        // A failed launch leaves the context unusable: stop the run, `finish` reports it.
        p.error().is_none()
    }
}

/// What the run on the hardware side produced.
pub(super) struct HardwareRun {
    pub(super) description: String,
    pub(super) report: RunReport,
    pub(super) recorded: Vec<RecordedEvent>,
    /// Every device call and its answer, with the free memory after it.
    pub(super) calls: CallLog,
    pub(super) patterns: Option<PatternReport>,
    pub(super) wall: Duration,
}

pub(super) fn options(args: &Args) -> RunOptions {
    RunOptions {
        policy: args.policy.clone(),
        alloc_conf: args.alloc_conf.clone(),
        memory_fraction: args.memory_fraction,
        check: true,
        ..RunOptions::default()
    }
}

pub(super) fn run_hardware(
    args: &Args,
    trace: &Trace,
    cx: &crate::Context,
) -> anyhow::Result<HardwareRun> {
    let opts = options(args);
    let mut recorder = Recorder::default();
    let progress = crate::input::progress_bar(cx, "validate", trace.ops.len() as u64);
    let setup = || format!("setting up the {} policy", allocsim_core::text::excerpt(&args.policy));
    let (description, report, patterns, calls, wall) = match args.device {
        HardwareArg::Cuda => {
            let mut gpu = CudaDevice::open(args.gpu).context("opening the GPU")?;
            let patterns = if args.no_patterns {
                None
            } else {
                Some(gpu.enable_patterns().context("loading the pattern kernels")?)
            };
            let description = gpu.description();
            let mut observer = patterns.clone().map(|patterns| PatternObserver { patterns });
            let mut extra: Vec<&mut dyn Observer> = vec![&mut recorder];
            if let Some(o) = observer.as_mut() {
                extra.push(o);
            }
            let mut logger = CallLogger::new(&mut gpu, true);
            let start = Instant::now();
            let report = run_trace_on(trace, &opts, &mut logger, "cuda", &mut extra, progress)
                .with_context(setup)?;
            drop(extra);
            let calls = logger.finish();
            let patterns = match patterns {
                Some(p) => Some(p.borrow_mut().finish().context("running the pattern checks")?),
                None => None,
            };
            gpu.synchronize()?;
            (description, report, patterns, calls, start.elapsed())
        }
        HardwareArg::Sim => {
            let (total, free) = sim_capacity(trace);
            let mut sim = SimDevice::new(SimConfig {
                total_bytes: total,
                free_bytes: free,
                ..SimConfig::default()
            });
            return run_stand_in(args, trace, &mut sim);
        }
    };
    Ok(HardwareRun { description, report, recorded: recorder.events, calls, patterns, wall })
}

/// The hardware side on a device standing in for the GPU.
pub(super) fn run_stand_in(
    args: &Args,
    trace: &Trace,
    device: &mut dyn allocsim_core::Device,
) -> anyhow::Result<HardwareRun> {
    let mut recorder = Recorder::default();
    let mut logger = CallLogger::new(device, true);
    let start = Instant::now();
    let report =
        run_trace_on(trace, &options(args), &mut logger, "sim", &mut [&mut recorder], |_| {})
            .with_context(|| {
                format!("setting up the {} policy", allocsim_core::text::excerpt(&args.policy))
            })?;
    Ok(HardwareRun {
        description: "simulated device standing in for the GPU".to_string(),
        report,
        recorded: recorder.events,
        calls: logger.finish(),
        patterns: None,
        wall: start.elapsed(),
    })
}

pub(super) fn sim_capacity(trace: &Trace) -> (u64, u64) {
    let total = trace.meta.device_total_bytes.unwrap_or(allocsim_run::H100_TOTAL_BYTES);
    let free = trace.meta.device_free_bytes.unwrap_or(allocsim_run::H100_FREE_BYTES).min(total);
    (total, free)
}

/// The op stream with the hardware run's events as its recording.
pub(super) fn as_recorded(trace: &Trace, hw: &HardwareRun) -> Trace {
    Trace {
        meta: trace.meta.clone(),
        ops: trace.ops.clone(),
        recorded: hw.recorded.clone(),
        ..Trace::default()
    }
}

/// The simulated run of the same ops on the modelled device sized from the hardware, compared
/// event for event with the hardware's.
pub(super) fn run_simulated(
    args: &Args,
    trace: &Trace,
    hw: &HardwareRun,
) -> anyhow::Result<RunReport> {
    let opts = RunOptions {
        device: DeviceChoice::Sim,
        device_total_bytes: Some(hw.report.device_total_bytes),
        device_free_bytes: Some(hw.report.device_free_bytes),
        fidelity: true,
        ..options(args)
    };
    Ok(run_trace(&as_recorded(trace, hw), &opts, &mut [], |_| {})?)
}

/// How the device that answers as the hardware did went.
pub(super) struct Following {
    pub(super) comparison: Comparison,
    pub(super) logged_calls: usize,
    pub(super) followed_calls: u64,
    /// Where it left the hardware's calls, if it did.
    pub(super) left: Option<String>,
    /// Logged calls the simulated policy never made (when it did not leave them).
    pub(super) unreached: Option<String>,
    /// The model's free memory against the hardware's after each call.
    pub(super) free_memory: String,
}

impl Following {
    pub(super) fn followed_all(&self) -> bool {
        self.left.is_none() && self.unreached.is_none()
    }

    pub(super) fn calls_summary(&self) -> String {
        let (n, m) = (self.followed_calls, self.logged_calls);
        match (&self.left, &self.unreached) {
            (Some(left), _) => left.clone(),
            (None, Some(unreached)) => format!("followed {n} of {m} calls; {unreached}"),
            (None, None) => format!("followed all {m} device calls"),
        }
    }
}

/// The simulated run again, on a device that answers every call exactly as the hardware did.
pub(super) fn run_following(
    args: &Args,
    trace: &Trace,
    hw: &HardwareRun,
) -> anyhow::Result<Following> {
    let model = SimDevice::new(SimConfig {
        total_bytes: hw.report.device_total_bytes,
        free_bytes: hw.report.device_free_bytes,
        ..SimConfig::default()
    });
    let mut device = ReplayCallsDevice::new(hw.calls.clone(), model);
    let opts = RunOptions { fidelity: true, ..options(args) };
    let report =
        run_trace_on(&as_recorded(trace, hw), &opts, &mut device, "gpu-calls", &mut [], |_| {})?;
    Ok(Following {
        comparison: Comparison::of(&hw.report, &report),
        logged_calls: device.logged_calls(),
        followed_calls: device.followed_calls(),
        left: device.divergence().map(|d| d.to_string()),
        unreached: device
            .unreached()
            .map(|(n, first)| format!("{n} logged calls never made, the first: {first}")),
        free_memory: device.free_check().to_string(),
    })
}

/// One side-by-side comparison's outcome.
pub(super) struct Comparison {
    /// `Ok(events)` when every event matched.
    pub(super) events: Result<u64, Divergence>,
    /// `(key, hardware, simulated)` for every `memory_stats` key that differs.
    pub(super) stats: Vec<(String, i64, i64)>,
    pub(super) ooms_simulated: Vec<u64>,
}

impl Comparison {
    pub(super) fn of(hw: &RunReport, sim: &RunReport) -> Comparison {
        let theirs: std::collections::BTreeMap<String, i64> =
            sim.stats.flat().into_iter().collect();
        let stats = hw
            .stats
            .flat()
            .into_iter()
            .filter_map(|(k, v)| {
                let s = theirs.get(&k).copied().unwrap_or(i64::MIN);
                (s != v).then_some((k, v, s))
            })
            .collect();
        Comparison {
            events: sim.fidelity.clone().unwrap_or(Ok(0)),
            stats,
            ooms_simulated: sim.metrics.ooms.iter().map(|o| o.op_index).collect(),
        }
    }

    pub(super) fn exact(&self) -> bool {
        self.events.is_ok() && self.stats.is_empty()
    }

    pub(super) fn summary(&self) -> String {
        match (&self.events, self.stats.first()) {
            (Ok(n), None) => format!("exact: all {n} events and every memory_stats key equal"),
            (Ok(n), Some((k, h, s))) => format!(
                "all {n} events equal, but {} memory_stats keys differ, first {k}: hardware {h}, simulated {s}",
                self.stats.len()
            ),
            (Err(d), _) => format!(
                "first difference at event {} (op {}): hardware {}, simulated {}",
                d.event_index,
                d.op_index,
                d.expected.as_deref().unwrap_or("nothing"),
                d.simulated.as_deref().unwrap_or("nothing")
            ),
        }
    }
}
