//! `allocsim report TRACE [-o report.html]`: one trace replayed and drawn as one self-contained
//! page (`report.js` draws it with the embedded uPlot; no network).
//!
//! What is drawn, and how a page stays small and quick for a trace of tens of millions of
//! entries:
//! - the active memory timeline, stacked per allocation as PyTorch's memory_viz stacks it
//!   (allocation order, a freed block's neighbours above move down), with reserved memory over
//!   it, against the recording's `time_us` where it has one (ops otherwise). The page holds
//!   every allocation exactly (start, end, size, address, stack, annotation), as compressed
//!   varint columns ([`pack`]: 3 to 5 bytes an allocation), and computes its level of detail
//!   for the range shown: each pixel column shows the state at the op where allocated memory
//!   peaks within it, allocations of a pixel or more one by one and the smaller ones as one
//!   grey band; zoomed in, each allocation is its own band with its stack;
//! - OOMs and `empty_cache` calls as marks; each of the first [`OOMS_EXPLAINED`] OOMs links to
//!   its explanation;
//! - the segment map after every op, or, when that would hold more than [`MAP_BLOCKS`] blocks,
//!   after every k-th op (k a power of two, doubled until it fits), at the reserved peak and at
//!   the first OOMs, chosen with a slider;
//! - the `memory_summary` table and, for the PyTorch policy on a trace of at most
//!   [`ADVICE_MAX_OPS`] ops, the `advise` table.

mod job_page;
mod pack;
mod timeline;

use crate::output::{bytes, conf_label, memory_summary};
use allocsim_core::{
    Allocator, BlockState, Device, Event, Op, Pool, SnapshotSegment, StartState, Trace,
};
use allocsim_replay::{Observer, OomExplainer, OomExplanation, OpOutcome};
use allocsim_run::run_trace;
use anyhow::Context;
use pack::Columns;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use timeline::{Allocations, Clock};

/// Blocks the kept segment maps may hold in all (a byte or two each in the page, compressed).
const MAP_BLOCKS: usize = 250_000;
/// OOMs explained on the page, each with its segment map, at most.
const OOMS_EXPLAINED: usize = 50;
/// The reserved peak's map is taken as the run goes while the maps taken for it hold at most
/// this many segments and blocks an op (plus a start): a run whose every op is a new peak
/// with thousands of segments (issue 50: one per stream) made the report quadratic. Past it,
/// the map of the last peak is taken by a second replay that stops there.
const PEAK_MAP_ITEMS_PER_OP: u64 = 64;
const PEAK_MAP_ITEMS_FREE: u64 = 1 << 20;
/// The table of settings (`advise`: some 220 replays of the trace) is left out of the page of
/// a longer trace, which says so: on 10 M entries it would take minutes.
const ADVICE_MAX_OPS: u64 = 2_000_000;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace (any format `replay` reads); or a job of per-rank traces: a folder of them,
    /// a pattern (`run/rank*.pickle.gz`), or several paths. A job's page shows each rank's
    /// peaks and need, the rank that decides the card, the spread, where that rank differs,
    /// and the ranks' timelines one under the other, on one axis and one scale.
    pub trace: PathBuf,
    /// Further ranks' traces of the job.
    pub more: Vec<PathBuf>,
    /// Where to write the page. Default: the trace's name with `.html` (a job's: its first
    /// rank's name with `_job.html`), in this directory.
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub run: crate::input::RunArgs,
    /// Leave out the table of settings (`allocsim advise`, about a second on a big trace;
    /// always left out past 2,000,000 ops).
    #[arg(long)]
    pub no_advice: bool,
}

/// Everything the page needs, collected in the one replay.
struct Collect<'t> {
    /// The segment map is kept after every `map_every`-th op.
    map_every: u64,
    map_blocks: usize,
    reserved: u64,
    /// `(op, reserved bytes after it)` for each op that changed reserved memory.
    reserved_steps: Vec<(u64, u64)>,
    allocations: Allocations<'t>,
    /// The live allocations' indices in `allocations`, by address.
    live: HashMap<u64, usize>,
    ooms: Vec<(u64, u64)>,
    empty_caches: Vec<u64>,
    peak_reserved: u64,
    peak: Option<(u64, Vec<SnapshotSegment>)>,
    /// Segments and blocks in the peak maps taken so far.
    peak_map_items: u64,
    /// The op of the reserved peak when its map was not taken (over the budget above).
    peak_missed: Option<u64>,
    snapshots: Vec<(u64, Vec<SnapshotSegment>)>,
    oom_now: bool,
}

