//! Jobs of per-rank recordings (issue 51): the DDP and FSDP2 training recorded on two H200s
//! under torchrun, given as a list, a folder or a pattern; every rank replays exactly, the job's
//! figures are the ranks' own, and bad jobs are refused naming the path.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn allocsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocsim")).args(args).output().expect("running allocsim")
}

fn folder() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces/pytorch-2.11-h200-ranks")
}

/// The rank traces of `mode` (`ddp`, `fsdp2`), sorted.
fn ranks(mode: &str) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(folder())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with(&format!("{mode}_rank")) && name.ends_with(".pickle.gz")
        })
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    found.sort();
    assert!(found.len() >= 2, "{mode}: the recordings are missing");
    found
}

/// `mode`'s job as a pattern, for the commands to expand.
fn pattern(mode: &str) -> String {
    folder().join(format!("{mode}_rank*.pickle.gz")).to_string_lossy().into_owned()
}

/// The sidecar's recorded `memory_stats()[key]` of a rank's trace.
fn recorded(trace: &str, key: &str) -> u64 {
    let sidecar = trace.replace(".pickle.gz", ".json");
    let j: Value = serde_json::from_str(&std::fs::read_to_string(sidecar).unwrap()).unwrap();
    j["memory_stats"][key].as_u64().unwrap()
}

