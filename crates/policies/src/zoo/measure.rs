//! Every policy on the bundled H100 recordings: peak reserved, the smallest device that runs
//! the trace without OOM, device calls and time. Ignored by default (minutes in release):
//! `cargo test --release -p allocsim-policies --lib zoo::measure -- --ignored --nocapture`.
//!
//! The run loop is the replay engine's contract in miniature: ops of failed allocations are
//! skipped, the trace's memory fraction applies from the start, settings strings (PyTorch's
//! syntax) go to `pytorch` only, and the device is the modelled H100 (`allocsim-sim`).

use allocsim_check::{CheckConfig, Checker};
use allocsim_core::{AllocId, Allocator, Device, Env, Event, Op, Trace, GIB, MIB};
use allocsim_sim::{SimConfig, SimDevice, H100_FREE_AT_START_BYTES, H100_TOTAL_BYTES};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const TRACES: [&str; 13] = [
    "gpt2_train",
    "resnet50_train",
    "varlen_train",
    "varlen_train_expandable",
    "synthetic_default",
    "synthetic_maxsplit",
    "synthetic_multistream",
    "synthetic_roundup",
    "synthetic_gc",
    "synthetic_oom",
    // Held out: recorded after allocsim's settings were chosen.
    "llama_generate_varlen",
    "varlen_train_tuned",
    "synthetic_expandable",
];

/// A policy and its settings; `{free}` in a setting stands for the device's free bytes.
const POLICIES: [(&str, &str, Option<&str>); 12] = [
    ("pytorch", "pytorch", None),
    ("pytorch+expandable", "pytorch", Some("expandable_segments:True")),
    ("uncached", "uncached", Some("")),
    ("bfc", "bfc", Some("")),
    ("rmm_pool", "rmm_pool", Some("")),
    ("rmm_arena", "rmm_arena", Some("")),
    ("rmm_arena(all)", "rmm_arena", Some("arena_size:{free}")),
    ("rmm_binning", "rmm_binning", Some("")),
    ("async_pool", "async_pool", Some("")),
    ("buddy", "buddy", Some("")),
    ("tlsf", "tlsf", Some("")),
    ("allocsim", "allocsim", Some("")),
];

/// The bundled trace `name`, from either recording set; `ZOO_TRACE_ROOT` overrides where the
/// sets are (for a test binary run from another checkout).
fn trace_path(name: &str) -> PathBuf {
    let root = std::env::var_os("ZOO_TRACE_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces"));
    let file = format!("{name}.pickle.gz");
    let first = root.join("pytorch-2.11-h100").join(&file);
    if first.exists() {
        first
    } else {
        root.join("pytorch-2.11-h100-extra").join(file)
    }
}

#[derive(Debug, Clone, Default)]
struct Run {
    peak_reserved: u64,
    /// Peak of what the device holds: segments rounded up to 2 MiB pages, mapped pages.
    device_peak: u64,
    ooms: u64,
    /// Bytes of the requests that succeeded.
    served: u64,
    device_calls: u64,
    device_time: Duration,
    policy_time: Duration,
    syncs: i64,
    /// What `allocsim-check` found, when asked to check.
    violations: u64,
    first_violation: Option<String>,
}

fn build(policy: &str, conf: Option<&str>, trace: &Trace, free: u64) -> Box<dyn Allocator> {
    let conf = match conf {
        // All free memory in whole 2 MiB pages: the device counts whole pages.
        Some(c) => c.replace("{free}", &(free / (2 * MIB) * (2 * MIB)).to_string()),
        None => trace.meta.alloc_conf.clone().unwrap_or_default(),
    };
    crate::by_name(policy, Some(&conf)).expect("policy settings")
}

/// Replay `trace` under `policy` on an H100 model with `free` bytes free at start.
fn run(trace: &Trace, policy: &str, conf: Option<&str>, free: u64, fraction: bool) -> Run {
    run_checked(trace, policy, conf, free, fraction, false)
}

