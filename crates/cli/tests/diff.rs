//! `allocsim diff`: a recording against itself, against a what-if of itself, and against
//! another recording; bad input refused naming the file.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn allocsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocsim")).args(args).output().expect("running allocsim")
}

fn trace(folder: &str, name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces").join(folder).join(name);
    p.to_string_lossy().into_owned()
}

fn json_of(args: &[&str]) -> Value {
    let out = allocsim(args);
    assert!(
        out.status.success(),
        "allocsim {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// A recording against itself: every change zero, no stack group, no parting op, the two
/// sides the same, with the capacity search too.
#[test]
fn a_recording_against_itself_changes_nothing() {
    let gpt2 = trace("pytorch-2.11-h100", "gpt2_train.pickle.gz");
    let j = json_of(&["diff", &gpt2, "--json"]);
    assert_eq!(j["a"], j["b"]);
    for (key, value) in j["change"].as_object().unwrap() {
        assert_eq!(value.as_f64(), Some(0.0), "change.{key}: {value}");
    }
    assert_eq!(j["stack_groups"], serde_json::json!([]));
    assert_eq!(j["stack_groups_changed"], 0);
    assert_eq!(j["first_parting_op"], Value::Null);
    assert!(j["a"]["capacity"]["capacity_bytes"].as_u64().unwrap() > 0);
    // Named twice, the same.
    let twice = json_of(&["diff", &gpt2, &gpt2, "--json"]);
    assert_eq!(twice, j);
    let text =
        String::from_utf8_lossy(&allocsim(&["diff", &gpt2, "--no-capacity"]).stdout).into_owned();
    assert!(text.contains("peak reserved: 7.53 GiB (8082423808 B) -> 7.53 GiB"), "{text}");
    assert!(text.contains("no change") && text.contains("the same throughout"), "{text}");
    assert!(!text.contains("needs free at start"), "{text}");
}

/// Issue 51's done criterion: a recording against itself under `expandable_segments:True`
/// gives the peak figures of two separate replays, one under that setting; the segments at
/// each peak add up to it. A complete history and one that starts mid-run (whose what-if
/// lays its live blocks out first).
#[test]
fn a_what_if_gives_the_figures_of_two_replays() {
    let conf = "expandable_segments:True";
    for t in [
        trace("pytorch-2.11-h100", "gpt2_train.pickle.gz"),
        trace("pytorch-2.11-h100-user", "d_gpt2_blog.pickle.gz"),
    ] {
        let d = json_of(&["diff", &t, "--b-alloc-conf", conf, "--no-capacity", "--json"]);
        let a = json_of(&["replay", &t, "--json"]);
        let b = json_of(&["replay", &t, "--alloc-conf", conf, "--json"]);
        for (side, replay) in [(&d["a"], &a), (&d["b"], &b)] {
            for key in [
                "peak_reserved_bytes",
                "peak_allocated_bytes",
                "fragmentation_at_peak",
                "alloc_conf",
                "device",
            ] {
                assert_eq!(side[key], replay[key], "{t}: {key}");
            }
            assert_eq!(
                side["ooms"].as_u64(),
                Some(replay["ooms"].as_array().unwrap().len() as u64)
            );
            assert_eq!(side["segments_at_peak"]["bytes"], replay["peak_reserved_bytes"], "{t}");
            let pools = side["segments_at_peak"]["by_pool"].as_array().unwrap();
            let sum: u64 = pools.iter().map(|p| p["bytes"].as_u64().unwrap()).sum();
            assert_eq!(Some(sum), side["segments_at_peak"]["bytes"].as_u64());
        }
        let change = |key: &str| d["change"][key].as_i64().unwrap();
        let peak = |j: &Value| j["peak_reserved_bytes"].as_i64().unwrap();
        assert_eq!(change("peak_reserved_bytes"), peak(&b) - peak(&a), "{t}");
        assert_eq!(d["first_parting_op"], Value::Null, "{t}: the same ops");
        // Expandable segments: one segment a pool instead of many.
        assert!(
            d["b"]["segments_at_peak"]["segments"].as_u64()
                < d["a"]["segments_at_peak"]["segments"].as_u64(),
            "{t}"
        );
        assert!(d["stack_groups_changed"].as_u64().unwrap() > 0, "{t}");
    }
}

/// Two recordings: where their op streams part, with the stacks there, and the stack groups
/// whose live bytes at the peaks changed most, the largest first.
#[test]
fn two_recordings_part_and_name_the_stacks_that_changed() {
    let gpt2 = trace("pytorch-2.11-h100", "gpt2_train.pickle.gz");
    let resnet = trace("pytorch-2.11-h100", "resnet50_train.pickle.gz");
    let j = json_of(&["diff", &gpt2, &resnet, "--no-capacity", "--json"]);
    let parting = &j["first_parting_op"];
    assert_eq!(parting["op"], 0, "{parting}");
    assert_ne!(parting["a"], parting["b"]);
    assert_eq!(
        (&parting["a"]["action"], &parting["b"]["action"]),
        (&"alloc".into(), &"alloc".into())
    );
    assert_eq!(parting["a"]["size"], 154389504);
    // gpt2 was recorded with stacks, ResNet without.
    assert!(parting["a"]["frames"][0].as_str().unwrap().contains("module.py"), "{parting}");
    assert_eq!(parting["b"]["frames"], serde_json::json!([]));
    assert_eq!(j["a"]["capacity"], Value::Null);
    let groups = j["stack_groups"].as_array().unwrap();
    assert!(!groups.is_empty() && groups.len() <= 10, "{}", groups.len());
    assert!(j["stack_groups_changed"].as_u64().unwrap() >= groups.len() as u64);
    let changes: Vec<u64> =
        groups.iter().map(|g| g["change_bytes"].as_i64().unwrap().unsigned_abs()).collect();
    assert!(changes.windows(2).all(|w| w[0] >= w[1]), "{changes:?}");
    for g in groups {
        let (a, b) = (g["a_bytes"].as_i64().unwrap(), g["b_bytes"].as_i64().unwrap());
        assert_eq!(g["change_bytes"].as_i64().unwrap(), b - a);
        assert!(!g["frames"].as_array().unwrap().is_empty(), "{g}");
    }
    // gpt2's optimizer state lives at its peak; ResNet's does not come from there.
    assert!(groups.iter().any(|g| g["frames"][0].as_str().unwrap().contains("adam.py")));
    let text =
        String::from_utf8_lossy(&allocsim(&["diff", &gpt2, &resnet, "--no-capacity"]).stdout)
            .into_owned();
    let op = parting["op"].as_u64().unwrap();
    assert!(text.contains(&format!("the op streams part at op {op}:")), "{text}");
    assert!(text.contains("live bytes at the peaks by stack, the largest changes"), "{text}");

    // One recording a longer run of the other: they part where the shorter ends, at the
    // longer one's request, with its stack.
    let user = |name| trace("pytorch-2.11-h100-user", name);
    let (c, c_oom) = (user("c_train.pickle.gz"), user("c_train_oom.pickle.gz"));
    let j = json_of(&["diff", &c, &c_oom, "--no-capacity", "--json"]);
    let parting = &j["first_parting_op"];
    assert_eq!((&parting["op"], &parting["a"]), (&392.into(), &Value::Null), "{parting}");
    assert_eq!(parting["b"]["size"], 2_000_000_000_000u64);
    assert!(parting["b"]["frames"][0].as_str().unwrap().starts_with("<module> ("), "{parting}");
    assert_eq!(j["change"]["ooms"], 1);

    // Another policy for B alone: A keeps its own; B does not take A's settings.
    let j = json_of(&[
        "diff",
        &gpt2,
        "--alloc-conf",
        "max_split_size_mb:128",
        "--b-policy",
        "bfc",
        "--no-capacity",
        "--json",
    ]);
    assert_eq!(
        (&j["a"]["policy"], &j["a"]["alloc_conf"]),
        (&"pytorch".into(), &"max_split_size_mb:128".into())
    );
    assert_eq!(j["b"]["policy"], "bfc");
    assert_eq!(j["first_parting_op"], Value::Null);
}

/// A missing trace, either one: an error naming it, no output.
#[test]
fn a_missing_trace_is_named() {
    let gpt2 = trace("pytorch-2.11-h100", "gpt2_train.pickle.gz");
    let missing = "/nonexistent/allocsim-diff-missing.pickle.gz";
    for args in [vec!["diff", missing], vec!["diff", &gpt2, missing]] {
        let out = allocsim(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(stderr.starts_with("error: ") && stderr.contains(missing), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let out = allocsim(&["diff", &gpt2, "--b-alloc-conf", "expandable_segments:Maybe"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("expandable_segments"), "{stderr}");
}

/// `--html` writes the page, and never over an input: refused before any work.
#[test]
fn the_page_is_written_and_never_over_an_input() {
    let gpt2 = trace("pytorch-2.11-h100", "gpt2_train.pickle.gz");
    let dir = tempfile::Builder::new().prefix("allocsim-diff-test-").tempdir().unwrap();
    let page = dir.path().join("diff.html");
    let page_arg = page.to_string_lossy().into_owned();
    let out = allocsim(&["diff", &gpt2, "--no-capacity", "--html", &page_arg]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("wrote {page_arg}")));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<title>allocsim diff: gpt2_train vs gpt2_train</title>"));
    assert!(html.contains(r#"<script type="application/json" id="data">"#));
    let out = allocsim(&["diff", &gpt2, "--no-capacity", "--html", &gpt2]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("it is the input"), "{stderr}");
    assert!(std::fs::metadata(&gpt2).unwrap().len() > 1000, "the input is intact");
}

/// The README's example: what `diff` says of gpt2 under `expandable_segments:True`.
#[test]
fn the_readme_example_is_what_diff_says() {
    let gpt2 = trace("pytorch-2.11-h100", "gpt2_train.pickle.gz");
    let out = allocsim(&["diff", &gpt2, "--b-alloc-conf", "expandable_segments:True"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("peak reserved: 7.53 GiB (8082423808 B) -> 7.70 GiB"), "{text}");
    assert!(text.contains("needs free at start: 7.76 GiB (8327790592 B) -> 7.57 GiB"), "{text}");
    assert!(
        text.contains("segments at A's peak: 137,") && text.contains("segments at B's peak: 2,")
    );
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let claim =
        "peak reserved 7.53 GiB -> 7.70 GiB, yet the memory needed\n  7.76 GiB -> 7.57 GiB \
                 (two segments instead of 137)";
    assert!(readme.contains(claim), "the README's diff example changed");
}

/// Issue 51: two real recordings of one training at batch 8 and batch 12 (an H200): the
/// allocations that grew are named by their stacks, the largest growth first, and the GELU
/// activations of the transformer blocks, which scale with the batch, are among them; each
/// side's peak is that recording's own.
#[test]
fn two_batch_sizes_name_the_allocations_that_grew() {
    let (a, b) = (
        trace("pytorch-2.11-h200-ranks", "bs8.pickle.gz"),
        trace("pytorch-2.11-h200-ranks", "bs12.pickle.gz"),
    );
    let d = json_of(&["diff", &a, &b, "--json"]);
    let groups = d["stack_groups"].as_array().expect("stack groups");
    let change = |g: &Value| g["change_bytes"].as_i64().unwrap();
    assert!(groups.windows(2).all(|w| change(&w[0]).abs() >= change(&w[1]).abs()), "{groups:?}");
    let grew = &groups[0];
    assert!(change(grew) > 0 && grew["b_bytes"].as_u64() > grew["a_bytes"].as_u64(), "{grew}");
    let gelu = groups.iter().find(|g| {
        g["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str().unwrap().contains("activations.py"))
    });
    let gelu = gelu.expect("the activations' stack among the changes");
    // Batch 12 over batch 8: the activations grow by half.
    let ratio = gelu["b_bytes"].as_f64().unwrap() / gelu["a_bytes"].as_f64().unwrap();
    assert!((ratio - 1.5).abs() < 0.01, "{gelu}");
    for (side, path) in [("a", &a), ("b", &b)] {
        let replay = json_of(&["replay", path, "--json"]);
        assert_eq!(
            d[side]["peak_reserved_bytes"], replay["memory_stats"]["reserved_bytes.all.peak"],
            "{side}"
        );
    }
}
