//! The self-contained HTML report of `compare --html`: inline SVG, no scripts, no network.

use allocsim_core::{Allocator, BlockState, Device, Op, SnapshotSegment, Trace};
use allocsim_replay::{Observer, OpOutcome};
use allocsim_run::{run_trace, DeviceChoice, GridCell, RunOptions};
use std::fmt::Write;

const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];
const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 260.0;

/// Takes the allocator's snapshot after op `at` and stops the run.
struct SnapshotAt {
    at: u64,
    snapshot: Vec<SnapshotSegment>,
}

impl Observer for SnapshotAt {
    fn on_op(&mut self, op: u64, _: &Op, _: &OpOutcome, a: &dyn Allocator, _: &dyn Device) -> bool {
        if op == self.at {
            self.snapshot = a.snapshot();
            return false;
        }
        true
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn gib(n: u64) -> String {
    format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64)
}

/// Reserved bytes of every policy, and allocated bytes of the first, over the ops.
fn timeline(cells: &[&GridCell]) -> String {
    let max_op = cells.iter().map(|c| c.report.ops_run).max().unwrap_or(1).max(1) as f64;
    let max_bytes = cells
        .iter()
        .flat_map(|c| {
            c.report.metrics.timeline.iter().map(|p| p.reserved_bytes.max(p.allocated_bytes))
        })
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let x = |op: u64| 50.0 + (WIDTH - 60.0) * op as f64 / max_op;
    let y = |b: u64| HEIGHT - 25.0 - (HEIGHT - 40.0) * b as f64 / max_bytes;
    let mut svg = format!(
        r#"<svg width="{WIDTH}" height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg" font-size="11">"#
    );
    let _ = write!(
        svg,
        r#"<line x1="50" y1="{0}" x2="{1}" y2="{0}" stroke="black"/><line x1="50" y1="15" x2="50" y2="{0}" stroke="black"/><text x="52" y="12">{2}</text><text x="{3}" y="{4}">op {5}</text>"#,
        HEIGHT - 25.0,
        WIDTH - 10.0,
        gib(max_bytes as u64),
        WIDTH - 90.0,
        HEIGHT - 8.0,
        max_op as u64
    );
    let line = |points: &mut dyn Iterator<Item = (u64, u64)>, color: &str, dash: &str| {
        let pts: Vec<String> = points.map(|(op, b)| format!("{:.1},{:.1}", x(op), y(b))).collect();
        format!(
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" stroke-dasharray="{dash}" points="{}"/>"#,
            pts.join(" ")
        )
    };
    if let Some(first) = cells.first() {
        let mut pts = first.report.metrics.timeline.iter().map(|p| (p.op_index, p.allocated_bytes));
        svg += &line(&mut pts, "black", "4 2");
    }
    for (i, c) in cells.iter().enumerate() {
        let mut pts = c.report.metrics.timeline.iter().map(|p| (p.op_index, p.reserved_bytes));
        svg += &line(&mut pts, COLORS[i % COLORS.len()], "");
    }
    svg += "</svg>";
    let mut legend =
        String::from(r#"<p class="legend"><span style="color:black">- - allocated</span>"#);
    for (i, c) in cells.iter().enumerate() {
        let _ = write!(
            legend,
            r#" <span style="color:{}">&#9644; {} reserved</span>"#,
            COLORS[i % COLORS.len()],
            escape(&c.policy)
        );
    }
    legend + "</p>" + &svg
}

/// The segments at the peak of reserved memory, laid end to end in address order.
fn segment_map(segments: &[SnapshotSegment]) -> String {
    let total: u64 = segments.iter().map(|s| s.total_size).sum::<u64>().max(1);
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
            c.min_feasible_capacity_bytes.map_or("-".into(), gib),
            c.report.check.as_ref().map_or(0, |r| r.total_violations()),
        );
    }
    t + "</table>"
}

/// The whole report. Re-runs each cell up to its reserved peak to draw the segment map there.
pub fn report(
    traces: &[(String, Trace)],
    cells: &[GridCell],
    base: &RunOptions,
) -> anyhow::Result<String> {
    let mut html = String::from(
        r#"<!DOCTYPE html><html><head><meta charset="utf-8"><title>allocsim comparison</title><style>
body{font-family:sans-serif;margin:2em;max-width:1000px} table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right} td:first-child{text-align:left}
.legend span{margin-right:1em;font-size:13px} h3{margin-bottom:0.2em}</style></head><body>
<h1>allocsim: policy comparison</h1>
<p>Reserved memory per policy over the trace's ops (solid), allocated memory (dashed), the segment map at each policy's reserved peak (blue allocated, orange pending free, grey cached free; black marks segment ends), and the summary table.</p>"#,
    );
    for (name, trace) in traces {
        let row: Vec<&GridCell> = cells.iter().filter(|c| &c.trace == name).collect();
        let _ = write!(html, "<h2>{}</h2>{}", escape(name), timeline(&row));
        for c in &row {
            let opts = RunOptions {
                policy: c.policy.clone(),
                device: DeviceChoice::Sim,
                check: false,
                ..base.clone()
            };
            let mut at = SnapshotAt { at: c.report.metrics.peak_reserved_op, snapshot: Vec::new() };
            run_trace(trace, &opts, &mut [&mut at], |_| {})?;
            let _ = write!(
                html,
                "<h3>{} at its reserved peak ({}, op {})</h3>{}",
                escape(&c.policy),
                gib(c.report.metrics.peak_reserved_bytes),
                c.report.metrics.peak_reserved_op,
                segment_map(&at.snapshot)
            );
        }
        html += &table(&row);
    }
    html += "</body></html>\n";
    Ok(html)
}
