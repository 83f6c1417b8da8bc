//! A live session: one policy on one device, driven call by call as a program makes its
//! requests, instead of from a trace. The PyTorch allocator library (`crates/torch`, one
//! session per GPU) and the estimator (`allocsim.estimate`, a real program on the simulated
//! device) both run through it, each op through the replay engine, so a live run makes the
//! same calls into the policy that `allocsim replay` makes for its recording, and its
//! recording replays to the same statistics.
//!
//! Programs hand out and free by pointer; the policies speak in allocation ids. The session
//! keeps the map between them, turns each call into an [`Op`], steps the engine and, when
//! asked to, keeps the ops and the events.
//!
//! Private pools (a CUDA graph's, a `torch.cuda.MemPool`'s) are requests routed to a pool: the
//! session brackets each run of requests into one pool with the policy's `BeginAllocate` and
//! `EndAllocate`, as the trace converter does for a recording, and balances them on release.

use allocsim_core::{
    AllocId, Allocator, Device, DynAllocator, DynDevice, Event, MemInfo, MemPoolId, MemoryStats,
    OomInfo, Op, PoolAction, SnapshotSegment, StreamId, Trace, TraceMeta,
};
use allocsim_replay::{Engine, Observer, OpOutcome, Recorder};
use std::collections::HashMap;

/// The ops and events of a session, while recording.
#[derive(Debug, Default)]
struct Recording {
    ops: Vec<Op>,
    events: Recorder,
}

/// One policy on one device, driven live.
pub struct Session {
    /// Holds the policy and the device, leaked: the engine borrows both, and a session lives
    /// as long as what it serves (a GPU of a PyTorch process, an estimated program), as
    /// PyTorch's own per-device allocators do.
    engine: Engine<'static>,
    live: HashMap<u64, AllocId>,
    next_id: u64,
    recording: Option<Recording>,
    last_oom: Option<String>,
    unknown_frees: u64,
    opened_with: MemInfo,
    /// The pool the policy serves requests from now (see [`Session::route`]).
    routing: MemPoolId,
    /// How many contexts (`BeginAllocate`s) each private pool has had.
    contexts: HashMap<MemPoolId, u32>,
    /// The settings, kept for the recording's metadata.
    conf: String,
    /// Which GPU this session serves, for messages.
    index: u32,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("live", &self.live.len())
            .field("recording", &self.recording.is_some())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// `policy` under `conf` (its settings; for `pytorch`, a `PYTORCH_CUDA_ALLOC_CONF`
    /// string) on `device`, serving GPU `index`. Refused if the policy or its settings are
    /// unknown.
    pub fn new(
        policy: &str,
        conf: &str,
        device: Box<dyn Device>,
        index: u32,
        record: bool,
    ) -> Result<Session, String> {
        let policy = allocsim_policies::by_name(policy, Some(conf))
            .map_err(|e| format!("policy {policy:?}: {e}"))?;
        let opened_with = device.mem_info();
        let policy: &'static mut dyn Allocator = Box::leak(policy);
        let device: &'static mut dyn Device = Box::leak(device);
        let allocator = Box::leak(Box::new(DynAllocator(policy)));
        let device = Box::leak(Box::new(DynDevice(device)));
        Ok(Session {
            engine: Engine::new(allocator, device),
            live: HashMap::new(),
            next_id: 0,
            recording: record.then(Recording::default),
            last_oom: None,
            unknown_frees: 0,
            opened_with,
            routing: MemPoolId::DEFAULT,
            contexts: HashMap::new(),
            conf: conf.to_string(),
            index,
        })
    }