fn json_of(args: &[&str]) -> Value {
    let out = allocsim(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "allocsim {}: {stderr}", args.join(" "));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn every_rank_of_the_ddp_and_fsdp2_jobs_replays_exactly() {
    for mode in ["ddp", "fsdp2"] {
        let list = ranks(mode);
        let mut args = vec!["fidelity"];
        args.extend(list.iter().map(String::as_str));
        let out = allocsim(&args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{mode}: {text}{}", String::from_utf8_lossy(&out.stderr));
        let n = list.len();
        assert!(text.contains(&format!("job: {n} of {n} ranks exact")), "{mode}: {text}");
        assert!(text.trim_end().ends_with("\nexact"), "{mode}: {text}");

        let p = pattern(mode);
        let j = json_of(&["replay", &p, "--json"]);
        assert_eq!(j["job"]["recorded_stats_match"], Value::Bool(true), "{mode}");
        let rows = j["ranks"].as_array().unwrap();
        assert_eq!(rows.len(), n);
        // Each rank's peak as its own recording measured it; the highest is the job's.
        let mut top = (0, 0);
        for (row, trace) in rows.iter().zip(&list) {
            assert_eq!(row["recorded_stats_match"], Value::Bool(true), "{trace}");
            let peak = recorded(trace, "reserved_bytes.all.peak");
            assert_eq!(u64_of(&row["peak_reserved_bytes"]), peak, "{trace}");
            if peak > top.1 {
                top = (u64_of(&row["rank"]), peak);
            }
        }
        assert_eq!(u64_of(&j["job"]["highest_peak_reserved_rank"]), top.0, "{mode}");
        let least = list.iter().map(|t| recorded(t, "reserved_bytes.all.peak")).min().unwrap();
        assert_eq!(u64_of(&j["job"]["peak_reserved"]["spread_bytes"]), top.1 - least);
    }
}

#[test]
fn info_on_a_job_gives_each_ranks_peaks_and_the_highest() {
    let list = ranks("fsdp2");
    let j = json_of(&["info", &pattern("fsdp2"), "--json"]);
    for (row, trace) in j["ranks"].as_array().unwrap().iter().zip(&list) {
        assert_eq!(row["trace"].as_str(), Some(trace.as_str()));
        assert_eq!(row["rank_from"], "sidecar");
        for key in ["reserved_bytes.all.peak", "allocated_bytes.all.peak"] {
            let field = format!("peak_{}_bytes", key.split('_').next().unwrap());
            assert_eq!(u64_of(&row[&field]), recorded(trace, key), "{trace} {field}");
        }
    }
    let top = u64_of(&j["job"]["highest_peak_reserved_rank"]);
    assert_differs(&j["job"]["differs"], top);
    // One trace is not a job: its output is as it was.
    let one = json_of(&["info", &list[0], "--json"]);
    assert!(one.get("job").is_none() && one.get("peak_reserved_bytes").is_none());
}

/// The job fits when every rank fits: its point is the largest of the ranks' points, its band
/// the largest low to the largest high, and the rank needing most decides.
#[test]
fn capacity_on_a_job_is_decided_by_the_rank_that_needs_most() {
    let j = json_of(&["capacity", &pattern("fsdp2"), "--json"]);
    let rows = j["ranks"].as_array().unwrap();
    assert_eq!(rows.len(), ranks("fsdp2").len());
    let field = |key: &str| rows.iter().map(|r| u64_of(&r[key])).collect::<Vec<_>>();
    let points = field("capacity_bytes");
    let max = *points.iter().max().unwrap();
    let job = &j["job"];
    assert_eq!(job["fits"], Value::Bool(true));
    assert_eq!(u64_of(&job["capacity_bytes"]), max);
    assert_eq!(
        u64_of(&job["capacity_low_bytes"]),
        *field("capacity_low_bytes").iter().max().unwrap()
    );
    assert_eq!(
        u64_of(&job["capacity_high_bytes"]),
        *field("capacity_high_bytes").iter().max().unwrap()
    );
    let deciding = rows.iter().find(|r| u64_of(&r["capacity_bytes"]) == max).unwrap();
    assert_eq!(job["deciding_rank"], deciding["rank"]);
    let min = *points.iter().min().unwrap();
    assert_eq!(u64_of(&job["spread_bytes"]), max - min);
    let percent = job["spread_percent"].as_f64().unwrap();
    assert!((percent - 100.0 * (max - min) as f64 / min as f64).abs() < 1e-9);
    assert_differs(&job["differs"], u64_of(&deciding["rank"]));
}

/// Where rank `top` differs: against another rank, the stack groups it holds more of at its
/// peak, each the difference of the two, the largest first.
fn assert_differs(d: &Value, top: u64) {
    assert_eq!(u64_of(&d["rank"]), top, "{d}");
    assert_ne!(u64_of(&d["against_rank"]), top, "{d}");
    let stacks = d["stacks"].as_array().unwrap();
    assert!(!stacks.is_empty(), "{d}");
    let more: Vec<u64> = stacks.iter().map(|s| u64_of(&s["more_bytes"])).collect();
    for (s, m) in stacks.iter().zip(&more) {
        assert!(*m > 0);
        assert_eq!(u64_of(&s["bytes"]) - u64_of(&s["against_bytes"]), *m, "{s}");
        assert!(!s["frames"].as_array().unwrap().is_empty());
    }
    assert!(more.windows(2).all(|w| w[0] >= w[1]), "{more:?}");
}

/// The FSDP2 job's threshold bisected on the two GPUs (validation/ranks/job_fit.py, every try
/// of two sessions), against the job's capacity: the real threshold, from the most free memory
/// a try failed with to the least one fitted with (or back: one free size both failed and fitted
/// with, the run's own spread), lies in the job's band, and the point is within 0.3 % of it.
#[test]
fn capacity_on_the_fsdp2_job_holds_against_the_bisected_threshold() {
    let fit = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../validation/ranks/job_fit_fsdp2.jsonl");
    let text = std::fs::read_to_string(fit).unwrap();
    let tries: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|t| t.get("fits").is_some())
        .collect();
    let free = |t: &Value, pick: fn(u64, u64) -> u64| {
        t["free"].as_array().unwrap().iter().map(u64_of).reduce(pick).unwrap()
    };
    let (fitted, failed): (Vec<&Value>, Vec<&Value>) =
        tries.iter().partition(|t| t["fits"].as_bool().unwrap());
    // A try fails when a rank fails: the most free any rank had; it fits when every rank fits.
    let oom = failed.iter().map(|t| free(t, u64::max)).max().unwrap();
    let fits = fitted.iter().map(|t| free(t, u64::min)).min().unwrap();
    let (lo, hi) = (oom.min(fits), oom.max(fits));
    let real = (lo + hi) / 2;
    let job = json_of(&["capacity", &pattern("fsdp2"), "--json"])["job"].clone();
    let (point, low, high) = (
        u64_of(&job["capacity_bytes"]),
        u64_of(&job["capacity_low_bytes"]),
        u64_of(&job["capacity_high_bytes"]),
    );
    let off = (real as f64 - point as f64).abs() / real as f64;
    assert!(
        low <= lo && hi <= high && off <= 0.003,
        "real threshold between {lo} and {hi}; the job's point {point}, band [{low}, {high}], \
         {:.2} % off",
        100.0 * off
    );
}

/// `advise` on a job, against `advise` on each rank alone, on a card where some setting runs
/// out (the free memory the least needy rank needs under the default settings): per setting
/// the job needs the most any rank needs, its band runs from the largest low to the largest
/// high, the rank needing most decides, the peak reserved is the highest rank's, the OOMs are
/// each rank's, summed; the settings are ranked by the job's need.
#[test]
fn advise_on_a_job_ranks_the_settings_by_the_rank_that_needs_most() {
    let list = ranks("ddp");
    let default_need = |j: &Value| {
        let rows = j["settings"].as_array().unwrap();
        u64_of(&rows.iter().find(|r| r["PYTORCH_CUDA_ALLOC_CONF"] == "").unwrap()["capacity_bytes"])
    };
    let alone: Vec<Value> = list.iter().map(|t| json_of(&["advise", t, "--json"])).collect();
    let card = alone.iter().map(default_need).min().unwrap().to_string();
    let alone: Vec<Value> =
        list.iter().map(|t| json_of(&["advise", t, "--json", "--device-free", &card])).collect();
    let j = json_of(&["advise", &pattern("ddp"), "--json", "--device-free", &card]);
    let settings = j["job"]["settings"].as_array().unwrap();
    assert_eq!(settings.len(), alone[0]["settings"].as_array().unwrap().len());
    let mut ooms_seen = 0;
    for s in settings {
        let conf = &s["PYTORCH_CUDA_ALLOC_CONF"];
        let rows: Vec<&Value> = (alone.iter())
            .map(|a| {
                a["settings"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| &r["PYTORCH_CUDA_ALLOC_CONF"] == conf)
                    .unwrap()
            })
            .collect();
        let all = |key: &str| rows.iter().map(|r| u64_of(&r[key])).collect::<Vec<_>>();
        let needs = all("capacity_bytes");
        let most = *needs.iter().max().unwrap();
        assert_eq!(u64_of(&s["capacity_bytes"]), most, "{conf}");
        assert_eq!(
            u64_of(&s["capacity_low_bytes"]),
            *all("capacity_low_bytes").iter().max().unwrap()
        );
        assert_eq!(
            u64_of(&s["capacity_high_bytes"]),
            *all("capacity_high_bytes").iter().max().unwrap()
        );
        let deciding = u64_of(&s["deciding_rank"]) as usize;
        assert_eq!(needs[deciding], most, "{conf}: rank {deciding} decides");
        assert_eq!(
            u64_of(&s["peak_reserved_bytes"]),
            *all("peak_reserved_bytes").iter().max().unwrap()
        );
        let ooms = all("ooms_on_device");
        assert_eq!(u64_of(&s["ooms_on_device"]), ooms.iter().sum::<u64>(), "{conf}");
        for (r, row) in s["ranks"].as_array().unwrap().iter().enumerate() {
            assert_eq!(u64_of(&row["rank"]), r as u64);
            assert_eq!(u64_of(&row["ooms_on_device"]), ooms[r], "{conf} rank {r}");
            assert_eq!(u64_of(&row["capacity_bytes"]), needs[r], "{conf} rank {r}");
        }
        ooms_seen += ooms.iter().sum::<u64>();
    }
    assert!(ooms_seen > 0, "a card some rank does not fit counts OOMs");
    let points: Vec<u64> = settings.iter().map(|s| u64_of(&s["capacity_bytes"])).collect();
    assert!(points.windows(2).all(|w| w[0] <= w[1]), "{points:?}");
    let out = allocsim(&["advise", &pattern("ddp"), "--device-free", &card]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("job: the settings ranked for the job of"), "{text}");
}

/// The page's data (its `<script type="application/json" id="data">` element).
fn page_data(page: &Path) -> Value {
    let text = std::fs::read_to_string(page).unwrap();
    let open = r#"<script type="application/json" id="data">"#;
    let start = text.find(open).expect("a data element") + open.len();
    let end = start + text[start..].find("</script>").expect("its end");
    serde_json::from_str(&text[start..end]).expect("the data parses")
}

/// `report` on a job, against the single-trace commands run rank by rank: each rank's peaks
/// as `replay` gives them, its need as `capacity` gives it, the deciding rank the one needing
/// most, the spread between the ranks' needs, where the deciding rank differs; one timeline per
/// rank, none beyond its peak. Without `-o`, the page is the first rank's name with `_job.html`
/// in the current directory.
#[test]
fn report_on_a_job_shows_each_ranks_figures_and_timeline() {
    let list = ranks("fsdp2");
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .arg("report")
        .arg(pattern("fsdp2"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let first = Path::new(&list[0]).file_name().unwrap().to_string_lossy().into_owned();
    let page = dir.path().join(first.replace(".pickle.gz", "_job.html"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("_job.html"), "{out:?}");
    let html = std::fs::read_to_string(&page).unwrap();
    let data = page_data(&page);
    let mut needs = Vec::new();
    for (i, trace) in list.iter().enumerate() {
        let replay = json_of(&["replay", trace, "--json"]);
        for key in ["peak_reserved_bytes", "peak_allocated_bytes"] {
            let peak = u64_of(&replay[key]);
            assert!(html.contains(&format!("({peak} B)")), "{trace}: {key} {peak} not shown");
        }
        let capacity = json_of(&["capacity", trace, "--json"]);
        let need = u64_of(&capacity["capacity_bytes"]);
        assert_eq!(u64_of(&data["ranks"][i]["capacity_bytes"]), need, "{trace}");
        assert!(html.contains(&format!("({need} B)")), "{trace}: need {need} not shown");
        needs.push(need);
        // The timeline: samples of the replay, none above its peak.
        let panel = &data["timelines"]["panels"][i];
        let most = panel["reserved"].as_array().unwrap().iter().map(u64_of).max().unwrap();
        assert!(most <= u64_of(&replay["peak_reserved_bytes"]), "{trace}");
        assert!(most > 0, "{trace}");
    }
    let job = &data["job"];
    let top = needs.iter().copied().enumerate().max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)));
    assert_eq!(u64_of(&job["deciding_rank"]), top.unwrap().0 as u64);
    let (max, min) = (*needs.iter().max().unwrap(), *needs.iter().min().unwrap());
    assert_eq!(u64_of(&job["spread_bytes"]), max - min);
    assert!(html.contains(&format!("Rank {} decides the card", top.unwrap().0)), "{html:.2000}");
    assert_differs(&job["differs"], top.unwrap().0 as u64);
    assert_eq!(data["timelines"]["panels"].as_array().unwrap().len(), list.len());
    // The page is not written over a rank's trace.
    assert_refused(&["report", &pattern("fsdp2"), "-o", &list[1]], "cannot write", "the input");
}

/// Refused with exit 1, the message naming `names` and containing `expect`.
fn assert_refused(args: &[&str], names: &str, expect: &str) {
    let out = allocsim(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "allocsim {}: {stderr}", args.join(" "));
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains(names), "expected {names:?} in: {stderr}");
    assert!(stderr.contains(expect), "expected {expect:?} in: {stderr}");
}

