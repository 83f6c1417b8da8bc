//! `allocsim report JOB`: one self-contained page for a job of per-rank recordings. The job's
//! answer as `capacity` on the job gives it (each rank's need, the deciding rank, the spread,
//! where the deciding rank differs from the rank nearest the median: `per_rank`), each rank's
//! peaks as its recording replays, and the ranks' timelines one under the other, drawn by
//! `assets/timelines.js` as `diff --html` draws its two: one x axis, one scale of bytes, one
//! zoom. The x axis is the recordings' time when every rank has one, each rank placed by its
//! first entry's time against the job's first (the ranks' `time_us` are one host's wall
//! clock), and ops otherwise.
//!
//! Every string from a file (paths, settings, frames) is text: HTML made here goes through
//! [`escape`], the data through [`json_in_script`], and the script sets only `textContent`.

use super::timeline::Clock;
use crate::html::{escape, json_in_script, timeline_panel, timelines};
use crate::job::{Job, Spread};
use crate::output::bytes;
use allocsim_run::{run_trace, RunReport, StartedFrom};
use anyhow::Context as _;
use serde_json::{json, Value};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The deciding rank's reserved line, and the others'.
const DECIDING_COLOR: &str = "#d62728";
const RANK_COLOR: &str = "#1f77b4";

/// One rank's replay, as the page shows it.
struct RankRun {
    report: RunReport,
    clock: Clock,
}

impl RankRun {
    /// Ops the run laid out before the recorded ones (a what-if of a recording that starts
    /// mid-run): the engine's op indices count them, the recording's do not.
    fn laid_out_ops(&self) -> u64 {
        match self.report.start {
            StartedFrom::LaidOut { ops, .. } => ops,
            _ => 0,
        }
    }
}

pub(super) fn run(
    args: &super::Args,
    paths: &[PathBuf],
    cx: &crate::Context,
) -> anyhow::Result<crate::Output> {
    let out = args.out.clone().unwrap_or_else(|| super::default_job_out(&paths[0]));
    let inputs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    crate::output::check_output(&out, &inputs)?;
    // As for one trace's page: no recorded event but the device's is read.
    let read = allocsim_trace::ReadOptions { events: false, ..cx.read.clone() };
    let job = crate::job::load(paths, &crate::Context { read, ..cx.clone() })?;
    let needs = job.each(|r, cx| {
        let args = crate::capacity::Args {
            trace: r.path.clone(),
            more: Vec::new(),
            alloc_conf: args.run.alloc_conf.clone(),
            policy: args.run.policy.clone(),
            model: crate::capacity::ModelArgs { outside: None },
        };
        crate::capacity::run(&args, cx)
    })?;
    let answer = crate::per_rank::capacity(&job, needs)?.json.unwrap_or_default();
    let opts = args.run.options();
    let runs = job.each(|r, cx| {
        let trace = cx.trace(&r.path)?;
        let report = run_trace(&trace, &opts, &mut [], |_| {})
            .with_context(|| format!("{}: replaying the rank", r.path.display()))?;
        Ok(RankRun { report, clock: Clock::new(&trace) })
    })?;
    let page = page(&job, &answer, &runs);
    crate::write_atomically(&out, page.as_bytes())?;
    let notes = vec![format!("wrote {} ({})", out.display(), bytes(page.len() as u64))];
    Ok(crate::Output { notes, ..crate::Output::default() })
}

/// Each rank's panel: its timeline on the job's x axis.
fn panels(job: &Job, answer: &Value, runs: &[RankRun]) -> Value {
    let timed = runs.iter().all(|r| r.clock.timed());
    let first = runs.iter().filter_map(|r| r.clock.start_us()).min().unwrap_or(0);
    let deciding = answer["job"]["deciding_rank"].as_u64();
    let panels = (job.ranks.iter().zip(runs).zip(rows(answer)))
        .map(|((r, run), row)| {
            let m = &run.report.metrics;
            let decides = deciding == Some(u64::from(r.rank));
            let label = format!(
                "rank {} ({}): peak reserved {}, peak allocated {}, needs {}, {} OOMs{}",
                r.rank,
                crate::input::trace_name(&r.path),
                bytes(m.peak_reserved_bytes),
                bytes(m.peak_allocated_bytes),
                row["capacity_bytes"].as_u64().map_or("-".into(), bytes),
                m.ooms.len(),
                if decides { " (decides)" } else { "" }
            );
            let (offset, clock) = (run.laid_out_ops(), &run.clock);
            let shift = clock.start_us().map_or(0, |s| (s - first) as u64);
            let x = |op: u64| {
                let op = op.saturating_sub(offset);
                if timed {
                    clock.x(op) + shift
                } else {
                    op
                }
            };
            let color = if decides { DECIDING_COLOR } else { RANK_COLOR };
            timeline_panel(m, label, color, x)
        })
        .collect();
    let x_label = if timed { "time since the job's first entry (s)" } else { "op" };
    timelines(timed, x_label, panels)
}

