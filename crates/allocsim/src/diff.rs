//! `allocsim diff A [B]`: two runs, or two settings of one run, side by side: the peaks,
//! fragmentation, OOMs and capacity of each and the change; the allocations, grouped by
//! stack, whose live bytes at the reserved peak changed most; the segments at each peak; and
//! the first op where the two op streams part. Two jobs of per-rank traces are diffed rank by
//! rank, with the job's answer over the ranks.

use crate::output::{bytes, outln, parse_size};
use allocsim_core::text::quoted;
use allocsim_core::{AllocId, MemPoolId, Op, Pool, Trace};
use allocsim_replay::{State, StateAt};
use allocsim_run::{capacity, run_trace, Capacity, RunOptions, RunReport, StartedFrom};
use anyhow::Context as _;
use rayon::prelude::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

mod page;

/// Stack groups listed, the largest changes first.
const TOP_GROUPS: usize = 10;
/// Frames of a stack shown (the JSON's, as the report's tooltips); the text shows fewer.
const FRAMES_SHOWN: usize = 12;
pub(crate) const FRAMES_IN_TEXT: usize = 4;
/// What groups the allocations no stack names (none recorded, or alive when the run began).
pub const NO_STACK: &str = "(no stack)";

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The first run's trace (any format `replay` reads), or a job's: a folder of per-rank
    /// traces or a quoted pattern (`'run/fsdp2_rank*.pickle.gz'`), diffed rank by rank.
    pub a: PathBuf,
    /// The second run's trace, or job. Default: A again, so that `--b-alloc-conf` or
    /// `--b-policy` makes B a what-if of the recording A.
    pub b: Option<PathBuf>,
    /// The policy of both runs (B's unless --b-policy).
    #[arg(long, default_value = "pytorch")]
    pub policy: String,
    /// Allocator settings of both runs, in the policy's syntax (B's unless --b-alloc-conf or
    /// another --b-policy). Default: each trace's own.
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// B's policy. Default: --policy.
    #[arg(long)]
    pub b_policy: Option<String>,
    /// B's allocator settings. Default: --alloc-conf under the same policy, else B's trace's own.
    #[arg(long)]
    pub b_alloc_conf: Option<String>,
    /// Total device memory of both runs (bytes, or `80GiB`). Default: each trace's.
    #[arg(long, value_parser = parse_size)]
    pub device_total: Option<u64>,
    /// Leave out the capacity search (the smallest free memory without an OOM), the slow part.
    #[arg(long)]
    pub no_capacity: bool,
    /// Also write the diff as one self-contained HTML page here: both timelines on one scale,
    /// the segment maps at each peak, the stack groups and the parting op (for two jobs, a
    /// page a rank: `OUT_rank{N}.html`).
    #[arg(long, value_name = "OUT.html")]
    pub html: Option<PathBuf>,
}

impl Args {
    /// The options of run A and of run B.
    fn options(&self) -> (RunOptions, RunOptions) {
        let a = RunOptions {
            policy: self.policy.clone(),
            alloc_conf: self.alloc_conf.clone(),
            device_total_bytes: self.device_total,
            ..RunOptions::default()
        };
        let policy = self.b_policy.clone().unwrap_or_else(|| self.policy.clone());
        let inherited = self.alloc_conf.clone().filter(|_| policy == self.policy);
        let alloc_conf = self.b_alloc_conf.clone().or(inherited);
        let b = RunOptions { policy, alloc_conf, ..a.clone() };
        (a, b)
    }

    fn b_path(&self) -> &Path {
        self.b.as_deref().unwrap_or(&self.a)
    }
}

/// One side of the diff: its run, the state at its reserved peak, and its capacity.
pub(crate) struct Side<'t> {
    path: &'t Path,
    trace: &'t Trace,
    pub(crate) report: RunReport,
    at_peak: State,
    capacity: Option<Capacity>,
}

impl Side<'_> {
    /// Ops the run laid out before the recorded ones (a what-if of a recording that starts
    /// mid-run): the engine's op indices count them.
    fn laid_out_ops(&self) -> u64 {
        match self.report.start {
            StartedFrom::LaidOut { ops, .. } => ops,
            _ => 0,
        }
    }
}

