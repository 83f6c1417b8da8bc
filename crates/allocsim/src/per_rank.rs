//! The commands on a [`Job`]: each rank answered as the single-trace command answers it (the
//! command runs itself on every rank, [`Job::each`], and hands the outputs here), and the
//! job's answer over them (which rank decides, the spread between the ranks).

use crate::job::{indented, Job, Spread};
use crate::output::{bytes, outln};
use serde_json::{json, Value};

/// Each rank's output with the rank's row merged into its JSON.
fn each(job: &Job, outs: Vec<crate::Output>) -> Vec<(crate::Output, Value)> {
    outs.into_iter()
        .enumerate()
        .map(|(i, o)| {
            let mut j = job.rank_json(i);
            if let (Some(Value::Object(from)), Value::Object(to)) = (&o.json, &mut j) {
                for (k, v) in from {
                    to.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            (o, j)
        })
        .collect()
}

/// The title and each rank's text, indented under `rank N (path)`.
fn ranks_text(command: &str, job: &Job, outs: &[(crate::Output, Value)]) -> String {
    let mut out = String::new();
    outln!(out, "allocsim {command}: {}", job.heading());
    for (r, (o, _)) in job.ranks.iter().zip(outs) {
        outln!(out, "rank {} ({}, numbered by {})", r.rank, r.path.display(), r.numbered_by);
        out.push_str(&indented(&o.text));
    }
    out
}

fn u64_at(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

/// `allocsim capacity` on a job: the job fits when every rank fits, so the rank that needs the
/// most free memory decides; the job's point is the largest of the ranks' points and its band
/// runs from the largest low to the largest high.
pub fn capacity(job: &Job, outs: Vec<crate::Output>) -> anyhow::Result<crate::Output> {
    let outs = each(job, outs);
    let rows: Vec<&Value> = outs.iter().map(|(_, j)| j).collect();
    let rank_of = |j: &Value| u64_at(j, "rank").unwrap_or(0) as u32;
    let points: Vec<(u32, Option<u64>)> =
        rows.iter().map(|j| (rank_of(j), u64_at(j, "capacity_bytes"))).collect();
    let unfit = points.iter().find(|(_, p)| p.is_none()).map(|(r, _)| *r);
    let spread = Spread::of(points.iter().filter_map(|&(r, p)| Some((r, p?))));
    let fits = unfit.is_none();
    let deciding = unfit.or(spread.map(|s| s.top_rank));
    let point = spread.filter(|_| fits).map(|s| s.top_bytes);
    let low = fits.then(|| rows.iter().filter_map(|j| u64_at(j, "capacity_low_bytes")).max());
    let high = rows.iter().map(|j| u64_at(j, "capacity_high_bytes")).collect::<Option<Vec<_>>>();
    let high = high.filter(|_| fits).and_then(|h| h.into_iter().max());
    let mut job_json = json!({
        "ranks": job.ranks.len(),
        "world_size": job.world_size,
        "fits": fits,
        "deciding_rank": deciding,
        "capacity_bytes": point,
        "capacity_low_bytes": low.flatten(),
        "capacity_high_bytes": high,
        "spread": spread.map(|s| s.json()),
        "spread_bytes": spread.map(|s| s.bytes()),
        "spread_percent": spread.map(|s| s.percent()),
    });
    let mut text = ranks_text("capacity", job, &outs);
    match (point, deciding) {
        (Some(p), Some(d)) => {
            outln!(
                text,
                "job: needs free at start on every rank's GPU: {} (rank {d} decides)",
                bytes(p)
            );
            outln!(
                text,
                "  band: [{}, {}]",
                low.flatten().map_or("-".into(), bytes),
                high.map_or("more than the device".into(), bytes)
            );
        }
        (_, d) => {
            let d = d.map_or("a rank".into(), |d| format!("rank {d}"));
            outln!(text, "job: does not fit: {d} does not (the job fits when every rank fits)");
        }
    }
    if let Some(s) = spread.filter(|s| s.top_rank != s.least_rank) {
        outln!(text, "  spread: {}", s.text("needs"));
    }
    outln!(text, "  (the job fits when every rank fits: the rank needing the most decides)");
    let fitting: Vec<(u32, u64)> = points.iter().filter_map(|&(r, p)| Some((r, p?))).collect();
    if let Some((j, t)) = deciding.map(|d| differs(job, d, &fitting)).transpose()?.flatten() {
        text.push_str(&t);
        job_json["differs"] = j;
    }
    let ranks: Vec<Value> = outs.into_iter().map(|(_, j)| j).collect();
    Ok(crate::Output::both(json!({ "job": job_json, "ranks": ranks }), text))
}

/// The peaks of each rank's rows (`peak_reserved_bytes`), and the line and JSON that say which
/// rank holds the most and how far the ranks spread.
fn peaks(rows: &[Value]) -> (Option<Spread>, Option<Spread>) {
    let of = |key: &str| {
        Spread::of(rows.iter().filter_map(|j| Some((u64_at(j, "rank")? as u32, u64_at(j, key)?))))
    };
    (of("peak_reserved_bytes"), of("peak_allocated_bytes"))
}

fn peaks_json(job_json: &mut Value, rows: &[Value]) {
    let (reserved, allocated) = peaks(rows);
    job_json["highest_peak_reserved_rank"] = json!(reserved.map(|s| s.top_rank));
    job_json["peak_reserved"] = json!(reserved.map(|s| s.json()));
    job_json["peak_allocated"] = json!(allocated.map(|s| s.json()));
}

fn peaks_text(text: &mut String, rows: &[Value]) {
    let (reserved, allocated) = peaks(rows);
    for j in rows {
        let (r, a) = (u64_at(j, "peak_reserved_bytes"), u64_at(j, "peak_allocated_bytes"));
        if let (Some(rank), Some(r), Some(a)) = (u64_at(j, "rank"), r, a) {
            outln!(text, "  rank {rank}: peak reserved {}, peak allocated {}", bytes(r), bytes(a));
        }
    }
    if let Some(s) = reserved {
        outln!(text, "  highest peak reserved: rank {} ({})", s.top_rank, bytes(s.top_bytes));
        outln!(text, "  spread of peak reserved: {}", s.text("holds"));
    }
    if let Some(s) = allocated {
        outln!(text, "  spread of peak allocated: {}", s.text("holds"));
    }
}

/// `allocsim info` on a job: each rank's summary and its peaks (the recording replayed as it
/// was made), the rank with the highest peak reserved, and the spread.
pub fn info(job: &Job, outs: Vec<crate::Output>) -> anyhow::Result<crate::Output> {
    let outs = each(job, outs);
    let rows: Vec<Value> = outs.iter().map(|(_, j)| j.clone()).collect();
    let mut job_json = json!({ "ranks": job.ranks.len(), "world_size": job.world_size });
    peaks_json(&mut job_json, &rows);
    let mut text = ranks_text("info", job, &outs);
    outln!(text, "job: {} (peaks as the recordings replay)", job.heading());
    peaks_text(&mut text, &rows);
    let reserved: Vec<(u32, u64)> = (rows.iter())
        .filter_map(|j| Some((u64_at(j, "rank")? as u32, u64_at(j, "peak_reserved_bytes")?)))
        .collect();
    let top = peaks(&rows).0.map(|s| s.top_rank);
    if let Some((j, t)) = top.map(|top| differs(job, top, &reserved)).transpose()?.flatten() {
        text.push_str(&t);
        job_json["differs"] = j;
    }
    Ok(crate::Output::both(json!({ "job": job_json, "ranks": rows }), text))
}

/// `allocsim replay` on a job: each rank's replay, the rank with the highest peak reserved,
/// the spread, and whether every rank's statistics match its recording.
pub fn replay(job: &Job, outs: Vec<crate::Output>) -> anyhow::Result<crate::Output> {
    let outs = each(job, outs);
    let rows: Vec<Value> = outs.iter().map(|(_, j)| j.clone()).collect();
    let matches: Vec<Option<bool>> =
        rows.iter().map(|j| j.get("recorded_stats_match").and_then(Value::as_bool)).collect();
    let exact =
        matches.iter().all(Option::is_some).then(|| matches.iter().all(|m| *m == Some(true)));
    let mut job_json = json!({
        "ranks": job.ranks.len(),
        "world_size": job.world_size,
        "recorded_stats_match": exact,
    });
    peaks_json(&mut job_json, &rows);
    let mut text = ranks_text("replay", job, &outs);
    outln!(text, "job: {}", job.heading());
    peaks_text(&mut text, &rows);
    match exact {
        Some(true) => outln!(text, "  every rank's memory_stats match its recording"),
        Some(false) => outln!(text, "  some rank's memory_stats differ from its recording"),
        None => {}
    }
    let failed = outs.iter().any(|(o, _)| o.failed);
    Ok(crate::Output {
        failed,
        ..crate::Output::both(json!({ "job": job_json, "ranks": rows }), text)
    })
}

/// `allocsim fidelity` on a job: each rank exact or not; the job is exact when every rank is.
pub fn fidelity(job: &Job, outs: Vec<crate::Output>) -> anyhow::Result<crate::Output> {
    let outs = each(job, outs);
    let mut text = ranks_text("fidelity", job, &outs);
    let exact: Vec<u32> =
        job.ranks.iter().zip(&outs).filter(|(_, (o, _))| !o.failed).map(|(r, _)| r.rank).collect();
    let all = exact.len() == job.ranks.len();
    outln!(text, "job: {} of {} ranks exact", exact.len(), job.ranks.len());
    outln!(text, "{}", if all { "exact" } else { "not exact" });
    Ok(crate::Output { failed: !all, ..crate::Output::text(text) })
}

/// Stack groups shown where the deciding rank differs.
const STACKS_SHOWN: usize = 5;

/// Where rank `top` differs from the others: against the rank whose `values` figure is
/// closest to the ranks' median (the most ordinary one), each run's reserved peak (the op,
/// and how far into the run) and the allocations, grouped by stack, whose live bytes at
/// `top`'s peak exceed those at the other's peak most (`allocsim diff` of the two).
fn differs(job: &Job, top: u32, values: &[(u32, u64)]) -> anyhow::Result<Option<(Value, String)>> {
    let mut sorted: Vec<u64> = values.iter().map(|v| v.1).collect();
    sorted.sort_unstable();
    let Some(&median) = sorted.get(sorted.len() / 2) else { return Ok(None) };
    let other = (values.iter().filter(|v| v.0 != top))
        .min_by_key(|v| (v.1.abs_diff(median), v.0))
        .map(|v| v.0);
    let (Some(other), Some(t)) = (other, job.ranks.iter().find(|r| r.rank == top)) else {
        return Ok(None);
    };
    let Some(o) = job.ranks.iter().find(|r| r.rank == other) else { return Ok(None) };
    let (t_trace, o_trace) = (job.cx.trace(&t.path)?, job.cx.trace(&o.path)?);
    let opts = allocsim_run::RunOptions {
        policy: "pytorch".to_string(),
        ..allocsim_run::RunOptions::default()
    };
    let (a, b) = rayon::join(
        || crate::diff::side(&o.path, &o_trace, &opts, false),
        || crate::diff::side(&t.path, &t_trace, &opts, false),
    );
    let (a, b) = (a?, b?);
    let groups: Vec<_> =
        crate::diff::stack_groups(&a, &b).into_iter().filter(|g| g.change() > 0).collect();
    let at = |s: &crate::diff::Side| {
        let (op, ops) = (s.report.metrics.peak_reserved_op, s.report.ops_run.max(1));
        (op, 100.0 * op as f64 / ops as f64)
    };
    let ((t_op, t_pc), (o_op, o_pc)) = (at(&b), at(&a));
    let shown = |g: &crate::diff::Group| {
        if g.frames.is_empty() {
            vec![crate::diff::NO_STACK.to_string()]
        } else {
            g.frames.iter().take(crate::diff::FRAMES_IN_TEXT).cloned().collect()
        }
    };
    let json = json!({
        "rank": top,
        "against_rank": other,
        "peak_reserved_op": t_op,
        "peak_reserved_at_percent": t_pc,
        "against_peak_reserved_op": o_op,
        "against_peak_reserved_at_percent": o_pc,
        "stacks": groups.iter().take(STACKS_SHOWN).map(|g| json!({
            "frames": shown(g),
            "bytes": g.b.bytes,
            "allocations": g.b.allocations,
            "against_bytes": g.a.bytes,
            "against_allocations": g.a.allocations,
            "more_bytes": g.change(),
        })).collect::<Vec<_>>(),
    });
    let mut text = String::new();
    outln!(text, "  where rank {top} differs from rank {other} (the rank nearest the median):");
    outln!(
        text,
        "    reserved peaks at op {t_op} ({t_pc:.0} % into the run) and op {o_op} ({o_pc:.0} %)"
    );
    outln!(text, "    live bytes at each one's peak by stack, where rank {top} holds most more:");
    for g in groups.iter().take(STACKS_SHOWN) {
        outln!(
            text,
            "      +{}: {} in {} allocations against {} in {}",
            bytes(g.change() as u64),
            bytes(g.b.bytes),
            g.b.allocations,
            bytes(g.a.bytes),
            g.a.allocations
        );
        for f in shown(g) {
            outln!(text, "        {f}");
        }
    }
    if groups.is_empty() {
        outln!(text, "      none: no stack holds more at rank {top}'s peak");
    }
    Ok(Some((json, text)))
}

/// `allocsim explain-oom` on a job: each rank's OOMs explained, and which ranks have any.
pub fn explain_oom(job: &Job, outs: Vec<crate::Output>) -> anyhow::Result<crate::Output> {
    let outs = each(job, outs);
    let rows: Vec<Value> = outs.iter().map(|(_, j)| j.clone()).collect();
    let with: Vec<(u64, u64)> = (rows.iter())
        .filter_map(|j| Some((u64_at(j, "rank")?, u64_at(j, "ooms")?)))
        .filter(|&(_, n)| n > 0)
        .collect();
    let job_json = json!({
        "ranks": job.ranks.len(),
        "world_size": job.world_size,
        "ranks_with_ooms": with.iter().map(|&(r, n)| json!({"rank": r, "ooms": n})).collect::<Vec<_>>(),
    });
    let mut text = ranks_text("explain-oom", job, &outs);
    let listed: Vec<String> = with.iter().map(|(r, n)| format!("rank {r} ({n})")).collect();
    match listed.is_empty() {
        true => outln!(text, "job: no rank has an OOM"),
        false => outln!(text, "job: OOMs on {}", listed.join(", ")),
    }
    Ok(crate::Output::both(json!({ "job": job_json, "ranks": rows }), text))
}

/// `allocsim advise` on a job: a setting fits the job when it fits every rank, so per setting
/// the job needs what the rank needing the most needs (its band: the largest low to the
/// largest high), that rank decides, the peak reserved is the highest rank's and the OOMs on
/// the card are each rank's, summed. The settings are ranked by the job's need, then its peak
/// reserved, as `advise` ranks them for one trace.
pub fn advise(job: &Job, outs: Vec<crate::Output>) -> anyhow::Result<crate::Output> {
    let outs = each(job, outs);
    let rows: Vec<Value> = outs.iter().map(|(_, j)| j.clone()).collect();
    let confs: Vec<&str> = (rows.first().and_then(|j| j["settings"].as_array()).into_iter())
        .flatten()
        .filter_map(|s| s["PYTORCH_CUDA_ALLOC_CONF"].as_str())
        .collect();
    let mut settings: Vec<Value> = confs.iter().map(|conf| advise_setting(conf, &rows)).collect();
    settings.sort_by_key(|s| {
        (u64_at(s, "capacity_bytes").unwrap_or(u64::MAX), u64_at(s, "peak_reserved_bytes"))
    });
    for (i, s) in settings.iter_mut().enumerate() {
        s["place"] = json!(i + 1);
    }
    let mut text = ranks_text("advise", job, &outs);
    advise_text(&mut text, job, &settings);
    let job_json = json!({
        "ranks": job.ranks.len(),
        "world_size": job.world_size,
        "settings": settings,
    });
    Ok(crate::Output::both(json!({ "job": job_json, "ranks": rows }), text))
}

/// One setting's row for the job, from each rank's row of that setting.
fn advise_setting(conf: &str, rows: &[Value]) -> Value {
    let of_rank: Vec<(u32, &Value)> = (rows.iter())
        .filter_map(|j| {
            let rank = u64_at(j, "rank")? as u32;
            let settings = j["settings"].as_array()?;
            Some((rank, settings.iter().find(|s| s["PYTORCH_CUDA_ALLOC_CONF"] == conf)?))
        })
        .collect();
    let need = |s: &Value| u64_at(s, "capacity_bytes");
    let unfit = of_rank.iter().find(|(_, s)| need(s).is_none()).map(|(r, _)| *r);
    let spread = Spread::of(of_rank.iter().filter_map(|&(r, s)| Some((r, need(s)?))));
    let fits = unfit.is_none() && of_rank.len() == rows.len();
    let most = |key: &str| of_rank.iter().filter_map(|(_, s)| u64_at(s, key)).max();
    let highs: Option<Vec<u64>> =
        of_rank.iter().map(|(_, s)| u64_at(s, "capacity_high_bytes")).collect();
    let peak = Spread::of(
        of_rank.iter().filter_map(|&(r, s)| Some((r, u64_at(s, "peak_reserved_bytes")?))),
    );
    let ooms: Vec<u64> =
        of_rank.iter().map(|(_, s)| u64_at(s, "ooms_on_device").unwrap_or(0)).collect();
    let ranks: Vec<Value> = (of_rank.iter())
        .map(|&(r, s)| {
            json!({
                "rank": r,
                "capacity_bytes": s["capacity_bytes"],
                "capacity_low_bytes": s["capacity_low_bytes"],
                "capacity_high_bytes": s["capacity_high_bytes"],
                "peak_reserved_bytes": s["peak_reserved_bytes"],
                "fragmentation_at_peak": s["fragmentation_at_peak"],
                "ooms_on_device": s["ooms_on_device"],
                "headroom_over_bound_bytes": s["headroom_over_bound_bytes"],
            })
        })
        .collect();
    json!({
        "PYTORCH_CUDA_ALLOC_CONF": conf,
        "fits": fits,
        "deciding_rank": unfit.or(spread.map(|s| s.top_rank)),
        "capacity_bytes": spread.filter(|_| fits).map(|s| s.top_bytes),
        "capacity_low_bytes": most("capacity_low_bytes").filter(|_| fits),
        "capacity_high_bytes": highs.filter(|_| fits).and_then(|h| h.into_iter().max()),
        "spread": spread.map(|s| s.json()),
        "peak_reserved_bytes": peak.map(|p| p.top_bytes),
        "peak_reserved_rank": peak.map(|p| p.top_rank),
        "ooms_on_device": ooms.iter().sum::<u64>(),
        "ranks": ranks,
    })
}

/// The job's table of settings, as `advise` prints one trace's.
fn advise_text(text: &mut String, job: &Job, settings: &[Value]) {
    let gib = |b: u64| format!("{:.2}", b as f64 / (1u64 << 30) as f64);
    let opt_gib = |b: Option<u64>| b.map_or("-".to_string(), gib);
    outln!(text, "job: the settings ranked for the {}", job.heading());
    outln!(
        text,
        "{:>5}  {:>22}  {:>7}  {:>7}  {:>13}  {:>5}  PYTORCH_CUDA_ALLOC_CONF",
        "place",
        "needs GiB [band]",
        "decides",
        "spread",
        "peak reserved",
        "OOMs"
    );
    for s in settings {
        let need = match u64_at(s, "capacity_bytes") {
            Some(p) => format!(
                "{} [{}, {}]",
                gib(p),
                opt_gib(u64_at(s, "capacity_low_bytes")),
                opt_gib(u64_at(s, "capacity_high_bytes"))
            ),
            None => "does not fit".to_string(),
        };
        let decides = u64_at(s, "deciding_rank").map_or("-".to_string(), |r| format!("rank {r}"));
        let spread = (s["spread"].get("spread_percent").and_then(Value::as_f64))
            .filter(|_| s["fits"] == json!(true))
            .map_or("-".to_string(), |p| format!("+{p:.1}%"));
        let conf = s["PYTORCH_CUDA_ALLOC_CONF"].as_str().unwrap_or_default();
        outln!(
            text,
            "{:>5}  {:>22}  {:>7}  {:>7}  {:>9} GiB  {:>5}  {}",
            u64_at(s, "place").unwrap_or(0),
            need,
            decides,
            spread,
            opt_gib(u64_at(s, "peak_reserved_bytes")),
            u64_at(s, "ooms_on_device").unwrap_or(0),
            crate::output::conf_label(conf)
        );
    }
    outln!(text, "  needs: the most any rank needs (the job fits a setting when every rank fits),");
    outln!(
        text,
        "  its band from the largest low to the largest high; decides: the rank that needs"
    );
    outln!(text, "  it; spread: how much more that rank needs than the rank needing least; peak");
    outln!(text, "  reserved: the highest rank's; OOMs: every rank's on the card, summed.");
}
