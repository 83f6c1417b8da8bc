//! One op at a time through the allocator, with the id bookkeeping that keeps the allocator's
//! API boundary.

use crate::Observer;
use allocsim_core::{Allocator, ConfigError, Device, Env, Event, Granted, IdTable, OomInfo, Op};

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

/// An allocator, concrete or a trait object, as the `&dyn Allocator` observers see.
///
/// The engine is generic over its allocator and device so that a replay of one known policy
/// on one known device (`allocsim replay` of the PyTorch policy, the hot loop) calls them
/// directly; everything else passes trait objects. Observers keep one signature either way.
pub trait AsDynAllocator: Allocator {
    fn as_dyn(&self) -> &dyn Allocator;
}

impl<T: Allocator> AsDynAllocator for T {
    fn as_dyn(&self) -> &dyn Allocator {
        self
    }
}

impl AsDynAllocator for dyn Allocator + '_ {
    fn as_dyn(&self) -> &dyn Allocator {
        self
    }
}

/// A device, concrete or a trait object, as the `dyn Device` observers and allocators see
/// (see [`AsDynAllocator`]).
pub trait AsDynDevice: Device {
    fn as_dyn(&self) -> &dyn Device;
    fn as_dyn_mut(&mut self) -> &mut dyn Device;
}

impl<T: Device> AsDynDevice for T {
    fn as_dyn(&self) -> &dyn Device {
        self
    }
    fn as_dyn_mut(&mut self) -> &mut dyn Device {
        self
    }
}

impl AsDynDevice for dyn Device + '_ {
    fn as_dyn(&self) -> &dyn Device {
        self
    }
    fn as_dyn_mut(&mut self) -> &mut dyn Device {
        self
    }
}

/// The engine: owns nothing but bookkeeping; borrows the allocator and the device.
pub struct Engine<'a, A: ?Sized = dyn Allocator + 'a, D: ?Sized = dyn Device + 'a> {
    allocator: &'a mut A,
    device: &'a mut D,
    ids: IdTable<IdState>,
    events: Vec<Event>,
    op_index: u64,
    event_index: u64,
    skipped: Skipped,
    refusals: Vec<String>,
}

impl<A: AsDynAllocator + ?Sized, D: ?Sized> std::fmt::Debug for Engine<'_, A, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("policy", &self.allocator.name())
            .field("op_index", &self.op_index)
            .field("event_index", &self.event_index)
            .finish_non_exhaustive()
    }
}

impl<'a, A: AsDynAllocator + ?Sized, D: AsDynDevice + ?Sized> Engine<'a, A, D> {
    pub fn new(allocator: &'a mut A, device: &'a mut D) -> Self {
        Engine {
            allocator,
            device,
            ids: IdTable::new(IdState::Unknown),
            events: Vec::with_capacity(64),
            op_index: 0,
            event_index: 0,
            skipped: Skipped::default(),
            refusals: Vec::new(),
        }
    }

    pub fn skipped(&self) -> Skipped {
        self.skipped
    }

    pub fn allocator(&self) -> &dyn Allocator {
        self.allocator.as_dyn()
    }

    pub fn device(&self) -> &dyn Device {
        self.device.as_dyn()
    }

    /// Run one op and notify the observers. Returns false when an observer asked to stop.
    pub fn step(&mut self, op: &Op, observers: &mut [&mut dyn Observer]) -> bool {
        self.step_with(op, observers)
    }

    /// [`Engine::step`] with one observer of a known type, called without dynamic dispatch
    /// (a slice of `&mut dyn Observer` is one observer too).
    #[inline(always)]
    pub fn step_with<O: Observer + ?Sized>(&mut self, op: &Op, observer: &mut O) -> bool {
        self.device.begin_op(self.op_index);
        let outcome = self.apply(op);
        let mut keep_going = true;
        for event in &self.events {
            if let Event::FreeCompleted { id, .. } = event {
                self.ids.set(*id, IdState::Unknown);
            }
            keep_going &= observer.on_event(self.event_index, self.op_index, event);
            self.event_index += 1;
        }
        self.events.clear();
        keep_going &= observer.on_op(
            self.op_index,
            op,
            &outcome,
            self.allocator.as_dyn(),
            self.device.as_dyn(),
        );
        self.op_index += 1;
        keep_going
    }

    #[inline(always)]
    fn apply(&mut self, op: &Op) -> OpOutcome {
        let mut env = Env { device: self.device.as_dyn_mut(), events: &mut self.events };
        match *op {
            Op::Alloc { id, size, stream } => {
                if matches!(self.ids.get(id), IdState::Live | IdState::Pending) {
                    self.skipped.duplicate_allocs += 1;
                    return OpOutcome::Skipped;
                }
                match self.allocator.malloc(&mut env, id, size, stream) {
                    Ok(granted) => {
                        self.ids.set(id, IdState::Live);
                        // The policy wrote the two fields with two 8-byte stores; copied as
                        // they are, they are read back with one 16-byte load, which cannot be
                        // forwarded from them and stalls every allocation (`perf annotate`).
                        // The opaque read makes them two loads.
                        let size = std::hint::black_box(granted.size);
                        OpOutcome::Allocated(Granted { addr: granted.addr, size })
                    }
                    Err(info) => {
                        self.ids.set(id, IdState::Failed);
                        OpOutcome::OutOfMemory(info)
                    }
                }
            }
            Op::FreeRequested { id } => match self.ids.get(id) {
                IdState::Live => {
                    self.ids.set(id, IdState::Pending);
                    self.allocator.free(&mut env, id);
                    OpOutcome::Done
                }
                other => skip(&mut self.skipped, other),
            },
            Op::RecordStream { id, stream } => match self.ids.get(id) {
                IdState::Live => {
                    self.allocator.record_stream(id, stream);
                    OpOutcome::Done
                }
                other => skip(&mut self.skipped, other),
            },
            Op::FreeCompleted { id } => match self.ids.get(id) {
                IdState::Pending => {
                    self.allocator.free_completed(&mut env, id);
                    OpOutcome::Done
                }
                other => skip(&mut self.skipped, other),
            },
            Op::EmptyCache => {
                self.allocator.empty_cache(&mut env);
                OpOutcome::Done
            }
            Op::SetMemoryFraction { fraction } => {
                let result = self.allocator.set_memory_fraction(&mut env, fraction);
                self.settings_outcome(result)
            }
            Op::SetAllocatorSettings { ref conf } => {
                let result = self.allocator.set_settings(conf);
                self.settings_outcome(result)
            }
        }
    }

    fn settings_outcome(&mut self, result: Result<(), ConfigError>) -> OpOutcome {
        match result {
            Ok(()) => OpOutcome::Done,
            Err(e) => {
                self.skipped.refused_settings += 1;
                if self.refusals.len() < MAX_NOTES {
                    self.refusals.push(format!("op {}: {e}", self.op_index));
                }
                OpOutcome::Skipped
            }
        }
    }

    /// Why settings ops were refused (the first few).
    pub fn refusals(&self) -> &[String] {
        &self.refusals
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