/// `run`, with `allocsim-check` watching every event and the stats after every op if `check`.
fn run_checked(
    trace: &Trace,
    policy: &str,
    conf: Option<&str>,
    free: u64,
    fraction: bool,
    check: bool,
) -> Run {
    let mut alloc = build(policy, conf, trace, free);
    let mut checker = check.then(|| {
        let align = if policy == "pytorch" { 512 } else { 256 };
        Checker::new(CheckConfig { alignment_bytes: align, ..CheckConfig::new(H100_TOTAL_BYTES) })
    });
    let mut event_index = 0u64;
    let cfg = SimConfig {
        total_bytes: H100_TOTAL_BYTES.max(free),
        free_bytes: free,
        ..SimConfig::default()
    };
    let mut device = SimDevice::new(cfg);
    let mut events = Vec::with_capacity(1 << 16);
    let mut live: HashSet<AllocId> = HashSet::new();
    let mut out = Run::default();
    let started = Instant::now();
    for (i, op) in trace.ops.iter().enumerate() {
        device.begin_op(i as u64);
        let mut env = Env::new(&mut device, &mut events);
        if i == 0 && fraction {
            if let Some(f) = trace.meta.memory_fraction {
                alloc.set_memory_fraction(&mut env, f).expect("fraction");
            }
        }
        match op {
            Op::Alloc { id, size, stream } | Op::AllocAt { id, size, stream, .. }
                if !live.contains(id) =>
            {
                match alloc.malloc(&mut env, *id, *size, *stream) {
                    Ok(_) => {
                        live.insert(*id);
                        out.served += size;
                    }
                    Err(_) => out.ooms += 1,
                }
            }
            Op::FreeRequested { id } if live.contains(id) => alloc.free(&mut env, *id),
            Op::FreeCompleted { id } if live.contains(id) => alloc.free_completed(&mut env, *id),
            Op::RecordStream { id, stream } if live.contains(id) => {
                alloc.record_stream(*id, *stream)
            }
            Op::EmptyCache => alloc.empty_cache(&mut env),
            Op::SetMemoryFraction { fraction: f } if fraction => {
                let _ = alloc.set_memory_fraction(&mut env, *f);
            }
            Op::SetAllocatorSettings { conf } if policy == "pytorch" => {
                let _ = alloc.set_settings(conf);
            }
            _ => {}
        }
        for e in &events {
            if let Event::FreeCompleted { id, .. } = e {
                live.remove(id);
            }
            if let Some(c) = checker.as_mut() {
                c.on_event(event_index, i as u64, e);
            }
            event_index += 1;
        }
        if let Some(c) = checker.as_mut() {
            c.on_stats(event_index, i as u64, &alloc.stats());
        }
        out.device_peak = out.device_peak.max(device.reserved_bytes());
        events.clear();
    }
    out.policy_time = started.elapsed();
    let stats = alloc.stats();
    out.peak_reserved = stats.reserved_bytes.all.peak as u64;
    out.syncs = stats.num_sync_all_streams;
    out.device_calls = device.calls().total_calls();
    out.device_time = Duration::from_nanos(device.calls().total_time_ns());
    if let Some(c) = checker {
        let report = c.finish();
        out.violations = report.total_violations();
        out.first_violation = report.violations().first().map(|v| v.to_string());
    }
    out
}

/// The smallest free memory (to a 2 MiB page) on which `policy` runs `trace` without OOM, if
/// the whole H100 does.
fn min_capacity(trace: &Trace, policy: &str, conf: Option<&str>) -> Option<u64> {
    const STEP: u64 = 2 * MIB;
    let fits = |free: u64| run(trace, policy, conf, free, false).ooms == 0;
    if !fits(H100_FREE_AT_START_BYTES) {
        return None;
    }
    let (mut lo, mut hi) = (0u64, H100_FREE_AT_START_BYTES.div_ceil(STEP));
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if fits(mid * STEP) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi * STEP)
}

/// Peak of the live requested bytes if every allocation succeeds: no policy can do better.
fn live_peak(trace: &Trace) -> u64 {
    let mut sizes = std::collections::HashMap::new();
    let (mut live, mut peak) = (0u64, 0u64);
    for op in &trace.ops {
        match op {
            Op::Alloc { id, size, .. } | Op::AllocAt { id, size, .. } => {
                sizes.insert(*id, *size);
                live += size;
                peak = peak.max(live);
            }
            Op::FreeRequested { id } => live -= sizes.remove(id).unwrap_or(0),
            _ => {}
        }
    }
    peak
}

fn gib(bytes: u64) -> String {
    format!("{:.3}", bytes as f64 / GIB as f64)
}

fn load(name: &str) -> Trace {
    allocsim_trace::read_trace(trace_path(name)).expect("bundled trace")
}

/// Peak reserved, device footprint, OOMs, device calls and times under each trace's own
/// fraction (OOMs are part of `synthetic_default`, `_gc` and `_oom`).
#[test]
#[ignore]
fn peak_reserved_per_trace() {
    println!("trace | policy | peak reserved GiB | device peak GiB | OOMs | served GiB | device calls | device ms | policy ms | syncs");
    for name in TRACES {
        let trace = load(name);
        println!("{name} | live peak | {} | | | | | |", gib(live_peak(&trace)));
        for (label, policy, conf) in POLICIES {
            let r = run(&trace, policy, conf, H100_FREE_AT_START_BYTES, true);
            println!(
                "{name} | {label} | {} | {} | {} | {:.1} | {} | {:.1} | {:.1} | {}",
                gib(r.peak_reserved),
                gib(r.device_peak),
                r.ooms,
                r.served as f64 / GIB as f64,
                r.device_calls,
                r.device_time.as_secs_f64() * 1e3,
                r.policy_time.as_secs_f64() * 1e3,
                r.syncs
            );
        }
    }
}

