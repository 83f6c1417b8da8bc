//! The self-contained HTML report of `compare --html`: per trace, one timeline panel per column
//! (each on its own scale, so that no flat line squashes the others), drawn by the embedded
//! uPlot (`assets/compare.js`); the segment map at each column's reserved peak (inline SVG); the
//! table. Nothing is fetched.

use allocsim_core::{BlockState, SnapshotSegment, Trace};
use allocsim_replay::StateAt;
use allocsim_run::{run_trace, DeviceChoice, GridCell, RunOptions};
use std::fmt::Write;

const WIDTH: f64 = 960.0;

/// Text as HTML, safe as an element's text and inside a quoted attribute.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `data` as the text of a `<script type="application/json">` element: `<`, `>` and `&` as
/// JSON escapes (`\u003c`...), so that no string in it (`</script>`, `<!--<script>`, which
/// would keep the element open to the page's end) is markup to the HTML parser, and U+2028
/// and U+2029 too, which some JavaScript parsers take as line ends. Outside strings JSON has
/// none of these characters, so the text still parses to the same value.
pub fn json_in_script(data: &serde_json::Value) -> String {
    let text = data.to_string();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// One panel of `assets/timelines.js` (timelines one under the other, on one x range and one
/// scale of bytes, zoomed together): a run's sampled timeline and its OOMs, each op drawn at
/// `x(op)` (the op itself, or its time), under `label`, reserved memory in `color`.
pub fn timeline_panel(
    m: &allocsim_replay::MetricsReport,
    label: String,
    color: &str,
    x: impl Fn(u64) -> u64,
) -> serde_json::Value {
    serde_json::json!({
        "label": label,
        "color": color,
        "x": m.timeline.iter().map(|p| x(p.op_index)).collect::<Vec<_>>(),
        "allocated": m.timeline.iter().map(|p| p.allocated_bytes).collect::<Vec<_>>(),
        "reserved": m.timeline.iter().map(|p| p.reserved_bytes).collect::<Vec<_>>(),
        "ooms": m.ooms.iter().map(|o| x(o.op_index)).collect::<Vec<_>>(),
    })
}

/// The data `assets/timelines.js` draws: the panels, and whether their x is the op or the
/// time in µs (`time_us`).
pub fn timelines(timed: bool, x_label: &str, panels: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({ "x": if timed { "time_us" } else { "op" }, "x_label": x_label, "panels": panels })
}

/// The script that draws [`timelines`]' data into the page's `<div id="timelines">`.
pub const TIMELINES_JS: &str = include_str!("../assets/timelines.js");

fn gib(n: u64) -> String {
    format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64)
}

/// The segments at the peak of reserved memory, laid end to end in address order.
fn segment_map(segments: &[SnapshotSegment]) -> String {
    segment_map_of(segments, segments.iter().map(|s| s.total_size).sum())
}

/// [`segment_map`] with the whole width standing for `total` bytes (at least the segments'):
/// two maps drawn to one scale.
pub fn segment_map_of(segments: &[SnapshotSegment], total: u64) -> String {
    let total = total.max(segments.iter().map(|s| s.total_size).sum::<u64>()).max(1);
    let mut svg =
        format!(r#"<svg width="{WIDTH}" height="28" xmlns="http://www.w3.org/2000/svg">"#);
    let mut offset = 0u64;
    let scale = WIDTH / total as f64;
    for seg in segments {
        for b in &seg.blocks {
            let color = match b.state {
                BlockState::ActiveAllocated => "#1f77b4",
                BlockState::ActivePendingFree => "#ff7f0e",
                BlockState::Inactive => "#dddddd",
            };
            let _ = write!(
                svg,
                r#"<rect x="{:.2}" y="2" width="{:.2}" height="20" fill="{color}"/>"#,
                offset as f64 * scale,
                (b.size as f64 * scale).max(0.3)
            );
            offset += b.size;
        }
        let _ = write!(
            svg,
            r#"<rect x="{:.2}" y="0" width="0.6" height="24" fill="black"/>"#,
            offset as f64 * scale
        );
    }
    svg + "</svg>"
}

fn table(cells: &[&GridCell]) -> String {
    let mut t = String::from(
        "<table><tr><th>policy</th><th>peak allocated</th><th>peak reserved</th><th>fragmentation at peak</th><th>OOMs</th><th>device calls</th><th>simulated call time</th><th>min feasible capacity</th><th>checker violations</th></tr>",
    );
    for c in cells {
        let m = &c.report.metrics;
        let _ = write!(
            t,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.2}%</td><td>{}</td><td>{}</td><td>{:.1} ms</td><td>{}</td><td>{}</td></tr>",
            escape(&c.policy),
            gib(m.peak_allocated_bytes),
            gib(m.peak_reserved_bytes),
            100.0 * m.fragmentation_at_peak,
            m.ooms.len(),
            c.report.device_calls.total_calls(),
            c.report.device_calls.total_time_ns() as f64 / 1e6,
            c.min_feasible_capacity_bytes.map_or_else(|| no_capacity(c), gib),
            c.report.check.as_ref().map_or(0, |r| r.total_violations()),
        );
    }
    t + "</table>"
}

/// What the table says of a cell without a feasible capacity.
fn no_capacity(c: &GridCell) -> String {
    format!("none: OOMs even on {}", gib(c.report.device_free_bytes))
}

