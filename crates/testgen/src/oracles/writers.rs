//! Writers, read back, and the settings parsers, for the fuzz targets `writers`,
//! `alloc_conf` and `snapshot_gzip` (issue 50: none of them was fuzzed).
//!
//! - [`writers`]: a generated program whose stacks, annotations and warnings are the input's
//!   text, written by every file writer (`write_trace` to each extension, the snapshot of a
//!   run, the event log) and read back: the native files give back every field, the
//!   snapshot gives back its entries and nothing it was not given, and the event log file
//!   holds the run's events line for line.
//! - [`settings`]: any settings string under any policy is taken or refused by a message
//!   that quotes a few hundred bytes of it at most, with no control character; a string that
//!   is taken runs a program under every oracle of the checked run.
//! - [`formats::decode_snapshot_gzip`](super::formats::decode_snapshot_gzip): corrupt gzip.

use super::failure::{Failure, Oracle};
use super::formats::same_trace;
use super::run::{checked_run, observed_run};
use crate::swarm::{from_bytes, Limits};
use allocsim_core::{Annotation, Stack, StackFrame, Trace};
use allocsim_replay::{EventLog, Recorder};
use allocsim_trace::{read_trace_with, write_trace, ReadOptions};
use std::path::{Path, PathBuf};

/// Programs for these targets: short, since each input is written to five files.
const LIMITS: Limits =
    Limits { max_steps: 48, expandable: true, invalid_settings: false, absurd_sizes: false };

fn fail(policy: &str, message: String) -> Failure {
    Failure::new(Oracle::RoundTrip, policy, None, message)
}

/// The input split at its first `0xff`: the text before it (its lines become stacks,
/// annotations and warnings), and the program's bytes after it.
pub fn trace_with_strings(data: &[u8]) -> Trace {
    let cut = data.iter().position(|&b| b == 0xff).unwrap_or(data.len().min(64));
    let text = String::from_utf8_lossy(&data[..cut]);
    let mut trace = from_bytes(data.get(cut + 1..).unwrap_or(&[]), &LIMITS).trace();
    let strings: Vec<&str> = text.split('\n').take(8).collect();
    trace.stacks = strings
        .iter()
        .enumerate()
        .map(|(i, s)| Stack {
            frames: vec![StackFrame { name: s.to_string(), filename: s.repeat(2), line: i as u32 }],
        })
        .collect();
    trace.annotations = strings
        .iter()
        .map(|s| Annotation { compile_context: s.to_string(), user_metadata: s.to_string() })
        .collect();
    let n = strings.len() as u64;
    let ops = trace.ops.len() as u64;
    trace.op_stacks = (0..ops).map(|op| (op, (op % n) as u32)).collect();
    trace.op_annotations =
        (0..ops).filter(|op| op % 3 == 0).map(|op| (op, (op % n) as u32)).collect();
    trace.warnings = strings.iter().map(|s| s.to_string()).collect();
    trace
}

/// A folder of this process and thread's own, for one input's files.
fn scratch(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "allocsim-fuzz-{what}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ))
}

fn read(path: &Path) -> Result<Trace, String> {
    let opts = ReadOptions { sidecar: false, ..ReadOptions::default() };
    read_trace_with(path, &opts).map_err(|e| e.to_string())
}