impl<'t> Collect<'t> {
    fn new(trace: &'t Trace, clock: &'t Clock) -> Collect<'t> {
        Collect {
            map_every: 1,
            map_blocks: 0,
            reserved: 0,
            reserved_steps: Vec::new(),
            allocations: Allocations::new(trace, clock),
            live: HashMap::new(),
            ooms: Vec::new(),
            empty_caches: Vec::new(),
            peak_reserved: 0,
            peak: None,
            peak_map_items: 0,
            peak_missed: None,
            snapshots: Vec::new(),
            oom_now: false,
        }
    }
}

impl Observer for Collect<'_> {
    fn on_start(&mut self, _: &StartState, allocator: &dyn Allocator) {
        self.reserved = allocator.stats().reserved_bytes.all.current.max(0) as u64;
        for seg in allocator.snapshot() {
            for b in seg.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated) {
                let i = self.allocations.push(0, b.address, b.size, seg.stream.0, seg.pool, true);
                self.live.insert(b.address, i);
            }
        }
    }

    fn on_event(&mut self, _: u64, op: u64, event: &Event) -> bool {
        match *event {
            Event::SegmentAlloc { size, .. } | Event::SegmentMap { size, .. } => {
                self.reserved += size
            }
            Event::SegmentFree { size, .. } | Event::SegmentUnmap { size, .. } => {
                self.reserved = self.reserved.saturating_sub(size)
            }
            Event::Alloc { addr, size, stream, pool, .. } => {
                let i = self.allocations.push(op, addr, size, stream.0, pool, false);
                self.live.insert(addr, i);
            }
            Event::FreeRequested { addr, .. } => {
                if let Some(i) = self.live.remove(&addr) {
                    self.allocations.end(i, op);
                }
            }
            Event::FreeCompleted { .. } => {}
            Event::Oom { size, .. } => {
                self.ooms.push((op, size));
                self.oom_now = true;
            }
        }
        true
    }

    fn on_op(&mut self, i: u64, op: &Op, _: &OpOutcome, a: &dyn Allocator, _: &dyn Device) -> bool {
        if self.reserved_steps.last().is_none_or(|&(_, r)| r != self.reserved) {
            self.reserved_steps.push((i, self.reserved));
        }
        if matches!(op, Op::EmptyCache) {
            self.empty_caches.push(i);
        }
        if self.reserved > self.peak_reserved {
            self.peak_reserved = self.reserved;
            if self.peak_map_items <= PEAK_MAP_ITEMS_FREE + PEAK_MAP_ITEMS_PER_OP * i {
                let map = a.snapshot();
                self.peak_map_items += map.iter().map(|s| 1 + s.blocks.len() as u64).sum::<u64>();
                (self.peak, self.peak_missed) = (Some((i, map)), None);
            } else {
                (self.peak, self.peak_missed) = (None, Some(i));
            }
        }
        let oom = std::mem::take(&mut self.oom_now) && self.ooms.len() <= OOMS_EXPLAINED;
        if oom || i.is_multiple_of(self.map_every) {
            let map = a.snapshot();
            self.map_blocks += map.iter().map(|s| s.blocks.len()).sum::<usize>();
            self.snapshots.push((i, map));
        }
        // Over budget: keep every other map (the OOMs' stay), and take half as many from here.
        while self.map_blocks > MAP_BLOCKS && self.snapshots.len() > 1 {
            self.map_every *= 2;
            let (every, ooms) = (self.map_every, &self.ooms);
            self.snapshots
                .retain(|(op, _)| op.is_multiple_of(every) || ooms.iter().any(|o| o.0 == *op));
            self.map_blocks =
                self.snapshots.iter().flat_map(|(_, m)| m).map(|s| s.blocks.len()).sum();
            if every > i.max(1) {
                break;
            }
        }
        true
    }
}