/// One panel's data: the column's timeline, its OOMs, and what its header says.
fn panel(c: &GridCell) -> serde_json::Value {
    let m = &c.report.metrics;
    let capacity = match c.min_feasible_capacity_bytes {
        Some(b) => format!("needs {}", gib(b)),
        None if m.ooms.is_empty() => "capacity not bisected".to_string(),
        None => format!(
            "no feasible capacity: it runs out of memory even with all {} free",
            gib(c.report.device_free_bytes)
        ),
    };
    serde_json::json!({
        "policy": c.policy,
        "device": c.report.device,
        "op": m.timeline.iter().map(|p| p.op_index).collect::<Vec<_>>(),
        "allocated": m.timeline.iter().map(|p| p.allocated_bytes).collect::<Vec<_>>(),
        "reserved": m.timeline.iter().map(|p| p.reserved_bytes).collect::<Vec<_>>(),
        "ooms": m.ooms.iter().map(|o| o.op_index).collect::<Vec<_>>(),
        "about": format!(
            "peak reserved {}, {}, {}",
            gib(m.peak_reserved_bytes),
            crate::output::counted(m.ooms.len() as u64, "OOM", "OOMs"),
            capacity
        ),
    })
}

/// The policy at `c`'s column, run as the grid ran it, up to its reserved peak: the segments.
fn segments_at_peak(trace: &Trace, c: &GridCell, base: &RunOptions) -> anyhow::Result<String> {
    let device =
        if c.report.device == "recorded" { DeviceChoice::Recorded } else { DeviceChoice::Sim };
    let opts = RunOptions { device, check: false, ..allocsim_run::column_options(&c.policy, base) };
    let mut at = StateAt::new(c.report.metrics.peak_reserved_op);
    run_trace(trace, &opts, &mut [&mut at], |_| {})?;
    Ok(segment_map(&at.state.unwrap_or_default().segments))
}

/// The whole report. Re-runs each cell up to its reserved peak to draw the segment map there.
pub fn report(
    traces: &[(String, std::borrow::Cow<'_, Trace>)],
    cells: &[GridCell],
    base: &RunOptions,
) -> anyhow::Result<String> {
    let mut body = String::new();
    let mut data = Vec::new();
    for (t, (name, trace)) in traces.iter().enumerate() {
        let row: Vec<&GridCell> = cells.iter().filter(|c| &c.trace == name).collect();
        let _ =
            write!(body, r#"<h2>{}</h2><div class="panels" id="trace-{t}"></div>"#, escape(name));
        for c in &row {
            let _ = write!(
                body,
                "<h3>{} at its reserved peak ({}, op {})</h3>{}",
                escape(&c.policy),
                gib(c.report.metrics.peak_reserved_bytes),
                c.report.metrics.peak_reserved_op,
                segments_at_peak(trace, c, base)?
            );
        }
        body += &table(&row);
        if row
            .iter()
            .any(|c| c.min_feasible_capacity_bytes.is_none() && !c.report.metrics.ooms.is_empty())
        {
            body +=
                "<p class=\"note\">A column without a feasible capacity runs out of memory even \
                     with all of the trace's device free: no card of that size runs it under that \
                     column.</p>";
        }
        data.push(
            serde_json::json!({ "panels": row.iter().map(|c| panel(c)).collect::<Vec<_>>() }),
        );
    }
    let data = json_in_script(&serde_json::Value::Array(data));
    Ok(format!(
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>allocsim comparison</title>
<style>{uplot_css}
body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} td:first-child{{text-align:left}}
h3{{margin-bottom:0.2em;font-size:1em}} .panel-title{{font-size:13px;margin:10px 0 2px}} .note{{color:#555}}</style></head>
<body data-status="loading">
<h1>allocsim: comparison</h1>
<p>Per trace, one panel per column, each on its own scale: reserved memory (solid), allocated
memory (dashed), OOMs (magenta). Drag to zoom a panel, double-click to zoom out. Then the segment
map at each column's reserved peak (blue allocated, orange pending free, grey cached free; black
marks segment ends), and the table.</p>
{body}
<script type="application/json" id="data">{data}</script>
<script>{common_js}</script>
<script>{uplot_js}</script>
<script>{compare_js}</script>
</body></html>
"#,
        uplot_css = include_str!("../assets/uplot/uPlot.min.css"),
        uplot_js = include_str!("../assets/uplot/uPlot.iife.min.js"),
        common_js = include_str!("../assets/common.js"),
        compare_js = include_str!("../assets/compare.js"),
    ))
}

#[cfg(test)]
mod tests {
    use super::{escape, json_in_script};

    #[test]
    fn strings_are_inert_in_the_script_element_and_in_text() {
        let hostile = "<!--<script></script>&\"'\u{2028}\u{2029}";
        let data = serde_json::json!({ "name": hostile, "frames": [hostile] });
        let text = json_in_script(&data);
        assert!(!text.contains(['<', '>', '&', '\u{2028}', '\u{2029}']), "{text}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), data);
        assert_eq!(
            escape(hostile),
            "&lt;!--&lt;script&gt;&lt;/script&gt;&amp;&quot;&#39;\u{2028}\u{2029}"
        );
    }
}
