//! `allocsim replay TRACE --policy NAME ...`.

use crate::output::outln;
use crate::output::{
    bytes, compares_cumulative, memory_summary, parse_size, read_stats_json, recorded_differences,
};
use allocsim_core::text::quoted;
use allocsim_core::RecordedEvent;
use allocsim_core::{CallKind, MemPoolId};
use allocsim_replay::{EventLog, Observer, RecordedTo, Recorder};
use allocsim_run::{
    run_trace, run_trace_streamed, DeviceChoice, RunOptions, RunReport, StartedFrom,
};
use allocsim_sim::Fault;
use allocsim_sim::Placement;
use allocsim_trace::atomic::AtomicFile;
use allocsim_trace::pytorch::StackUses;
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    /// Follow the recording when replaying it under its own settings, else the model.
    Auto,
    /// The modelled device (free memory from --device-total/--device-free).
    Sim,
    /// Follow the recording's device calls and addresses, model from where the run leaves it.
    Recorded,
    /// A real GPU (CUDA device 0): measured wall time per op and per device call.
    Cuda,
}

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The trace: a PyTorch snapshot (.pickle, .pickle.gz), an RMM log (.csv) or a native
    /// trace (.allocsim, .allocsim.json); or a live workload, `workload:NAME?key=value&...`
    /// (`allocsim workload` lists them).
    pub trace: PathBuf,
    /// Further ranks' traces: with them, or a folder or a pattern (`run/rank*.pickle.gz`) as
    /// TRACE, the command answers per rank and for the job.
    pub more: Vec<PathBuf>,
    /// The allocation policy.
    #[arg(long, default_value = "pytorch")]
    pub policy: String,
    /// The device to replay on.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    /// Allocator settings in the policy's syntax (for pytorch: a PYTORCH_CUDA_ALLOC_CONF
    /// string). Default: the trace's own settings.
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// Cap reserved memory at this fraction of the device total. Default: the trace's.
    #[arg(long)]
    pub memory_fraction: Option<f64>,
    /// Total device memory (bytes, or `80GiB`, `80GB`, `8e10`). Default: the trace's, else an
    /// H100's 85017493504.
    #[arg(long, value_parser = parse_size)]
    pub device_total: Option<u64>,
    /// Device memory free at start (bytes, or `40GiB`, `40GB`, `4e10`). Default: the trace's,
    /// else 84465090560.
    #[arg(long, value_parser = parse_size)]
    pub device_free: Option<u64>,
    /// Run the independent checker over every event; exit 1 on any violation.
    #[arg(long)]
    pub check: bool,
    /// Write every event, one line each, to this file.
    #[arg(long)]
    pub event_log: Option<PathBuf>,
    /// Write the simulated run as a PyTorch memory snapshot (.pickle or .pickle.gz) that
    /// `torch.cuda._memory_viz` and pytorch.org/memory_viz open.
    #[arg(long)]
    pub export_snapshot: Option<PathBuf>,
    /// Fault injection: the N-th device reservation (cudaMalloc or page map, 1-based) fails.
    /// Repeatable.
    #[arg(long, value_name = "N", value_parser = crate::output::parse_nth)]
    pub fail_nth_malloc: Vec<u64>,
    /// Fault injection: another process takes BYTES of free device memory when op OP begins.
    /// Repeatable.
    #[arg(long, value_name = "OP:BYTES", value_parser = parse_take_memory)]
    pub take_memory: Vec<(u64, u64)>,
    /// Fault injection: every reservation fails with this probability (seeded by --seed).
    #[arg(long, value_name = "P", value_parser = crate::output::parse_probability)]
    pub fail_random: Option<f64>,
    /// Seed for the simulated device's random choices.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `torch.cuda.memory_stats()` when a history that starts mid-run began, as JSON (the flat
    /// dict, or an object with a `memory_stats` member), so that cumulative statistics are
    /// exact. Default: the sidecar's `meta.memory_stats_at_history_start`, if any.
    #[arg(long, value_name = "FILE")]
    pub stats_at_start: Option<PathBuf>,
    /// How the modelled device places segments: `driver` (the CUDA driver's rule, see
    /// docs/capacity.md), `recorded` (where the recording had a segment of the size, else the
    /// driver's rule), `jittered:SEED` (the driver's rule with seeded swaps), `descending`
    /// (each below the last) or `lowest` (first fit from the bottom).
    #[arg(long, value_parser = Placement::parse, default_value = "driver")]
    pub placement: Placement,
}

