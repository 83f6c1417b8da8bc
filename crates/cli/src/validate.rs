//! The real-GPU mode: `allocsim validate`, `allocsim workload`, the GPU side of
//! `allocsim replay --device cuda`, and `workload:SPEC` wherever a TRACE is expected.
//!
//! `validate` replays one op stream twice with the same policy: on the GPU (a `CudaDevice`,
//! with pattern kernels filling and verifying every block) and on the simulated device sized
//! with the GPU's real free and total memory. The GPU run's events become a recording, and the
//! simulated run is compared with it event for event by the same `Fidelity` observer that
//! compares a simulation with a PyTorch recording: action, size, offset within the segment
//! (addresses differ), OOMs; then the final `memory_stats`. The GPU's device calls are logged
//! too (each call, its answer, and the free memory after it), and the comparison is repeated on
//! a device that answers every call exactly as the GPU did (`ReplayCallsDevice`: its addresses,
//! its refusals, its `mem_info`): that tells a difference caused by the driver's answers
//! (address tie-breaks, a refusal the model did not predict) from one in a decision.

use crate::gpu::per_op_us;
use crate::input::load_trace;
use crate::output::bytes;
use allocsim_core::{CallKind, Event, RecordedEvent, Trace};
use allocsim_cuda::{CudaDevice, PatternReport, Patterns};
use allocsim_replay::{Divergence, Observer, Recorder};
use allocsim_run::{run_trace, run_trace_on, DeviceChoice, RunOptions, RunReport};
use allocsim_sim::{CallLog, CallLogger, ReplayCallsDevice, SimConfig, SimDevice};
use anyhow::Context;
use std::cell::RefCell;
use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HardwareArg {
    /// A real GPU through the CUDA driver (loaded at run time).
    Cuda,
    /// A second simulated device in the GPU's place: checks the comparison itself, anywhere.
    Sim,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The op stream: a trace file (.pickle[.gz], .csv, .allocsim, .allocsim.json) or a live
    /// workload, `workload:NAME?key=value&...`, e.g.
    /// `workload:transformer-train?layers=12&hidden=768&batch=8&seq=512` (`allocsim workload`
    /// lists names and parameters).
    pub input: PathBuf,
    /// The allocation policy, run identically on both devices.
    #[arg(long, default_value = "pytorch")]
    pub policy: String,
    /// The hardware side of the comparison.
    #[arg(long, value_enum, default_value_t = HardwareArg::Cuda)]
    pub device: HardwareArg,
    /// Which GPU (CUDA device ordinal).
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Allocator settings in the policy's syntax. Default: the trace's own (pytorch only).
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// Cap reserved memory at this fraction of the device total. Default: the trace's.
    #[arg(long)]
    pub memory_fraction: Option<f64>,
    /// Skip the pattern kernels (fill on alloc, verify on free and at the end).
    #[arg(long)]
    pub no_patterns: bool,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// Drives the pattern kernels from the events: fill on alloc, verify on free.
struct PatternObserver {
    patterns: Rc<RefCell<Patterns>>,
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
struct HardwareRun {
    description: String,
    report: RunReport,
    recorded: Vec<RecordedEvent>,
    /// Every device call and its answer, with the free memory after it.
    calls: CallLog,
    patterns: Option<PatternReport>,
    wall: Duration,
}

fn options(args: &Args) -> RunOptions {
    RunOptions {
        policy: args.policy.clone(),
        alloc_conf: args.alloc_conf.clone(),
        memory_fraction: args.memory_fraction,
        check: true,
        ..RunOptions::default()
    }
}

fn run_hardware(args: &Args, trace: &Trace) -> anyhow::Result<HardwareRun> {
    let opts = options(args);
    let mut recorder = Recorder::default();
    let progress = crate::input::progress_bar(trace.ops.len() as u64);
    let setup = || format!("setting up the {} policy", args.policy);
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
fn run_stand_in(
    args: &Args,
    trace: &Trace,
    device: &mut dyn allocsim_core::Device,
) -> anyhow::Result<HardwareRun> {
    let mut recorder = Recorder::default();
    let mut logger = CallLogger::new(device, true);
    let start = Instant::now();
    let report =
        run_trace_on(trace, &options(args), &mut logger, "sim", &mut [&mut recorder], |_| {})
            .with_context(|| format!("setting up the {} policy", args.policy))?;
    Ok(HardwareRun {
        description: "simulated device standing in for the GPU".to_string(),
        report,
        recorded: recorder.events,
        calls: logger.finish(),
        patterns: None,
        wall: start.elapsed(),
    })
}

fn sim_capacity(trace: &Trace) -> (u64, u64) {
    let total = trace.meta.device_total_bytes.unwrap_or(allocsim_run::H100_TOTAL_BYTES);
    let free = trace.meta.device_free_bytes.unwrap_or(allocsim_run::H100_FREE_BYTES).min(total);
    (total, free)
}

/// The op stream with the hardware run's events as its recording.
fn as_recorded(trace: &Trace, hw: &HardwareRun) -> Trace {
    Trace {
        meta: trace.meta.clone(),
        ops: trace.ops.clone(),
        recorded: hw.recorded.clone(),
        ..Trace::default()
    }
}

/// The simulated run of the same ops on the modelled device sized from the hardware, compared
/// event for event with the hardware's.
fn run_simulated(args: &Args, trace: &Trace, hw: &HardwareRun) -> anyhow::Result<RunReport> {
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
struct Following {
    comparison: Comparison,
    logged_calls: usize,
    followed_calls: u64,
    /// Where it left the hardware's calls, if it did.
    left: Option<String>,
    /// Logged calls the simulated policy never made (when it did not leave them).
    unreached: Option<String>,
    /// The model's free memory against the hardware's after each call.
    free_memory: String,
}

impl Following {
    fn followed_all(&self) -> bool {
        self.left.is_none() && self.unreached.is_none()
    }

    fn calls_summary(&self) -> String {
        let (n, m) = (self.followed_calls, self.logged_calls);
        match (&self.left, &self.unreached) {
            (Some(left), _) => left.clone(),
            (None, Some(unreached)) => format!("followed {n} of {m} calls; {unreached}"),
            (None, None) => format!("followed all {m} device calls"),
        }
    }
}

/// The simulated run again, on a device that answers every call exactly as the hardware did.
fn run_following(args: &Args, trace: &Trace, hw: &HardwareRun) -> anyhow::Result<Following> {
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
struct Comparison {
    /// `Ok(events)` when every event matched.
    events: Result<u64, Divergence>,
    /// `(key, hardware, simulated)` for every `memory_stats` key that differs.
    stats: Vec<(String, i64, i64)>,
    ooms_simulated: Vec<u64>,
}

impl Comparison {
    fn of(hw: &RunReport, sim: &RunReport) -> Comparison {
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

    fn exact(&self) -> bool {
        self.events.is_ok() && self.stats.is_empty()
    }

    fn summary(&self) -> String {
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

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let trace = load_trace(&args.input)?;
    let hw = run_hardware(&args, &trace)?;
    let model = Comparison::of(&hw.report, &run_simulated(&args, &trace, &hw)?);
    // Run always: it also compares the model's free memory with the driver's after each call.
    let following = run_following(&args, &trace, &hw)?;
    let corrupted = hw
        .patterns
        .as_ref()
        .is_some_and(|p| p.mismatched_words > 0 || p.overlapping_allocs > 0 || p.unknown_frees > 0);
    let violations = hw.report.check.as_ref().map_or(0, |c| c.total_violations());
    let clean = !corrupted && violations == 0;
    let verdict = verdict(clean, &model, &following);
    if args.json {
        let value = json(&args, &trace, &hw, &model, &following, violations, verdict);
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print(&args, &trace, &hw, &model, &following, violations, verdict);
    }
    Ok(if verdict == "DIFFER" { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// AGREE: the modelled device alone reproduces the hardware run; AGREE given the GPU's
/// answers: answering every device call as the GPU did, it does; DIFFER otherwise, or on any
/// corrupted word, overlap or checker violation.
fn verdict(clean: bool, model: &Comparison, following: &Following) -> &'static str {
    match (clean, model.exact(), following.comparison.exact()) {
        (false, _, _) => "DIFFER",
        (true, true, _) => "AGREE",
        (true, false, true) => "AGREE given the GPU's answers",
        (true, false, false) => "DIFFER",
    }
}

fn calls_line(r: &RunReport) -> String {
    let calls: Vec<String> = CallKind::ALL
        .iter()
        .filter(|&&k| r.device_calls.get(k).calls > 0)
        .map(|&k| {
            let c = r.device_calls.get(k);
            let refused =
                if c.failed > 0 { format!(", {} refused", c.failed) } else { String::new() };
            format!("{} {} ({:.3} ms{refused})", c.calls, k.name(), c.time_ns as f64 / 1e6)
        })
        .collect();
    format!("{} [{}]", r.device_calls.total_calls(), calls.join(", "))
}

fn print(
    args: &Args,
    trace: &Trace,
    hw: &HardwareRun,
    model: &Comparison,
    following: &Following,
    violations: u64,
    verdict: &str,
) {
    let r = &hw.report;
    println!("allocsim validate {} --policy {}", args.input.display(), args.policy);
    println!("  hardware: {}", hw.description);
    println!(
        "    {} total, {} free at start; policy settings {:?}{}",
        bytes(r.device_total_bytes),
        bytes(r.device_free_bytes),
        r.alloc_conf,
        r.memory_fraction.map(|f| format!(", memory fraction {f}")).unwrap_or_default()
    );
    println!(
        "    ops: {} of {}  events: {}  wall time: {:.3} s ({:.2} us/op)",
        r.ops_run,
        trace.ops.len(),
        r.metrics.events,
        hw.wall.as_secs_f64(),
        per_op_us(hw.wall, r.ops_run)
    );
    println!("    device calls: {}", calls_line(r));
    println!(
        "    peak reserved {}, peak allocated {}",
        bytes(r.metrics.peak_reserved_bytes),
        bytes(r.metrics.peak_allocated_bytes)
    );
    let ooms: Vec<u64> = r.metrics.ooms.iter().map(|o| o.op_index).collect();
    println!(
        "    OOMs: {} (simulated: {}){}",
        ooms.len(),
        model.ooms_simulated.len(),
        if ooms == model.ooms_simulated { ", at the same ops" } else { ", at DIFFERENT ops" }
    );
    for note in &r.device_notes {
        println!("    device note: {note}");
    }
    println!("    checker: {violations} violations");
    match &hw.patterns {
        Some(p) => println!(
            "    patterns: {} blocks filled ({}), {} verified ({} at release), {} read-modify-write touches; {} corrupted words, {} overlapping allocations{}",
            p.blocks_filled,
            bytes(p.bytes_filled),
            p.blocks_verified,
            p.verified_at_release,
            p.touches,
            p.mismatched_words,
            p.overlapping_allocs,
            p.first_mismatch
                .map(|m| format!("; first: allocation {} word {} expected {:#x} found {:#x}", m.id.0, m.word, m.expected, m.found))
                .unwrap_or_default()
        ),
        None => println!("    patterns: not run"),
    }
    println!("  simulated, modelled device sized from the hardware: {}", model.summary());
    println!(
        "  simulated, answered as the hardware answered each device call: {}",
        following.comparison.summary()
    );
    println!("    device calls: {}", following.calls_summary());
    println!("    {}", following.free_memory);
    println!("  verdict: {verdict}");
}

fn comparison_json(c: &Comparison) -> serde_json::Value {
    serde_json::json!({
        "exact": c.exact(),
        "events_compared": c.events.as_ref().ok(),
        "first_difference": c.events.as_ref().err().map(|d| serde_json::json!({
            "event": d.event_index, "op": d.op_index, "hardware": d.expected, "simulated": d.simulated,
        })),
        "stats_differences": c.stats.iter().map(|(k, h, s)| serde_json::json!({"key": k, "hardware": h, "simulated": s})).collect::<Vec<_>>(),
        "ooms": c.ooms_simulated.len(),
        "summary": c.summary(),
    })
}

fn following_json(f: &Following) -> serde_json::Value {
    let mut value = comparison_json(&f.comparison);
    value["logged_calls"] = f.logged_calls.into();
    value["followed_calls"] = f.followed_calls.into();
    value["followed_all"] = f.followed_all().into();
    value["calls_summary"] = f.calls_summary().into();
    value["left"] = f.left.clone().into();
    value["unreached"] = f.unreached.clone().into();
    value["free_memory"] = f.free_memory.clone().into();
    value
}

fn json(
    args: &Args,
    trace: &Trace,
    hw: &HardwareRun,
    model: &Comparison,
    following: &Following,
    violations: u64,
    verdict: &str,
) -> serde_json::Value {
    let r = &hw.report;
    let calls: serde_json::Map<String, serde_json::Value> = CallKind::ALL
        .iter()
        .map(|&k| {
            let c = r.device_calls.get(k);
            (
                k.name().to_string(),
                serde_json::json!({"calls": c.calls, "failed": c.failed, "time_ns": c.time_ns}),
            )
        })
        .collect();
    serde_json::json!({
        "input": args.input.display().to_string(),
        "policy": args.policy,
        "hardware": hw.description,
        "alloc_conf": r.alloc_conf,
        "memory_fraction": r.memory_fraction,
        "device_total_bytes": r.device_total_bytes,
        "device_free_bytes": r.device_free_bytes,
        "ops": trace.ops.len(),
        "ops_run": r.ops_run,
        "events": r.metrics.events,
        "wall_s": hw.wall.as_secs_f64(),
        "us_per_op": per_op_us(hw.wall, r.ops_run),
        "device_calls": calls,
        "device_call_time_ns": r.device_calls.total_time_ns(),
        "device_notes": r.device_notes,
        "peak_reserved_bytes": r.metrics.peak_reserved_bytes,
        "peak_allocated_bytes": r.metrics.peak_allocated_bytes,
        "ooms": r.metrics.ooms.len(),
        "checker_violations": violations,
        "patterns": hw.patterns.as_ref().map(|p| serde_json::json!({
            "blocks_filled": p.blocks_filled,
            "bytes_filled": p.bytes_filled,
            "blocks_verified": p.blocks_verified,
            "verified_at_release": p.verified_at_release,
            "touches": p.touches,
            "mismatched_words": p.mismatched_words,
            "overlapping_allocs": p.overlapping_allocs,
            "unknown_frees": p.unknown_frees,
        })),
        "model": comparison_json(model),
        "following_device_calls": following_json(following),
        "verdict": verdict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn args(input: &str, policy: &str) -> Args {
        Args {
            input: PathBuf::from(input),
            policy: policy.into(),
            device: HardwareArg::Sim,
            gpu: 0,
            alloc_conf: None,
            memory_fraction: None,
            no_patterns: true,
            json: false,
        }
    }

    /// With a simulated device in the GPU's place, the comparison machinery must find the two
    /// runs identical for every policy: anything else is a bug in the comparison, not a
    /// finding about hardware.
    #[test]
    fn sim_against_sim_agrees_for_every_policy_on_a_workload() {
        let input =
            "workload:transformer-train?layers=2&hidden=256&batch=2&seq=128&vocab=4096&steps=2";
        let trace = load_trace(Path::new(input)).unwrap();
        for policy in allocsim_policies::names() {
            let a = args(input, policy);
            let hw = run_hardware(&a, &trace).unwrap();
            assert!(!hw.recorded.is_empty());
            let model = Comparison::of(&hw.report, &run_simulated(&a, &trace, &hw).unwrap());
            assert!(model.exact(), "{policy}: {}", model.summary());
            let f = run_following(&a, &trace, &hw).unwrap();
            assert!(f.comparison.exact(), "{policy}: {}", f.comparison.summary());
            assert!(f.followed_all(), "{policy}: {}", f.calls_summary());
            assert!(f.free_memory.starts_with("free memory equal after"), "{}", f.free_memory);
            assert!(!f.free_memory.contains("differs"), "{policy}: {}", f.free_memory);
        }
    }

    /// A simulated device whose addresses are mirrored, so segments the model places side by
    /// side come out in the opposite order, as a real driver's often do.
    struct Mirrored(SimDevice);

    const MIRROR: u64 = 1 << 48;

    impl allocsim_core::Device for Mirrored {
        fn malloc(&mut self, size: u64) -> Result<u64, allocsim_core::DeviceError> {
            self.0.malloc(size).map(|a| MIRROR - a - size)
        }
        fn free(&mut self, addr: u64, size: u64) {
            self.0.free(MIRROR - addr - size, size)
        }
        fn reserve_address(
            &mut self,
            size: u64,
            alignment: u64,
        ) -> Result<u64, allocsim_core::DeviceError> {
            self.0.reserve_address(size, alignment).map(|a| MIRROR - a - size)
        }
        fn release_address(&mut self, addr: u64, size: u64) {
            self.0.release_address(MIRROR - addr - size, size)
        }
        fn map(&mut self, addr: u64, size: u64) -> Result<(), allocsim_core::DeviceError> {
            self.0.map(MIRROR - addr - size, size)
        }
        fn unmap(&mut self, addr: u64, size: u64) {
            self.0.unmap(MIRROR - addr - size, size)
        }
        fn mem_info(&self) -> allocsim_core::MemInfo {
            self.0.mem_info()
        }
        fn calls(&self) -> &allocsim_core::DeviceCalls {
            self.0.calls()
        }
    }

    /// Other addresses (adjacent segments in the other order) change no decision of a policy
    /// that never looks at addresses: the comparison must say so, offsets and all.
    #[test]
    fn other_addresses_alone_are_no_difference() {
        let input = "workload:cnn-train?batch=2&image=64&steps=2";
        let trace = load_trace(Path::new(input)).unwrap();
        let a = args(input, "uncached");
        let (total, free) = sim_capacity(&trace);
        let sim = SimDevice::new(SimConfig {
            total_bytes: total,
            free_bytes: free,
            ..SimConfig::default()
        });
        let hw = run_stand_in(&a, &trace, &mut Mirrored(sim)).unwrap();
        let model = Comparison::of(&hw.report, &run_simulated(&a, &trace, &hw).unwrap());
        assert!(model.exact(), "{}", model.summary());
    }

    fn stand_in_sim(trace: &Trace, faults: Vec<allocsim_sim::Fault>) -> SimDevice {
        let (total, free) = sim_capacity(trace);
        SimDevice::new(SimConfig {
            total_bytes: total,
            free_bytes: free,
            faults,
            ..SimConfig::default()
        })
    }

    /// A driver that packs mallocs smaller than a page side by side inside one 2 MiB page,
    /// 512-byte aligned, as the H100's does; addresses mirrored as in [`Mirrored`].
    struct Packing {
        sim: Mirrored,
        /// The page being filled: (address, next free offset).
        open: Option<(u64, u64)>,
        /// Page -> live segments packed into it.
        users: std::collections::BTreeMap<u64, u32>,
        packed: u64,
    }

    const PAGE: u64 = allocsim_sim::PAGE_BYTES;

    impl allocsim_core::Device for Packing {
        fn malloc(&mut self, size: u64) -> Result<u64, allocsim_core::DeviceError> {
            if size >= PAGE {
                return self.sim.malloc(size);
            }
            let (page, used) = match self.open {
                Some((page, used)) if used + size <= PAGE => (page, used),
                _ => (self.sim.malloc(PAGE)?, 0),
            };
            self.packed += u64::from(used > 0);
            *self.users.entry(page).or_default() += 1;
            self.open = Some((page, (used + size).div_ceil(512) * 512));
            Ok(page + used)
        }
        fn free(&mut self, addr: u64, size: u64) {
            if size >= PAGE {
                return self.sim.free(addr, size);
            }
            let page = *self.users.range(..=addr).next_back().unwrap().0;
            let users = self.users.get_mut(&page).unwrap();
            *users -= 1;
            if *users == 0 {
                self.users.remove(&page);
                if self.open.is_some_and(|(p, _)| p == page) {
                    self.open = None;
                }
                self.sim.free(page, PAGE);
            }
        }
        fn reserve_address(
            &mut self,
            size: u64,
            alignment: u64,
        ) -> Result<u64, allocsim_core::DeviceError> {
            self.sim.reserve_address(size, alignment)
        }
        fn release_address(&mut self, addr: u64, size: u64) {
            self.sim.release_address(addr, size)
        }
        fn map(&mut self, addr: u64, size: u64) -> Result<(), allocsim_core::DeviceError> {
            self.sim.map(addr, size)
        }
        fn unmap(&mut self, addr: u64, size: u64) {
            self.sim.unmap(addr, size)
        }
        fn mem_info(&self) -> allocsim_core::MemInfo {
            self.sim.mem_info()
        }
        fn calls(&self) -> &allocsim_core::DeviceCalls {
            self.sim.calls()
        }
    }

    /// The rmm_pool runs on the H100 that the event-following device could not follow: the
    /// driver packed small segments into one page. Answering the calls as the device did, with
    /// exact byte ranges in the model's books, follows them to the end, exactly.
    #[test]
    fn a_driver_packing_small_segments_is_followed() {
        let input = "workload:cnn-train?batch=2&image=64&steps=2";
        let trace = load_trace(Path::new(input)).unwrap();
        for policy in ["rmm_pool", "bfc", "rmm_binning", "async_pool"] {
            let a = args(input, policy);
            let mut device = Packing {
                sim: Mirrored(stand_in_sim(&trace, vec![])),
                open: None,
                users: Default::default(),
                packed: 0,
            };
            let hw = run_stand_in(&a, &trace, &mut device).unwrap();
            if policy == "rmm_pool" {
                assert!(device.packed > 0, "the test must pack something");
            }
            let f = run_following(&a, &trace, &hw).unwrap();
            assert!(f.followed_all(), "{policy}: {}", f.calls_summary());
            assert!(f.comparison.exact(), "{policy}: {}", f.comparison.summary());
        }
    }

    /// The async_pool runs the event-following device could not follow: the driver refused a
    /// malloc the model would have granted, and the policy went on without an event showing
    /// it. Answering the calls as the device did reproduces the refusal.
    #[test]
    fn a_refusal_the_model_would_not_make_is_followed() {
        let input =
            "workload:transformer-train?layers=2&hidden=256&batch=2&seq=128&vocab=4096&steps=2";
        let trace = load_trace(Path::new(input)).unwrap();
        for policy in allocsim_policies::names() {
            let a = args(input, policy);
            let mut device = stand_in_sim(&trace, vec![allocsim_sim::Fault::FailNthMalloc(3)]);
            let hw = run_stand_in(&a, &trace, &mut device).unwrap();
            let calls = &hw.report.device_calls;
            let (malloc, map) = (calls.get(CallKind::Malloc), calls.get(CallKind::Map));
            let refused = malloc.failed + map.failed;
            assert_eq!(refused, u64::from(malloc.calls + map.calls >= 3), "{policy}");
            let f = run_following(&a, &trace, &hw).unwrap();
            assert!(f.followed_all(), "{policy}: {}", f.calls_summary());
            assert!(f.comparison.exact(), "{policy}: {}", f.comparison.summary());
            if policy == "async_pool" {
                let model = Comparison::of(&hw.report, &run_simulated(&a, &trace, &hw).unwrap());
                assert!(!model.exact(), "the model alone grants the refused call");
            }
        }
    }

    #[test]
    fn a_wrong_workload_is_an_error_naming_the_choices() {
        let err = load_trace(Path::new("workload:nope")).unwrap_err();
        assert!(format!("{err:#}").contains("transformer-train"), "{err:#}");
    }
}
