//! `allocsim info TRACE`.

use crate::output::{bytes, outln};
use allocsim_core::text::quoted;
use allocsim_core::{BlockState, MemPoolId, Op, PoolAction, RecordedKind, Trace};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The trace: a PyTorch snapshot (.pickle, .pickle.gz), an RMM log (.csv) or a native
    /// trace (.allocsim, .allocsim.json).
    pub trace: PathBuf,
    /// Further ranks' traces: with them, or a folder or a pattern (`run/rank*.pickle.gz`) as
    /// TRACE, the command answers per rank and for the job.
    pub more: Vec<PathBuf>,
}

/// What `info` reports, computed from the ops alone (and the recording, when there is one).
#[derive(Debug, Default)]
struct Summary {
    ops_by_action: BTreeMap<&'static str, u64>,
    recorded_by_action: BTreeMap<&'static str, u64>,
    streams: BTreeSet<u64>,
    peak_live_bytes: u64,
    requested_bytes_total: u64,
    /// Private pools: contexts entered, and whether the pool was released.
    pools: BTreeMap<MemPoolId, (u64, bool)>,
}

/// What `info` reads of a trace: the trace, and where its ops and the recording's counts are
/// when a snapshot was read packed (`crate::input::read_snapshot_packed`).
struct Read<'t> {
    trace: &'t Trace,
    packed: Option<&'t allocsim_core::PackedOps>,
    /// The recording's events by kind and in all, where `trace.recorded` holds only some.
    recorded: Option<(&'t BTreeMap<&'static str, u64>, u64)>,
}

impl Read<'_> {
    fn ops_len(&self) -> usize {
        self.packed.map_or(self.trace.ops.len(), allocsim_core::PackedOps::len)
    }

    fn recorded_len(&self) -> u64 {
        self.recorded.map_or(self.trace.recorded.len() as u64, |(_, len)| len)
    }
}

fn summarise(read: &Read<'_>) -> Summary {
    match read.packed {
        Some(ops) => summarise_ops(read, ops),
        None => summarise_ops(read, read.trace.ops.iter().cloned()),
    }
}

fn summarise_ops(read: &Read<'_>, ops: impl IntoIterator<Item = Op>) -> Summary {
    let trace = read.trace;
    let mut s = Summary::default();
    match read.recorded {
        Some((counts, _)) => s.recorded_by_action = counts.clone(),
        None => {
            for r in &trace.recorded {
                *s.recorded_by_action.entry(r.kind.action()).or_default() += 1;
            }
        }
    }
    // Live bytes as the program saw them: allocations that the recording shows failing never
    // become live.
    let failed: BTreeSet<u64> =
        trace.recorded.iter().filter(|r| r.kind == RecordedKind::Oom).map(|r| r.op).collect();
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut live_bytes = 0u64;
    for seg in trace.start.iter().flat_map(|start| &start.segments) {
        for b in seg.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated) {
            if let Some(id) = trace.start.as_ref().and_then(|start| start.id_at(b.address)) {
                live.insert(id.0, b.requested_size);
                live_bytes += b.requested_size;
            }
        }
    }
    s.peak_live_bytes = live_bytes;
    for (i, op) in ops.into_iter().enumerate() {
        *s.ops_by_action.entry(op.action()).or_default() += 1;
        match op {
            Op::Alloc { id, size, stream } | Op::AllocAt { id, size, stream, .. } => {
                s.streams.insert(stream.0);
                if failed.contains(&(i as u64)) {
                    continue;
                }
                live.insert(id.0, size);
                live_bytes += size;
                s.requested_bytes_total += size;
                s.peak_live_bytes = s.peak_live_bytes.max(live_bytes);
            }
            Op::FreeRequested { id } => {
                live_bytes -= live.remove(&id.0).unwrap_or(0);
            }
            Op::Pool { pool, action } => {
                let entry = s.pools.entry(pool).or_default();
                entry.0 += u64::from(action == PoolAction::BeginAllocate);
                entry.1 |= action == PoolAction::Release;
            }
            _ => {}
        }
    }
    s
}

/// A rank's peak reserved and allocated bytes, its recording replayed as it was made.
fn peaks(path: &std::path::Path, cx: &crate::Context) -> anyhow::Result<(u64, u64)> {
    use anyhow::Context as _;
    let trace = cx.trace(path)?;
    let opts = allocsim_run::RunOptions {
        policy: "pytorch".to_string(),
        device: allocsim_run::DeviceChoice::Auto,
        ..allocsim_run::RunOptions::default()
    };
    let report = allocsim_run::run_trace(&trace, &opts, &mut [], |_| {})
        .with_context(|| format!("{}: replaying it for its peaks", path.display()))?;
    Ok((report.metrics.peak_reserved_bytes, report.metrics.peak_allocated_bytes))
}

