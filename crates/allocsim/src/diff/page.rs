//! `allocsim diff --html`: the diff as one self-contained page. The figures, segment maps,
//! stack groups and parting op are HTML made here (every string from a file through
//! [`escape`]); the two timelines are drawn by the embedded uPlot (`assets/timelines.js`, shared with a job's report) from the
//! data in a `<script type="application/json">` element ([`json_in_script`]).

use super::{change_text, frames_of, shape_text, Group, Side, FRAMES_SHOWN, NO_STACK, TOP_GROUPS};
use crate::html::{escape, json_in_script, segment_map_of, timeline_panel, timelines};
use crate::output::bytes;
use serde_json::{json, Value};
use std::fmt::Write;

/// A run's timeline and OOMs, as `timelines.js` draws them: A's reserved line red, B's green.
fn timeline(name: &str, color: &str, s: &Side) -> Value {
    let offset = s.laid_out_ops();
    let m = &s.report.metrics;
    let label = format!(
        "{name}: {}, {} (settings {}): peak reserved {}, {} OOMs",
        s.path.display(),
        s.report.policy,
        allocsim_core::text::quoted(&s.report.alloc_conf),
        bytes(m.peak_reserved_bytes),
        m.ooms.len()
    );
    timeline_panel(m, label, color, |op| op.saturating_sub(offset))
}

fn figures(a: &Side, b: &Side) -> String {
    let (ma, mb) = (&a.report.metrics, &b.report.metrics);
    let mut t = String::from("<table><tr><th></th><th>A</th><th>B</th><th>change</th></tr>");
    let mut row = |what: &str, x: String, y: String, change: String| {
        let _ = write!(
            t,
            "<tr><td>{what}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&x),
            escape(&y),
            escape(&change)
        );
    };
    let sizes = |x: u64, y: u64| (bytes(x), bytes(y), change_text(x, y));
    let (x, y, c) = sizes(ma.peak_reserved_bytes, mb.peak_reserved_bytes);
    row("peak reserved", x, y, c);
    let (x, y, c) = sizes(ma.peak_allocated_bytes, mb.peak_allocated_bytes);
    row("peak allocated", x, y, c);
    let percent = |f: f64| format!("{:.1} %", 100.0 * f);
    let (fa, fb) = (ma.fragmentation_at_peak, mb.fragmentation_at_peak);
    row(
        "fragmentation at peak",
        percent(fa),
        percent(fb),
        format!("{:+.1} points", 100.0 * (fb - fa)),
    );
    let (oa, ob) = (ma.ooms.len() as i64, mb.ooms.len() as i64);
    row("OOMs", oa.to_string(), ob.to_string(), format!("{:+}", ob - oa));
    if let (Some(ca), Some(cb)) = (&a.capacity, &b.capacity) {
        let shown = |c: Option<u64>| c.map_or("does not fit".to_string(), bytes);
        let change = match (ca.capacity_bytes, cb.capacity_bytes) {
            (Some(x), Some(y)) => change_text(x, y),
            _ => "-".to_string(),
        };
        row("needs free at start", shown(ca.capacity_bytes), shown(cb.capacity_bytes), change);
    }
    let segs = |s: &Side| {
        let total: u64 = s.at_peak.segments.iter().map(|g| g.total_size).sum();
        (s.at_peak.segments.len(), total)
    };
    let ((na, ba), (nb, bb)) = (segs(a), segs(b));
    let show = |n: usize, b: u64| format!("{n}, {}", bytes(b));
    row("segments at the peak", show(na, ba), show(nb, bb), change_text(ba, bb));
    t + "</table>"
}

fn segment_maps(a: &Side, b: &Side) -> String {
    let total = |s: &Side| s.at_peak.segments.iter().map(|g| g.total_size).sum::<u64>();
    let scale = total(a).max(total(b));
    let mut out = String::new();
    for (name, s) in [("A", a), ("B", b)] {
        let pools: Vec<String> = super::segments_by_pool(s)
            .into_iter()
            .map(|((id, kind), (n, size))| {
                let private = if id.0 == 0 && id.1 == 0 {
                    String::new()
                } else {
                    format!(" ({}, {})", id.0, id.1)
                };
                format!("{}{private}: {n}, {}", kind.replace('_', " "), bytes(size))
            })
            .collect();
        let _ = write!(
            out,
            "<h3>{name} at its reserved peak (op {}): {}</h3>{}",
            s.report.metrics.peak_reserved_op.saturating_sub(s.laid_out_ops()),
            escape(&pools.join("; ")),
            segment_map_of(&s.at_peak.segments, scale)
        );
    }
    out
}

