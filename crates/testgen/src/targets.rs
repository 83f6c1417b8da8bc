//! The fuzz targets' bodies, here so that `fuzz/` is glue and `cargo test` runs the same
//! oracles as smoke tests (`tests/fuzz_smoke.rs`). Each takes the fuzzer's bytes; `Err` is a
//! finding, and a panic is one too.

use crate::oracles::{check_trace, formats, Failure};
use crate::swarm::{from_bytes, Limits};

/// The policy an input exercises: its first byte picks one from `allocsim_policies::names()`,
/// so every execution runs one policy and the fuzzer's coverage covers them all.
pub fn policy_for(data: &[u8]) -> &'static str {
    let names = allocsim_policies::names();
    names[usize::from(data.first().copied().unwrap_or(0)) % names.len()]
}

/// Limits for fuzzed programs: short, so one execution stays in the milliseconds.
pub const FUZZ_LIMITS: Limits =
    Limits { max_steps: 64, expandable: true, invalid_settings: true, absurd_sizes: true };

/// `program`: bytes → a program ([`crate::swarm::from_bytes`]) → every oracle for one policy,
/// plus the native round trip of its trace.
pub fn program(data: &[u8]) -> Result<(), Failure> {
    let policy = policy_for(data);
    let program = from_bytes(data.get(1..).unwrap_or(&[]), &FUZZ_LIMITS);
    let trace = program.trace();
    check_trace(policy, &trace).map_err(|f| with_listing(f, &program))?;
    formats::roundtrip_native(&trace)
}

fn with_listing(mut f: Failure, program: &crate::Program) -> Failure {
    f.message = format!("{}\nprogram:\n{program}", f.message);
    f
}

/// `snapshot_import`: bytes as a PyTorch snapshot pickle.
pub fn snapshot_import(data: &[u8]) -> Result<(), Failure> {
    formats::decode_snapshot(data, "pytorch")
}

/// `snapshot_file`: bytes as a snapshot file, plain and gzipped, read as the CLI reads it.
pub fn snapshot_file(data: &[u8]) -> Result<(), Failure> {
    formats::decode_snapshot_file(data, "pytorch")
}

/// `rmm_import`: bytes as an RMM log.
pub fn rmm_import(data: &[u8]) -> Result<(), Failure> {
    formats::decode_rmm(data, policy_for(data))
}

/// `native_decode`: bytes as a native binary trace, and as a native JSON trace.
pub fn native_decode(data: &[u8]) -> Result<(), Failure> {
    formats::decode_native(data, "pytorch")?;
    formats::decode_native_json(data, "pytorch")
}

/// `snapshot_gzip`: bytes as a gzip stream, and gzipped then damaged (truncated, flipped,
/// cut short, followed by part of itself), read as the CLI reads a `.pickle.gz`.
pub fn snapshot_gzip(data: &[u8]) -> Result<(), Failure> {
    formats::decode_snapshot_gzip(data, "pytorch")
}

/// `alloc_conf`: bytes as a policy (first byte) and its settings string
/// ([`crate::oracles::writers::settings`]).
pub fn alloc_conf(data: &[u8]) -> Result<(), Failure> {
    crate::oracles::writers::settings(data)
}

/// `writers`: bytes as a program with strings, through every file writer and back
/// ([`crate::oracles::writers::writers`]); the first byte picks the policy.
pub fn writers(data: &[u8]) -> Result<(), Failure> {
    crate::oracles::writers::writers(data.get(1..).unwrap_or(&[]), policy_for(data))
}

/// A fuzz target's body.
pub type Target = fn(&[u8]) -> Result<(), Failure>;

/// Every target by its `fuzz/fuzz_targets/` name.
pub const TARGETS: [(&str, Target); 9] = [
    ("program", program),
    ("snapshot_import", snapshot_import),
    ("snapshot_file", snapshot_file),
    ("rmm_import", rmm_import),
    ("native_decode", native_decode),
    ("snapshot_gzip", snapshot_gzip),
    ("alloc_conf", alloc_conf),
    ("writers", writers),
    ("report_page", report_page),
];

/// The `report_page` fuzz target's body: `data` as the `writers` target reads it (the first
/// byte picks the policy, then lines of text and a program:
/// [`crate::oracles::writers::trace_with_strings`]), its first line also the title, through
/// [`allocsim::page_reads_back`].
pub fn report_page(data: &[u8]) -> Result<(), Failure> {
    let policy = policy_for(data);
    let rest = data.get(1..).unwrap_or(&[]);
    let trace = crate::oracles::writers::trace_with_strings(rest);
    let title = trace.warnings.first().cloned().unwrap_or_default();
    allocsim::page_reads_back(&trace, &title, policy).map_err(|message| Failure {
        oracle: crate::oracles::Oracle::RoundTrip,
        policy: policy.to_string(),
        op_index: None,
        message,
    })
}
