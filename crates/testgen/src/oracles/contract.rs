//! The contract between an op and the events a policy emits for it, which the checker cannot
//! see (it reads events only, never ops): an `Alloc` that succeeds ends with the `Alloc` event
//! of that id, at the granted address and size; one that fails ends with its `Oom`; a free
//! emits its `FreeRequested`; a completion its `FreeCompleted`; `empty_cache` only gives back.
//! After every op, the snapshot and statistics must agree ([`super::stat_consistency`]), and
//! once nothing is live or pending, nothing may be counted as allocated or active.

use super::consistency::{implied_free_space, stat_consistency};
use allocsim_core::{AllocId, Allocator, BlockState, Device, Event, Op, StartState};
use allocsim_replay::{Observer, OpOutcome};
use std::collections::BTreeSet;

/// The first broken promise: op index and what was wrong.
pub type Breach = (u64, String);

/// Watches a run; see the module doc. Stops the run at the first breach.
#[derive(Debug, Default)]
pub struct Contract {
    pytorch_rules: bool,
    events: Vec<Event>,
    live: BTreeSet<AllocId>,
    pending: BTreeSet<AllocId>,
    /// Zero-byte requests granted as a null pointer (PyTorch's `allocate(0)`): no events for
    /// them, nor for their frees.
    null: BTreeSet<AllocId>,
    breach: Option<Breach>,
}

fn expect(ok: bool, broken: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(broken.to_string())
    }
}

fn count(events: &[Event], f: impl Fn(&Event) -> bool) -> usize {
    events.iter().filter(|e| f(e)).count()
}

impl Contract {
    /// A contract for `policy` (PyTorch's accounting for [`super::PYTORCH_ACCOUNTING`]).
    pub fn new(policy: &str) -> Self {
        Contract {
            pytorch_rules: super::PYTORCH_ACCOUNTING
                .contains(&allocsim_policies::parse_spec(policy).0),
            ..Contract::default()
        }
    }

    pub fn finish(self) -> Option<Breach> {
        self.breach
    }