pub fn run(args: &Args, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    if let Some(paths) = crate::job::paths(&args.trace, &args.more)? {
        let job = crate::job::load(&paths, cx)?;
        let outs = job.each(|r, cx| {
            let mut o = run(&Args { trace: r.path.clone(), more: Vec::new() }, cx)?;
            let (reserved, allocated) = peaks(&r.path, cx)?;
            if let Some(j) = o.json.as_mut() {
                j["peak_reserved_bytes"] = serde_json::json!(reserved);
                j["peak_allocated_bytes"] = serde_json::json!(allocated);
            }
            Ok(o)
        })?;
        return crate::per_rank::info(&job, outs);
    }
    // A snapshot is read with its ops packed and its events counted: its memory then grows
    // with the distinct stacks, not with the entries (issue 52).
    let (loaded, packed) = match cx.preloaded(&args.trace) {
        None if crate::input::is_snapshot(&args.trace) => {
            let read = crate::input::read_snapshot_packed(&args.trace, cx, true)?;
            let counts = (read.recorded_counts, read.recorded_len);
            (std::borrow::Cow::Owned(read.trace), Some((read.packed, counts)))
        }
        _ => (cx.trace(&args.trace)?, None),
    };
    let trace = &*loaded;
    let read = Read {
        trace,
        packed: packed.as_ref().and_then(|(p, _)| p.as_ref()),
        recorded: packed.as_ref().map(|(_, (counts, len))| (counts, *len)),
    };
    let s = summarise(&read);
    let m = &trace.meta;
    let json = serde_json::json!({
            "trace": args.trace.display().to_string(),
            "format": m.source_format,
            "ops": read.ops_len(),
            "ops_by_action": s.ops_by_action,
            "recorded_events": read.recorded_len(),
            "recorded_by_action": s.recorded_by_action,
            "streams": s.streams,
            "peak_live_bytes": s.peak_live_bytes,
            "requested_bytes_total": s.requested_bytes_total,
            "alloc_conf": m.alloc_conf,
            "memory_fraction": m.memory_fraction,
            "device_total_bytes": m.device_total_bytes,
            "device_free_bytes": m.device_free_bytes,
            "has_expected_stats": m.expected_stats.is_some(),
            "stacks": trace.stacks.len(),
            "warnings": trace.warnings,
            "private_pools": s.pools.iter().map(|(id, (contexts, released))| serde_json::json!({
                "id": [id.0, id.1],
                "contexts": contexts,
                "released": released,
            })).collect::<Vec<_>>(),
            "history_starts_mid_run": trace.start.is_some(),
            "start": trace.start.as_ref().map(|st| serde_json::json!({
                "segments": st.segments.len(),
                "reserved_bytes": st.reserved_bytes(),
                "live_blocks": st.ids.len(),
                "has_stats_at_start": m.stats_at_start.is_some(),
            })),
    });
    let mut out = String::new();
    outln!(out, "{} ({})", args.trace.display(), m.source_format);
    for w in &trace.warnings {
        outln!(out, "  warning: {w}");
    }
    if let Some(start) = &trace.start {
        outln!(
            out,
            "  history starts mid-run: {} segments ({}) and {} live blocks at its first entry",
            start.segments.len(),
            bytes(start.reserved_bytes()),
            start.ids.len()
        );
        let stats = if m.stats_at_start.is_some() { "known" } else { "unknown" };
        outln!(out, "  memory_stats at history start: {stats}");
    }
    outln!(out, "  ops: {}", read.ops_len());
    for (action, n) in &s.ops_by_action {
        outln!(out, "    {action:<24} {n:>10}");
    }
    if read.recorded_len() > 0 {
        outln!(out, "  recorded events: {}", read.recorded_len());
        for (action, n) in &s.recorded_by_action {
            outln!(out, "    {action:<24} {n:>10}");
        }
    }
    if !s.pools.is_empty() {
        let pools: Vec<String> = (s.pools.iter())
            .map(|(id, (contexts, released))| {
                let released = if *released { ", released" } else { "" };
                format!("{id} ({contexts} contexts{released})")
            })
            .collect();
        outln!(out, "  private pools: {}", pools.join(", "));
    }
    let streams: Vec<String> = s.streams.iter().map(|s| format!("{s:#x}")).collect();
    outln!(out, "  streams: {} ({})", s.streams.len(), streams.join(", "));
    outln!(out, "  peak live bytes (requested): {}", bytes(s.peak_live_bytes));
    outln!(out, "  requested in total: {}", bytes(s.requested_bytes_total));
    outln!(out, "  allocator settings: {}", quoted(m.alloc_conf.as_deref().unwrap_or("")));
    if let Some(f) = m.memory_fraction {
        outln!(out, "  memory fraction: {f}");
    }
    if let (Some(t), Some(f)) = (m.device_total_bytes, m.device_free_bytes) {
        outln!(out, "  device: {} total, {} free at start", bytes(t), bytes(f));
    }
    if m.expected_stats.is_some() {
        outln!(out, "  recorded memory_stats: yes (the replay compares against them)");
    }
    if !trace.stacks.is_empty() {
        outln!(out, "  call stacks: {} distinct", trace.stacks.len());
    }
    Ok(crate::Output::both(json, out))
}
