//! Running a trace under the oracles: the checker and the op contract in one run, the same run
//! again for determinism, and for `pytorch` the reference model in lockstep.

use super::contract::Contract;
use super::differential::compare_with_reference;
use super::failure::{Failure, Oracle};
use allocsim_check::{CheckConfig, Checker};
use allocsim_core::Trace;
use allocsim_replay::{CheckObserver, EventLog, Observer};
use allocsim_run::{run_trace, DeviceChoice, RunOptions, H100_TOTAL_BYTES};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The options every oracle run uses: the modelled device (generated traces have no
/// recording), the checker on, seed 0; `policy` is `NAME` or `NAME[SETTINGS]`. The same as
/// `allocsim replay FILE --policy NAME [--alloc-conf SETTINGS] --check`.
pub fn run_options(policy: &str) -> RunOptions {
    let base = RunOptions { device: DeviceChoice::Sim, check: true, ..RunOptions::default() };
    allocsim_run::column_options(policy, &base)
}

/// The checker as `run_trace` configures it for `--check`: the trace's device, the policy's
/// own alignment.
fn checker_for(policy: &str, trace: &Trace) -> Checker {
    let (name, conf) = allocsim_policies::parse_spec(policy);
    let recorded = (name == "pytorch").then_some(trace.meta.alloc_conf.as_deref()).flatten();
    let alignment_bytes = allocsim_policies::by_name(name, Some(conf.or(recorded).unwrap_or("")))
        .map_or(CheckConfig::default().alignment_bytes, |a| a.block_alignment());
    let device_total_bytes = trace.meta.device_total_bytes.unwrap_or(H100_TOTAL_BYTES);
    Checker::new(CheckConfig { device_total_bytes, alignment_bytes, ..CheckConfig::default() })
}

/// Run `trace` under `policy` with the checker and the op contract (both stop the run at
/// their first finding) and `extra` watching too.
pub fn observed_run(policy: &str, trace: &Trace, extra: &mut dyn Observer) -> Result<(), Failure> {
    let mut checker = CheckObserver::stopping(checker_for(policy, trace));
    let mut contract = Contract::new(policy);
    let opts = RunOptions { check: false, ..run_options(policy) };
    run_trace(trace, &opts, &mut [&mut checker, &mut contract, extra], |_| {})
        .map_err(|e| Failure::new(Oracle::Setup, policy, None, e.to_string()))?;
    let check = checker.checker.finish();
    if let Some(first) = check.violations.first() {
        return Err(Failure::new(Oracle::Checker, policy, Some(first.op_index), first.to_string()));
    }
    if let Some((op, message)) = contract.finish() {
        return Err(Failure::new(Oracle::Contract, policy, Some(op), message));
    }
    Ok(())
}

/// Run `trace` under `policy` with the checker and the op contract; the event log on success.
pub fn checked_run(policy: &str, trace: &Trace) -> Result<Vec<u8>, Failure> {
    let mut log = EventLog::new(Vec::new());
    observed_run(policy, trace, &mut log)?;
    log.finish().map_err(|e| Failure::new(Oracle::Determinism, policy, None, e.to_string()))
}

/// Run `trace` again and compare its event log with `first`, byte for byte.
pub fn determinism(policy: &str, trace: &Trace, first: &[u8]) -> Result<(), Failure> {
    let mut log = EventLog::new(Vec::new());
    let opts = RunOptions { check: false, ..run_options(policy) };
    run_trace(trace, &opts, &mut [&mut log], |_| {})
        .map_err(|e| Failure::new(Oracle::Setup, policy, None, e.to_string()))?;
    let second =
        log.finish().map_err(|e| Failure::new(Oracle::Determinism, policy, None, e.to_string()))?;
    if second == first {
        return Ok(());
    }
    let a = String::from_utf8_lossy(first);
    let b = String::from_utf8_lossy(&second);
    let (line, (x, y)) = a
        .lines()
        .chain(std::iter::repeat("<end>"))
        .zip(b.lines().chain(std::iter::repeat("<end>")))
        .enumerate()
        .find(|(_, (x, y))| x != y)
        .unwrap_or((0, ("", "")));
    Err(Failure::new(
        Oracle::Determinism,
        policy,
        None,
        format!("event logs differ at line {line}: first run {x:?}, second run {y:?}"),
    ))
}

/// Every oracle that applies to `policy`: checker and contract, determinism, and for
/// `pytorch` the reference model. Panics propagate (proptest and fuzzers want them).
pub fn check_trace(policy: &str, trace: &Trace) -> Result<(), Failure> {
    let log = checked_run(policy, trace)?;
    determinism(policy, trace, &log)?;
    if policy == "pytorch" {
        compare_with_reference(policy, trace)?;
    }
    Ok(())
}

/// [`check_trace`] with a panic turned into a [`Failure`] (for `allocsim fuzz`, which goes
/// on to print the reproducing command).
pub fn check_trace_catching(policy: &str, trace: &Trace) -> Result<(), Failure> {
    match catch_unwind(AssertUnwindSafe(|| check_trace(policy, trace))) {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into());
            Err(Failure::new(Oracle::Panic, policy, None, message))
        }
    }
}