pub(crate) fn side<'t>(
    path: &'t Path,
    trace: &'t Trace,
    opts: &RunOptions,
    with_capacity: bool,
) -> anyhow::Result<Side<'t>> {
    let setup = || format!("{}: setting up the {} policy", path.display(), quoted(&opts.policy));
    let report = run_trace(trace, opts, &mut [], |_| {}).with_context(setup)?;
    // A run is deterministic: the second, stopped at the first's peak, sees the same state.
    let mut at = StateAt::new(report.metrics.peak_reserved_op);
    run_trace(trace, opts, &mut [&mut at], |_| {}).with_context(setup)?;
    let capacity = if with_capacity {
        let (outside, _) = crate::capacity_model::outside_bytes(None, trace);
        let copts =
            crate::capacity_model::options(&opts.policy, opts.alloc_conf.clone(), outside, trace);
        Some(capacity(trace, &copts).with_context(setup)?)
    } else {
        None
    };
    Ok(Side { path, trace, report, at_peak: at.state.unwrap_or_default(), capacity })
}

pub fn run(args: &Args, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    let a_job = crate::job::paths(&args.a, &[])?;
    let b_job = match &args.b {
        Some(b) => crate::job::paths(b, &[])?,
        None => a_job.clone(),
    };
    match (a_job, b_job) {
        (None, None) => pair(args, cx),
        (Some(a), Some(b)) => jobs(args, &a, &b, cx),
        _ => anyhow::bail!(
            "{} and {}: one names a job of per-rank traces (a folder or a pattern), the other \
             one trace; diff two traces, or two jobs rank by rank",
            args.a.display(),
            args.b_path().display()
        ),
    }
}

