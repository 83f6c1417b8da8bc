//! `allocsim report TRACE [-o report.html]`: one trace replayed and drawn as one self-contained
//! page (`report.js` draws it with the embedded uPlot; no network).
//!
//! What is drawn, and how it is cut down to what a browser draws at once:
//! - the active memory timeline, stacked per allocation as PyTorch's memory_viz stacks it
//!   (allocation order, a freed block's neighbours above move down), with reserved memory over
//!   it. The run is cut into at most [`COLUMNS`] columns; each column shows the state at the op
//!   where allocated memory peaks within it. The [`BANDS`] allocations that matter most (size
//!   times lifetime, in columns) are drawn one by one, the rest as one band, and the page says
//!   so;
//! - OOMs and `empty_cache` calls as marks; each of the first [`OOMS_EXPLAINED`] OOMs links to
//!   its explanation;
//! - the segment map after every op, or, when that would hold more than [`MAP_BLOCKS`] blocks,
//!   after every k-th op (k a power of two, doubled until it fits), at the reserved peak and at
//!   the first OOMs, chosen with a slider;
//! - the `memory_summary` table and, for the PyTorch policy, the `advise` table.

use crate::output::{bytes, conf_label, memory_summary};
use allocsim_core::{Allocator, BlockState, Device, Event, Op, SnapshotSegment, StartState, Trace};
use allocsim_replay::{Observer, OomExplainer, OomExplanation, OpOutcome};
use allocsim_run::run_trace;
use anyhow::Context;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

/// Columns of the timeline at most.
const COLUMNS: u64 = 3000;
/// Allocations drawn one by one at most.
const BANDS: usize = 600;
/// Blocks the kept segment maps may hold in all (about 20 bytes each in the page).
const MAP_BLOCKS: usize = 250_000;
/// OOMs explained on the page, each with its segment map, at most.
const OOMS_EXPLAINED: usize = 50;
/// The reserved peak's map is taken as the run goes while the maps taken for it hold at most
/// this many segments and blocks an op (plus a start): a run whose every op is a new peak
/// with thousands of segments (issue 50: one per stream) made the report quadratic. Past it,
/// the map of the last peak is taken by a second replay that stops there.
const PEAK_MAP_ITEMS_PER_OP: u64 = 64;
const PEAK_MAP_ITEMS_FREE: u64 = 1 << 20;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace (any format `replay` reads).
    pub trace: PathBuf,
    /// Where to write the page. Default: the trace's name with `.html`, in this directory.
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub run: crate::input::RunArgs,
    /// Leave out the table of settings (`allocsim advise`, about a second on a big trace).
    #[arg(long)]
    pub no_advice: bool,
}

/// One allocation's life: from the op of its `Alloc` to the op that freed it.
#[derive(Debug, Clone)]
struct Life {
    start: u64,
    /// The op of its `FreeRequested` (`u64::MAX`: alive at the end).
    end: u64,
    addr: u64,
    size: u64,
    stream: u64,
    pool: &'static str,
    /// It was alive before the recorded history began.
    before: bool,
}

/// One column of the timeline: the op where allocated memory peaked within it, and the most
/// reserved within it.
#[derive(Debug, Clone, Copy, Default)]
struct Column {
    op: u64,
    allocated: u64,
    reserved: u64,
}