fn frames_cell(frames: &[String]) -> String {
    if frames.is_empty() {
        return format!("<td class=\"frames\">{NO_STACK}</td>");
    }
    let lines: Vec<String> = frames.iter().take(FRAMES_SHOWN).map(|f| escape(f)).collect();
    format!("<td class=\"frames\">{}</td>", lines.join("<br>"))
}

fn groups_table(groups: &[Group]) -> String {
    if groups.is_empty() {
        return "<p>No stack group's live bytes at the peaks changed.</p>".to_string();
    }
    let mut t = format!(
        "<p>The {} of {} stack groups whose live bytes at the peaks changed most.</p><table \
         id=\"groups\"><tr><th>A</th><th>B</th><th>change</th><th>allocations</th><th>stack, \
         innermost first</th></tr>",
        groups.len().min(TOP_GROUPS),
        groups.len()
    );
    for g in groups.iter().take(TOP_GROUPS) {
        let _ = write!(
            t,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} &rarr; {}</td>{}</tr>",
            escape(&bytes(g.a.bytes)),
            escape(&bytes(g.b.bytes)),
            escape(&change_text(g.a.bytes, g.b.bytes)),
            g.a.allocations,
            g.b.allocations,
            frames_cell(&g.frames)
        );
    }
    t + "</table>"
}

fn parting(a: &Side, b: &Side, p: Option<&super::Parting>) -> String {
    let Some(p) = p else {
        return "<p>The two op streams are the same throughout.</p>".to_string();
    };
    let mut out = format!("<p id=\"parting\">The op streams part at op {}.</p><table>", p.op);
    for (name, s, shape) in [("A", a, &p.a), ("B", b, &p.b)] {
        let frames = if shape.is_some() { frames_of(s.trace, p.op) } else { Vec::new() };
        let cell = if shape.is_some() { frames_cell(&frames) } else { "<td></td>".to_string() };
        let _ =
            write!(out, "<tr><td>{name}</td><td>{}</td>{cell}</tr>", escape(&shape_text(shape)));
    }
    out + "</table>"
}

/// The page. `json` is the diff's JSON, carried whole in the page for anyone who reads it.
pub(super) fn page(
    a: &Side,
    b: &Side,
    groups: &[Group],
    parting_op: Option<&super::Parting>,
    json: &Value,
) -> String {
    let panels = vec![timeline("A", "#d62728", a), timeline("B", "#2ca02c", b)];
    let data = json!({ "diff": json, "timelines": timelines(false, "op", panels) });
    let side = |name: &str, s: &Side| {
        format!(
            "<p>{name}: <b>{}</b>, {} policy (settings {}) on the {} device, {} ops</p>",
            escape(&s.path.display().to_string()),
            escape(&s.report.policy),
            escape(&allocsim_core::text::quoted(&s.report.alloc_conf)),
            s.report.device,
            s.trace.ops.len()
        )
    };
    let title = format!(
        "allocsim diff: {} vs {}",
        crate::input::trace_name(a.path),
        crate::input::trace_name(b.path)
    );
    format!(
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>{uplot_css}
body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}} table{{border-collapse:collapse;font-size:13px;margin:0.5em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right;vertical-align:top}} td:first-child{{text-align:left}}
th:last-child{{text-align:left}} td.frames{{text-align:left;font-family:monospace;font-size:11px}} h3{{margin-bottom:0.2em;font-size:1em}}
.panel-title{{font-size:13px;margin:10px 0 2px}}</style></head>
<body data-status="loading">
<h1>{title}</h1>
{side_a}{side_b}
{figures}
<h2>Timelines</h2>
<p>Reserved memory (solid: A red, B green), allocated memory (dashed), OOMs (magenta), both on
one scale of bytes. Drag or scroll to zoom, Shift+scroll to pan (both panels follow),
double-click to zoom out.</p>
<div id="timelines"></div>
<h2>Segments at each peak</h2>
<p>Laid end to end in address order, both maps to one scale: blue allocated, orange pending
free, grey cached free; black marks segment ends.</p>
{maps}
<h2>Live bytes at the peaks by stack</h2>
{groups}
<h2>Where the op streams part</h2>
{parting}
<script type="application/json" id="data">{data}</script>
<script>{common_js}</script>
<script>{uplot_js}</script>
<script>{timelines_js}</script>
</body></html>
"#,
        title = escape(&title),
        side_a = side("A", a),
        side_b = side("B", b),
        figures = figures(a, b),
        maps = segment_maps(a, b),
        groups = groups_table(groups),
        parting = parting(a, b, parting_op),
        data = json_in_script(&data),
        uplot_css = include_str!("../../assets/uplot/uPlot.min.css"),
        uplot_js = include_str!("../../assets/uplot/uPlot.iife.min.js"),
        common_js = include_str!("../../assets/common.js"),
        timelines_js = crate::html::TIMELINES_JS,
    )
}