/// `diff` of two jobs, rank by rank: the ranks paired by number (the jobs must have the same
/// ranks), each pair diffed as two traces are, and the job's answer: each rank's change of
/// peak reserved and of the free memory it needs, the rank whose peak changed most, and the
/// job's need before and after (the most any rank needs: that rank decides).
fn jobs(
    args: &Args,
    a: &[PathBuf],
    b: &[PathBuf],
    cx: &crate::Context,
) -> anyhow::Result<crate::Output> {
    let a_job = crate::job::load(a, cx)?;
    let b_job = if a == b { None } else { Some(crate::job::load(b, cx)?) };
    let b_ranks = b_job.as_ref().map_or(&a_job.ranks, |j| &j.ranks);
    let numbers = |ranks: &[crate::job::Rank]| ranks.iter().map(|r| r.rank).collect::<Vec<_>>();
    if numbers(&a_job.ranks) != numbers(b_ranks) {
        anyhow::bail!(
            "{} has ranks {:?}, {} ranks {:?}: two jobs are diffed rank by rank, so they need \
             the same ranks",
            args.a.display(),
            numbers(&a_job.ranks),
            args.b_path().display(),
            numbers(b_ranks)
        );
    }
    // One context that holds both jobs' traces, each read once.
    let mut both = a_job.cx.clone();
    if let Some(j) = &b_job {
        both.loaded.extend(j.cx.loaded.iter().cloned());
    }
    let outs: Vec<crate::Output> = a_job
        .ranks
        .par_iter()
        .zip(b_ranks.par_iter())
        .map(|(ra, rb)| {
            let html = args.html.as_deref().map(|p| rank_page(p, ra.rank));
            let one = Args { a: ra.path.clone(), b: Some(rb.path.clone()), html, ..args.clone() };
            pair(&one, &both)
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(job_answer(&a_job, &outs))
}

/// `OUT.html` of rank `rank`: `OUT_rank{rank}.html`.
fn rank_page(out: &Path, rank: u32) -> PathBuf {
    let stem = out.file_stem().unwrap_or_default().to_string_lossy();
    out.with_file_name(format!("{stem}_rank{rank}.html"))
}

/// The job's answer over its ranks' diffs (their JSON, in rank order).
fn job_answer(job: &crate::job::Job, outs: &[crate::Output]) -> crate::Output {
    let at = |v: &Value, path: &[&str]| path.iter().fold(v, |v, k| &v[*k]).as_u64();
    let rows: Vec<Value> = job
        .ranks
        .iter()
        .zip(outs)
        .map(|(r, o)| {
            let mut j = o.json.clone().unwrap_or_default();
            j["rank"] = json!(r.rank);
            j
        })
        .collect();
    let need = |side: &str| {
        crate::job::Spread::of(rows.iter().filter_map(|j| {
            Some((at(j, &["rank"])? as u32, at(j, &[side, "capacity", "capacity_bytes"])?))
        }))
    };
    let changed = rows
        .iter()
        .filter_map(|j| Some((at(j, &["rank"])?, j["change"]["peak_reserved_bytes"].as_i64()?)))
        .max_by_key(|&(rank, change)| (change.unsigned_abs(), std::cmp::Reverse(rank)));
    let need_json = |s: Option<crate::job::Spread>| {
        s.map(|s| json!({ "capacity_bytes": s.top_bytes, "deciding_rank": s.top_rank }))
    };
    let (need_a, need_b) = (need("a"), need("b"));
    let job_json = json!({
        "ranks": job.ranks.len(),
        "a": need_json(need_a),
        "b": need_json(need_b),
        "most_changed_rank": changed.map(|(rank, _)| rank),
        "most_changed_peak_reserved_bytes": changed.map(|(_, change)| change),
    });
    let mut text = String::new();
    outln!(text, "allocsim diff: {}, rank by rank", job.heading());
    for (r, o) in job.ranks.iter().zip(outs) {
        outln!(text, "rank {}", r.rank);
        text.push_str(&crate::job::indented(&o.text));
    }
    if let Some((rank, change)) = changed {
        let sign = if change < 0 { "-" } else { "+" };
        outln!(
            text,
            "job: the peak reserved changed most on rank {rank} ({sign}{})",
            bytes(change.unsigned_abs())
        );
    }
    if let (Some(a), Some(b)) = (need_a, need_b) {
        outln!(
            text,
            "job: needs free at start on every rank's GPU: A {} (rank {} decides), B {} (rank {} \
             decides): {}",
            bytes(a.top_bytes),
            a.top_rank,
            bytes(b.top_bytes),
            b.top_rank,
            change_text(a.top_bytes, b.top_bytes)
        );
    }
    let notes = outs.iter().flat_map(|o| o.notes.clone()).collect();
    crate::Output {
        json: Some(json!({ "job": job_json, "ranks": rows })),
        text,
        notes,
        failed: outs.iter().any(|o| o.failed),
    }
}

/// `diff` of two traces.
fn pair(args: &Args, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    if let Some(path) = &args.html {
        crate::output::check_output(path, &[&args.a, args.b_path()])?;
    }
    let a_trace = cx.trace(&args.a)?;
    let b_own;
    let b_trace: &Trace = if args.b_path() == args.a {
        &a_trace
    } else {
        b_own = cx.trace(args.b_path())?;
        &b_own
    };
    let (a_opts, b_opts) = args.options();
    let (a, b) = rayon::join(
        || side(&args.a, &a_trace, &a_opts, !args.no_capacity),
        || side(args.b_path(), b_trace, &b_opts, !args.no_capacity),
    );
    let (a, b) = (a?, b?);
    let groups = stack_groups(&a, &b);
    let parting = parting_op(a.trace, b.trace);
    let json = diff_json(&a, &b, &groups, parting.as_ref());
    let text = diff_text(&a, &b, &groups, parting.as_ref());
    let mut notes = Vec::new();
    if let Some(path) = &args.html {
        crate::write_atomically(
            path,
            page::page(&a, &b, &groups, parting.as_ref(), &json).as_bytes(),
        )?;
        notes.push(format!("wrote {}", path.display()));
    }
    Ok(crate::Output { json: Some(json), text, notes, failed: false })
}

/// A stack as its frames, `name (file:line)`, innermost first; empty for no stack.
pub(crate) type Frames = Vec<String>;

/// The frames of the stack op `op` of `trace` came from.
fn frames_of(trace: &Trace, op: u64) -> Frames {
    let Ok(i) = trace.op_stacks.binary_search_by_key(&op, |&(o, _)| o) else {
        return Vec::new();
    };
    let stack = &trace.stacks[trace.op_stacks[i].1 as usize];
    stack.frames.iter().map(|f| format!("{} ({}:{})", f.name, f.filename, f.line)).collect()
}

/// Live bytes and allocations of one stack group at one side's peak.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Live {
    pub(crate) bytes: u64,
    pub(crate) allocations: u64,
}

/// A stack group in both runs.
pub(crate) struct Group {
    pub(crate) frames: Frames,
    pub(crate) a: Live,
    pub(crate) b: Live,
}

impl Group {
    pub(crate) fn change(&self) -> i64 {
        self.b.bytes as i64 - self.a.bytes as i64
    }
}

/// The live allocations at a side's peak, by the stack of the op that made them.
fn live_by_stack(s: &Side) -> BTreeMap<Frames, Live> {
    let offset = s.laid_out_ops();
    // By stack index first: the frames are made once a stack.
    let mut by_index: BTreeMap<Option<u32>, Live> = BTreeMap::new();
    for l in &s.at_peak.live {
        let op = l.alloc_op.and_then(|op| op.checked_sub(offset));
        let stack = op.and_then(|op| {
            let i = s.trace.op_stacks.binary_search_by_key(&op, |&(o, _)| o).ok()?;
            Some(s.trace.op_stacks[i].1)
        });
        let live = by_index.entry(stack).or_default();
        live.bytes += l.size;
        live.allocations += 1;
    }
    let mut by_frames: BTreeMap<Frames, Live> = BTreeMap::new();
    for (stack, live) in by_index {
        let frames = stack.map_or_else(Vec::new, |i| {
            let frames = &s.trace.stacks[i as usize].frames;
            frames.iter().map(|f| format!("{} ({}:{})", f.name, f.filename, f.line)).collect()
        });
        let sum = by_frames.entry(frames).or_default();
        sum.bytes += live.bytes;
        sum.allocations += live.allocations;
    }
    by_frames
}

/// Every stack group whose live bytes at the peaks differ, the largest change first (ties in
/// the order of their frames).
pub(crate) fn stack_groups(a: &Side, b: &Side) -> Vec<Group> {
    let (in_a, in_b) = (live_by_stack(a), live_by_stack(b));
    let mut all: BTreeMap<&Frames, (Live, Live)> = BTreeMap::new();
    for (frames, live) in &in_a {
        all.entry(frames).or_default().0 = *live;
    }
    for (frames, live) in &in_b {
        all.entry(frames).or_default().1 = *live;
    }
    let mut groups: Vec<Group> = all
        .into_iter()
        .map(|(frames, (a, b))| Group { frames: frames.clone(), a, b })
        .filter(|g| g.change() != 0)
        .collect();
    groups.sort_by_key(|g| std::cmp::Reverse(g.change().unsigned_abs()));
    groups
}

/// What an op is, as two recordings are held to each other: its kind, its size (a free's
/// is its allocation's), its stream and, for a setting, its value. Ids are not compared:
/// each recording numbers its own.
#[derive(Debug, Clone, PartialEq)]
struct Shape {
    action: &'static str,
    size: Option<u64>,
    stream: Option<u64>,
    value: Option<String>,
}

/// Each op's [`Shape`], knowing the sizes of the allocations it has seen.
#[derive(Default)]
struct Shapes {
    sizes: HashMap<AllocId, u64>,
}

impl Shapes {
    fn of(&mut self, op: &Op) -> Shape {
        let (mut size, mut stream, mut value) = (None, None, None);
        match op {
            Op::Alloc { id, size: s, stream: st } | Op::AllocAt { id, size: s, stream: st, .. } => {
                self.sizes.insert(*id, *s);
                (size, stream) = (Some(*s), Some(st.0));
            }
            Op::FreeRequested { id } | Op::FreeCompleted { id } => {
                size = self.sizes.get(id).copied();
            }
            Op::RecordStream { id, stream: st } => {
                (size, stream) = (self.sizes.get(id).copied(), Some(st.0));
            }
            Op::SetMemoryFraction { fraction } => value = Some(fraction.to_string()),
            Op::SetAllocatorSettings { conf } => value = Some(conf.clone()),
            Op::Pool { action, .. } => value = Some(action.name().to_string()),
            Op::EmptyCache => {}
        }
        Shape { action: op.action(), size, stream, value }
    }
}

/// Where two op streams part: the op index, and each side's op there (`None` where its
/// stream has ended).
struct Parting {
    op: u64,
    a: Option<Shape>,
    b: Option<Shape>,
}

/// The first op index where the two traces' ops differ in kind, size or stream, or where one
/// ends before the other; `None` when they are the same throughout.
fn parting_op(a: &Trace, b: &Trace) -> Option<Parting> {
    let (mut sa, mut sb) = (Shapes::default(), Shapes::default());
    let n = a.ops.len().max(b.ops.len());
    (0..n).find_map(|i| {
        let x = a.ops.get(i).map(|op| sa.of(op));
        let y = b.ops.get(i).map(|op| sb.of(op));
        (x != y).then_some(Parting { op: i as u64, a: x, b: y })
    })
}

/// Segments at a side's peak by (memory pool, size class): count and bytes.
fn segments_by_pool(s: &Side) -> BTreeMap<(MemPoolId, &'static str), (u64, u64)> {
    let mut pools = BTreeMap::new();
    for seg in &s.at_peak.segments {
        let kind = match seg.pool {
            Pool::Small => "small_pool",
            Pool::Large => "large_pool",
        };
        let e: &mut (u64, u64) = pools.entry((seg.pool_id, kind)).or_default();
        e.0 += 1;
        e.1 += seg.total_size;
    }
    pools
}

fn segments_json(s: &Side) -> Value {
    let segs = &s.at_peak.segments;
    let by_pool: Vec<Value> = segments_by_pool(s)
        .into_iter()
        .map(|((id, kind), (count, bytes))| {
            json!({"pool_id": [id.0, id.1], "pool": kind, "segments": count, "bytes": bytes})
        })
        .collect();
    json!({
        "segments": segs.len(),
        "bytes": segs.iter().map(|s| s.total_size).sum::<u64>(),
        "by_pool": by_pool,
    })
}

fn side_json(s: &Side) -> Value {
    let (r, m) = (&s.report, &s.report.metrics);
    json!({
        "trace": s.path.display().to_string(),
        "policy": r.policy,
        "alloc_conf": r.alloc_conf,
        "device": r.device,
        "ops": s.trace.ops.len(),
        "peak_reserved_bytes": m.peak_reserved_bytes,
        "peak_allocated_bytes": m.peak_allocated_bytes,
        "fragmentation_at_peak": m.fragmentation_at_peak,
        "ooms": m.ooms.len(),
        "peak_reserved_op": m.peak_reserved_op.saturating_sub(s.laid_out_ops()),
        "capacity": s.capacity.as_ref().map(crate::capacity_model::capacity_json),
        "segments_at_peak": segments_json(s),
    })
}

fn shape_json(trace: &Trace, op: u64, shape: &Option<Shape>) -> Value {
    match shape {
        None => Value::Null,
        Some(s) => {
            let mut frames = frames_of(trace, op);
            frames.truncate(FRAMES_SHOWN);
            json!({
                "action": s.action, "size": s.size, "stream": s.stream, "value": s.value,
                "frames": frames,
            })
        }
    }
}

fn diff_json(a: &Side, b: &Side, groups: &[Group], parting: Option<&Parting>) -> Value {
    let (ma, mb) = (&a.report.metrics, &b.report.metrics);
    let signed = |x: u64, y: u64| y as i64 - x as i64;
    let capacity = |s: &Side| s.capacity.as_ref().and_then(|c| c.capacity_bytes);
    let seg_bytes = |s: &Side| s.at_peak.segments.iter().map(|s| s.total_size).sum::<u64>();
    let change = json!({
        "peak_reserved_bytes": signed(ma.peak_reserved_bytes, mb.peak_reserved_bytes),
        "peak_allocated_bytes": signed(ma.peak_allocated_bytes, mb.peak_allocated_bytes),
        "fragmentation_at_peak": mb.fragmentation_at_peak - ma.fragmentation_at_peak,
        "ooms": mb.ooms.len() as i64 - ma.ooms.len() as i64,
        "capacity_bytes": capacity(a).zip(capacity(b)).map(|(x, y)| signed(x, y)),
        "segments_at_peak": b.at_peak.segments.len() as i64 - a.at_peak.segments.len() as i64,
        "segment_bytes_at_peak": signed(seg_bytes(a), seg_bytes(b)),
    });
    let shown: Vec<Value> = groups
        .iter()
        .take(TOP_GROUPS)
        .map(|g| {
            json!({
                "frames": if g.frames.is_empty() { vec![NO_STACK.to_string()] }
                          else { g.frames.iter().take(FRAMES_SHOWN).cloned().collect() },
                "a_bytes": g.a.bytes,
                "b_bytes": g.b.bytes,
                "change_bytes": g.change(),
                "a_allocations": g.a.allocations,
                "b_allocations": g.b.allocations,
            })
        })
        .collect();
    let parting = parting.map(|p| {
        json!({
            "op": p.op,
            "a": shape_json(a.trace, p.op, &p.a),
            "b": shape_json(b.trace, p.op, &p.b),
        })
    });
    json!({
        "a": side_json(a),
        "b": side_json(b),
        "change": change,
        "stack_groups": shown,
        "stack_groups_changed": groups.len(),
        "first_parting_op": parting,
    })
}

/// A signed change for people: `+1.00 GiB (1073741824 B) (+12.5 %)`, or `no change`.
fn change_text(a: u64, b: u64) -> String {
    let d = b as i64 - a as i64;
    if d == 0 {
        return "no change".to_string();
    }
    let sign = if d < 0 { "-" } else { "+" };
    let percent = 100.0 * d as f64 / a.max(1) as f64;
    format!("{sign}{} ({percent:+.1} %)", bytes(d.unsigned_abs()))
}

fn side_line(out: &mut String, name: &str, s: &Side) {
    let r = &s.report;
    outln!(
        out,
        "  {name}: {} ({} ops), {} policy (settings {}) on the {} device",
        s.path.display(),
        s.trace.ops.len(),
        r.policy,
        quoted(&r.alloc_conf),
        r.device
    );
}

fn diff_text(a: &Side, b: &Side, groups: &[Group], parting: Option<&Parting>) -> String {
    let mut out = String::new();
    outln!(out, "allocsim diff {} {}", a.path.display(), b.path.display());
    side_line(&mut out, "A", a);
    side_line(&mut out, "B", b);
    let (ma, mb) = (&a.report.metrics, &b.report.metrics);
    let row = |out: &mut String, what: &str, x: u64, y: u64| {
        outln!(out, "  {what}: {} -> {}: {}", bytes(x), bytes(y), change_text(x, y));
    };
    row(&mut out, "peak reserved", ma.peak_reserved_bytes, mb.peak_reserved_bytes);
    row(&mut out, "peak allocated", ma.peak_allocated_bytes, mb.peak_allocated_bytes);
    outln!(
        out,
        "  fragmentation at peak: {:.1} % -> {:.1} %",
        100.0 * ma.fragmentation_at_peak,
        100.0 * mb.fragmentation_at_peak
    );
    outln!(out, "  OOMs: {} -> {}", ma.ooms.len(), mb.ooms.len());
    capacity_text(&mut out, a, b);
    for (name, s) in [("A", a), ("B", b)] {
        let segs = &s.at_peak.segments;
        let total: u64 = segs.iter().map(|s| s.total_size).sum();
        outln!(out, "  segments at {name}'s peak: {}, {}", segs.len(), bytes(total));
        for ((id, kind), (count, bytes_)) in segments_by_pool(s) {
            let pool = kind.replace('_', " ");
            let private = if id == MemPoolId::DEFAULT {
                String::new()
            } else {
                format!(" of private pool ({}, {})", id.0, id.1)
            };
            outln!(out, "    {pool}{private}: {count}, {}", bytes(bytes_));
        }
    }
    groups_text(&mut out, groups);
    parting_text(&mut out, a, b, parting);
    out
}

fn capacity_text(out: &mut String, a: &Side, b: &Side) {
    let (Some(ca), Some(cb)) = (&a.capacity, &b.capacity) else {
        return;
    };
    let shown = |c: &Capacity| {
        c.capacity_bytes
            .map_or_else(|| format!("does not fit in {}", bytes(c.searched_up_to_bytes)), bytes)
    };
    let change = match (ca.capacity_bytes, cb.capacity_bytes) {
        (Some(x), Some(y)) => change_text(x, y),
        _ => "-".to_string(),
    };
    outln!(out, "  needs free at start: {} -> {}: {change}", shown(ca), shown(cb));
}

fn groups_text(out: &mut String, groups: &[Group]) {
    if groups.is_empty() {
        outln!(out, "  live bytes at the peaks by stack: no change");
        return;
    }
    outln!(
        out,
        "  live bytes at the peaks by stack, the largest changes ({} of {}):",
        groups.len().min(TOP_GROUPS),
        groups.len()
    );
    for g in groups.iter().take(TOP_GROUPS) {
        outln!(
            out,
            "    {} -> {} ({} -> {} allocations): {}",
            bytes(g.a.bytes),
            bytes(g.b.bytes),
            g.a.allocations,
            g.b.allocations,
            change_text(g.a.bytes, g.b.bytes)
        );
        if g.frames.is_empty() {
            outln!(out, "      {NO_STACK}");
        }
        for f in g.frames.iter().take(FRAMES_IN_TEXT) {
            outln!(out, "      {f}");
        }
    }
}

fn shape_text(s: &Option<Shape>) -> String {
    let Some(s) = s else { return "(its ops have ended)".to_string() };
    let mut t = s.action.to_string();
    if let Some(size) = s.size {
        t += &format!(" of {}", bytes(size));
    }
    if let Some(stream) = s.stream {
        t += &format!(" on stream {stream:#x}");
    }
    if let Some(v) = &s.value {
        t += &format!(" {}", quoted(v));
    }
    t
}

fn parting_text(out: &mut String, a: &Side, b: &Side, parting: Option<&Parting>) {
    let Some(p) = parting else {
        outln!(out, "  the two op streams are the same throughout");
        return;
    };
    outln!(out, "  the op streams part at op {}:", p.op);
    for (name, s, shape) in [("A", a, &p.a), ("B", b, &p.b)] {
        outln!(out, "    {name}: {}", shape_text(shape));
        if shape.is_some() {
            for f in frames_of(s.trace, p.op).iter().take(FRAMES_IN_TEXT) {
                outln!(out, "      {f}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parting_op, side, stack_groups, Side};
    use allocsim_core::{AllocId, BlockState, Op, StreamId, Trace};
    use allocsim_run::RunOptions;
    use std::path::Path;

    fn ops(ops: Vec<Op>) -> Trace {
        Trace { ops, ..Trace::default() }
    }

    fn alloc(id: u64, size: u64) -> Op {
        Op::Alloc { id: AllocId(id), size, stream: StreamId(0) }
    }

    fn free(id: u64) -> Op {
        Op::FreeRequested { id: AllocId(id) }
    }

    /// Ids are each recording's own; kinds, sizes (a free's is its allocation's) and streams
    /// are compared, and a stream that ends parts where it ends.
    #[test]
    fn streams_part_at_the_first_op_of_another_shape() {
        let a = ops(vec![alloc(1, 512), alloc(2, 1024), free(1), free(2)]);
        let renumbered = ops(vec![alloc(7, 512), alloc(9, 1024), free(7), free(9)]);
        assert!(parting_op(&a, &renumbered).is_none());
        let other_free = ops(vec![alloc(1, 512), alloc(2, 1024), free(2), free(1)]);
        let p = parting_op(&a, &other_free).expect("parts");
        assert_eq!(p.op, 2);
        assert_eq!((p.a.unwrap().size, p.b.unwrap().size), (Some(512), Some(1024)));
        let shorter = ops(vec![alloc(1, 512), alloc(2, 1024)]);
        let p = parting_op(&a, &shorter).expect("parts");
        assert_eq!((p.op, p.a.unwrap().action, p.b), (2, "free_requested", None));
        let other_stream = ops(vec![Op::Alloc { id: AllocId(1), size: 512, stream: StreamId(5) }]);
        assert_eq!(parting_op(&a, &other_stream).unwrap().op, 0);
    }

    fn bundled(folder: &str, name: &str) -> (std::path::PathBuf, Trace) {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces").join(folder).join(name);
        let trace = allocsim_trace::read_trace(&path).expect("a bundled trace");
        (path, trace)
    }

    /// The live allocations the observer kept at the peak are the allocator's: their bytes are
    /// the snapshot's allocated blocks', for a complete history, one that starts mid-run
    /// (seeded) and its what-if (laid out first).
    #[test]
    fn the_live_allocations_at_the_peak_are_the_allocators() {
        let expandable = Some("expandable_segments:True".to_string());
        for (folder, name) in [
            ("pytorch-2.11-h100", "gpt2_train.pickle.gz"),
            ("pytorch-2.11-h100-user", "d_gpt2_blog.pickle.gz"),
        ] {
            let (path, trace) = bundled(folder, name);
            for conf in [None, expandable.clone()] {
                let opts = RunOptions {
                    policy: "pytorch".into(),
                    alloc_conf: conf.clone(),
                    ..RunOptions::default()
                };
                let s: Side = side(&path, &trace, &opts, false).unwrap();
                let live: u64 = s.at_peak.live.iter().map(|l| l.size).sum();
                let blocks = s.at_peak.segments.iter().flat_map(|g| &g.blocks);
                let allocated: u64 =
                    blocks.filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.size).sum();
                assert_eq!(live, allocated, "{name} {conf:?}");
                assert!(live > 0);
                // Against itself, nothing changed.
                assert!(stack_groups(&s, &s).is_empty());
            }
        }
    }
}
