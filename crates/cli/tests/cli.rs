//! The `allocsim` binary end to end: bad input is refused with a message naming the file and
//! a non-zero exit, never a panic; the main commands work on a bundled trace.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn allocsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocsim")).args(args).output().expect("running allocsim")
}

fn bundled(name: &str) -> String {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces/pytorch-2.11-h100").join(name);
    p.to_string_lossy().into_owned()
}

/// A directory of the test's own, removed when dropped.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("allocsim-cli-test-").tempdir().unwrap()
}

/// `bytes` written to `name` in `dir`.
fn file_in(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path).unwrap().write_all(bytes).unwrap();
    path
}

/// Every command that reads a trace refuses `path` cleanly, naming it.
fn assert_refused(path: &Path, what: &str, expect: &str) {
    let p = path.to_string_lossy();
    for cmd in [
        &["info", &p][..],
        &["replay", &p, "--check"],
        &["convert", &p, "/tmp/allocsim-never-written.allocsim"],
    ] {
        let out = allocsim(cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: `allocsim {}` succeeded", cmd.join(" "));
        assert_eq!(out.status.code(), Some(1), "{what}: exit code (a panic exits 101)\n{stderr}");
        assert!(!stderr.contains("panicked"), "{what}: panicked\n{stderr}");
        let name = path.file_name().unwrap().to_string_lossy();
        assert!(stderr.contains(&*name), "{what}: the error does not name the file:\n{stderr}");
        assert!(stderr.contains(expect), "{what}: expected {expect:?} in the error:\n{stderr}");
    }
}

/// A protocol-4 pickle of `{"device_traces": [[{"action": "alloc", "addr": 0, "size": SIZE,
/// "stream": 0}]], "segments": []}` with SIZE written as an 8-byte LONG1.
fn snapshot_with_size(size: i64) -> Vec<u8> {
    let mut p = vec![0x80, 4, b'}', b'('];
    let s = |p: &mut Vec<u8>, text: &str| {
        p.push(0x8c);
        p.push(text.len() as u8);
        p.extend_from_slice(text.as_bytes());
    };
    s(&mut p, "segments");
    p.push(b']');
    s(&mut p, "device_traces");
    p.extend_from_slice(b"]]}(");
    for (k, v) in [("action", None), ("addr", Some(0)), ("size", Some(size)), ("stream", Some(0))] {
        s(&mut p, k);
        match v {
            None => s(&mut p, "alloc"),
            Some(n) => {
                p.extend_from_slice(&[0x8a, 8]);
                p.extend_from_slice(&n.to_le_bytes());
            }
        }
    }
    p.extend_from_slice(b"uaau.");
    p
}

#[test]
fn bad_inputs_are_refused_cleanly() {
    let real = std::fs::read(bundled("resnet50_train.pickle.gz")).unwrap();
    let mut pickle = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&real[..]), &mut pickle).unwrap();
    // os.system("echo hi") through GLOBAL + REDUCE, as pickle.dumps writes it at protocol 2.
    let evil = b"\x80\x02cposix\nsystem\nq\x00X\x07\x00\x00\x00echo hiq\x01\x85q\x02Rq\x03.";
    // (what, file name, bytes, words the error must contain)
    let cases: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        ("empty file", "empty.pickle", Vec::new(), "empty"),
        ("truncated gzip", "truncated.pickle.gz", real[..real.len() / 2].to_vec(), "deflate"),
        ("truncated pickle", "truncated.pickle", pickle[..pickle.len() / 3].to_vec(), "ends inside"),
        ("not a pickle", "text.pickle", b"hello, this is not a pickle\n".to_vec(), "not a pickle"),
        ("pickle calling os.system", "evil.pickle", evil.to_vec(), "GLOBAL"),
        ("list where an int belongs", "types.pickle", {
            let mut p = snapshot_with_size(1);
            // Replace the size's LONG1 (opcode, length, 8 bytes) by an empty list.
            let at = p.windows(4).position(|w| w == b"size").unwrap() + 4;
            p.splice(at..at + 10, [b']']);
            p
        }, "size"),
        ("negative size", "negative.pickle", snapshot_with_size(-4096), "size"),
        ("absurd size", "absurd.pickle", snapshot_with_size((1 << 62) + 1), "size"),
        ("unknown action", "action.pickle", {
            let mut p = snapshot_with_size(512);
            let at = p.windows(5).position(|w| w == b"alloc").unwrap();
            p[at..at + 5].copy_from_slice(b"alxoc");
            p
        }, "alxoc"),
        (
            "malformed RMM CSV",
            "bad.csv",
            b"Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000001,allocate,0x7f00,notanumber,0\n"
                .to_vec(),
            "line 2",
        ),
    ];
    let dir = scratch();
    for (what, name, bytes, expect) in cases {
        assert_refused(&file_in(dir.path(), name, &bytes), what, expect);
    }
    let missing = std::env::temp_dir().join("allocsim-no-such-trace.pickle.gz");
    assert_refused(&missing, "missing file", "allocsim-no-such-trace");
}