    /// A request of `size` bytes on `stream`, served from `pool` (`MemPoolId::DEFAULT`: the
    /// policy's own pools): the block's address, or PyTorch's "CUDA out of memory" message
    /// with the policy's figures. 0 bytes get the null pointer without reaching the policy,
    /// as under PyTorch's own allocator.
    pub fn malloc(&mut self, size: u64, stream: u64, pool: MemPoolId) -> Result<u64, String> {
        if size == 0 {
            return Ok(0);
        }
        self.route(pool);
        let id = AllocId(self.next_id);
        self.next_id += 1;
        match self.step(Op::Alloc { id, size, stream: StreamId(stream) }) {
            OpOutcome::Allocated(granted) => {
                self.live.insert(granted.addr, id);
                Ok(granted.addr)
            }
            OpOutcome::OutOfMemory(info) => {
                let message = oom_message(size, self.index, &info);
                self.last_oom = Some(message.clone());
                Err(message)
            }
            other => unreachable!("an alloc of a fresh id ends as {other:?}"),
        }
    }

    /// Frees the block at `ptr`. A block with stream uses recorded on it
    /// ([`Session::record_stream`]) stays the policy's pending free until
    /// [`Session::complete_free`]; any other block is free at once. The block's id, or `None`
    /// for a pointer this session did not hand out (counted, nothing else happens). Null
    /// frees nothing.
    pub fn free(&mut self, ptr: u64) -> Option<AllocId> {
        if ptr == 0 {
            return None;
        }
        let Some(id) = self.live.remove(&ptr) else {
            self.unknown_frees += 1;
            return None;
        };
        self.step(Op::FreeRequested { id });
        Some(id)
    }

    /// Completes the pending free of `id` (its other streams are done with it).
    pub fn complete_free(&mut self, id: AllocId) {
        self.step(Op::FreeCompleted { id });
    }

    /// The block's id if `ptr` is a block this session handed out and has not freed.
    pub fn block_at(&self, ptr: u64) -> Option<AllocId> {
        self.live.get(&ptr).copied()
    }

    /// `Tensor.record_stream(stream)` on the block `id`.
    pub fn record_stream(&mut self, id: AllocId, stream: u64) {
        self.step(Op::RecordStream { id, stream: StreamId(stream) });
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&mut self) {
        self.step(Op::EmptyCache);
    }

    /// `torch.cuda.set_per_process_memory_fraction(fraction)`; the policy's reason when it
    /// refuses.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), String> {
        let refused = self.engine.skipped().refused_settings;
        self.step(Op::SetMemoryFraction { fraction });
        if self.engine.skipped().refused_settings == refused {
            return Ok(());
        }
        let why = self.engine.refusals().last().cloned();
        Err(why.unwrap_or_else(|| format!("memory fraction {fraction} refused")))
    }

    /// Whether the policy keeps private pools (a CUDA graph capture needs them).
    pub fn has_private_pools(&self) -> bool {
        self.engine.allocator().has_private_pools()
    }

    /// No more requests go to `pool` (`endAllocateToPool`).
    pub fn end_pool(&mut self, pool: MemPoolId) {
        if self.routing == pool {
            self.route(MemPoolId::DEFAULT);
        }
    }

    /// The pool's owner (the graph, the `MemPool`) is gone; once its blocks are free, its
    /// segments go back to the device.
    pub fn release_pool(&mut self, pool: MemPoolId) {
        self.end_pool(pool);
        // Each context took the pool twice and gave one back at its end.
        for _ in 0..self.contexts.remove(&pool).unwrap_or(0) {
            self.step(Op::Pool { pool, action: PoolAction::Release });
        }
    }

    /// The policy's statistics under `torch.cuda.memory_stats()`'s names.
    pub fn stats(&self) -> MemoryStats {
        self.engine.allocator().stats()
    }

    pub fn reset_peak_stats(&mut self) {
        self.engine.reset_peak_stats();
    }

    /// The device's total and free memory now.
    pub fn mem_info(&self) -> MemInfo {
        self.engine.device().mem_info()
    }

    /// Every segment with its blocks, as `torch.cuda.memory._snapshot()` lists them.
    pub fn segments(&self) -> Vec<SnapshotSegment> {
        self.engine.allocator().snapshot()
    }

    /// Pointers handed out and not yet freed.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Frees of pointers this session never handed out.
    pub fn unknown_frees(&self) -> u64 {
        self.unknown_frees
    }

    /// Why the last request that failed failed.
    pub fn last_oom(&self) -> Option<&str> {
        self.last_oom.as_deref()
    }

    /// The ops so far, when recording.
    pub fn ops(&self) -> Option<&[Op]> {
        self.recording.as_ref().map(|r| r.ops.as_slice())
    }

    /// The op stream so far and the events it caused, as a trace `allocsim replay` reads:
    /// `meta` holds the settings, the device's memory when the session opened and the
    /// statistics now (so a replay says whether it comes to the same). `None` without
    /// recording.
    pub fn recording(&self, source_format: &str) -> Option<Trace> {
        let rec = self.recording.as_ref()?;
        Some(Trace {
            meta: TraceMeta {
                source_format: source_format.into(),
                alloc_conf: Some(self.conf.clone()),
                device_total_bytes: Some(self.opened_with.total_bytes),
                device_free_bytes: Some(self.opened_with.free_bytes),
                expected_stats: Some(self.stats().flat()),
                ..TraceMeta::default()
            },
            ops: rec.ops.clone(),
            recorded: rec.events.events.clone(),
            ..Trace::default()
        })
    }

    /// Serve the next requests from `pool`: close the open context, if any, and open one for
    /// `pool` unless it is the default.
    fn route(&mut self, pool: MemPoolId) {
        if pool == self.routing {
            return;
        }
        let open = std::mem::replace(&mut self.routing, pool);
        if !open.is_default() {
            self.step(Op::Pool { pool: open, action: PoolAction::EndAllocate });
        }
        if !pool.is_default() {
            self.step(Op::Pool { pool, action: PoolAction::BeginAllocate });
            *self.contexts.entry(pool).or_default() += 1;
        }
    }

    /// Run `op` and say what came of it; recorded when recording.
    fn step(&mut self, op: Op) -> OpOutcome {
        let mut tap = Tap {
            outcome: OpOutcome::Done,
            recorder: self.recording.as_mut().map(|r| &mut r.events),
        };
        self.engine.step_with(&op, &mut tap);
        let outcome = tap.outcome;
        if let Some(r) = &mut self.recording {
            r.ops.push(op);
        }
        outcome
    }
}

