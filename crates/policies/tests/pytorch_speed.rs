//! A speed probe, not a test: replays bundled recordings through the PyTorch clone on a device
//! that never refuses and prints ops per second of wall and of on-CPU time. Ignored by default
//! and asserts nothing (timings are not correctness); criterion benchmarks carry speed claims.
//!
//! `cargo test --release -p allocsim-policies --test pytorch_speed -- --ignored --nocapture`
//! Environment: `ONLY=<trace>`, `REPS=<n>` (default 50), `KEEP_EVENTS=1` to let the event log
//! grow over a whole replay as an engine's would (by default it is cleared after every op, to
//! time the policy alone). `TRACES_DIR` overrides where the recordings are.

use allocsim_core::{Allocator, CallKind, Device, DeviceCalls, DeviceError, Env, MemInfo, Op};
use allocsim_policies::pytorch::PyTorchAllocator;
use std::time::Instant;

/// Hands out fresh addresses upwards and never refuses; costs nothing.
#[derive(Debug, Default)]
struct Bump {
    next: u64,
    calls: DeviceCalls,
}

impl Bump {
    fn take(&mut self, size: u64) -> u64 {
        let addr = (1 << 40) + self.next;
        self.next += size.div_ceil(2 << 20) * (2 << 20);
        addr
    }
}

impl Device for Bump {
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.calls.record(CallKind::Malloc, true, 0);
        Ok(self.take(size))
    }
    fn free(&mut self, _: u64, _: u64) {}
    fn reserve_address(&mut self, size: u64, _: u64) -> Result<u64, DeviceError> {
        Ok(self.take(size))
    }
    fn release_address(&mut self, _: u64, _: u64) {}
    fn map(&mut self, _: u64, _: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn unmap(&mut self, _: u64, _: u64) {}
    fn mem_info(&self) -> MemInfo {
        MemInfo { free_bytes: 1 << 50, total_bytes: 85_017_493_504 }
    }
    fn calls(&self) -> &DeviceCalls {
        &self.calls
    }
}

/// Nanoseconds this thread has run on a CPU (Linux), so a busy machine does not skew it.
fn cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

fn replay_once(conf: &str, ops: &[Op], keep_events: bool, events: &mut Vec<allocsim_core::Event>) {
    let mut alloc = PyTorchAllocator::from_conf(conf).expect("recorded conf");
    let mut dev = Bump::default();
    events.clear();
    for op in ops {
        let mut env = Env::new(&mut dev, events);
        match op {
            Op::Alloc { id, size, stream } => {
                let _ = alloc.malloc(&mut env, *id, *size, *stream);
            }
            Op::FreeRequested { id } => alloc.free(&mut env, *id),
            Op::FreeCompleted { id } => alloc.free_completed(&mut env, *id),
            Op::RecordStream { id, stream } => alloc.record_stream(*id, *stream),
            Op::EmptyCache => alloc.empty_cache(&mut env),
            _ => {}
        }
        if !keep_events {
            events.clear();
        }
    }
}

#[test]
#[ignore = "speed probe; run explicitly with --ignored --nocapture"]
fn replay_speed() {
    let only = std::env::var("ONLY").ok();
    let reps: usize = std::env::var("REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(50);
    let keep_events = std::env::var_os("KEEP_EVENTS").is_some();
    let dir = std::env::var("TRACES_DIR").unwrap_or_else(|_| {
        format!("{}/../../traces/pytorch-2.11-h100", env!("CARGO_MANIFEST_DIR"))
    });
    for name in [
        "gpt2_train",
        "resnet50_train",
        "synthetic_default",
        "varlen_train",
        "varlen_train_expandable",
        "synthetic_maxsplit",
    ] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let trace = allocsim_trace::read_trace(format!("{dir}/{name}.pickle.gz")).expect("trace");
        let conf = trace.meta.alloc_conf.clone().unwrap_or_default();
        let mut events = Vec::with_capacity(trace.ops.len() * 3);
        let (start, cpu0) = (Instant::now(), cpu_ns());
        for _ in 0..reps {
            replay_once(&conf, &trace.ops, keep_events, &mut events);
        }
        let ops = (trace.ops.len() * reps) as f64;
        let wall = ops / start.elapsed().as_secs_f64() / 1e6;
        let cpu = cpu_ns().zip(cpu0).map(|(b, a)| ops / ((b - a) as f64 / 1e9) / 1e6);
        println!("{name}: {wall:.1} M ops/s wall, {:.1} M ops/s on-CPU", cpu.unwrap_or(f64::NAN));
    }
}