/// The allocator's map after op `op`; the replay stops there.
struct MapAt {
    op: u64,
    map: Option<Vec<SnapshotSegment>>,
}

impl Observer for MapAt {
    fn on_op(&mut self, i: u64, _: &Op, _: &OpOutcome, a: &dyn Allocator, _: &dyn Device) -> bool {
        if i == self.op {
            self.map = Some(a.snapshot());
        }
        i < self.op
    }
}

pub fn run(args: &Args, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    if let Some(paths) = crate::job::paths(&args.trace, &args.more)? {
        return job_page::run(args, &paths, cx);
    }
    let out = args.out.clone().unwrap_or_else(|| default_out(&args.trace));
    crate::output::check_output(&out, &[&args.trace])?;
    // The page reads no recorded event but the device's (which the recorded device follows):
    // keeping every one would cost 40 bytes an entry.
    let read = allocsim_trace::ReadOptions { events: false, ..cx.read.clone() };
    let reading = crate::Context { read, ..cx.clone() };
    let trace = reading.trace(&args.trace)?;
    let title = args.trace.file_name().map_or("trace".into(), |n| n.to_string_lossy().into_owned());
    let advice = (args.run.policy == "pytorch" && !args.no_advice).then_some(args.run.device_total);
    let page = build(&trace, &title, &args.run.options(), advice, cx)
        .with_context(|| args.trace.display().to_string())?;
    crate::write_atomically(&out, page.as_bytes())?;
    let notes = vec![format!("wrote {} ({})", out.display(), bytes(page.len() as u64))];
    Ok(crate::Output { notes, ..crate::Output::default() })
}

/// The page of `trace` replayed under `opts`, titled `title`; with the settings ranked when
/// `advice` is given (the card's total memory, if set) and the trace has at most
/// [`ADVICE_MAX_OPS`] ops.
pub fn build(
    trace: &Trace,
    title: &str,
    opts: &allocsim_run::RunOptions,
    advice: Option<Option<u64>>,
    cx: &crate::Context,
) -> anyhow::Result<String> {
    let ops = trace.ops.len() as u64;
    let clock = Clock::new(trace);
    let mut collect = Collect::new(trace, &clock);
    let mut explainer = OomExplainer::default();
    let report = run_trace(
        trace,
        opts,
        &mut [&mut collect, &mut explainer],
        crate::input::progress_bar(cx, "report", ops),
    )
    .with_context(|| {
        format!("setting up the {} policy", allocsim_core::text::excerpt(&opts.policy))
    })?;
    if let Some(op) = collect.peak_missed {
        let mut at = MapAt { op, map: None };
        run_trace(trace, opts, &mut [&mut at], |_| {})?;
        collect.peak = at.map.map(|map| (op, map));
    }
    let advice_skipped = advice.is_some() && ops > ADVICE_MAX_OPS;
    let advice = match advice.filter(|_| !advice_skipped) {
        Some(device_total) => {
            let (outside, _) = crate::capacity_model::outside_bytes(None, trace);
            // Each setting's headroom over the bound, as `advise` shows it.
            let bound = allocsim_bound::bound_bytes(trace);
            Some((crate::capacity::advice(trace, outside, device_total)?, bound))
        }
        None => None,
    };
    let allocations = std::mem::replace(&mut collect.allocations, Allocations::new(trace, &clock));
    let mut timeline = allocations.into_json();
    timeline["steps"] = timeline::steps(&collect.reserved_steps, &clock);
    let data = json!({
        "title": title,
        "policy": report.policy,
        "alloc_conf": report.alloc_conf,
        "device": report.device,
        "device_total": report.device_total_bytes,
        "device_free": report.device_free_bytes,
        "ops": ops,
        "start_note": report.start.note(),
        "x": if clock.timed() { "time_us" } else { "op" },
        "timeline": timeline,
        "ooms": collect.ooms.iter().map(|&(op, size)| json!([op, size, clock.x(op)])).collect::<Vec<_>>(),
        "explained": explainer.explanations.iter().take(OOMS_EXPLAINED).map(|e| {
            json!({"op": e.op_index, "text": explain(trace, e)})
        }).collect::<Vec<_>>(),
        "empty_caches": collect.empty_caches.iter().map(|&op| json!([op, clock.x(op)])).collect::<Vec<_>>(),
        "map_every": collect.map_every,
        "snapshots": snapshots(&mut collect),
        "summary": memory_summary(&report.stats, 0),
        "advice_skipped": advice_skipped,
        "advice": advice.map(|(rows, bound)| rows.iter().map(|r| json!({
            "conf": conf_label(r.conf),
            "needs": r.capacity.capacity_bytes,
            "low": r.capacity.low_bytes,
            "high": r.capacity.high_bytes,
            "peak_reserved": r.peak_reserved,
            "ooms": r.ooms,
            "fragmentation": r.fragmentation,
            "headroom": r.peak_reserved as i64 - bound as i64,
        })).collect::<Vec<_>>()),
    });
    Ok(page(title, &data))
}

