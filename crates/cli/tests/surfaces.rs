//! What a hostile file's strings, or a hostile flag, can do to the surfaces that show them
//! (issue 50): a message never echoes more than a few hundred bytes of input, and a terminal
//! never receives a control character from a file. Every file is made here, small.

use allocsim_trace::pickle::{to_vec, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn allocsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocsim")).args(args).output().expect("running allocsim")
}

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("allocsim-surfaces-").tempdir().unwrap()
}

/// One frame with `name` and `filename`.
fn frames(name: &str, filename: &str) -> Value {
    Value::list(vec![Value::str_dict([
        ("filename", Value::str(filename)),
        ("name", Value::str(name)),
        ("line", Value::Int(7)),
    ])])
}

/// A snapshot of three 512 MiB allocations (a 1 GiB card runs out at the third), each entry
/// with `frames` and `user_metadata`, and `allocator_settings` when given.
fn snapshot(dir: &Path, name: &str, frames: Value, metadata: &str, conf: Option<&str>) -> PathBuf {
    let entries = (0..3i64)
        .map(|i| {
            Value::str_dict([
                ("action", Value::str("alloc")),
                ("addr", Value::Int(0x7f00_0000_0000 + (i << 30))),
                ("size", Value::Int(1 << 29)),
                ("stream", Value::Int(0)),
                ("frames", frames.clone()),
                ("time_us", Value::Int(i)),
                ("compile_context", Value::str("N/A")),
                ("user_metadata", Value::str(metadata)),
            ])
        })
        .collect();
    let mut top = vec![
        ("segments", Value::list(vec![])),
        ("device_traces", Value::list(vec![Value::list(entries)])),
    ];
    if let Some(conf) = conf {
        let settings = Value::str_dict([("PYTORCH_CUDA_ALLOC_CONF", Value::str(conf))]);
        top.push(("allocator_settings", settings));
    }
    let path = dir.join(name);
    std::fs::write(&path, to_vec(&Value::str_dict(top)).unwrap()).unwrap();
    path
}

/// Everything `out` printed, with the exit status.
fn printed(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Issue 50, item 6: a 100 MB `allocator_settings` was written whole to stderr by `replay`,
/// `report` and `compare`, and a 120 KB `--alloc-conf` twice. Here 1 MB and 120 KB: every
/// command that reads them prints at most a few hundred bytes of them.
#[test]
fn messages_never_echo_more_than_a_few_hundred_bytes_of_input() {
    let dir = scratch();
    let big = format!("garbage:{}", "x".repeat(1 << 20));
    let recorded = snapshot(dir.path(), "settings.pickle", frames("f", "f.py"), "", Some(&big));
    let plain = snapshot(dir.path(), "plain.pickle", frames("f", "f.py"), "", None);
    let (recorded, plain) = (recorded.to_str().unwrap(), plain.to_str().unwrap());
    let flag = "y".repeat(120_000);
    let column = format!("pytorch[{flag}]");
    let spec = format!("workload:{flag}");
    let report = dir.path().join("r.html");
    let report = report.to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["info", recorded],
        vec!["replay", recorded],
        vec!["report", recorded, "-o", report],
        vec!["compare", recorded, "--policy", "pytorch"],
        vec!["explain-oom", recorded],
        vec!["capacity", recorded],
        vec!["fidelity", recorded],
        vec!["replay", plain, "--alloc-conf", &flag],
        vec!["compare", plain, "--policy", &column],
        vec!["capacity", plain, "--alloc-conf", &flag],
        vec!["explain-oom", plain, "--alloc-conf", &flag],
        vec!["replay", plain, "--policy", &flag],
        vec!["replay", plain, "--device-free", &flag],
        vec!["replay", &spec],
    ];
    for args in cases {
        let out = allocsim(&args);
        let text = printed(&out);
        let shown = format!("allocsim {}", args.join(" ").chars().take(80).collect::<String>());
        assert!(!text.contains("panicked"), "{shown}: {text}");
        let echoed = text.matches(['x', 'y']).count();
        assert!(echoed <= 200, "{shown}: {echoed} bytes of the input echoed:\n{:.2000}", text);
        assert!(text.len() < 4000, "{shown}: {} bytes printed:\n{:.2000}", text.len(), text);
        if args[0] != "info" {
            assert!(!out.status.success(), "{shown}: succeeded\n{text}");
            assert!(text.contains("bytes)"), "{shown}: the cut is not said:\n{text}");
        }
    }
}

