//! Bugs this crate's generators and fuzz targets found in other crates, as the minimal
//! programs that showed them: regression tests once fixed, `#[ignore]`d while open (run those
//! with `cargo test -p allocsim-testgen --test known_bugs -- --ignored`).

use allocsim_core::{Op, Trace};
use allocsim_testgen::oracles::check_trace;
use allocsim_testgen::{DeviceSpec, Program, Step};
use std::path::Path;

fn one_alloc(size: u64) -> Program {
    Program {
        device: DeviceSpec { total_bytes: 1 << 30, free_bytes: 1 << 30 },
        alloc_conf: String::new(),
        memory_fraction: None,
        steps: vec![Step::Alloc { size, stream: 0 }],
        drain: false,
    }
}

/// `pytorch` (fixed): a request of 2^60 bytes or more got PyTorch's "more than 1EB" refusal as an
/// `Oom` event, but `num_ooms` stays 0, so the checker reports
/// `stat-mismatch: num_ooms: events imply 1, allocator reports 0`.
#[test]
fn pytorch_counts_the_oom_it_reports_for_an_exabyte_request() {
    let r = check_trace("pytorch", &one_alloc(1 << 60).trace());
    assert!(r.is_ok(), "{}", r.unwrap_err());
}

/// `uncached` (fixed): rounding `size.div_ceil(512) * 512` overflowed for sizes within 512 bytes of
/// `u64::MAX` (a panic in debug builds, a wrapped size in release).
#[test]
fn uncached_refuses_a_request_near_u64_max() {
    let r = check_trace("uncached", &one_alloc(u64::MAX).trace());
    assert!(r.is_ok(), "{}", r.unwrap_err());
}

/// `allocsim-trace` native JSON (fixed): a memory fraction written as `2.1805410472768694e-289`
/// (the shortest form that reads back exactly) read back as `2.18054104727687e-289`, one ULP
/// off: serde_json parses floats exactly only with its `float_roundtrip` feature, now on.
/// Found by the `native_decode` fuzz target.
#[test]
fn native_json_gives_back_every_float() {
    let fraction = 2.1805410472768694e-289;
    let trace = Trace { ops: vec![Op::SetMemoryFraction { fraction }], ..Trace::default() };
    let mut json = Vec::new();
    allocsim_trace::native::write_native_json(&trace, &mut json, Path::new("<memory>")).unwrap();
    let back = allocsim_testgen::oracles::formats::read_native_json_bytes(&json).unwrap();
    assert_eq!(back.ops, trace.ops, "{}", String::from_utf8_lossy(&json));
}

/// `allocsim-trace` snapshots (fixed): a simulated run with a request above 2^62 bytes
/// (recorded as an `oom` entry of that size) was written without complaint, and the same
/// crate's reader then refused the file. The writer now refuses such sizes itself, naming them.
/// Found by the `formats` property suite.
#[test]
fn a_snapshot_we_write_reads_back() {
    let mut program = one_alloc(5_057_416_258_585_344_512);
    program.device.total_bytes = 64 << 20;
    program.device.free_bytes = 64 << 20;
    let trace = program.trace();
    let mut recorder = allocsim_replay::Recorder::default();
    let opts = allocsim_testgen::oracles::run_options("pytorch");
    allocsim_run::run_trace(&trace, &opts, &mut [&mut recorder], |_| {}).unwrap();
    let run = Trace { ops: trace.ops.clone(), recorded: recorder.events, ..Trace::default() };
    let mut bytes = Vec::new();
    let written =
        allocsim_trace::pytorch::write_snapshot(&run, &mut bytes, false, Path::new("<memory>"));
    if let Err(e) = written {
        assert!(e.to_string().contains("larger than 2^62"), "{e}");
        return;
    }
    let root = allocsim_trace::pickle::from_slice(&bytes).unwrap();
    let back = allocsim_trace::pytorch::snapshot_to_trace(&root, Path::new("<memory>"), true);
    assert!(back.is_ok(), "{}", back.unwrap_err());
}