/// The per-rank rows of `capacity`'s answer, in rank order.
fn rows(answer: &Value) -> impl Iterator<Item = &Value> {
    answer["ranks"].as_array().into_iter().flatten()
}

/// The table of ranks: peaks, need, OOMs; the deciding rank's row marked.
fn ranks_table(job: &Job, answer: &Value, runs: &[RankRun]) -> String {
    let deciding = answer["job"]["deciding_rank"].as_u64();
    let mut t = String::from(
        "<table id=\"ranks\"><tr><th>rank</th><th>trace</th><th>peak reserved</th><th>peak \
         allocated</th><th>needs free at start [band]</th><th>OOMs</th></tr>",
    );
    for ((r, run), row) in job.ranks.iter().zip(runs).zip(rows(answer)) {
        let m = &run.report.metrics;
        let at = |k: &str| row[k].as_u64();
        let need = match at("capacity_bytes") {
            Some(p) => format!(
                "{} [{}, {}]",
                bytes(p),
                at("capacity_low_bytes").map_or("-".into(), bytes),
                at("capacity_high_bytes").map_or("more than the device".into(), bytes)
            ),
            None => "does not fit".to_string(),
        };
        let decides = deciding == Some(u64::from(r.rank));
        let _ = write!(
            t,
            "<tr{}><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if decides { " class=\"deciding\"" } else { "" },
            r.rank,
            if decides { " (decides)" } else { "" },
            escape(&r.path.display().to_string()),
            escape(&bytes(m.peak_reserved_bytes)),
            escape(&bytes(m.peak_allocated_bytes)),
            escape(&need),
            m.ooms.len()
        );
    }
    t + "</table>"
}

/// The job's answer in words: which rank decides, what the job needs, how far the ranks
/// spread (in need and in peak reserved).
fn verdict(answer: &Value, runs: &[RankRun], job: &Job) -> String {
    let j = &answer["job"];
    let mut out = String::from("<p id=\"verdict\">");
    match (j["capacity_bytes"].as_u64(), j["deciding_rank"].as_u64()) {
        (Some(p), Some(d)) => {
            let band = format!(
                "[{}, {}]",
                j["capacity_low_bytes"].as_u64().map_or("-".into(), bytes),
                j["capacity_high_bytes"].as_u64().map_or("more than the device".into(), bytes)
            );
            let _ = write!(
                out,
                "<b>Rank {d} decides the card</b>: the job needs {} free at start on every \
                 rank's GPU (band {}); it fits when every rank fits.",
                escape(&bytes(p)),
                escape(&band)
            );
        }
        (_, d) => {
            let who = d.map_or("a rank".into(), |d| format!("rank {d}"));
            let _ = write!(out, "<b>The job does not fit</b>: {who} does not.");
        }
    }
    out.push_str("</p><p id=\"spread\">");
    let s = &j["spread"];
    if let (Some(top), Some(least), Some(b), Some(pc)) = (
        s["top_rank"].as_u64(),
        s["least_rank"].as_u64(),
        s["spread_bytes"].as_u64(),
        s["spread_percent"].as_f64(),
    ) {
        let _ = write!(
            out,
            "Spread of the need: rank {top} needs {} more than rank {least} (+{pc:.2} %). ",
            escape(&bytes(b))
        );
    }
    let peaks =
        job.ranks.iter().zip(runs).map(|(r, run)| (r.rank, run.report.metrics.peak_reserved_bytes));
    if let Some(s) = Spread::of(peaks) {
        let _ = write!(out, "Spread of peak reserved: {}.", escape(&s.text("holds")));
    }
    out + "</p>"
}