/// The `report_page` fuzz target's oracle (`allocsim_testgen::targets::report_page`):
/// the page of `trace`, read back. Its data element must hold no markup, parse, and carry
/// the title and every frame it shows as they were; the visible title must hold no markup
/// either.
pub fn page_reads_back(trace: &Trace, title: &str, policy: &str) -> Result<(), String> {
    let opts = allocsim_run::RunOptions { policy: policy.into(), ..Default::default() };
    let Ok(page) = build(trace, title, &opts, None, &crate::Context::default()) else {
        return Ok(());
    };
    let open = r#"<script type="application/json" id="data">"#;
    let start = page.find(open).ok_or("no data element")? + open.len();
    let len = page[start..].find("</script>").ok_or("the data element does not end")?;
    let text = &page[start..start + len];
    if let Some(at) = text.find(['<', '>', '&', '\u{2028}', '\u{2029}']) {
        return Err(format!("the data element holds {:?} at byte {at}", &text[at..at + 1]));
    }
    let data: Value = serde_json::from_str(text).map_err(|e| format!("the data: {e}"))?;
    if data["title"] != json!(title) {
        return Err(format!("the title {:?} reads back as {}", title, data["title"]));
    }
    let shown = page.split("<title>").nth(1).and_then(|t| t.split("</title>").next());
    if shown.is_none_or(|t| t.contains('<') || t.contains('>')) {
        return Err(format!("the <title> element is not plain text: {shown:?}"));
    }
    for frame in data["timeline"]["frames"].as_array().into_iter().flatten() {
        let frame = frame.as_str().ok_or_else(|| format!("frame {frame}"))?;
        let known = trace.stacks.iter().flat_map(|s| &s.frames);
        if !known.clone().any(|f| frame.contains(&f.name) && frame.contains(&f.filename)) {
            return Err(format!("frame {frame:?} of the page is no frame of the trace"));
        }
    }
    Ok(())
}

/// `TRACE.html` in the current directory, for `TRACE.pickle.gz` and the other formats.
pub fn default_out(trace: &std::path::Path) -> PathBuf {
    let stem = crate::input::trace_name(trace);
    let stem = stem.trim_start_matches("workload:").replace(['?', '&', '=', '/'], "_");
    PathBuf::from(format!("{stem}.html"))
}

/// A job's page: its first rank's [`default_out`] with `_job.html` (`ddp_rank0_job.html`).
pub fn default_job_out(first: &std::path::Path) -> PathBuf {
    let single = default_out(first);
    let stem = single.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    single.with_file_name(format!("{stem}_job.html"))
}