impl Args {
    pub fn options(&self) -> RunOptions {
        RunOptions {
            policy: self.policy.clone(),
            alloc_conf: self.alloc_conf.clone(),
            memory_fraction: self.memory_fraction,
            device: match self.device {
                DeviceArg::Auto => DeviceChoice::Auto,
                DeviceArg::Sim | DeviceArg::Cuda => DeviceChoice::Sim,
                DeviceArg::Recorded => DeviceChoice::Recorded,
            },
            device_total_bytes: self.device_total,
            device_free_bytes: self.device_free,
            check: self.check,
            fidelity: false,
            seed: self.seed,
            faults: self.faults(),
            placement: self.placement,
            until_oom: false,
        }
    }
}

fn parse_take_memory(s: &str) -> Result<(u64, u64), String> {
    let (op, bytes) = s.split_once(':').ok_or("expected OP:BYTES, e.g. 1000:1GiB")?;
    let op = op.trim().parse::<u64>().map_err(|e| format!("{}: {e}", quoted(op)))?;
    Ok((op, parse_size(bytes)?))
}

impl Args {
    fn faults(&self) -> Vec<Fault> {
        let mut faults: Vec<Fault> =
            self.fail_nth_malloc.iter().map(|&n| Fault::FailNthMalloc(n)).collect();
        faults.extend(
            self.take_memory.iter().map(|&(at_op, bytes)| Fault::TakeMemory { at_op, bytes }),
        );
        faults.extend(self.fail_random.map(|probability| Fault::FailRandom { probability }));
        faults
    }
}