    /// What the events of one op must look like given the op and its outcome.
    fn op_events(&self, op: &Op, outcome: &OpOutcome) -> Result<(), String> {
        let ev = &self.events;
        let allocs = count(ev, |e| matches!(e, Event::Alloc { .. }));
        let ooms = count(ev, |e| matches!(e, Event::Oom { .. }));
        let requests = count(ev, |e| matches!(e, Event::FreeRequested { .. }));
        if matches!(outcome, OpOutcome::Skipped) && !ev.is_empty() {
            return Err(format!("a skipped op emitted {} events", ev.len()));
        }
        match (op, outcome) {
            (
                &(Op::Alloc { size: 0, .. } | Op::AllocAt { size: 0, .. }),
                OpOutcome::Allocated(g),
            ) if g.size == 0 && ev.is_empty() => {}
            (&Op::FreeRequested { id } | &Op::FreeCompleted { id }, OpOutcome::Done)
                if self.null.contains(&id) && ev.is_empty() => {}
            (
                &(Op::Alloc { id, size, stream } | Op::AllocAt { id, size, stream, .. }),
                OpOutcome::Allocated(g),
            ) => {
                let want = Event::Alloc {
                    id,
                    addr: g.addr,
                    size: g.size,
                    requested: size,
                    stream,
                    pool: pool_of(ev),
                };
                if allocs != 1 || ooms != 0 || ev.last() != Some(&want) {
                    return Err(format!(
                        "granted {g:?}, but the events do not end with exactly one {want:?}"
                    ));
                }
            }
            (
                &(Op::Alloc { id, stream, .. } | Op::AllocAt { id, stream, .. }),
                OpOutcome::OutOfMemory(info),
            ) => {
                let ok = matches!(ev.last(), Some(Event::Oom { id: i, stream: s, info: j, .. }) if *i == id && *s == stream && j == info);
                if !ok || allocs != 0 || ooms != 1 {
                    return Err(
                        "an OOM outcome must end with exactly one matching Oom event and no Alloc"
                            .into(),
                    );
                }
            }
            (_, _) if allocs + ooms > 0 => {
                return Err("Alloc/Oom events outside an alloc op".into())
            }
            (&Op::FreeRequested { id }, OpOutcome::Done) => expect(
                requests == 1
                    && count(ev, |e| matches!(e, Event::FreeRequested { id: i, .. } if *i == id))
                        == 1,
                "a free must emit exactly one FreeRequested, of its id",
            )?,
            (_, _) if requests > 0 => return Err("FreeRequested outside a free op".into()),
            (&Op::FreeCompleted { id }, OpOutcome::Done) => expect(
                count(ev, |e| matches!(e, Event::FreeCompleted { id: i, .. } if *i == id)) == 1,
                "completing a pending free must emit its FreeCompleted",
            )?,
            (Op::EmptyCache, _) => {
                let taking = ev
                    .iter()
                    .any(|e| matches!(e, Event::SegmentAlloc { .. } | Event::SegmentMap { .. }));
                if taking {
                    return Err("empty_cache took memory from the device".into());
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn track(&mut self, op: &Op, outcome: &OpOutcome) {
        if let (&(Op::Alloc { id, .. } | Op::AllocAt { id, .. }), OpOutcome::Allocated(g)) =
            (op, outcome)
        {
            if g.size == 0 {
                self.null.insert(id);
            }
        }
        for e in &self.events {
            match *e {
                Event::Alloc { id, .. } => {
                    self.live.insert(id);
                }
                Event::FreeRequested { id, .. } => {
                    self.live.remove(&id);
                    self.pending.insert(id);
                }
                Event::FreeCompleted { id, .. } => {
                    self.live.remove(&id);
                    self.pending.remove(&id);
                }
                _ => {}
            }
        }
    }

    fn state(&self, allocator: &dyn Allocator) -> Result<(), String> {
        let snapshot = allocator.snapshot();
        let stats = allocator.stats();
        let problems = stat_consistency(&snapshot, &stats, self.pytorch_rules);
        if !problems.is_empty() {
            return Err(format!("snapshot and stats disagree: {}", problems.join("; ")));
        }
        let (reported, implied) = (allocator.free_space(), implied_free_space(&snapshot));
        if reported != implied {
            return Err(format!("free_space() is {reported:?}, the snapshot implies {implied:?}"));
        }
        if self.live.is_empty() && self.pending.is_empty() {
            let busy = [
                ("allocation", stats.allocation.all.current),
                ("allocated_bytes", stats.allocated_bytes.all.current),
                ("active", stats.active.all.current),
                ("active_bytes", stats.active_bytes.all.current),
                ("requested_bytes", stats.requested_bytes.all.current),
            ];
            if let Some((name, v)) = busy.iter().find(|(_, v)| *v != 0) {
                return Err(format!("nothing is live or pending, yet {name}.all.current is {v}"));
            }
        }
        Ok(())
    }
}

/// The pool the policy reported for the op's `Alloc`, so the comparison is on the rest.
fn pool_of(events: &[Event]) -> allocsim_core::Pool {
    match events.last() {
        Some(Event::Alloc { pool, .. }) => *pool,
        _ => allocsim_core::Pool::Small,
    }
}

impl Observer for Contract {
    /// A run seeded with a recording's state at its start: its blocks are live (or pending)
    /// from the first op on, without events of their own.
    fn on_start(&mut self, start: &StartState, _allocator: &dyn Allocator) {
        for (id, state) in start.active_ids() {
            match state {
                BlockState::ActivePendingFree => self.pending.insert(id),
                _ => self.live.insert(id),
            };
        }
    }

    fn on_event(&mut self, _event_index: u64, _op_index: u64, event: &Event) -> bool {
        self.events.push(event.clone());
        true
    }

    fn on_op(
        &mut self,
        op_index: u64,
        op: &Op,
        outcome: &OpOutcome,
        allocator: &dyn Allocator,
        _device: &dyn Device,
    ) -> bool {
        let result = self.op_events(op, outcome).and_then(|()| {
            self.track(op, outcome);
            self.state(allocator)
        });
        self.events.clear();
        match result {
            Ok(()) => true,
            Err(message) => {
                self.breach.get_or_insert((op_index, message));
                false
            }
        }
    }
}