/// The kept segment maps, in op order: `list` holds `[op, label]` of each, `maps` its
/// segments as columns: per map `segments`; per segment `address` (as the change from the one
/// before), `size`, `kind` (its stream's index in `streams` times 2, 1 for the large pool) and
/// `blocks`; per block `gap` (from the end of the one before, or the segment's start), `bytes`
/// and `state` (0 allocated, 1 pending free, 2 cached free).
fn snapshots(c: &mut Collect) -> Value {
    let mut all = std::mem::take(&mut c.snapshots);
    let oom_ops: BTreeSet<u64> = c.ooms.iter().map(|&(op, _)| op).collect();
    let peak_op = c.peak.as_ref().map(|(op, _)| *op);
    if let Some(peak) = c.peak.take() {
        all.push(peak);
    }
    all.sort_by_key(|(op, _)| *op);
    all.dedup_by_key(|(op, _)| *op);
    let mut cols =
        Columns::with(&["segments", "address", "size", "kind", "blocks", "gap", "bytes", "state"]);
    let mut streams: Vec<u64> = Vec::new();
    let mut stream_index: HashMap<u64, u64> = HashMap::new();
    let mut list = Vec::new();
    let mut last_addr = 0u64;
    for (op, segments) in &all {
        let label = if Some(*op) == peak_op {
            "reserved peak"
        } else if oom_ops.contains(op) {
            "OOM"
        } else {
            ""
        };
        list.push(json!([op, label]));
        cols.col("segments").push(segments.len() as u64);
        for s in segments {
            cols.col("address").push_signed(s.address.wrapping_sub(last_addr) as i64);
            last_addr = s.address;
            cols.col("size").push(s.total_size);
            let stream = *stream_index.entry(s.stream.0).or_insert_with(|| {
                streams.push(s.stream.0);
                streams.len() as u64 - 1
            });
            cols.col("kind").push(stream * 2 + u64::from(s.pool == Pool::Large));
            cols.col("blocks").push(s.blocks.len() as u64);
            let mut end = s.address;
            for b in &s.blocks {
                cols.col("gap").push(b.address.saturating_sub(end));
                cols.col("bytes").push(b.size);
                end = b.address + b.size;
                let state = match b.state {
                    BlockState::ActiveAllocated => 0,
                    BlockState::ActivePendingFree => 1,
                    BlockState::Inactive => 2,
                };
                cols.col("state").push(state);
            }
        }
    }
    json!({"list": list, "maps": cols.to_json(), "streams": streams})
}

/// An OOM's explanation as `explain-oom` prints it.
fn explain(trace: &Trace, e: &OomExplanation) -> String {
    let mut out = String::new();
    crate::explain_oom::explanation_text(&mut out, trace, e);
    out.trim_start().to_string()
}

/// The page: the data as JSON in the page, the script and the embedded uPlot.
fn page(title: &str, data: &Value) -> String {
    let data = crate::html::json_in_script(data);
    let title = crate::html::escape(title);
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>allocsim report: {title}</title>
<style>{uplot_css}{css}</style></head>
<body data-status="loading">
<h1>allocsim report: {title}</h1>
<p id="about"></p>
<h2>Active memory timeline</h2>
<p class="hint">Each band is one allocation, stacked in allocation order as PyTorch's memory_viz
stacks them, over a grey band of those too small to draw at this zoom; the line above is reserved
memory. Drag along the time axis or scroll to zoom, drag up the memory axis to zoom into bytes,
Shift+scroll to pan, double-click to zoom out, hover for an allocation and its stack.</p>
<div id="timeline"></div><div id="tip"></div>
<p id="timeline-note" class="hint"></p>
<div id="marks"></div>
<h2>Segment map</h2>
<p class="hint">Each bar is a segment, drawn to scale: <span class="k a">allocated</span>
<span class="k p">freed, waiting for its stream</span> <span class="k f">cached free</span>.</p>
<div><input type="range" id="at" min="0" value="0"> <span id="at-label"></span></div>
<p class="hint" id="at-note"></p>
<canvas id="segments" width="1200" height="200"></canvas><div id="seg-tip" class="hint"></div>
<div id="advice"></div>
<h2>memory_summary</h2>
<pre id="summary"></pre>
<div id="oom-list"></div>
<script type="application/json" id="data">{data}</script>
<script>{common_js}</script>
<script>{uplot_js}</script>
<script>{report_js}</script>
</body></html>
"#,
        uplot_css = include_str!("../assets/uplot/uPlot.min.css"),
        css = include_str!("../assets/report.css"),
        uplot_js = include_str!("../assets/uplot/uPlot.iife.min.js"),
        common_js = include_str!("../assets/common.js"),
        report_js = include_str!("../assets/report.js"),
    )
}
