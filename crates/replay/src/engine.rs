//! One op at a time through the allocator, with the id bookkeeping that keeps the allocator's
//! API boundary.

use crate::Observer;
use allocsim_core::{
    Allocator, BlockState, ConfigError, Device, DynAllocator, DynDevice, Emit, Env, Event, Granted,
    IdTable, MemoryStats, OomInfo, Op, OpSource, StartState,
};

/// What happened to an op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OpOutcome {
    Allocated(Granted),
    OutOfMemory(OomInfo),
    Done,
    /// The op was not passed on: it named an allocation that is not live (see [`Skipped`]).
    Skipped,
}

/// Ops the engine did not pass to the allocator, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Skipped {
    /// Frees, stream uses and completions of allocations that failed with OOM: expected in
    /// any trace of a program that catches OOM and goes on.
    pub of_failed_allocs: u64,
    /// Ops naming ids never allocated or already freed: a broken or partial trace.
    pub of_unknown_ids: u64,
    /// `Alloc` of an id that is still live.
    pub duplicate_allocs: u64,
    /// Settings or fraction changes the policy refused.
    pub refused_settings: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum IdState {
    /// Never allocated, or freed and completed.
    Unknown,
    Live,
    /// Freed by the program, waiting for other streams' work.
    Pending,
    Failed,
}

/// Keep at most this many refusal messages.
const MAX_NOTES: usize = 16;

/// The engine: owns nothing but bookkeeping; borrows the allocator and the device.
/// Generic over its allocator and device so that each replay loop calls them directly, with
/// the engine's event sink of a known type ([`Allocator::malloc_to`]); a trait object comes
/// wrapped ([`DynAllocator`], [`DynDevice`]). Observers see `&dyn` either way.
pub struct Engine<'a, A = DynAllocator<'a>, D = DynDevice<'a>> {
    allocator: &'a mut A,
    device: &'a mut D,
    tally: Tally,
    skipped: Skipped,
    refusals: Vec<String>,
}

impl<A: Allocator, D> std::fmt::Debug for Engine<'_, A, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("policy", &self.allocator.name())
            .field("op_index", &self.tally.op_index)
            .field("event_index", &self.tally.event_index)
            .finish_non_exhaustive()
    }
}

impl<'a, A: Allocator, D: Device> Engine<'a, A, D> {
    pub fn new(allocator: &'a mut A, device: &'a mut D) -> Self {
        Engine {
            allocator,
            device,
            tally: Tally {
                ids: IdTable::new(IdState::Unknown),
                op_index: 0,
                event_index: 0,
                keep_going: true,
            },
            skipped: Skipped::default(),
            refusals: Vec::new(),
        }
    }

    pub fn skipped(&self) -> Skipped {
        self.skipped
    }

    pub fn allocator(&self) -> &dyn Allocator {
        &*self.allocator
    }

    pub fn device(&self) -> &dyn Device {
        &*self.device
    }

    /// Start the allocator from `start` ([`Allocator::seed`]); its live blocks become live
    /// ids here too. On refusal nothing changed, and the caller lays the blocks out instead
    /// ([`StartState::prologue`]).
    pub fn seed(&mut self, start: &StartState, stats: Option<&MemoryStats>) -> Result<(), String> {
        let mut events = Vec::new();
        let mut env = Env::new(&mut *self.device as &mut dyn Device, &mut events);
        self.allocator.seed(&mut env, start, stats)?;
        debug_assert!(events.is_empty(), "seeding emits no events");
        for (id, state) in start.active_ids() {
            let live = state == BlockState::ActiveAllocated;
            self.tally.ids.set(id, if live { IdState::Live } else { IdState::Pending });
        }
        Ok(())
    }

    /// Run `ops` one after the other until an observer asks to stop; `progress` hears the
    /// count every 4096 ops and at the end. Returns how many ran.
    pub fn run<B: Observer + ?Sized>(
        &mut self,
        ops: impl OpSource,
        observer: &mut B,
        mut progress: impl FnMut(u64),
    ) -> u64 {
        // The count comes from the op index, which the step keeps anyway: a counter of its
        // own is one more store per op.
        let start = self.tally.op_index;
        // Inlined into each place the source calls it: see `OpSource`.
        ops.drive(
            #[inline(always)]
            |op| {
                let keep_going = self.step_with(op, observer);
                let ran = self.tally.op_index - start;
                if ran.is_multiple_of(4096) {
                    progress(ran);
                }
                keep_going
            },
        );
        let ran = self.tally.op_index - start;
        progress(ran);
        ran
    }

    /// Run one op and notify the observers. Returns false when an observer asked to stop.
    pub fn step(&mut self, op: &Op, observers: &mut [&mut dyn Observer]) -> bool {
        self.step_with(op, observers)
    }

    /// [`Engine::step`] with one observer of a known type, called without dynamic dispatch
    /// (a slice of `&mut dyn Observer` is one observer too).
    #[inline(always)]
    pub fn step_with<O: Observer + ?Sized>(&mut self, op: &Op, observer: &mut O) -> bool {
        self.device.begin_op(self.tally.op_index);
        let outcome = self.apply(op, observer);
        let keep_going = observer.on_op(
            self.tally.op_index,
            op,
            &outcome,
            &*self.allocator as &dyn Allocator,
            &*self.device as &dyn Device,
        ) && self.tally.keep_going;
        self.tally.op_index += 1;
        // Reset only once an observer asked to stop: not a store on every op.
        if !self.tally.keep_going {
            self.tally.keep_going = true;
        }
        keep_going
    }