/// Where the deciding rank differs from the rank nearest the median (`per_rank`'s answer).
fn differs(answer: &Value) -> String {
    let d = &answer["job"]["differs"];
    let (Some(rank), Some(other)) = (d["rank"].as_u64(), d["against_rank"].as_u64()) else {
        return "<p>One rank, or no rank fits: no other rank to compare with.</p>".to_string();
    };
    let pc = |k: &str| d[k].as_f64().unwrap_or(0.0);
    let mut out = format!(
        "<h2>Where rank {rank} differs from rank {other}</h2><p>Rank {other} is the rank nearest \
         the median. Reserved peaks at op {} ({:.0} % into the run) and op {} ({:.0} %). The \
         allocations live at each one's peak, by stack, where rank {rank} holds most more:</p>",
        d["peak_reserved_op"].as_u64().unwrap_or(0),
        pc("peak_reserved_at_percent"),
        d["against_peak_reserved_op"].as_u64().unwrap_or(0),
        pc("against_peak_reserved_at_percent"),
    );
    let stacks = d["stacks"].as_array().map(Vec::as_slice).unwrap_or_default();
    if stacks.is_empty() {
        return out + &format!("<p>None: no stack holds more at rank {rank}'s peak.</p>");
    }
    let _ = write!(
        out,
        "<table id=\"differs\"><tr><th>more</th><th>rank {rank}</th><th>rank {other}</th>\
         <th>allocations</th><th>stack, innermost first</th></tr>"
    );
    for s in stacks {
        let size = |k: &str| escape(&s[k].as_u64().map_or("-".into(), bytes));
        let count = |k: &str| s[k].as_u64().unwrap_or(0);
        let frames: Vec<String> = (s["frames"].as_array().into_iter().flatten())
            .map(|f| escape(f.as_str().unwrap_or_default()))
            .collect();
        let _ = write!(
            out,
            "<tr><td>+{}</td><td>{}</td><td>{}</td><td>{} &rarr; {}</td><td class=\"frames\">{}\
             </td></tr>",
            size("more_bytes"),
            size("bytes"),
            size("against_bytes"),
            count("against_allocations"),
            count("allocations"),
            frames.join("<br>")
        );
    }
    out + "</table>"
}

/// The page's title: the job and its first and last ranks' names.
fn title(job: &Job) -> String {
    let name = |i: usize| crate::input::trace_name(&job.ranks[i].path);
    let names = match job.ranks.len() {
        0 => String::new(),
        1 => name(0),
        2 => format!("{}, {}", name(0), name(1)),
        n => format!("{} .. {}", name(0), name(n - 1)),
    };
    format!("allocsim report: {}: {names}", job.heading())
}

fn page(job: &Job, answer: &Value, runs: &[RankRun]) -> String {
    let data = json!({
        "job": answer["job"],
        "ranks": answer["ranks"],
        "timelines": panels(job, answer, runs),
    });
    let run = runs.first().map(|r| &r.report);
    let about = run.map_or(String::new(), |r| {
        format!(
            "<p>Each rank replayed under the <b>{}</b> policy ({}) on the {} device.</p>",
            escape(&r.policy),
            match r.alloc_conf.as_str() {
                "" => "default settings".to_string(),
                conf => format!("settings {}", escape(&allocsim_core::text::quoted(conf))),
            },
            r.device
        )
    });
    format!(
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>{uplot_css}{css}
td{{text-align:right;vertical-align:top}} td:nth-child(2){{text-align:left}} tr.deciding td{{font-weight:bold}}
td.frames{{text-align:left;font-family:monospace;font-size:11px}} .panel-title{{font-size:13px;margin:10px 0 2px}}</style></head>
<body data-status="loading">
<h1>{title}</h1>
{about}
{verdict}
{ranks}
<h2>Timelines</h2>
<p class="hint">Each rank's reserved memory (solid: the deciding rank red, the others blue),
allocated memory (dashed) and OOMs (magenta), one under the other on one axis of {x} and one
scale of bytes, so the rank that holds more is the taller. Drag or scroll to zoom, Shift+scroll
to pan: every rank follows; double-click to zoom out.</p>
<div id="timelines"></div>
{differs}
<script type="application/json" id="data">{data}</script>
<script>{common_js}</script>
<script>{uplot_js}</script>
<script>{timelines_js}</script>
</body></html>
"#,
        title = escape(&title(job)),
        verdict = verdict(answer, runs, job),
        ranks = ranks_table(job, answer, runs),
        x = if runs.iter().all(|r| r.clock.timed()) {
            "time (the ranks' recorded times, aligned on the job's first entry)"
        } else {
            "ops"
        },
        differs = differs(answer),
        data = json_in_script(&data),
        uplot_css = include_str!("../../assets/uplot/uPlot.min.css"),
        css = include_str!("../../assets/report.css"),
        uplot_js = include_str!("../../assets/uplot/uPlot.iife.min.js"),
        common_js = include_str!("../../assets/common.js"),
        timelines_js = crate::html::TIMELINES_JS,
    )
}
