//! The PyTorch policy against the reference model (`crate::reference`), in lockstep: each on
//! its own modelled device of the same configuration, op by op, comparing the events of every
//! op, then the statistics and the snapshot after it. The first difference is the failure.

use super::failure::{Failure, Oracle};
use crate::program::format_op;
use crate::reference::{Reference, Settings};
use allocsim_core::{Allocator, Device, DynAllocator, Env, Event, MemoryStats, Op, Trace};
use allocsim_replay::{format_event, Engine, Observer, OpOutcome};
use allocsim_run::{H100_FREE_BYTES, H100_TOTAL_BYTES};
use allocsim_sim::{SimConfig, SimDevice};

/// Collects one op's events and outcome.
#[derive(Debug, Default)]
struct Collect {
    events: Vec<Event>,
    outcome: Option<OpOutcome>,
}

impl Observer for Collect {
    fn on_event(&mut self, _event_index: u64, _op_index: u64, event: &Event) -> bool {
        self.events.push(event.clone());
        true
    }

    fn on_op(
        &mut self,
        _i: u64,
        _op: &Op,
        outcome: &OpOutcome,
        _a: &dyn Allocator,
        _d: &dyn Device,
    ) -> bool {
        self.outcome = Some(*outcome);
        true
    }
}

/// Whether the reference model follows this trace: no expandable segments, no private pools,
/// and only settings strings it accepts. (PyTorch applies a refused string up to the mistake,
/// after resetting the keys every parse resets; the model does not follow that.)
pub fn reference_applies(trace: &Trace) -> bool {
    let ok = |s: &str| Settings::default().apply(s).is_ok_and(|s| !s.expandable_segments);
    let followed = |op: &Op| match op {
        Op::SetAllocatorSettings { conf } => ok(conf),
        Op::Pool { .. } => false,
        _ => true,
    };
    trace.meta.alloc_conf.as_deref().is_none_or(ok) && trace.ops.iter().all(followed)
}

fn device(trace: &Trace) -> SimDevice {
    let total = trace.meta.device_total_bytes.unwrap_or(H100_TOTAL_BYTES);
    let free = trace.meta.device_free_bytes.unwrap_or(H100_FREE_BYTES.min(total));
    SimDevice::new(SimConfig {
        total_bytes: total,
        free_bytes: free,
        seed: 0,
        ..SimConfig::default()
    })
}

fn lines(events: &[Event]) -> String {
    if events.is_empty() {
        return "    (no events)".into();
    }
    events.iter().map(|e| format!("    {}", format_event(0, 0, e))).collect::<Vec<_>>().join("\n")
}

fn stat_differences(want: &MemoryStats, got: &MemoryStats) -> String {
    want.flat()
        .into_iter()
        .zip(got.flat())
        .filter(|(a, b)| a.1 != b.1)
        .map(|(a, b)| format!("{}: reference {}, policy {}", a.0, a.1, b.1))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Run `policy` (normally `pytorch`) and the reference model through `trace` in lockstep.
/// `Ok` when the reference does not apply (expandable segments).
pub fn compare_with_reference(policy: &str, trace: &Trace) -> Result<(), Failure> {
    if !reference_applies(trace) {
        return Ok(());
    }
    let conf = trace.meta.alloc_conf.clone().unwrap_or_default();
    let fail = |op: Option<u64>, msg: String| Failure::new(Oracle::Reference, policy, op, msg);
    let mut model = Reference::new(&conf)
        .map_err(|e| fail(None, format!("the reference refuses {conf:?}: {e}")))?;
    let mut policy_alloc = allocsim_policies::by_name(policy, Some(&conf))
        .map_err(|e| Failure::new(Oracle::Setup, policy, None, e.to_string()))?;
    let (mut model_device, mut policy_device) = (device(trace), device(trace));
    if let Some(fraction) = trace.meta.memory_fraction {
        let mut sink = Vec::new();
        let a = model.set_memory_fraction(&mut Env::new(&mut model_device, &mut sink), fraction);
        let b = policy_alloc
            .set_memory_fraction(&mut Env::new(&mut policy_device, &mut sink), fraction);
        if a.is_ok() != b.is_ok() {
            return Err(fail(
                None,
                format!("memory fraction {fraction}: reference {a:?}, policy {b:?}"),
            ));
        }
    }
    let beyond = model.beyond_model();
    let mut want_engine = Engine::new(&mut model, &mut model_device);
    let mut policy_alloc = DynAllocator(&mut *policy_alloc);
    let mut got_engine = Engine::new(&mut policy_alloc, &mut policy_device);
    for (i, op) in trace.ops.iter().enumerate() {
        let (mut want, mut got) = (Collect::default(), Collect::default());
        want_engine.step(op, &mut [&mut want]);
        got_engine.step(op, &mut [&mut got]);
        if let Some(what) = beyond.borrow().as_deref() {
            return Err(fail(
                Some(i as u64),
                format!(
                    "the reference model stops here: {what}\n  policy events:\n{}",
                    lines(&got.events)
                ),
            ));
        }
        let context = || {
            let from = i.saturating_sub(12);
            let before: Vec<String> =
                (from..i).map(|j| format!("    op {j}: {}", format_op(&trace.ops[j]))).collect();
            let op_line = format!("op {i}: {}", format_op(op));
            if before.is_empty() {
                op_line
            } else {
                format!("after\n{}\n{op_line}", before.join("\n"))
            }
        };
        if want.events != got.events || want.outcome != got.outcome {
            return Err(fail(
                Some(i as u64),
                format!(
                    "{}\n  reference ({:?}):\n{}\n  policy ({:?}):\n{}",
                    context(),
                    want.outcome,
                    lines(&want.events),
                    got.outcome,
                    lines(&got.events)
                ),
            ));
        }
        let (ws, gs) = (want_engine.allocator().stats(), got_engine.allocator().stats());
        if ws != gs {
            return Err(fail(
                Some(i as u64),
                format!("{}\n  stats differ: {}", context(), stat_differences(&ws, &gs)),
            ));
        }
        let (wsnap, gsnap) =
            (want_engine.allocator().snapshot(), got_engine.allocator().snapshot());
        if wsnap != gsnap {
            let at = wsnap
                .iter()
                .zip(&gsnap)
                .position(|(a, b)| a != b)
                .unwrap_or(wsnap.len().min(gsnap.len()));
            return Err(fail(
                Some(i as u64),
                format!(
                    "{}\n  snapshots differ ({} vs {} segments) at segment {at}:\n  reference {:?}\n  policy    {:?}",
                    context(),
                    wsnap.len(),
                    gsnap.len(),
                    wsnap.get(at),
                    gsnap.get(at)
                ),
            ));
        }
    }
    Ok(())
}