/// The smallest H100 (free memory, 2 MiB steps) each policy runs each trace on without OOM.
#[test]
#[ignore]
fn minimum_feasible_capacity() {
    println!("trace | live peak GiB | {}", POLICIES.map(|p| p.0).join(" | "));
    for name in TRACES.iter().filter(|n| !matches!(**n, "synthetic_gc" | "synthetic_oom")) {
        let trace = load(name);
        let caps: Vec<String> = POLICIES
            .iter()
            .map(|&(_, policy, conf)| min_capacity(&trace, policy, conf).map_or("-".into(), gib))
            .collect();
        println!("{name} | {} | {}", gib(live_peak(&trace)), caps.join(" | "));
    }
}

/// Variants of one policy on the traces that fit: for tuning.
#[test]
#[ignore]
fn variants() {
    let policy = std::env::var("ZOO_POLICY").unwrap_or_else(|_| "allocsim".into());
    let confs = std::env::var("ZOO_CONFS").unwrap_or_default();
    println!("trace | conf | peak reserved GiB | device calls | device ms | policy ms | syncs");
    let only = std::env::var("ZOO_TRACES").unwrap_or_default();
    let wanted = |n: &str| only.is_empty() || only.split(',').any(|o| o == n);
    for name in TRACES.iter().filter(|n| {
        wanted(n)
            && !n.starts_with("synthetic_default")
            && !n.ends_with("gc")
            && !n.ends_with("oom")
    }) {
        let trace = load(name);
        for conf in confs.split(';') {
            let r = run(&trace, &policy, Some(conf), H100_FREE_AT_START_BYTES, true);
            println!(
                "{name} | {conf} | {} | {} | {:.1} | {:.1} | {}",
                gib(r.peak_reserved),
                r.device_calls,
                r.device_time.as_secs_f64() * 1e3,
                r.policy_time.as_secs_f64() * 1e3,
                r.syncs
            );
        }
    }
}

/// Where in a trace a policy's device calls happen: maps/unmaps (or mallocs/frees) per tenth.
#[test]
#[ignore]
fn call_timeline() {
    let policy = std::env::var("ZOO_POLICY").unwrap_or_else(|_| "allocsim".into());
    let conf = std::env::var("ZOO_CONF").unwrap_or_default();
    let name = std::env::var("ZOO_TRACE").unwrap_or_else(|_| "gpt2_train".into());
    let trace = load(&name);
    let mut alloc = build(&policy, Some(&conf), &trace, H100_FREE_AT_START_BYTES);
    let mut device = SimDevice::new(SimConfig::default());
    let mut events = Vec::new();
    let mut live: HashSet<AllocId> = HashSet::new();
    let n = trace.ops.len();
    let mut buckets = [(0u32, 0u32, 0u64); 20];
    for (i, op) in trace.ops.iter().enumerate() {
        let mut env = Env::new(&mut device, &mut events);
        match op {
            Op::Alloc { id, size, stream } | Op::AllocAt { id, size, stream, .. } => {
                let granted = alloc.malloc(&mut env, *id, *size, *stream).is_ok();
                if granted {
                    live.insert(*id);
                }
            }
            Op::FreeRequested { id } if live.contains(id) => alloc.free(&mut env, *id),
            Op::FreeCompleted { id } if live.contains(id) => alloc.free_completed(&mut env, *id),
            Op::RecordStream { id, stream } if live.contains(id) => {
                alloc.record_stream(*id, *stream)
            }
            Op::EmptyCache => alloc.empty_cache(&mut env),
            _ => {}
        }
        let b = &mut buckets[i * 20 / n];
        for e in events.drain(..) {
            match e {
                Event::SegmentAlloc { size, .. } | Event::SegmentMap { size, .. } => {
                    b.0 += 1;
                    b.2 += size;
                }
                Event::SegmentFree { .. } | Event::SegmentUnmap { .. } => b.1 += 1,
                Event::FreeCompleted { id, .. } => {
                    live.remove(&id);
                }
                _ => {}
            }
        }
    }
    for (i, (a, f, bytes)) in buckets.iter().enumerate() {
        println!("{name} {policy} {conf} | {:>3}% | +{a} -{f} | mapped {} MiB", i * 5, bytes >> 20);
    }
}

/// Every zoo policy on every bundled trace under `allocsim-check`: no violation anywhere.
#[test]
#[ignore]
fn real_traces_pass_the_checker() {
    let mut failures = Vec::new();
    for name in TRACES {
        let trace = load(name);
        for (label, policy, conf) in POLICIES.iter().filter(|p| p.1 != "pytorch") {
            let r = run_checked(&trace, policy, *conf, H100_FREE_AT_START_BYTES, true, true);
            if r.violations > 0 {
                failures.push(format!(
                    "{name} {label}: {} violations, first: {:?}",
                    r.violations, r.first_violation
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
