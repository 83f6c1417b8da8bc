//! Starting from a state is the same as having run to it: the PyTorch policy run over a whole
//! program, and a fresh one seeded ([`Allocator::seed`]) at op `k` with the first run's
//! segments, live blocks and statistics, make the same events from `k` on and end with the
//! same statistics. This is what a history that starts mid-run relies on.

use super::failure::{Failure, Oracle};
use allocsim_core::{AllocId, Allocator, BlockState, Device, Event, Op, StartState, Trace};
use allocsim_policies::pytorch::PyTorchAllocator;
use allocsim_replay::{Engine, Observer, OpOutcome};
use allocsim_run::{H100_FREE_BYTES, H100_TOTAL_BYTES};
use allocsim_sim::{Placement, SimConfig, SimDevice};
use std::collections::BTreeMap;

/// Whether a run's state at op `k` is all a seed carries: no stream uses (a snapshot does not
/// show them), no settings, fraction or pool changes before `k` (the seeded allocator starts
/// with the trace's settings and no context), no expandable segments or garbage collection
/// (their page maps and block ages are not in a snapshot).
pub fn seed_applies(trace: &Trace, k: usize) -> bool {
    let conf = trace.meta.alloc_conf.as_deref().unwrap_or("");
    let plain_conf = !conf.contains("expandable_segments:True")
        && !conf.contains("garbage_collection_threshold");
    let plain_op =
        |op: &Op| matches!(op, Op::Alloc { .. } | Op::FreeRequested { .. } | Op::EmptyCache);
    plain_conf
        && trace.ops[..k].iter().all(plain_op)
        && !trace.ops.iter().any(|op| matches!(op, Op::RecordStream { .. }))
}

/// The events of a run and the live blocks' ids by address.
#[derive(Default)]
struct Watch {
    events: Vec<Event>,
    live: BTreeMap<u64, AllocId>,
}

impl Observer for Watch {
    fn on_event(&mut self, _event_index: u64, _op_index: u64, event: &Event) -> bool {
        match *event {
            Event::Alloc { id, addr, .. } => {
                self.live.insert(addr, id);
            }
            Event::FreeCompleted { addr, .. } => {
                self.live.remove(&addr);
            }
            _ => {}
        }
        self.events.push(event.clone());
        true
    }

    fn on_op(&mut self, _: u64, _: &Op, _: &OpOutcome, _: &dyn Allocator, _: &dyn Device) -> bool {
        true
    }
}

/// Lowest-first placement: where it puts a segment depends only on the live ranges, which a
/// snapshot shows. (The driver placement's chunks are not in a snapshot: a seeded device can
/// only guess their extent.)
fn device(trace: &Trace) -> SimDevice {
    let total = trace.meta.device_total_bytes.unwrap_or(H100_TOTAL_BYTES);
    let free = trace.meta.device_free_bytes.unwrap_or(H100_FREE_BYTES.min(total));
    let placement = Placement::Lowest;
    SimDevice::new(SimConfig {
        total_bytes: total,
        free_bytes: free,
        placement,
        ..Default::default()
    })
}

fn allocator(trace: &Trace, device: &mut SimDevice) -> Result<PyTorchAllocator, Failure> {
    let setup = |e: String| Failure::new(Oracle::Setup, "pytorch", None, e);
    let conf = trace.meta.alloc_conf.as_deref().unwrap_or("");
    let mut a = PyTorchAllocator::from_conf(conf).map_err(|e| setup(e.to_string()))?;
    if let Some(fraction) = trace.meta.memory_fraction {
        let mut sink = Vec::new();
        let mut env = allocsim_core::Env::new(device, &mut sink);
        a.set_memory_fraction(&mut env, fraction).map_err(|e| setup(e.to_string()))?;
    }
    Ok(a)
}

/// The seeded run from op `k` against the whole run (see the module doc). `Ok` when the seed
/// does not apply ([`seed_applies`]).
pub fn seeded_matches_full(trace: &Trace, k: usize) -> Result<(), Failure> {
    if k > trace.ops.len() || !seed_applies(trace, k) {
        return Ok(());
    }
    let fail = |op: Option<u64>, msg: String| Failure::new(Oracle::Seed, "pytorch", op, msg);
    let (mut full_device, mut seeded_device) = (device(trace), device(trace));
    let mut full = allocator(trace, &mut full_device)?;
    let mut watch = Watch::default();
    let mut engine = Engine::new(&mut full, &mut full_device);
    engine.run(&trace.ops[..k], &mut watch, |_| {});
    let segments = engine.allocator().snapshot();
    let ids = (segments.iter().flat_map(|s| &s.blocks))
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .filter_map(|b| watch.live.get(&b.address).map(|&id| (b.address, id)))
        .collect();
    let (start, stats_at_k) = (StartState { segments, ids }, engine.allocator().stats());
    let before = watch.events.len();
    engine.run(&trace.ops[k..], &mut watch, |_| {});
    let full_stats = engine.allocator().stats();
    let mut seeded = allocator(trace, &mut seeded_device)?;
    let mut seeded_watch = Watch::default();
    {
        let mut engine = Engine::new(&mut seeded, &mut seeded_device);
        engine.seed(&start, Some(&stats_at_k)).map_err(|e| fail(Some(k as u64), e))?;
        engine.run(&trace.ops[k..], &mut seeded_watch, |_| {});
    }
    let (want, got) = (&watch.events[before..], &seeded_watch.events);
    if let Some(i) = (0..want.len().max(got.len())).find(|&i| want.get(i) != got.get(i)) {
        return Err(fail(
            Some(k as u64),
            format!(
                "seeded at op {k}, event {i} after it: the whole run made {:?}, the seeded one \
                 {:?}",
                want.get(i),
                got.get(i)
            ),
        ));
    }
    let (a, b) = (full_stats.flat(), seeded.stats().flat());
    if a != b {
        let differ: Vec<_> = a.iter().zip(&b).filter(|(x, y)| x != y).take(4).collect();
        return Err(fail(
            None,
            format!("seeded at op {k}, the statistics at the end differ: {differ:?}"),
        ));
    }
    Ok(())
}