pub fn run(args: &Args, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    if let Some(paths) = crate::job::paths(&args.trace, &args.more)? {
        let job = crate::job::load(&paths, cx)?;
        if args.event_log.is_some() || args.export_snapshot.is_some() {
            anyhow::bail!(
                "--event-log and --export-snapshot write one file, and a job has {} ranks: \
                 replay each rank's trace alone to write its own",
                job.ranks.len()
            );
        }
        if args.device == DeviceArg::Cuda {
            anyhow::bail!("--device cuda replays one trace on the one GPU: replay each rank alone");
        }
        let outs = job.each(|r, cx| {
            run(&Args { trace: r.path.clone(), more: Vec::new(), ..args.clone() }, cx)
        })?;
        return crate::per_rank::replay(&job, outs);
    }
    if let (Some(log), Some(export)) = (&args.event_log, &args.export_snapshot) {
        if allocsim_trace::atomic::same_file(log, export) {
            anyhow::bail!("--event-log and --export-snapshot name one file: {}", log.display());
        }
    }
    let inputs: Vec<&std::path::Path> =
        std::iter::once(&args.trace).chain(&args.stats_at_start).map(|p| p.as_path()).collect();
    for path in args.event_log.iter().chain(&args.export_snapshot) {
        crate::output::check_output(path, &inputs)?;
    }
    // A native binary trace streams its ops, so memory stays bounded however long it is;
    // replaying on a GPU wants the whole trace, and so does the offline policy, planned from
    // it; a trace the caller loaded is used as it is.
    let preloaded = cx.preloaded(&args.trace);
    let whole = preloaded.is_some() || args.policy == allocsim_run::OFFLINE;
    let streams = !whole
        && args.device != DeviceArg::Cuda
        && allocsim_trace::Format::from_path(&args.trace) == Some(allocsim_trace::Format::Native);
    let mut stream = if streams {
        Some(allocsim_trace::native::read_native_ops_with(&args.trace, &cx.read)?)
    } else {
        None
    };
    // A snapshot replays while it is read when the run wants nothing but its ops as they come
    // (`allocsim_trace::pytorch::read_snapshot_replaying`).
    let overlaps = !streams
        && !whole
        && args.export_snapshot.is_none()
        && args.event_log.is_none()
        && args.device != DeviceArg::Cuda
        && args.stats_at_start.is_none()
        && matches!(
            allocsim_trace::Format::from_path(&args.trace),
            Some(
                allocsim_trace::Format::PytorchSnapshot | allocsim_trace::Format::PytorchSnapshotGz
            )
        );
    let opts = args.options();
    let mut overlapped = None;
    // Events the recording has, where the snapshot's trace holds only its device events.
    let mut recorded_len = None;
    // The snapshot's ops, packed (`trace.ops` is then empty).
    let mut packed = None;
    let mut trace = match stream.as_mut() {
        Some(s) => std::borrow::Cow::Owned(std::mem::take(&mut s.head)),
        None if overlaps => {
            let read = crate::input::read_snapshot_replaying(&args.trace, cx, |o| {
                let head = allocsim_core::Trace { meta: o.meta, ..Default::default() };
                allocsim_run::run_trace_fed(&head, o.recorded, o.ops, &opts, &mut [], |_| {})
            })?;
            (overlapped, recorded_len) = (read.replay.flatten(), Some(read.recorded_len));
            packed = read.packed;
            std::borrow::Cow::Owned(read.trace)
        }
        None => cx.trace(&args.trace)?,
    };
    if let Some(path) = &args.stats_at_start {
        trace.to_mut().meta.stats_at_start = Some(read_stats_json(path)?);
    }
    let mut log = match &args.event_log {
        Some(path) => Some(EventLog::new(AtomicFile::create(path)?)),
        None => None,
    };
    // The export writes the run's events as a second run makes them (a run is deterministic),
    // holding none; this one counts the stacks' uses, which the writer needs first. A run on
    // a GPU is not repeated: its events are kept.
    let exports = args.export_snapshot.is_some();
    let on_gpu = args.device == DeviceArg::Cuda;
    let mut recorder = (exports && on_gpu).then(Recorder::default);
    let mut uses = (exports && !on_gpu).then(|| StackUses::new(&trace));
    let mut counter = uses.as_mut().map(|uses| {
        RecordedTo::new(|e: &RecordedEvent| {
            uses.count(e);
            true
        })
    });
    let mut extra: Vec<&mut dyn Observer> = Vec::new();
    if let Some(l) = log.as_mut() {
        extra.push(l);
    }
    if let Some(r) = recorder.as_mut() {
        extra.push(r);
    }
    if let Some(c) = counter.as_mut() {
        extra.push(c);
    }
    let setup = || {
        format!(
            "{}: setting up the {} policy",
            args.trace.display(),
            allocsim_core::text::excerpt(&opts.policy)
        )
    };
    let ops_len = match (&stream, &packed) {
        (Some(s), _) => s.ops.total(),
        (None, Some(p)) => p.len() as u64,
        (None, None) => trace.ops.len() as u64,
    };
    let progress = crate::input::progress_bar(cx, "replay", ops_len);
    let mut cuda_lines = Vec::new();
    let report = if let Some(report) = overlapped {
        report.with_context(setup)?
    } else if let Some(mut s) = stream {
        let ops = s.ops.plain();
        let report = run_trace_streamed(&trace, s.recorded_len, ops, &opts, &mut extra, progress)
            .with_context(setup)?;
        if let Some(e) = s.ops.take_error() {
            return Err(e.into());
        }
        report
    } else if let (Some(len), Some(ops)) = (recorded_len, &packed) {
        run_trace_streamed(&trace, len, ops, &opts, &mut extra, progress).with_context(setup)?
    } else if let Some(len) = recorded_len {
        run_trace_streamed(&trace, len, &trace.ops, &opts, &mut extra, progress)
            .with_context(setup)?
    } else if args.device == DeviceArg::Cuda {
        let (report, wall, gpu) = crate::gpu::replay_on_cuda(&trace, &opts, &mut extra, progress)?;
        cuda_lines = crate::gpu::cuda_timing_lines(&report, wall, &gpu);
        report
    } else {
        run_trace(&trace, &opts, &mut extra, progress).with_context(setup)?
    };
    drop(extra);
    drop(counter);
    if let (Some(l), Some(path)) = (log, &args.event_log) {
        l.finish()
            .and_then(AtomicFile::commit)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let mut notes = Vec::new();
    if let Some(path) = &args.export_snapshot {
        let (snapshot, policy, conf) = (&report.snapshot, &report.policy, &report.alloc_conf);
        if let Some(r) = recorder {
            crate::export::write_snapshot(path, &trace, r.events, snapshot, policy, conf)?
        } else if let Some(uses) = uses {
            let again = |sink: &mut dyn FnMut(&RecordedEvent) -> bool| {
                let mut to = RecordedTo::new(sink);
                run_again(args, cx, &trace, streams, &opts, &mut to).map_err(|e| format!("{e:#}"))
            };
            let write = crate::export::write_snapshot_streamed;
            write(path, &trace, uses, again, snapshot, policy, conf)?
        }
        notes.push(format!("wrote {}", path.display()));
    }
    // A what-if is not the recorded run: it is held against it on what matters, not key by key.
    let what_if = opts.policy != "pytorch" || allocsim_run::changes_the_run(&opts, &trace.meta);
    let expected = trace.meta.expected_stats.as_ref();
    let differences = expected.filter(|_| !what_if).map(|e| recorded_differences(&report, e));
    let what_if = expected.filter(|_| what_if).map(|e| WhatIf::new(e, &report));
    let violations = report.check.as_ref().map_or(0, |c| c.total_violations());
    let mut json = json_report(args, &report, &differences, &what_if);
    if !cuda_lines.is_empty() {
        json["gpu_timing"] = serde_json::json!(cuda_lines);
    }
    let mut text = print_report(args, cx, &trace.warnings, &report, &differences, &what_if);
    for line in &cuda_lines {
        outln!(text, "{line}");
    }
    Ok(crate::Output { json: Some(json), text, notes, failed: violations > 0 })
}

/// The run of [`run`] again (not on a GPU), for `observer` alone: the same events.
fn run_again(
    args: &Args,
    cx: &crate::Context,
    trace: &allocsim_core::Trace,
    streams: bool,
    opts: &RunOptions,
    observer: &mut dyn Observer,
) -> anyhow::Result<()> {
    if streams {
        let mut s = allocsim_trace::native::read_native_ops_with(&args.trace, &cx.read)?;
        let ops = s.ops.plain();
        run_trace_streamed(trace, s.recorded_len, ops, opts, &mut [observer], |_| {})?;
        if let Some(e) = s.ops.take_error() {
            return Err(e.into());
        }
    } else {
        run_trace(trace, opts, &mut [observer], |_| {})?;
    }
    Ok(())
}

type Differences = Option<Vec<(String, Option<i64>, Option<i64>)>>;

/// A what-if held against the recorded run on what a user asks: the peaks and the OOMs.
struct WhatIf {
    /// (what, recorded, simulated); the recorded value when the recording has it.
    rows: Vec<(&'static str, Option<i64>, i64)>,
}

impl WhatIf {
    fn new(recorded: &[(String, i64)], r: &RunReport) -> WhatIf {
        let get = |key: &str| recorded.iter().find(|(k, _)| k == key).map(|&(_, v)| v);
        let m = &r.metrics;
        WhatIf {
            rows: vec![
                ("peak reserved", get("reserved_bytes.all.peak"), m.peak_reserved_bytes as i64),
                ("peak allocated", get("allocated_bytes.all.peak"), m.peak_allocated_bytes as i64),
                ("OOMs", get("num_ooms"), m.ooms.len() as i64),
            ],
        }
    }

    fn json(&self) -> serde_json::Value {
        let rows = self.rows.iter().map(|(what, recorded, simulated)| {
            serde_json::json!({"what": what, "recorded": recorded, "simulated": simulated})
        });
        serde_json::Value::Array(rows.collect())
    }

    fn text(&self, out: &mut String) {
        outln!(out, "  what-if against the recorded run:");
        for &(what, recorded, simulated) in &self.rows {
            let show = |v: i64| if what == "OOMs" { v.to_string() } else { bytes(v as u64) };
            let Some(recorded) = recorded else {
                outln!(out, "    {what}: {} (the recording does not say)", show(simulated));
                continue;
            };
            let change = match simulated - recorded {
                0 => "the same".to_string(),
                d if what == "OOMs" => format!("{d:+}"),
                d => format!(
                    "{}{} ({:+.1} %)",
                    if d < 0 { "-" } else { "+" },
                    bytes(d.unsigned_abs()),
                    100.0 * d as f64 / recorded.max(1) as f64
                ),
            };
            outln!(
                out,
                "    {what}: {} recorded, {} here: {change}",
                show(recorded),
                show(simulated)
            );
        }
    }
}

/// A statistic's value, or that one side does not have it.
fn stat_value(v: Option<i64>) -> String {
    v.map_or("absent".to_string(), |v| v.to_string())
}

/// One pool's share of the memory at the end of a run.
#[derive(Debug, Default)]
struct PoolFigures {
    segments: u64,
    reserved_bytes: u64,
    allocated_bytes: u64,
}

/// The final snapshot's segments by memory pool (default pools and private ones).
fn pools_at_end(r: &RunReport) -> BTreeMap<MemPoolId, PoolFigures> {
    let mut pools: BTreeMap<MemPoolId, PoolFigures> = BTreeMap::new();
    for seg in &r.snapshot {
        let p = pools.entry(seg.pool_id).or_default();
        p.segments += 1;
        p.reserved_bytes += seg.total_size;
        p.allocated_bytes += seg.allocated_size();
    }
    pools
}

fn json_report(
    args: &Args,
    r: &RunReport,
    differences: &Differences,
    what_if: &Option<WhatIf>,
) -> serde_json::Value {
    let stats: serde_json::Map<String, serde_json::Value> =
        r.stats.flat().into_iter().map(|(k, v)| (k, v.into())).collect();
    let calls = crate::output::device_calls_json(&r.device_calls);
    let m = &r.metrics;
    serde_json::json!({
        "trace": args.trace.display().to_string(),
        "policy": r.policy,
        "device": r.device,
        "alloc_conf": r.alloc_conf,
        "memory_fraction": r.memory_fraction,
        "device_total_bytes": r.device_total_bytes,
        "device_free_bytes": r.device_free_bytes,
        "ops": r.ops_run,
        "events": m.events,
        "history_start": match &r.start {
            StartedFrom::Empty => "complete",
            StartedFrom::Seeded { stats_known: true } => "mid_run_stats_known",
            StartedFrom::Seeded { stats_known: false } => "mid_run_cumulative_since_history_start",
            StartedFrom::LaidOut { .. } => "mid_run_laid_out",
        },
        "start_note": r.start.note(),
        "memory_stats": stats,
        "what_if_against_recording": what_if.as_ref().map(WhatIf::json),
        "recorded_stats_match": differences.as_ref().map(|d| d.is_empty()),
        "recorded_stats_differences": differences.as_ref().map(|d| d.iter().map(|(k, a, b)| serde_json::json!({"key": k, "recorded": a, "simulated": b})).collect::<Vec<_>>()),
        "peak_allocated_bytes": m.peak_allocated_bytes,
        "peak_reserved_bytes": m.peak_reserved_bytes,
        "peak_active_bytes": m.peak_active_bytes,
        "peak_requested_bytes": m.peak_requested_bytes,
        "fragmentation_at_peak": m.fragmentation_at_peak,
        "external_fragmentation_max": m.external_fragmentation_max,
        "external_fragmentation_mean": m.external_fragmentation_mean,
        "ooms": m.ooms.iter().map(|o| serde_json::json!({
            "op": o.op_index,
            "rounded_bytes": o.info.rounded_bytes,
            "device_free_bytes": o.info.device_free_bytes,
            "allowed_bytes": o.info.allowed_bytes,
            "allocated_bytes": o.info.allocated_bytes,
            "reserved_bytes": o.info.reserved_bytes,
            "reserved_but_unallocated_bytes": o.info.cached_bytes(),
            "largest_free_small_bytes": o.info.largest_free_small_bytes,
            "largest_free_large_bytes": o.info.largest_free_large_bytes,
        })).collect::<Vec<_>>(),
        "pools_at_end": pools_at_end(r).into_iter().map(|(id, p)| serde_json::json!({
            "id": [id.0, id.1],
            "segments": p.segments,
            "reserved_bytes": p.reserved_bytes,
            "allocated_bytes": p.allocated_bytes,
        })).collect::<Vec<_>>(),
        "device_calls": calls,
        "device_call_time_ns": r.device_calls.total_time_ns(),
        "device_notes": r.device_notes,
        "skipped_ops": {
            "of_failed_allocs": r.skipped.of_failed_allocs,
            "of_unknown_ids": r.skipped.of_unknown_ids,
            "duplicate_allocs": r.skipped.duplicate_allocs,
            "refused_settings": r.skipped.refused_settings,
        },
        "checker_violations": r.check.as_ref().map(|c| c.total_violations()),
        "timeline": {
            "op": m.timeline.iter().map(|p| p.op_index).collect::<Vec<_>>(),
            "allocated_bytes": m.timeline.iter().map(|p| p.allocated_bytes).collect::<Vec<_>>(),
            "reserved_bytes": m.timeline.iter().map(|p| p.reserved_bytes).collect::<Vec<_>>(),
        },
    })
}

fn print_report(
    args: &Args,
    cx: &crate::Context,
    warnings: &[String],
    r: &RunReport,
    differences: &Differences,
    what_if: &Option<WhatIf>,
) -> String {
    let mut out = String::new();
    let m = &r.metrics;
    outln!(out, "allocsim replay {}", args.trace.display());
    outln!(out, "  policy: {} (settings {})", r.policy, quoted(&r.alloc_conf));
    if let Some(f) = r.memory_fraction {
        outln!(out, "  memory fraction: {f}");
    }
    outln!(
        out,
        "  device: {} ({} total, {} free at start)",
        r.device,
        bytes(r.device_total_bytes),
        bytes(r.device_free_bytes)
    );
    for note in &r.device_notes {
        outln!(out, "    {note}");
    }
    if let Some(note) = r.start.note() {
        outln!(out, "  start: {note}");
    }
    outln!(out, "  ops: {}  events: {}", r.ops_run, m.events);
    let pools = pools_at_end(r);
    if pools.keys().any(|id| !id.is_default()) {
        for (id, p) in &pools {
            let name =
                if id.is_default() { "default pools".to_string() } else { format!("pool {id}") };
            outln!(
                out,
                "  {name} at the end: {} segments, {} reserved, {} allocated",
                p.segments,
                bytes(p.reserved_bytes),
                bytes(p.allocated_bytes)
            );
        }
    }
    outln!(out, "  peak allocated: {}", bytes(m.peak_allocated_bytes));
    outln!(out, "  peak reserved:  {}", bytes(m.peak_reserved_bytes));
    outln!(out, "  peak active:    {}", bytes(m.peak_active_bytes));
    outln!(out, "  peak requested: {}", bytes(m.peak_requested_bytes));
    outln!(
        out,
        "  fragmentation at peak (1 - peak allocated / peak reserved): {:.2}%",
        100.0 * m.fragmentation_at_peak
    );
    outln!(
        out,
        "  cache fragmentation ((free - largest free block) / free): max {:.2}%, mean {:.2}%",
        100.0 * m.external_fragmentation_max,
        100.0 * m.external_fragmentation_mean
    );
    let calls: Vec<String> = CallKind::ALL
        .iter()
        .filter(|&&k| r.device_calls.get(k).calls > 0)
        .map(|&k| {
            let c = r.device_calls.get(k);
            format!(
                "{} {}{}",
                c.calls,
                k.name(),
                if c.failed > 0 { format!(" ({} refused)", c.failed) } else { String::new() }
            )
        })
        .collect();
    outln!(
        out,
        "  device calls: {} [{}], {:.3} ms simulated",
        r.device_calls.total_calls(),
        calls.join(", "),
        r.device_calls.total_time_ns() as f64 / 1e6
    );
    outln!(out, "  OOMs: {}", m.ooms.len());
    for o in m.ooms.iter().take(5) {
        outln!(
            out,
            "    op {}: {} requested; device free {}; reserved but unallocated {}; largest free block small {} / large {}",
            o.op_index,
            bytes(o.info.rounded_bytes),
            bytes(o.info.device_free_bytes),
            bytes(o.info.cached_bytes()),
            bytes(o.info.largest_free_small_bytes),
            bytes(o.info.largest_free_large_bytes)
        );
    }
    if m.ooms.len() > 5 {
        outln!(out, "    ... and {} more (--json lists all)", m.ooms.len() - 5);
    }
    let s = &r.skipped;
    if s.of_failed_allocs + s.of_unknown_ids + s.duplicate_allocs + s.refused_settings > 0 {
        outln!(
            out,
            "  skipped ops: {} frees of failed allocations, {} naming unknown ids, {} duplicate allocs, {} refused settings",
            s.of_failed_allocs, s.of_unknown_ids, s.duplicate_allocs, s.refused_settings
        );
    }
    match differences {
        Some(d) if d.is_empty() && compares_cumulative(r) => {
            outln!(
                out,
                "  memory_stats: all {} keys equal the recorded run's",
                r.stats.flat().len()
            )
        }
        Some(d) if d.is_empty() => outln!(
            out,
            "  memory_stats: every current value equals the recorded run's (cumulative values \
             are compared with --stats-at-start)"
        ),
        Some(d) => {
            outln!(out, "  memory_stats: {} keys differ from the recorded run's:", d.len());
            for (k, a, b) in d.iter().take(12) {
                let (a, b) = (stat_value(*a), stat_value(*b));
                outln!(out, "    {k}: recorded {a}, simulated {b}");
            }
        }
        None => {}
    }
    if let Some(w) = what_if {
        w.text(&mut out);
    }
    if let Some(c) = &r.check {
        outln!(out, "  checker: {} violations", c.total_violations());
        for v in c.violations().iter().take(10) {
            outln!(out, "    {v}");
        }
    }
    for w in warnings {
        outln!(out, "  trace warning: {w}");
    }
    // The GPU the snapshot was read for (`--cuda-device`; else the one with entries, which a
    // single-GPU recording names as 0).
    let device = cx.read.cuda_device.unwrap_or(0);
    outln!(out, "{}", memory_summary(&r.stats, device as u32));
    out
}
