//! A recording of another PyTorch release than the clone's says so, once, through every
//! command that shows a trace's warnings.

use allocsim_trace::pickle::{self, Value};
use clap::Parser;
use std::path::{Path, PathBuf};

/// A snapshot of one allocation with a sidecar that says `torch` recorded it.
fn recording(dir: &Path, torch: &str) -> PathBuf {
    let entry = |action: &str| {
        Value::str_dict([
            ("action", Value::str(action)),
            ("addr", Value::Int(0x7000_0000)),
            ("size", Value::Int(if action == "alloc" { 512 } else { 2 << 20 })),
            ("stream", Value::Int(0)),
        ])
    };
    let snapshot = Value::str_dict([
        ("segments", Value::list(vec![])),
        (
            "device_traces",
            Value::list(vec![Value::list(vec![entry("segment_alloc"), entry("alloc")])]),
        ),
        ("allocator_settings", Value::str_dict([("PYTORCH_CUDA_ALLOC_CONF", Value::str(""))])),
    ]);
    let path = dir.join("run.pickle");
    std::fs::write(&path, pickle::to_vec(&snapshot).unwrap()).unwrap();
    let meta = serde_json::json!({ "meta": { "torch": torch, "total_memory": 80u64 << 30 } });
    std::fs::write(dir.join("run.json"), meta.to_string()).unwrap();
    path
}

fn times(text: &str) -> usize {
    text.matches("recorded with PyTorch").count()
}

#[derive(Parser)]
struct Replay {
    #[command(flatten)]
    args: allocsim::replay::Args,
}

#[derive(Parser)]
struct Fidelity {
    #[command(flatten)]
    args: allocsim::fidelity::Args,
}

/// Issue 49 item 4: `info`, `replay` and `fidelity` of a 2.13 recording say once that the
/// clone is 2.11 and name the changes between; of a 2.11 recording, nothing.
#[test]
fn a_recording_of_another_release_says_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let cx = allocsim::Context::default();
    for (torch, want) in [("2.13.0+cu130", 1), ("2.11.0+cu130", 0)] {
        let path = recording(dir.path(), torch);
        let trace = allocsim::load(&path, &cx.read).unwrap().trace;
        assert_eq!(times(&trace.warnings.join("\n")), want, "{torch}: {:?}", trace.warnings);
        let info = allocsim::info::run(
            &allocsim::info::Args { trace: path.clone(), more: Vec::new() },
            &cx,
        )
        .unwrap();
        let replay = Replay::parse_from(["replay", path.to_str().unwrap()]).args;
        let replay = allocsim::replay::run(&replay, &cx).unwrap();
        let fidelity = Fidelity::parse_from(["fidelity", path.to_str().unwrap()]).args;
        let fidelity = allocsim::fidelity::run(&fidelity, &cx).unwrap();
        for (command, text) in
            [("info", &info.text), ("replay", &replay.text), ("fidelity", &fidelity.text)]
        {
            assert_eq!(times(text), want, "{command} of {torch}:\n{text}");
            if want == 1 {
                assert!(
                    text.contains("throw_on_cudamalloc_oom")
                        && text.contains("pytorch/pytorch#179444"),
                    "{command}:\n{text}"
                );
            }
        }
    }
}