fn copy(from: &str, to: &Path) {
    std::fs::copy(from, to).unwrap();
}

#[test]
fn bad_jobs_are_refused_naming_the_path() {
    let list = ranks("ddp");
    for cmd in ["info", "replay", "capacity", "fidelity", "advise", "report"] {
        assert_refused(&[cmd, &list[0], &list[0]], "ddp_rank0", "rank 0 twice");
        assert_refused(&[cmd, &pattern("nothing")], "nothing_rank*", "no trace file matches");
    }
    let empty = tempfile::tempdir().unwrap();
    let e = empty.path().to_string_lossy().into_owned();
    assert_refused(&["info", &e], &e, "not a regular file (a directory)");
    assert_refused(&["info", &e, &list[0]], &e, "no trace files");
    // Two ranks recorded under different settings are two jobs.
    let mixed = tempfile::tempdir().unwrap();
    for (i, trace) in list.iter().enumerate() {
        let name = format!("ddp_rank{i}");
        copy(trace, &mixed.path().join(format!("{name}.pickle.gz")));
        let mut j: Value = serde_json::from_str(
            &std::fs::read_to_string(trace.replace(".pickle.gz", ".json")).unwrap(),
        )
        .unwrap();
        if i == 1 {
            j["meta"]["alloc_conf"] = Value::from("expandable_segments:True");
        }
        std::fs::write(mixed.path().join(format!("{name}.json")), j.to_string()).unwrap();
    }
    let m = mixed.path().to_string_lossy().into_owned();
    assert_refused(&["capacity", &m], "ddp_rank1", "different allocator settings");
    // Without sidecars, the file name numbers the ranks.
    let bare = tempfile::tempdir().unwrap();
    for (i, trace) in list.iter().enumerate().rev() {
        copy(trace, &bare.path().join(format!("ddp_rank{}.pickle.gz", 7 - i)));
    }
    let j = json_of(&["info", &bare.path().to_string_lossy(), "--json"]);
    let numbers: Vec<u64> =
        j["ranks"].as_array().unwrap().iter().map(|r| u64_of(&r["rank"])).collect();
    assert_eq!(numbers, [6, 7]);
    assert_eq!(j["ranks"][0]["rank_from"], "file name");
}