/// The observer of one step: keeps its outcome, and passes events to the recorder.
struct Tap<'a> {
    outcome: OpOutcome,
    recorder: Option<&'a mut Recorder>,
}

impl Observer for Tap<'_> {
    fn on_event(&mut self, event_index: u64, op_index: u64, event: &Event) -> bool {
        if let Some(r) = &mut self.recorder {
            r.on_event(event_index, op_index, event);
        }
        true
    }

    fn on_op(
        &mut self,
        _op_index: u64,
        _op: &Op,
        outcome: &OpOutcome,
        _allocator: &dyn Allocator,
        _device: &dyn Device,
    ) -> bool {
        self.outcome = *outcome;
        true
    }
}

/// PyTorch's OOM message, with the figures the policy gave.
pub fn oom_message(size: u64, device: u32, info: &OomInfo) -> String {
    let gib = format_size;
    let mut text = format!(
        "CUDA out of memory (allocsim). Tried to allocate {} ({} after rounding). GPU {device} \
         has a total capacity of {} of which {} is free. Of the memory the policy holds, {} is \
         allocated and {} is reserved but unallocated; its largest free block is {} (large \
         pool) and {} (small pool).",
        gib(size),
        gib(info.rounded_bytes),
        gib(info.device_total_bytes),
        gib(info.device_free_bytes),
        gib(info.allocated_bytes),
        gib(info.cached_bytes()),
        gib(info.largest_free_large_bytes),
        gib(info.largest_free_small_bytes),
    );
    if let Some(allowed) = info.allowed_bytes {
        text.push_str(&format!(" The memory fraction allows {}.", gib(allowed)));
    }
    text
}

/// `1.50 GiB`, `20.00 MiB`, `512 bytes`: PyTorch's `format_size`.
pub fn format_size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if b <= KIB * KIB {
        format!("{:.2} KiB", b / KIB)
    } else if b <= KIB * KIB * KIB {
        format!("{:.2} MiB", b / KIB / KIB)
    } else {
        format!("{:.2} GiB", b / KIB / KIB / KIB)
    }
}