#[test]
fn replay_reproduces_a_bundled_recording() {
    let out = allocsim(&["replay", &bundled("resnet50_train.pickle.gz"), "--check", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["recorded_stats_match"], true, "{json:#}");
    assert_eq!(json["checker_violations"], 0);
    assert_eq!(json["device"], "recorded");
    let stats = json["memory_stats"].as_object().unwrap();
    assert!(stats.contains_key("inactive_split_bytes.large_pool.peak"));
    assert!(stats.contains_key("num_device_alloc"));
}

#[test]
fn fidelity_says_exact_and_convert_round_trips() {
    let trace = bundled("synthetic_roundup.pickle.gz");
    let out = allocsim(&["fidelity", &trace]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.trim_end().ends_with("\nexact"), "{stdout}");

    let dir = scratch();
    let native = dir.path().join("roundup.allocsim");
    let json = dir.path().join("roundup.allocsim.json");
    for (from, to) in [(trace.as_str(), &native), (&native.to_string_lossy(), &json)] {
        let out = allocsim(&["convert", from, &to.to_string_lossy()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let stats = |path: &str| {
        let out = allocsim(&["replay", path, "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["memory_stats"].clone()
    };
    let original = stats(&trace);
    assert_eq!(original, stats(&native.to_string_lossy()), "native replays differently");
    assert_eq!(original, stats(&json.to_string_lossy()), "JSON replays differently");
}

#[test]
fn compare_prints_the_grid_and_writes_the_html_report() {
    let dir = scratch();
    let html = dir.path().join("compare.html");
    let trace = bundled("resnet50_train.pickle.gz");
    let policies = "pytorch,bfc,rmm_pool";
    let out = allocsim(&[
        "compare",
        &trace,
        "--policy",
        policies,
        "--json",
        "--html",
        &html.to_string_lossy(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.len(), 3);
    for row in &rows {
        for key in [
            "trace",
            "policy",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "ooms",
            "device_calls",
            "min_feasible_capacity_bytes",
            "checker_violations",
        ] {
            assert!(row.get(key).is_some(), "missing {key} in {row}");
        }
        assert_eq!(row["checker_violations"], 0, "{row}");
        let (reserved, capacity) = (
            row["peak_reserved_bytes"].as_u64().unwrap(),
            row["min_feasible_capacity_bytes"].as_u64().unwrap(),
        );
        assert!(capacity <= reserved + (2 << 20), "capacity beyond the unconstrained peak: {row}");
        assert!(capacity >= row["peak_allocated_bytes"].as_u64().unwrap() / 2, "{row}");
    }
    let page = std::fs::read_to_string(&html).unwrap();
    // One timeline panel per column (drawn by the embedded uPlot), the segment maps in SVG.
    assert!(page.contains(r#""panels":[{"#) && page.matches(r#""policy":"#).count() == 3);
    assert!(page.contains("<svg") && page.contains("uPlot"), "panels or segment maps missing");
    // Self-contained: nothing loaded from elsewhere.
    for outside in ["<script src", "<link", "@import", "url(http"] {
        assert!(!page.contains(outside), "the report loads something: {outside}");
    }
    for p in policies.split(',') {
        assert!(page.contains(&format!("{p} at its reserved peak")), "no segment map for {p}");
    }
}

#[test]
fn explain_oom_names_the_fencing_blocks_and_their_stacks() {
    // GPT-2 training (peak reserved 7.5 GiB) on a 7 GiB card runs out of memory.
    let trace = bundled("gpt2_train.pickle.gz");
    let out = allocsim(&["explain-oom", &trace, "--device-total", "7516192768", "--limit", "1"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("OOMs under pytorch"), "{stdout}");
    assert!(stdout.contains("reserved but unallocated"), "{stdout}");
    assert!(stdout.contains("fenced by a live block"), "{stdout}");
    assert!(stdout.contains("modeling_gpt2.py"), "no allocation stack in:\n{stdout}");
}

/// The same in JSON, and the failing request's own stack: the capture script's recording
/// ends in one OOM, whose request the script made at line 8.
#[test]
fn explain_oom_in_json_with_the_requests_own_stack() {
    let trace = user_trace("c_train_oom.pickle.gz");
    let out = allocsim(&["explain-oom", trace.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(": 1 OOM under pytorch"), "{stdout}");
    let out = allocsim(&["explain-oom", trace.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["ooms"], 1);
    let oom = &json["explained"][0];
    assert_eq!(oom["rounded_bytes"], 2_000_000_000_000u64);
    assert!(oom["frames"][0].as_str().unwrap().contains("tiny.py:8"), "{oom}");
    assert!(oom["largest_free"][0]["fences"][0]["frames"].as_array().is_some(), "{oom}");
    assert!(oom["avoided_by"].is_array(), "{oom}");
}

/// `compare` columns name settings as well as policies; the PyTorch column under the
/// recording's own settings follows the recording, the others say they ran on the model.
#[test]
fn compare_takes_settings_as_columns() {
    let trace = bundled("varlen_train.pickle.gz");
    let columns = "pytorch,pytorch[expandable_segments:True],pytorch[max_split_size_mb:128,roundup_power2_divisions:4]";
    let out = allocsim(&["compare", &trace, "--policy", columns, "--no-capacity", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("JSON rows");
    let got: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap();
            (s("policy"), s("alloc_conf"), s("device"))
        })
        .collect();
    assert_eq!(
        got,
        [
            ("pytorch", "", "recorded"),
            ("pytorch[expandable_segments:True]", "expandable_segments:True", "sim"),
            (
                "pytorch[max_split_size_mb:128,roundup_power2_divisions:4]",
                "max_split_size_mb:128,roundup_power2_divisions:4",
                "sim"
            ),
        ]
    );
    // The expandable column's peak is the one `replay --alloc-conf` predicts.
    assert_eq!(rows[1]["peak_reserved_bytes"], 9128902656u64);
    // Every row carries the trace's bound and offline placement (`allocsim bound`), and its
    // headroom over the placement: peak reserved less it.
    let bound = allocsim(&["bound", &trace, "--json"]);
    let bound: serde_json::Value = serde_json::from_slice(&bound.stdout).expect("bound JSON");
    for r in &rows {
        assert_eq!(
            (&r["bound_bytes"], &r["offline_bytes"]),
            (&bound["bound_bytes"], &bound["offline_bytes"])
        );
        let headroom =
            r["peak_reserved_bytes"].as_i64().unwrap() - r["offline_bytes"].as_i64().unwrap();
        assert_eq!(r["headroom_bytes"].as_i64(), Some(headroom));
    }
    assert!(
        rows[0]["headroom_bytes"].as_i64().unwrap() > rows[1]["headroom_bytes"].as_i64().unwrap()
    );
    let out = allocsim(&["compare", &trace, "--policy", "pytorch[nope:1]"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Unrecognized key \"nope\"")
            && stderr.contains("e.g. max_split_size_mb:128"),
        "{stderr}"
    );
}

/// `--policy offline` replays `bound`'s offline placement as a policy, in `replay` (under the
/// checker, from a native file too, which otherwise streams) and as a `compare` column; it
/// takes no settings.
#[test]
fn the_offline_placement_replays_as_a_policy() {
    let trace = user_trace("c_ring.pickle.gz");
    let trace = trace.to_str().unwrap();
    let bound = allocsim(&["bound", trace, "--json"]);
    let bound: serde_json::Value = serde_json::from_slice(&bound.stdout).expect("bound JSON");
    let dir = scratch();
    let native = dir.path().join("c_ring.allocsim");
    let native = native.to_str().unwrap();
    assert!(allocsim(&["convert", trace, native]).status.success());
    for input in [trace, native] {
        let out = allocsim(&["replay", input, "--policy", "offline", "--check", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("replay JSON");
        assert_eq!(j["checker_violations"], 0);
        assert_eq!(j["peak_reserved_bytes"], bound["offline_bytes"], "{input}");
    }
    let out = allocsim(&["compare", trace, "--policy", "offline,bfc", "--no-capacity", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("compare JSON");
    assert_eq!((&rows[0]["policy"], &rows[0]["headroom_bytes"]), (&"offline".into(), &0.into()));
    for args in [
        vec!["compare", trace, "--policy", "offline[x:1]"],
        vec!["replay", trace, "--policy", "offline", "--alloc-conf", "x:1"],
    ] {
        let out = allocsim(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(stderr.contains("policy offline takes no settings"), "{stderr}");
    }
}

/// A what-if replay is held against the recorded run on peaks and OOMs, not key by key.
#[test]
fn a_what_if_says_what_changed() {
    let trace = bundled("varlen_train.pickle.gz");
    let out = allocsim(&["replay", &trace, "--alloc-conf", "expandable_segments:True"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("what-if against the recorded run:"), "{stdout}");
    assert!(
        stdout.contains("peak reserved: 10.91 GiB (11718885376 B) recorded, 8.50 GiB (9128902656 B) here: -2.41 GiB"),
        "{stdout}"
    );
    assert!(!stdout.contains("keys differ") && !stdout.contains("Some("), "{stdout}");
    let out = allocsim(&["replay", &trace, "--alloc-conf", "expandable_segments:True", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["what_if_against_recording"][0]["simulated"], 9128902656u64);
    assert!(json["recorded_stats_differences"].is_null());
}

/// `replay --export-snapshot` keeps each op's recorded `time_us`, `compile_context` and
/// `user_metadata` (a `torch.compile` recording with metadata per step).
#[test]
fn an_exported_snapshot_keeps_the_recorded_times_and_annotations() {
    let trace = user_trace("c_annotated.pickle.gz");
    let dir = scratch();
    let out = dir.path().join("times.pickle.gz");
    let run =
        allocsim(&["replay", trace.to_str().unwrap(), "--export-snapshot", out.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let (source, exported) =
        (allocsim_trace::read_trace(&trace).unwrap(), allocsim_trace::read_trace(&out).unwrap());
    assert_eq!(source.op_times.len(), source.ops.len(), "every op has its time");
    assert_eq!(exported.op_times, source.op_times);
    let contexts: std::collections::BTreeSet<&str> =
        source.annotations.iter().map(|a| a.compile_context.as_str()).collect();
    assert!(contexts.contains("Torch-Compiled Region: 0/0"), "{contexts:?}");
    assert!(source.annotations.iter().any(|a| a.user_metadata == "step 1"));
    let annotated = |t: &allocsim_core::Trace| -> Vec<(u64, allocsim_core::Annotation)> {
        t.op_annotations.iter().map(|&(op, a)| (op, t.annotations[a as usize].clone())).collect()
    };
    assert!(!source.op_annotations.is_empty());
    assert_eq!(annotated(&exported), annotated(&source));
}

/// The report's data keeps what the snapshot said of each allocation: `torch.compile`'s
/// context and the user's metadata (shown on hover; the browser test loads the page).
#[test]
fn the_report_carries_annotations() {
    let trace = user_trace("c_annotated.pickle.gz");
    let dir = scratch();
    let page = dir.path().join("annotated.html");
    let out = allocsim(&["report", trace.to_str().unwrap(), "-o", page.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains(r#"["Torch-Compiled Region: 0/0","step 0"]"#), "no compile context");
    assert!(html.contains(r#"["N/A","step 2"]"#), "no user metadata");
}

/// Output paths are checked before the work: the error names the path given.
#[test]
fn output_paths_are_checked_first() {
    let trace = bundled("synthetic_oom.pickle.gz");
    for (args, says) in [
        (
            vec!["replay", &trace, "--event-log", "/no/such/dir/e.log"],
            "there is no directory /no/such/dir",
        ),
        (vec!["replay", &trace, "--export-snapshot", "/no/x.pickle"], "cannot write /no/x.pickle"),
        (vec!["convert", &trace, "/tmp/x.txt"], "the extension picks the format"),
        (vec!["convert", &trace, "/tmp"], "cannot write /tmp"),
        (vec!["compare", &trace, "--html", "/no/r.html"], "cannot write /no/r.html"),
        (
            vec!["workload", "transformer-train", "--out", "/no/w.allocsim"],
            "cannot write /no/w.allocsim",
        ),
    ] {
        let out = allocsim(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    // fidelity on a trace without recorded events says it needs a PyTorch snapshot.
    let dir = scratch();
    let native = dir.path().join("workload.allocsim");
    let out =
        allocsim(&["workload", "transformer-train?steps=1", "--out", native.to_str().unwrap()]);
    assert!(out.status.success());
    let out = allocsim(&["fidelity", native.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("fidelity needs a PyTorch memory snapshot"), "{stderr}");
}

#[test]
fn info_reads_every_bundled_trace_and_every_command_has_help() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces");
    let mut seen = 0;
    for dir in ["pytorch-2.11-h100", "pytorch-2.11-h100-extra", "pytorch-2.11-h100-user"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if !path.to_string_lossy().ends_with(".pickle.gz") {
                continue;
            }
            let out = allocsim(&["info", &path.to_string_lossy(), "--json"]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert!(json["ops"].as_u64().unwrap() > 0 && json["has_expected_stats"] == true);
            seen += 1;
        }
    }
    assert_eq!(seen, 38);
    let help = allocsim(&["--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    let commands: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 6, "{text}");
    for &c in &commands {
        let out = allocsim(&[c, "--help"]);
        assert!(out.status.success(), "{c} --help failed");
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: allocsim"), "{c} --help");
    }
    // The README's table of commands lists every command and no other.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let mut listed: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `allocsim "))
        .filter_map(|l| l.split([' ', '`']).next())
        .collect();
    listed.sort_unstable();
    let mut commands = commands;
    commands.sort_unstable();
    assert_eq!(listed, commands, "the README's table of commands");
    // ARCHITECTURE.md's code map names every command too.
    let arch =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../ARCHITECTURE.md"))
            .expect("ARCHITECTURE.md");
    for c in &commands {
        assert!(arch.contains(&format!("`{c}`")), "ARCHITECTURE.md does not name `{c}`");
    }
}

fn user_trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces/pytorch-2.11-h100-user").join(name)
}

/// A history that starts mid-run: the report says how its statistics count, in text and
/// JSON, and `--stats-at-start` makes every statistic comparable.
#[test]
fn mid_run_histories_say_how_their_statistics_count() {
    let blog = user_trace("d_gpt2_blog.pickle.gz");
    let out = allocsim(&["replay", &blog.to_string_lossy(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["history_start"], "mid_run_cumulative_since_history_start");
    assert_eq!(json["recorded_stats_match"], true, "{}", json["recorded_stats_differences"]);
    let text = String::from_utf8_lossy(&allocsim(&["replay", &blog.to_string_lossy()]).stdout)
        .into_owned();
    assert!(text.contains("count since the history began"), "{text}");

    // d_late_history without its sidecar's stats at start: current values only; with them
    // given on the command line, all 122 keys.
    let scratch = scratch();
    let dir = scratch.path();
    let late = dir.join("late.pickle.gz");
    std::fs::copy(user_trace("d_late_history.pickle.gz"), &late).unwrap();
    let sidecar: serde_json::Value =
        serde_json::from_slice(&std::fs::read(user_trace("d_late_history.json")).unwrap()).unwrap();
    let mut without = sidecar.clone();
    without["meta"].as_object_mut().unwrap().remove("memory_stats_at_history_start");
    std::fs::write(dir.join("late.json"), without.to_string()).unwrap();
    let at_start = dir.join("at_start.json");
    let stats = &sidecar["meta"]["memory_stats_at_history_start"];
    std::fs::write(&at_start, stats.to_string()).unwrap();
    let fidelity = |extra: &[&str]| {
        let late = late.to_string_lossy();
        let out = allocsim(&[&["fidelity", late.as_ref()][..], extra].concat());
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (ok, text) = fidelity(&[]);
    assert!(ok && text.contains("exact (29 current values"), "{text}");
    let (ok, text) = fidelity(&["--stats-at-start", &at_start.to_string_lossy()]);
    assert!(ok && text.contains("memory_stats: exact (122 of 122 keys)"), "{text}");
}

/// Private pools: `info` lists what it inferred, `replay` reports each pool, and the exported
/// snapshot carries `segment_pool_id`.
#[test]
fn private_pools_are_listed_and_reported() {
    let mempool = user_trace("d_mempool.pickle.gz");
    let out = allocsim(&["info", &mempool.to_string_lossy(), "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pools: Vec<_> =
        json["private_pools"].as_array().unwrap().iter().map(|p| &p["id"]).collect();
    assert_eq!(pools, [&serde_json::json!([0, 1]), &serde_json::json!([0, 2])]);
    assert!(json["warnings"][0].as_str().unwrap().contains("private pools"), "{json}");
    let out = allocsim(&["replay", &mempool.to_string_lossy(), "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<_> = json["pools_at_end"].as_array().unwrap().iter().map(|p| &p["id"]).collect();
    assert_eq!(ids, [&serde_json::json!([0, 0]), &serde_json::json!([0, 2])]);
}

/// `capacity` and `advise`: the JSON keys the issue names, a band around the point, the
/// outside memory from the flag, every setting ranked, and clean errors.
#[test]
fn capacity_and_advise_answer_in_json_and_refuse_bad_input() {
    let trace = bundled("gpt2_train.pickle.gz");
    let out = allocsim(&["capacity", &trace, "--outside", "256MiB", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let key = |k: &str| j[k].as_u64().unwrap_or_else(|| panic!("{k} in {j}"));
    let (point, low, high) =
        (key("capacity_bytes"), key("capacity_low_bytes"), key("capacity_high_bytes"));
    assert!(low <= point && point <= high, "{j}");
    assert_eq!(key("outside_allocator_bytes"), 256 << 20);
    // The recording reserved at most its peak: it needs no more than that plus the outside.
    let peak = allocsim(&["replay", &trace, "--json"]);
    let peak: serde_json::Value = serde_json::from_slice(&peak.stdout).unwrap();
    let reserved = peak["memory_stats"]["reserved_bytes.all.peak"].as_u64().unwrap();
    assert!(point <= reserved + (256 << 20), "{point} vs {reserved}");

    let out = allocsim(&["advise", &trace, "--device-free", "10GiB", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = j["settings"].as_array().unwrap();
    assert_eq!(rows.len(), 8);
    let needs: Vec<u64> = rows.iter().map(|r| r["capacity_bytes"].as_u64().unwrap()).collect();
    assert!(needs.windows(2).all(|w| w[0] <= w[1]), "ranked by memory needed: {needs:?}");
    assert!(rows.iter().any(|r| r["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"));
    // Each setting's headroom over the bound, which `bound` computes the same way.
    let bound = allocsim(&["bound", &trace, "--json"]);
    let bound: serde_json::Value = serde_json::from_slice(&bound.stdout).unwrap();
    assert_eq!(j["bound_bytes"], bound["bound_bytes"]);
    for r in rows {
        let peak = r["peak_reserved_bytes"].as_i64().unwrap();
        let over = peak - j["bound_bytes"].as_i64().unwrap();
        assert_eq!(r["headroom_over_bound_bytes"].as_i64(), Some(over), "{r}");
        assert!(over >= 0, "no setting reserves less than the bound: {r}");
    }

    for args in [
        vec!["capacity", "/nonexistent/x.pickle.gz"],
        vec!["advise", "/nonexistent/x.pickle.gz"],
        vec!["capacity", &trace, "--outside", "lots"],
        vec!["capacity", &trace, "--alloc-conf", "max_split_size_mb:nope"],
    ] {
        let out = allocsim(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            err.contains("x.pickle.gz") || err.contains("lots") || err.contains("nope"),
            "{args:?}: {err}"
        );
    }
}

/// `workload:NAME?key=value` works wherever a trace is expected, as the README says.
#[test]
fn a_workload_spec_is_taken_wherever_a_trace_is() {
    let spec = "workload:transformer-train?layers=2";
    for args in [
        vec!["info", spec],
        vec!["replay", spec],
        vec!["explain-oom", spec],
        vec!["capacity", spec],
        vec!["compare", spec, "--policy", "pytorch,best_fit", "--no-capacity"],
    ] {
        let out = allocsim(&args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// No command line writes over what it reads, even through a link, and two outputs of one
/// command are never one file: each is refused before any work, naming both, and the input
/// stays as it was.
#[test]
fn no_command_writes_over_its_input() {
    let original = std::fs::read(bundled("synthetic_oom.pickle.gz")).unwrap();
    let scratch = scratch();
    let dir = scratch.path();
    let input = file_in(dir, "own-input.pickle.gz", &original);
    let link = dir.join("link-to-input.pickle.gz");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    let (i, l) = (input.to_str().unwrap(), link.to_str().unwrap());
    let dotted = format!("{}/./{}", dir.display(), input.file_name().unwrap().to_string_lossy());
    for (cmd, says) in [
        (vec!["replay", i, "--event-log", i], "it is the input"),
        (vec!["replay", i, "--export-snapshot", &dotted], "it is the input"),
        (vec!["convert", i, l], "it is the input"),
        (vec!["compare", i, "--html", l], "it is the input"),
        (vec!["report", i, "-o", i], "it is the input"),
        (
            vec!["replay", i, "--event-log", "/tmp/x.log", "--export-snapshot", "/tmp/x.log"],
            "name one file",
        ),
    ] {
        let out = allocsim(&cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "`allocsim {}`: {stderr}", cmd.join(" "));
        assert!(stderr.contains(says), "`allocsim {}`: {stderr}", cmd.join(" "));
        assert_eq!(std::fs::read(&input).unwrap(), original, "`allocsim {}`", cmd.join(" "));
    }
}

/// Ctrl-C, SIGTERM or SIGHUP while an event log is written leaves the file that was there, and
/// no temporary file.
#[test]
fn an_interrupted_write_leaves_the_old_file_and_no_temporary() {
    for signal in ["-INT", "-TERM", "-HUP"] {
        let scratch = scratch();
        let dir = scratch.path();
        let log = file_in(dir, "interrupted.log", b"the old log\n");
        let temporaries = || {
            std::fs::read_dir(dir)
                .unwrap()
                .filter(|e| {
                    let name = e.as_ref().unwrap().file_name();
                    name.to_string_lossy().starts_with(".interrupted.log")
                })
                .count()
        };
        let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../traces/pytorch-2.11-h100-extra/llama_generate_varlen.pickle.gz");
        let mut child = Command::new(env!("CARGO_BIN_EXE_allocsim"))
            .args(["replay", trace.to_str().unwrap(), "--check", "--policy", "tlsf"])
            .args(["--event-log", log.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while temporaries() == 0 && start.elapsed().as_secs() < 20 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(temporaries(), 1, "{signal}: the log is written to a temporary file first");
        let pid = child.id().to_string();
        assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
        let status = child.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(130),
            "{signal}: ended by its handler at the replay's start"
        );
        assert_eq!(std::fs::read(&log).unwrap(), b"the old log\n");
        assert_eq!(temporaries(), 0, "{signal}");
    }
}

/// Settings a trace recorded that the policy refuses: the error names the file and where in it.
#[test]
fn recorded_settings_the_policy_refuses_are_named_with_their_file() {
    let dir = scratch();
    let json = file_in(dir.path(), "bad-settings.allocsim.json", b"");
    let out = allocsim(&["convert", &bundled("synthetic_oom.pickle.gz"), json.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    trace["meta"]["alloc_conf"] = "max_split_size_mb:banana".into();
    std::fs::write(&json, serde_json::to_vec(&trace).unwrap()).unwrap();
    let out = allocsim(&["replay", json.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("bad-settings.allocsim.json"), "{stderr}");
    assert!(
        stderr.contains("recorded allocator settings") && stderr.contains("banana"),
        "{stderr}"
    );
}

/// Issue 49: a run that fits no device says why, and an OOM whose request alone is larger than
/// the card says so. The log asks for 1 TiB once, after a small allocation.
#[test]
fn capacity_and_explain_oom_say_why_a_request_cannot_fit() {
    let dir = scratch();
    let log = dir.path().join("huge.csv");
    std::fs::write(
        &log,
        "Thread,Time,Action,Pointer,Size,Stream\n\
         1,00:00:00.000001,allocate,0x7f0000000000,1048576,0\n\
         1,00:00:00.000002,allocate,0x7f1000000000,1099511627776,0\n",
    )
    .unwrap();
    let log = log.to_string_lossy();
    let out = allocsim(&["capacity", &log]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("does not fit in"), "{text}");
    assert!(text.contains("why: one request alone asks for 1.00 TiB"), "{text}");
    let out = allocsim(&["capacity", &log, "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(j["does_not_fit_because"].as_str().unwrap().starts_with("one request alone"));
    let out = allocsim(&["explain-oom", &log]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("this request alone is larger than the device's total memory"), "{text}");
}

/// The README: `allocsim report TRACE` writes `NAME.html` in the current directory, NAME the
/// trace's file name without its extension.
#[test]
fn report_writes_its_page_in_the_current_directory() {
    let dir = scratch();
    let trace = bundled("synthetic_roundup.pickle.gz");
    let out = Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .args(["report", &trace, "--no-advice"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.path().join("synthetic_roundup.html").is_file());
    let beside = PathBuf::from(&trace).with_file_name("synthetic_roundup.html");
    assert!(!beside.exists(), "written beside the trace");
}

/// `capacity` counts the driver's floor for a recording made on an H200, and says so; for one
/// made on an H100, where it was not measured, it counts none and says nothing.
#[test]
fn capacity_counts_the_drivers_floor_where_it_was_measured() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces");
    for (trace, floor) in [
        ("pytorch-2.11-h200-ranks/bs8.pickle.gz", 3_276_800),
        ("pytorch-2.11-h100-user/d_gpt2_blog.pickle.gz", 0),
    ] {
        let path = root.join(trace).display().to_string();
        let out = allocsim(&["capacity", &path, "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["driver_floor_bytes"], floor, "{trace}");
        let text = String::from_utf8(allocsim(&["capacity", &path]).stdout).unwrap();
        let said = text.contains("never handed out by the driver: 3.12 MiB (3276800 B)");
        assert_eq!(said, floor > 0, "{text}");
    }
}
