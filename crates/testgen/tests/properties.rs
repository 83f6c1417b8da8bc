//! The property suites: generated programs under every oracle, for every policy
//! `allocsim_policies::names()` lists (a new policy is covered by being registered).
//!
//! Case counts are bounded so the whole file takes a minute or two in release (CI runs
//! `cargo test --workspace --release`); debug builds run fewer. A failure is shrunk, printed
//! as an op listing, and written under `target/.../tmp/testgen-failures/` with the command
//! that reproduces it.

use allocsim_testgen::oracles::{
    capture_replays_exactly, check_trace, compare_with_reference, formats, seed_applies,
    seeded_matches_full,
};
use allocsim_testgen::suite::Suite;
use allocsim_testgen::Limits;
use std::path::PathBuf;

/// Cases per policy and suite: release / debug.
const CASES: u32 = if cfg!(debug_assertions) { 16 } else { 2048 };
const STEPS: usize = 160;

fn suite(name: &'static str, cases: u32, limits: Limits) -> Suite {
    let failure_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("testgen-failures");
    Suite { name, cases, limits, failure_dir }
}

/// The checker, the op/event contract and `_check_memory_stat_consistency` after every op,
/// and a second run with a byte-identical event log, for every policy under its defaults and
/// its test settings; for `pytorch`, also the reference model wherever it applies.
#[test]
fn every_policy_passes_every_oracle() {
    let s = suite("oracles", CASES, Limits { max_steps: STEPS, ..Limits::default() });
    for spec in allocsim_policies::POLICIES.iter().flat_map(|p| p.test_specs()) {
        s.run(&spec, check_trace);
    }
}

/// The PyTorch policy against the reference model, event for event, on programs the model
/// follows in full (no expandable segments, only settings PyTorch accepts).
#[test]
fn pytorch_matches_the_reference_model() {
    if !allocsim_policies::names().contains(&"pytorch") {
        return;
    }
    suite("reference", CASES * 3, Limits::for_reference(STEPS))
        .run("pytorch", compare_with_reference);
}

/// The PyTorch policy seeded with a run's state halfway through its plain prefix (before any
/// settings, fraction or pool change) goes on exactly as the run did: the same events, the
/// same statistics at the end. Programs whose state a seed cannot carry (stream uses,
/// expandable segments, garbage collection) are skipped, and most programs are not.
#[test]
fn pytorch_seeded_from_a_runs_state_goes_on_as_the_run_did() {
    if !allocsim_policies::names().contains(&"pytorch") {
        return;
    }
    let (cases, applied) = (CASES, std::sync::atomic::AtomicU32::new(0));
    suite("seed", cases, Limits::for_reference(STEPS)).run("pytorch", |_, trace| {
        let plain = |op: &allocsim_core::Op| {
            use allocsim_core::Op::{Alloc, EmptyCache, FreeRequested};
            matches!(op, Alloc { .. } | FreeRequested { .. } | EmptyCache)
        };
        let k = trace.ops.iter().take_while(|op| plain(op)).count() / 2;
        if seed_applies(trace, k) && k > 0 {
            applied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        seeded_matches_full(trace, k)
    });
    let applied = applied.into_inner();
    assert!(applied > cases / 8, "the seed applied to only {applied} of {cases} programs");
}

/// CUDA graph trees' rounds (a graph's inputs in its pool in one context, the capture in
/// another) with `empty_cache()` calls between the two contexts or inside one, run under the
/// PyTorch policy and written as `allocsim.capture` writes a recording: the snapshot and its
/// sidecar (the calls by the allocations and frees before them, the statistics) convert back
/// to ops that replay every event and every statistic, `num_sync_all_streams` included (a call
/// between two contexts synchronizes, one inside does not).
#[test]
fn pytorch_replays_its_capture_of_calls_among_pool_contexts() {
    if !allocsim_policies::names().contains(&"pytorch") {
        return;
    }
    suite("capture", CASES / 2, Limits::default()).run_on(
        "pytorch",
        allocsim_testgen::strategy::graph_rounds(),
        capture_replays_exactly,
    );
}

/// Native binary and JSON round trips, and every policy's run exported as a PyTorch snapshot
/// and imported again.
#[test]
fn formats_round_trip() {
    let s = suite("formats", CASES / 2, Limits { max_steps: STEPS, ..Limits::default() });
    for policy in allocsim_policies::names() {
        s.run(policy, |policy, trace| {
            formats::roundtrip_native(trace)?;
            formats::roundtrip_snapshot(policy, trace)
        });
    }
}