/// Everything the page needs, collected in the one replay.
struct Collect {
    ops_per_column: u64,
    /// The segment map is kept after every `map_every`-th op.
    map_every: u64,
    map_blocks: usize,
    allocated: u64,
    reserved: u64,
    columns: Vec<Column>,
    lives: Vec<Life>,
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

impl Collect {
    fn new(ops: u64) -> Collect {
        Collect {
            ops_per_column: ops.div_ceil(COLUMNS).max(1),
            map_every: 1,
            map_blocks: 0,
            allocated: 0,
            reserved: 0,
            columns: Vec::new(),
            lives: Vec::new(),
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

impl Observer for Collect {
    fn on_start(&mut self, _: &StartState, allocator: &dyn Allocator) {
        let stats = allocator.stats();
        self.allocated = stats.allocated_bytes.all.current.max(0) as u64;
        self.reserved = stats.reserved_bytes.all.current.max(0) as u64;
        for seg in allocator.snapshot() {
            for b in seg.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated) {
                self.live.insert(b.address, self.lives.len());
                self.lives.push(Life {
                    start: 0,
                    end: u64::MAX,
                    addr: b.address,
                    size: b.size,
                    stream: seg.stream.0,
                    pool: seg.pool.stats_name(),
                    before: true,
                });
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
                self.allocated += size;
                self.live.insert(addr, self.lives.len());
                let pool = pool.stats_name();
                let life = Life {
                    start: op,
                    end: u64::MAX,
                    addr,
                    size,
                    stream: stream.0,
                    pool,
                    before: false,
                };
                self.lives.push(life);
            }
            Event::FreeRequested { addr, size, .. } => {
                self.allocated = self.allocated.saturating_sub(size);
                if let Some(i) = self.live.remove(&addr) {
                    self.lives[i].end = op;
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
        let c = (i / self.ops_per_column) as usize;
        if self.columns.len() <= c {
            self.columns.resize(c + 1, Column { op: i, ..Column::default() });
        }
        let column = &mut self.columns[c];
        if self.allocated >= column.allocated {
            (column.op, column.allocated) = (i, self.allocated);
        }
        column.reserved = column.reserved.max(self.reserved);
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
            if every > self.ops_per_column * COLUMNS {
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
    let out = args.out.clone().unwrap_or_else(|| default_out(&args.trace));
    crate::output::check_output(&out, &[&args.trace])?;
    let trace = cx.trace(&args.trace)?;
    let title = args.trace.file_name().map_or("trace".into(), |n| n.to_string_lossy().into_owned());
    let advice = (args.run.policy == "pytorch" && !args.no_advice).then_some(args.run.device_total);
    let page = build(&trace, &title, &args.run.options(), advice, cx)
        .with_context(|| args.trace.display().to_string())?;
    crate::write_atomically(&out, page.as_bytes())?;
    let notes = vec![format!("wrote {} ({})", out.display(), bytes(page.len() as u64))];
    Ok(crate::Output { notes, ..crate::Output::default() })
}

/// The page of `trace` replayed under `opts`, titled `title`; with the settings ranked when
/// `advice` is given (the card's total memory, if set).
pub fn build(
    trace: &Trace,
    title: &str,
    opts: &allocsim_run::RunOptions,
    advice: Option<Option<u64>>,
    cx: &crate::Context,
) -> anyhow::Result<String> {
    let ops = trace.ops.len() as u64;
    let mut collect = Collect::new(ops);
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
    let advice = match advice {
        Some(device_total) => {
            let (outside, _) = crate::capacity::outside_bytes(None, trace);
            // Each setting's headroom over the bound, as `advise` shows it.
            let bound = allocsim_bound::bound_bytes(trace);
            Some((crate::capacity::advice(trace, outside, device_total)?, bound))
        }
        None => None,
    };
    let data = json!({
        "title": title,
        "policy": report.policy,
        "alloc_conf": report.alloc_conf,
        "device": report.device,
        "device_total": report.device_total_bytes,
        "device_free": report.device_free_bytes,
        "ops": ops,
        "start_note": report.start.note(),
        "timeline": timeline(&collect, trace),
        "ooms": collect.ooms.iter().map(|&(op, size)| json!([op, size])).collect::<Vec<_>>(),
        "explained": explainer.explanations.iter().take(OOMS_EXPLAINED).map(|e| {
            json!({"op": e.op_index, "text": explain(trace, e)})
        }).collect::<Vec<_>>(),
        "empty_caches": collect.empty_caches,
        "map_every": collect.map_every,
        "snapshots": snapshots(&mut collect),
        "summary": memory_summary(&report.stats, 0),
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
/// the title and every frame of every stack it draws as they were; the visible title must
/// hold no markup either.
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
    for (i, frames) in data["timeline"]["frames"].as_array().into_iter().flatten().enumerate() {
        for frame in frames.as_array().into_iter().flatten() {
            let frame = frame.as_str().ok_or_else(|| format!("frame of stack {i}: {frame}"))?;
            let known = trace.stacks.iter().flat_map(|s| &s.frames);
            if !known.clone().any(|f| frame.contains(&f.name) && frame.contains(&f.filename)) {
                return Err(format!("frame {frame:?} of the page is no frame of the trace"));
            }
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

/// The columns, the allocations drawn one by one, the rest as one band, and their stacks.
fn timeline(c: &Collect, trace: &Trace) -> Value {
    let columns = &c.columns;
    let n = columns.len();
    // The column where each life starts and ends (a life is drawn in the columns whose op
    // falls within it).
    let column_of = |op: u64| columns.partition_point(|col| col.op < op);
    let weight = |l: &Life| {
        let span = column_of(l.end.min(u64::MAX - 1)).min(n) - column_of(l.start).min(n);
        l.size as f64 * span.max(1) as f64
    };
    let mut order: Vec<usize> = (0..c.lives.len()).collect();
    order.sort_by(|&a, &b| weight(&c.lives[b]).total_cmp(&weight(&c.lives[a])).then(a.cmp(&b)));
    order.truncate(BANDS);
    order.sort_unstable();
    // What the drawn bands leave of each column's allocated memory is the "other" band.
    let mut drawn = vec![0i64; n + 1];
    for &i in &order {
        let l = &c.lives[i];
        let (a, b) = (column_of(l.start), column_of(l.end).min(n));
        if a < b {
            drawn[a] += l.size as i64;
            drawn[b] -= l.size as i64;
        }
    }
    let mut sum = 0i64;
    let other: Vec<u64> = columns
        .iter()
        .enumerate()
        .map(|(k, col)| {
            sum += drawn[k];
            col.allocated.saturating_sub(sum.max(0) as u64)
        })
        .collect();
    let mut stacks: Vec<u32> = Vec::new();
    let mut stack_index: HashMap<u32, usize> = HashMap::new();
    let bands: Vec<Value> = order
        .iter()
        .map(|&i| {
            let l = &c.lives[i];
            let stack = (!l.before)
                .then(|| trace.op_stacks.binary_search_by_key(&l.start, |&(o, _)| o).ok())
                .flatten()
                .map(|k| trace.op_stacks[k].1)
                .map(|s| {
                    *stack_index.entry(s).or_insert_with(|| {
                        stacks.push(s);
                        stacks.len() - 1
                    })
                });
            let end = (l.end != u64::MAX).then_some(l.end);
            // What the snapshot said of the allocation besides its stack (`torch.compile`'s
            // context, user metadata), when not PyTorch's defaults.
            let note = (!l.before)
                .then(|| trace.op_annotations.binary_search_by_key(&l.start, |&(o, _)| o).ok())
                .flatten()
                .map(|k| &trace.annotations[trace.op_annotations[k].1 as usize])
                .map(|a| [&a.compile_context, &a.user_metadata]);
            json!([l.start, end, l.size, l.addr, l.stream, l.pool, stack, l.before, note])
        })
        .collect();
    let frames: Vec<Vec<String>> = stacks
        .iter()
        .map(|&s| {
            let frames = &trace.stacks[s as usize].frames;
            frames
                .iter()
                .take(12)
                .map(|f| format!("{} ({}:{})", f.name, f.filename, f.line))
                .collect()
        })
        .collect();
    // When each column's op was recorded, in µs since the first recorded op (snapshots only).
    let first = trace.op_times.first().map(|&(_, t)| t);
    let time = |op: u64| {
        let i = trace.op_times.partition_point(|&(o, _)| o < op);
        trace.op_times.get(i).filter(|&&(o, _)| o == op).and_then(|&(_, t)| Some(t - first?))
    };
    json!({
        "ops_per_column": c.ops_per_column,
        "time_us": columns.iter().map(|c| time(c.op)).collect::<Vec<_>>(),
        "op": columns.iter().map(|c| c.op).collect::<Vec<_>>(),
        "allocated": columns.iter().map(|c| c.allocated).collect::<Vec<_>>(),
        "reserved": columns.iter().map(|c| c.reserved).collect::<Vec<_>>(),
        "other": other,
        "bands": bands,
        "allocations": c.lives.len(),
        "frames": frames,
    })
}

/// The kept segment maps, in op order: `[op, label, segments]`, each segment
/// `[address, size, stream, pool, [[offset, size, state], ...]]` with state 0 allocated, 1
/// pending free, 2 cached free.
fn snapshots(c: &mut Collect) -> Value {
    let mut all = std::mem::take(&mut c.snapshots);
    let oom_ops: BTreeSet<u64> = c.ooms.iter().map(|&(op, _)| op).collect();
    let peak_op = c.peak.as_ref().map(|(op, _)| *op);
    if let Some(peak) = c.peak.take() {
        all.push(peak);
    }
    all.sort_by_key(|(op, _)| *op);
    all.dedup_by_key(|(op, _)| *op);
    let maps: Vec<Value> = all
        .iter()
        .map(|(op, segments)| {
            let label = if Some(*op) == peak_op {
                "reserved peak"
            } else if oom_ops.contains(op) {
                "OOM"
            } else {
                ""
            };
            let segs: Vec<Value> = segments
                .iter()
                .map(|s| {
                    let blocks: Vec<[u64; 3]> = s
                        .blocks
                        .iter()
                        .map(|b| {
                            let state = match b.state {
                                BlockState::ActiveAllocated => 0,
                                BlockState::ActivePendingFree => 1,
                                BlockState::Inactive => 2,
                            };
                            [b.address - s.address, b.size, state]
                        })
                        .collect();
                    json!([s.address, s.total_size, s.stream.0, s.pool.stats_name(), blocks])
                })
                .collect();
            json!([op, label, segs])
        })
        .collect();
    Value::Array(maps)
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
stacks them; the line above is reserved memory. Drag or scroll to zoom, Shift+scroll to pan,
double-click to zoom out, hover for an allocation.</p>
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