    /// Pass `op` on if it keeps the API boundary. The observer sees each event as the
    /// allocator makes it.
    #[inline(always)]
    fn apply<O: Observer + ?Sized>(&mut self, op: &Op, observer: &mut O) -> OpOutcome {
        let op_index = self.tally.op_index;
        let mut sink = Sink { tally: &mut self.tally, observer };
        let mut env = Env { device: &mut *self.device as &mut dyn Device, events: &mut sink };
        let allocator = &mut *self.allocator;
        match *op {
            Op::Alloc { id, size, stream } => {
                if matches!(env.events.tally.ids.get(id), IdState::Live | IdState::Pending) {
                    self.skipped.duplicate_allocs += 1;
                    OpOutcome::Skipped
                } else {
                    match allocator.malloc_to(&mut env, id, size, stream) {
                        Ok(granted) => {
                            env.events.tally.ids.set(id, IdState::Live);
                            // The policy wrote the two fields with two 8-byte stores; copied
                            // as they are, they are read back with one 16-byte load, which
                            // cannot be forwarded from them and stalls every allocation
                            // (`perf annotate`). The opaque read makes them two loads.
                            let size = std::hint::black_box(granted.size);
                            OpOutcome::Allocated(Granted { addr: granted.addr, size })
                        }
                        Err(info) => {
                            env.events.tally.ids.set(id, IdState::Failed);
                            OpOutcome::OutOfMemory(info)
                        }
                    }
                }
            }
            Op::AllocAt { id, size, stream, addr } => {
                if matches!(env.events.tally.ids.get(id), IdState::Live | IdState::Pending) {
                    self.skipped.duplicate_allocs += 1;
                    return OpOutcome::Skipped;
                }
                match allocator.malloc_at(&mut env.as_dyn(), id, size, stream, addr) {
                    Ok(granted) => {
                        env.events.tally.ids.set(id, IdState::Live);
                        OpOutcome::Allocated(granted)
                    }
                    Err(info) => {
                        env.events.tally.ids.set(id, IdState::Failed);
                        OpOutcome::OutOfMemory(info)
                    }
                }
            }
            Op::FreeRequested { id } => match env.events.tally.ids.get(id) {
                IdState::Live => {
                    env.events.tally.ids.set(id, IdState::Pending);
                    allocator.free_to(&mut env, id);
                    OpOutcome::Done
                }
                other => skip(&mut self.skipped, other),
            },
            Op::RecordStream { id, stream } => match env.events.tally.ids.get(id) {
                IdState::Live => {
                    allocator.record_stream(id, stream);
                    OpOutcome::Done
                }
                other => skip(&mut self.skipped, other),
            },
            Op::FreeCompleted { id } => match env.events.tally.ids.get(id) {
                IdState::Pending => {
                    allocator.free_completed_to(&mut env, id);
                    OpOutcome::Done
                }
                other => skip(&mut self.skipped, other),
            },
            Op::EmptyCache => {
                allocator.empty_cache(&mut env.as_dyn());
                OpOutcome::Done
            }
            Op::SetMemoryFraction { fraction } => {
                let result = allocator.set_memory_fraction(&mut env.as_dyn(), fraction);
                settings_outcome(result, op_index, &mut self.skipped, &mut self.refusals)
            }
            Op::Pool { pool, action } => {
                allocator.pool_action(&mut env.as_dyn(), pool, action);
                OpOutcome::Done
            }
            Op::SetAllocatorSettings { ref conf } => {
                let result = allocator.set_settings(conf);
                settings_outcome(result, op_index, &mut self.skipped, &mut self.refusals)
            }
        }
    }

    /// `torch.cuda.reset_peak_memory_stats()` on the allocator (not an op: no trace records it).
    pub fn reset_peak_stats(&mut self) {
        self.allocator.reset_peak_stats();
    }

    /// Why settings ops were refused (the first few).
    pub fn refusals(&self) -> &[String] {
        &self.refusals
    }
}

fn settings_outcome(
    result: Result<(), ConfigError>,
    op_index: u64,
    skipped: &mut Skipped,
    refusals: &mut Vec<String>,
) -> OpOutcome {
    match result {
        Ok(()) => OpOutcome::Done,
        Err(e) => {
            skipped.refused_settings += 1;
            if refusals.len() < MAX_NOTES {
                refusals.push(format!("op {op_index}: {e}"));
            }
            OpOutcome::Skipped
        }
    }
}

/// What the engine keeps while it runs, and its event sink updates.
#[derive(Debug)]
struct Tally {
    ids: IdTable<IdState>,
    op_index: u64,
    event_index: u64,
    /// False once an observer asked to stop during the current op; true again after it.
    keep_going: bool,
}

/// The engine's event sink: the observer sees each event as the allocator makes it, and a
/// completed free makes its id unknown again.
struct Sink<'s, O: ?Sized> {
    tally: &'s mut Tally,
    observer: &'s mut O,
}

impl<O: Observer + ?Sized> Emit for Sink<'_, O> {
    #[inline(always)]
    fn emit(&mut self, event: Event) {
        let t = &mut *self.tally;
        if let Event::FreeCompleted { id, .. } = event {
            t.ids.set(id, IdState::Unknown);
        }
        t.keep_going &= self.observer.on_event(t.event_index, t.op_index, &event);
        t.event_index += 1;
    }
}

#[cold]
fn skip(skipped: &mut Skipped, state: IdState) -> OpOutcome {
    match state {
        IdState::Failed => skipped.of_failed_allocs += 1,
        _ => skipped.of_unknown_ids += 1,
    }
    OpOutcome::Skipped
}