/// Control characters a terminal acts on: ESC (CSI and OSC sequences), BEL, CR, CSI as one
/// C1 character, and the bidirectional override.
const HOSTILE: &str = "\u{1b}]0;retitled\u{7}\u{1b}[2J\r\u{9b}2J\u{202e}";

fn assert_no_controls(what: &str, out: &Output) {
    for (stream, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let text = String::from_utf8_lossy(bytes);
        let raw = text.chars().find(|&c| {
            (c.is_control() && c != '\n' && c != '\t') || c == '\u{202e}' || c == '\u{9b}'
        });
        assert_eq!(raw, None, "{what}: a raw control character on {stream}:\n{text:?}");
    }
}

/// Issue 50, item 8: ESC/OSC sequences in frames, warnings or `source_format` were printed
/// raw by `explain-oom`, `info` and `replay`. Each now shows them escaped, in text and in
/// JSON (which still parses, to the same strings); `diff` too.
#[test]
fn a_files_strings_reach_the_terminal_escaped() {
    let dir = scratch();
    let snap = snapshot(dir.path(), "frames.pickle", frames(HOSTILE, HOSTILE), HOSTILE, None);
    // The native JSON format carries warnings and the source format as they are.
    let native = dir.path().join("warned.allocsim.json");
    let out = allocsim(&["convert", snap.to_str().unwrap(), native.to_str().unwrap()]);
    assert!(out.status.success(), "{}", printed(&out));
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&native).unwrap()).unwrap();
    json["warnings"] = serde_json::json!([HOSTILE]);
    json["meta"]["source_format"] = serde_json::json!(HOSTILE);
    std::fs::write(&native, serde_json::to_vec(&json).unwrap()).unwrap();
    let (snap, native) = (snap.to_str().unwrap(), native.to_str().unwrap());
    let one_gib = ["--device-total", "1GiB"];
    let gpt2 =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/pytorch-2.11-h100/gpt2_train.pickle.gz");
    for trace in [snap, native] {
        let cases: Vec<Vec<&str>> = vec![
            vec!["info", trace],
            vec!["replay", trace],
            [&["explain-oom", trace][..], &one_gib].concat(),
            vec!["diff", trace, gpt2, "--no-capacity"],
        ];
        for json in [false, true] {
            for args in &cases {
                let mut args = args.clone();
                if json {
                    args.push("--json");
                }
                let out = allocsim(&args);
                let what = format!("allocsim {}", args.join(" "));
                assert!(out.status.success(), "{what}: {}", printed(&out));
                assert_no_controls(&what, &out);
                let text = String::from_utf8_lossy(&out.stdout);
                // Frames are shown by explain-oom and diff (where the ops part, and by stack);
                // warnings and the format by info and replay.
                let shows =
                    ["explain-oom", "diff"].contains(&args[0]) || (trace == native && !json);
                let escaped = text.contains("\\u001b]0;retitled\\u0007\\u001b[2J");
                assert!(escaped || !shows, "{what}: the strings are not shown:\n{text}");
                if json {
                    let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
                    let same = parsed.to_string().contains("\\u001b]0;retitled\\u0007");
                    assert!(same || !text.contains("retitled"), "{what}:\n{text}");
                }
            }
        }
    }
    // An error quoting a file's string.
    let bad = snapshot(dir.path(), "bad.pickle", frames("f", "f.py"), "", Some(HOSTILE));
    let out = allocsim(&["replay", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_no_controls("replay of hostile settings", &out);
}

/// `fuzz --trace`, `validate` (against the simulated stand-in for a GPU) and `workload` print
/// through the same escaping: a trace's name, which is any name a folder holds, and its
/// strings reach the terminal escaped, in text and in JSON.
#[test]
fn fuzz_validate_and_workload_show_their_inputs_escaped() {
    let dir = scratch();
    let name = format!("{HOSTILE}.pickle");
    let snap = snapshot(dir.path(), &name, frames(HOSTILE, HOSTILE), HOSTILE, None);
    let snap = snap.to_str().unwrap();
    let cases: [&[&str]; 4] = [
        &["fuzz", "--trace", snap, "--policy", "pytorch"],
        &["validate", snap, "--device", "sim"],
        &["validate", snap, "--device", "sim", "--json"],
        &["workload", "transformer-train?layers=1&steps=1"],
    ];
    for args in cases {
        let out = allocsim(args);
        let what = format!("allocsim {}", args.join(" "));
        assert!(out.status.success(), "{what}: {}", printed(&out));
        assert_no_controls(&what, &out);
        let text = String::from_utf8_lossy(&out.stdout);
        let shows_name = args[0] != "workload" && !args.contains(&"--json");
        let escaped = text.contains("\\u001b]0;retitled\\u0007\\u001b[2J");
        assert!(escaped || !shows_name, "{what}: the name is not shown:\n{text}");
    }
}

/// The `report_page` fuzz target's oracle on seeded random bytes with text of every kind
/// before the program (`fuzz_smoke` runs its corpus and mutations).
#[test]
fn report_page_target_smoke() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/report_page");
    let mut inputs: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert!(!inputs.is_empty());
    let mut state = 0x5eed_u64;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as u8
    };
    let alphabet = "<>&\"'/!-\u{1b}\u{2028}\u{2029}script\n é".as_bytes();
    for _ in 0..40 {
        let mut input: Vec<u8> = vec![next()];
        input.extend((0..40).map(|_| alphabet[usize::from(next()) % alphabet.len()]));
        input.push(0xff);
        input.extend((0..200).map(|_| next()));
        inputs.push(input);
    }
    for input in &inputs {
        if let Err(e) = allocsim_testgen::targets::report_page(input) {
            panic!("{e}\ninput: {input:?}");
        }
    }
}

