//! The allocator's state after one op: its segments and the allocations alive then, each with
//! the op that made it. `allocsim diff` takes it at each run's reserved peak.

use crate::{Observer, OpOutcome};
use allocsim_core::{AllocId, Allocator, Device, Event, Op, SnapshotSegment, StartState};
use std::collections::HashMap;

/// One allocation alive at the op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveAllocation {
    pub id: AllocId,
    /// The op that made it (the engine's index); `None` for one alive when the run started
    /// from a recording's state.
    pub alloc_op: Option<u64>,
    /// Its block's size: what it adds to allocated bytes.
    pub size: u64,
}

/// The state after op `at`.
#[derive(Debug, Clone, Default)]
pub struct State {
    pub segments: Vec<SnapshotSegment>,
    /// Sorted by id.
    pub live: Vec<LiveAllocation>,
}

/// Watches a run up to op `at`, keeps the state after it, and stops the run there. An
/// allocation is alive from its `Alloc` event to its `FreeRequested` one, as allocated bytes
/// count it.
#[derive(Debug)]
pub struct StateAt {
    at: u64,
    /// Only looked up by id; [`State::live`] is sorted.
    live: HashMap<AllocId, (Option<u64>, u64)>,
    pub state: Option<State>,
}

impl StateAt {
    pub fn new(at: u64) -> StateAt {
        StateAt { at, live: HashMap::new(), state: None }
    }
}

impl Observer for StateAt {
    fn on_start(&mut self, start: &StartState, _allocator: &dyn Allocator) {
        let blocks = start.segments.iter().flat_map(|s| &s.blocks);
        for b in blocks.filter(|b| b.state == allocsim_core::BlockState::ActiveAllocated) {
            if let Some(id) = start.id_at(b.address) {
                self.live.insert(id, (None, b.size));
            }
        }
    }

    fn on_event(&mut self, _event_index: u64, op_index: u64, event: &Event) -> bool {
        match *event {
            Event::Alloc { id, size, .. } => {
                self.live.insert(id, (Some(op_index), size));
            }
            Event::FreeRequested { id, .. } => {
                self.live.remove(&id);
            }
            _ => {}
        }
        true
    }

    fn on_op(
        &mut self,
        op_index: u64,
        _op: &Op,
        _outcome: &OpOutcome,
        allocator: &dyn Allocator,
        _device: &dyn Device,
    ) -> bool {
        if op_index < self.at {
            return true;
        }
        let mut live: Vec<LiveAllocation> = (self.live.iter())
            .map(|(&id, &(alloc_op, size))| LiveAllocation { id, alloc_op, size })
            .collect();
        live.sort_unstable_by_key(|l| l.id.0);
        self.state = Some(State { segments: allocator.snapshot(), live });
        false
    }
}