/// The `writers` target: `data` as [`trace_with_strings`], through every writer and back.
pub fn writers(data: &[u8], policy: &str) -> Result<(), Failure> {
    let trace = trace_with_strings(data);
    let dir = scratch("writers");
    let io = |e: std::io::Error| fail(policy, format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(&dir).map_err(io)?;
    let result = write_and_read(&trace, policy, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn write_and_read(trace: &Trace, policy: &str, dir: &Path) -> Result<(), Failure> {
    // The native files: every field back.
    for name in ["t.allocsim", "t.allocsim.json"] {
        let path = dir.join(name);
        write_trace(trace, &path).map_err(|e| fail(policy, format!("writing {name}: {e}")))?;
        let back = read(&path).map_err(|e| fail(policy, format!("reading {name} back: {e}")))?;
        same_trace(trace, &back).map_err(|e| fail(policy, format!("{name}: {e}")))?;
    }
    // The run as a snapshot: its entries back, and no stack or annotation it was not given.
    let mut recorder = Recorder::default();
    observed_run(policy, trace, &mut recorder)?;
    let run = Trace { recorded: recorder.events, ..trace.clone() };
    for name in ["t.pickle", "t.pickle.gz"] {
        let path = dir.join(name);
        if let Err(e) = write_trace(&run, &path) {
            // Sizes over 2^62 are refused by name: nothing to read back.
            let big = run.recorded.iter().any(|r| r.size > super::formats::SNAPSHOT_MAX_BYTES);
            if big {
                return Ok(());
            }
            return Err(fail(policy, format!("writing {name}: {e}")));
        }
        let back = read(&path).map_err(|e| fail(policy, format!("reading {name} back: {e}")))?;
        let entries = |t: &Trace| -> Vec<_> {
            t.recorded.iter().map(|e| (e.kind.action(), e.addr, e.size, e.stream.0)).collect()
        };
        if entries(&run) != entries(&back) {
            return Err(fail(policy, format!("{name}: the entries read back differ")));
        }
        if let Some(s) = back.stacks.iter().find(|s| !run.stacks.contains(s)) {
            return Err(fail(policy, format!("{name}: a stack it was not given: {s:?}")));
        }
        if let Some(a) = back.annotations.iter().find(|a| !run.annotations.contains(a)) {
            return Err(fail(policy, format!("{name}: an annotation it was not given: {a:?}")));
        }
    }
    event_log_reads_back(trace, policy, dir)
}

/// The event log written to a file (as `replay --event-log` writes it) is the log of the
/// same run kept in memory, its events numbered from 0 in order.
fn event_log_reads_back(trace: &Trace, policy: &str, dir: &Path) -> Result<(), Failure> {
    let in_memory = checked_run(policy, trace)?;
    let path = dir.join("events.log");
    let file = allocsim_trace::atomic::AtomicFile::create(&path)
        .map_err(|e| fail(policy, format!("creating the event log: {e}")))?;
    let mut log = EventLog::new(std::io::BufWriter::new(file));
    observed_run(policy, trace, &mut log)?;
    let file = log.finish().map_err(|e| fail(policy, format!("writing the event log: {e}")))?;
    let file = file.into_inner().map_err(|e| fail(policy, format!("event log: {e}")))?;
    file.commit().map_err(|e| fail(policy, format!("committing the event log: {e}")))?;
    let back = std::fs::read(&path).map_err(|e| fail(policy, format!("event log: {e}")))?;
    if back != in_memory {
        return Err(fail(policy, "the event log file is not the run's log".into()));
    }
    let text = String::from_utf8(back).map_err(|e| fail(policy, format!("event log: {e}")))?;
    for (i, line) in text.lines().enumerate() {
        if line.split(' ').next() != Some(&i.to_string()) {
            return Err(fail(policy, format!("event log line {i} is {line:?}")));
        }
    }
    Ok(())
}

/// What a settings message may hold: a few hundred bytes of the input in each of a few
/// quotes, the message's own words, the policy's known settings.
pub const MAX_SETTINGS_MESSAGE_BYTES: usize = 1500;

/// The `alloc_conf` target: the first byte picks a policy, the text up to the first `0xff`
/// is its settings string, the rest a program run under it when the policy takes it.
pub fn settings(data: &[u8]) -> Result<(), Failure> {
    let policy = crate::targets::policy_for(data);
    let rest = data.get(1..).unwrap_or(&[]);
    let cut = rest.iter().position(|&b| b == 0xff).unwrap_or(rest.len());
    let conf = String::from_utf8_lossy(&rest[..cut]);
    let problem = |m: String| Err(Failure::new(Oracle::Setup, policy, None, m));
    match allocsim_policies::by_name(policy, Some(&conf)) {
        Err(e) => {
            if e.0.len() > MAX_SETTINGS_MESSAGE_BYTES {
                return problem(format!("a message of {} bytes: {:.400}", e.0.len(), e.0));
            }
            if let Some(c) = e.0.chars().find(|&c| c.is_control() && c != '\n') {
                return problem(format!("a raw {c:?} in the message {:?}", e.0));
            }
            Ok(())
        }
        Ok(_) => {
            let program = from_bytes(rest.get(cut + 1..).unwrap_or(&[]), &LIMITS);
            let spec = format!("{policy}[{conf}]");
            match checked_run(&spec, &program.trace()) {
                // A setting refused only on a device of the program's size is no finding.
                Err(f) if f.oracle == Oracle::Setup => Ok(()),
                Err(f) => Err(f),
                Ok(_) => Ok(()),
            }
        }
    }
}