/// Issue 50: `--fail-random nan`, `--device-free=-0.4` and `--fail-nth-malloc 0` were taken
/// and did nothing; 2^64 on a size flag became u64::MAX. Each is refused, saying what is taken.
#[test]
fn flags_out_of_their_range_are_refused() {
    let dir = scratch();
    let trace = snapshot(dir.path(), "t.pickle", frames("f", "f.py"), "", None);
    let trace = trace.to_str().unwrap();
    for (flag, expect) in [
        ("--fail-random=nan", "a probability from 0 to 1"),
        ("--fail-random=1.5", "a probability from 0 to 1"),
        ("--device-free=-0.4", "not a size in bytes"),
        ("--device-total=18446744073709551616", "not a size in bytes"),
        ("--device-total=16777216TiB", "not a size in bytes"),
        ("--fail-nth-malloc=0", "1 or more"),
    ] {
        let out = allocsim(&["replay", trace, flag]);
        let text = printed(&out);
        assert_eq!(out.status.code(), Some(2), "{flag}: {text}");
        assert!(text.contains(expect), "{flag}: {text}");
    }
}

/// Issue 50: a FIFO named `*.pickle` blocked forever (opening it waits for a writer). Every
/// reader refuses it by name, and a directory too.
#[test]
fn a_fifo_or_a_directory_is_refused_by_name() {
    let dir = scratch();
    let fifo = dir.path().join("t.pickle");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let folder = dir.path().join("d.allocsim");
    std::fs::create_dir(&folder).unwrap();
    for (path, kind) in [(&fifo, "a FIFO"), (&folder, "a directory")] {
        for command in ["info", "replay", "report"] {
            let mut child = Command::new(env!("CARGO_BIN_EXE_allocsim"))
                .args(
                    [command, path.to_str().unwrap(), "-o", "/dev/null"]
                        [..if command == "report" { 4 } else { 2 }]
                        .iter(),
                )
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let start = std::time::Instant::now();
            while child.try_wait().unwrap().is_none() {
                if start.elapsed() > std::time::Duration::from_secs(20) {
                    let _ = child.kill();
                    panic!("allocsim {command} {} still waits after 20 s", path.display());
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let out = child.wait_with_output().unwrap();
            let text = printed(&out);
            assert_eq!(out.status.code(), Some(1), "{command} {kind}: {text}");
            let name = path.file_name().unwrap().to_str().unwrap();
            let expect = format!("{name}: not a regular file ({kind})");
            assert!(text.contains(&expect), "{command} {kind}: {text}");
        }
    }
}