#[test]
fn explain_oom_on_a_job_says_which_ranks_have_ooms() {
    let j = json_of(&["explain-oom", &pattern("ddp"), "--json"]);
    let rows = j["ranks"].as_array().unwrap();
    assert_eq!(rows.len(), ranks("ddp").len());
    let with: Vec<u64> =
        rows.iter().filter(|r| u64_of(&r["ooms"]) > 0).map(|r| u64_of(&r["rank"])).collect();
    let listed: Vec<u64> = (j["job"]["ranks_with_ooms"].as_array().unwrap().iter())
        .map(|r| u64_of(&r["rank"]))
        .collect();
    assert_eq!(listed, with);
}

/// `diff` of two jobs, rank by rank (issue 51): each rank's diff is `diff` of that rank's two
/// traces; the job needs before and after what the rank needing most needs; the rank whose
/// peak reserved changed most is named. Mismatched inputs are refused naming both.
#[test]
fn diff_of_two_jobs_is_each_ranks_diff_and_the_jobs_answer() {
    let (ddp, fsdp2) = (ranks("ddp"), ranks("fsdp2"));
    let j = json_of(&["diff", &pattern("ddp"), &pattern("fsdp2"), "--json"]);
    let rows = j["ranks"].as_array().unwrap();
    assert_eq!(rows.len(), ddp.len());
    let mut needs = (Vec::new(), Vec::new());
    for (i, row) in rows.iter().enumerate() {
        let mut alone = json_of(&["diff", &ddp[i], &fsdp2[i], "--json"]);
        alone["rank"] = Value::from(i as u64);
        assert_eq!(row, &alone, "rank {i}");
        needs.0.push(u64_of(&row["a"]["capacity"]["capacity_bytes"]));
        needs.1.push(u64_of(&row["b"]["capacity"]["capacity_bytes"]));
    }
    let job = &j["job"];
    assert_eq!(u64_of(&job["a"]["capacity_bytes"]), *needs.0.iter().max().unwrap());
    assert_eq!(u64_of(&job["b"]["capacity_bytes"]), *needs.1.iter().max().unwrap());
    let change = |r: &Value| r["change"]["peak_reserved_bytes"].as_i64().unwrap().unsigned_abs();
    let most = rows.iter().max_by_key(|r| change(r)).unwrap();
    assert_eq!(job["most_changed_rank"], most["rank"]);
    // A what-if of the job, as two runs of one rank are a what-if of one trace.
    let what_if = ["--b-alloc-conf", "expandable_segments:True", "--no-capacity", "--json"];
    let j = json_of(&[&["diff", &pattern("ddp")][..], &what_if[..]].concat());
    for (i, row) in j["ranks"].as_array().unwrap().iter().enumerate() {
        let alone = json_of(&[&["diff", &ddp[i]][..], &what_if[..]].concat());
        assert_eq!(row["change"], alone["change"], "rank {i}");
    }
    assert_refused(&["diff", &pattern("ddp"), &ddp[0]], "ddp_rank0", "two jobs rank by rank");
    assert_refused(&["diff", &pattern("ddp"), &pattern("nothing")], "nothing_rank*", "no trace");
    let one = tempfile::tempdir().unwrap();
    copy(&ddp[0], &one.path().join("ddp_rank0.pickle.gz"));
    let o = one.path().to_string_lossy().into_owned();
    assert_refused(&["diff", &pattern("ddp"), &o], &o, "the same ranks");
}
