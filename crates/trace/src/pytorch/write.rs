//! A `Trace` as a snapshot dict that `torch.cuda._memory_viz` and this crate's reader open.
//!
//! The trace entries come from `recorded` when the trace has it (a recording, or a simulated
//! run's event log turned into recorded events): that is where addresses are. A trace without
//! `recorded` has only ops, which carry no addresses, so its entries are made from the ops,
//! each block at an address of its own ([`SYNTHETIC_BASE`] up, never reused): the file reads
//! back as the same ops, and its addresses say nothing of any device's.
//!
//! Each entry's `time_us` is the recorded time of the op it belongs to, when the trace came
//! from a snapshot (`Trace::op_times`), and its `compile_context` and `user_metadata` the op's
//! annotation (`Trace::op_annotations`) or PyTorch's defaults.
//!
//! `segments` is written empty: the memory map at the end is a simulation's business, not
//! the trace's.

use crate::addr_map::AddrMap;
use crate::error::TraceError;
use crate::pickle::{Stream, Value, BATCH};
use allocsim_core::{AllocId, Op, RecordedEvent, StreamId, Trace};
use std::collections::HashSet;

/// Interned keys and actions, so each is one shared string (and one memo entry when written).
struct Keys {
    action: Value,
    addr: Value,
    device_free: Value,
    size: Value,
    stream: Value,
    time_us: Value,
    frames: Value,
    compile_context: Value,
    user_metadata: Value,
    /// The few actions' names, found by a scan (hashing each entry's took a tenth of writing).
    actions: Vec<(&'static str, Value)>,
}

impl Keys {
    fn new() -> Keys {
        let s = Value::str;
        Keys {
            action: s("action"),
            addr: s("addr"),
            device_free: s("device_free"),
            size: s("size"),
            stream: s("stream"),
            time_us: s("time_us"),
            frames: s("frames"),
            compile_context: s("compile_context"),
            user_metadata: s("user_metadata"),
            actions: Vec::new(),
        }
    }

    fn action(&mut self, name: &'static str) -> Value {
        if let Some((_, v)) = self.actions.iter().find(|(n, _)| *n == name) {
            return v.clone();
        }
        let v = Value::str(name);
        self.actions.push((name, v.clone()));
        v
    }
}

/// Sizes as the reader accepts them: no larger than `MAX_SIZE_BYTES` (below `i64::MAX`), so
/// every snapshot this crate writes reads back.
fn size_value(size: u64) -> Result<Value, String> {
    if size > super::entries::MAX_SIZE_BYTES {
        return Err(format!("size {size} is larger than 2^62 bytes, which no snapshot holds"));
    }
    Ok(Value::Int(size as i64))
}

/// Where the addresses of a trace without recorded ones start (a CUDA-like address).
pub const SYNTHETIC_BASE: u64 = 0x7f00_0000_0000;

/// One trace entry before it is a dict: its action, address, size, stream and op.
#[derive(Clone, Copy)]
struct Parts {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: StreamId,
    op: Option<u64>,
}

impl Parts {
    /// The entry of a recorded event.
    fn of(ev: &RecordedEvent) -> Parts {
        Parts {
            action: ev.kind.action(),
            addr: ev.addr,
            size: ev.size,
            stream: ev.stream,
            op: Some(ev.op),
        }
    }
}

/// How many entries use each stack, counted before any is written: a stack's `frames` list
/// shared by two or more entries is written once and referred to, as PyTorch's pickle does.
#[derive(Debug)]
pub struct StackUses {
    op_stack: AddrMap<u64, usize>,
    /// Per stack of the trace, then one slot for the entries without one.
    uses: Vec<u64>,
}

impl StackUses {
    /// None counted yet, for the stacks of `trace`.
    pub fn new(trace: &Trace) -> StackUses {
        StackUses {
            op_stack: trace.op_stacks.iter().map(|&(op, s)| (op, s as usize)).collect(),
            uses: vec![0; trace.stacks.len() + 1],
        }
    }

    /// Count the entry of `event`.
    pub fn count(&mut self, event: &RecordedEvent) {
        self.count_op(Some(event.op));
    }

    fn count_op(&mut self, op: Option<u64>) {
        let stacks = self.uses.len() - 1;
        let s = op.and_then(|o| self.op_stack.get(&o)).copied().filter(|&s| s < stacks);
        self.uses[s.unwrap_or(stacks)] += 1;
    }

    /// Every entry of `trace` counted.
    fn of(trace: &Trace) -> Result<StackUses, String> {
        let mut uses = StackUses::new(trace);
        for_each_entry(trace, |p| {
            uses.count_op(p.op);
            Ok(())
        })?;
        Ok(uses)
    }
}

/// Every entry of `trace`, in order, handed to `f`.
fn for_each_entry(
    trace: &Trace,
    mut f: impl FnMut(Parts) -> Result<(), String>,
) -> Result<(), String> {
    let mut entry = |action, addr, size, stream, op| f(Parts { action, addr, size, stream, op });
    if !trace.recorded.is_empty() {
        return trace.recorded.iter().try_for_each(|ev| f(Parts::of(ev)));
    }
    // Entries as PyTorch would write them for these ops. A 0-byte tensor gets a null
    // pointer without reaching the allocator, so it has none, and neither has its free.
    let mut blocks: AddrMap<AllocId, (u64, StreamId, u64)> = AddrMap::default();
    let mut deferred: HashSet<AllocId> = HashSet::new();
    let mut next_addr = SYNTHETIC_BASE;
    for (i, op) in trace.ops.iter().enumerate() {
        let o = Some(i as u64);
        let empty = |id: &AllocId| blocks.get(id).is_some_and(|&(size, ..)| size == 0);
        match op {
            Op::Alloc { id, size, stream } | Op::AllocAt { id, size, stream, .. } => {
                let addr = match op {
                    Op::AllocAt { addr, .. } => *addr,
                    _ => {
                        let addr = next_addr;
                        next_addr = next_addr.saturating_add(size.next_multiple_of(512).max(512));
                        addr
                    }
                };
                blocks.insert(*id, (*size, *stream, addr));
                if *size > 0 {
                    entry("alloc", addr, *size, *stream, o)?;
                }
            }
            Op::FreeRequested { id } | Op::FreeCompleted { id } if empty(id) => {}
            Op::RecordStream { id, .. } => {
                deferred.insert(*id);
            }
            // A block is forgotten once its free completes, so the writer holds the live
            // blocks, not every block of the trace.
            Op::FreeRequested { id } => {
                let (size, stream, addr) = blocks.get(id).copied().unwrap_or_default();
                entry("free_requested", addr, size, stream, o)?;
                if !deferred.contains(id) {
                    blocks.remove(id);
                    entry("free_completed", addr, size, stream, o)?;
                }
            }
            Op::FreeCompleted { id } => {
                let (size, stream, addr) = blocks.remove(id).unwrap_or_default();
                deferred.remove(id);
                entry("free_completed", addr, size, stream, o)?;
            }
            Op::EmptyCache
            | Op::SetMemoryFraction { .. }
            | Op::SetAllocatorSettings { .. }
            | Op::Pool { .. } => {}
        }
    }
    Ok(())
}

/// What the entries share (keys, stacks, annotations) and how each op's are found: makes
/// the entries one at a time, so a writer holds one batch of them, not the trace's worth.
struct EntryMaker<'t> {
    trace: &'t Trace,
    keys: Keys,
    /// Each stack's `frames` list when two or more entries share it (a list written once and
    /// referred to after, as PyTorch's pickle does); `None`, made afresh when its one entry is
    /// written, otherwise (written in place).
    frames: Vec<Option<Value>>,
    /// The empty `frames` list, when entries share it.
    empty_frames: Option<Value>,
    op_stack: AddrMap<u64, usize>,
    op_time: AddrMap<u64, i64>,
    op_annotation: AddrMap<u64, usize>,
    annotations: Vec<[Value; 2]>,
    no_annotation: [Value; 2],
    /// Entries made so far: the time of an entry whose op has none.
    made: usize,
}

impl<'t> EntryMaker<'t> {
    /// The maker of `trace`'s entries, which `uses` counted: a list shared is written once
    /// and referred to, a list of one entry is written in place.
    fn new(trace: &'t Trace, uses: StackUses) -> Self {
        let StackUses { op_stack, uses } = uses;
        let frames =
            (0..trace.stacks.len()).map(|s| (uses[s] > 1).then(|| stack_value(trace, s))).collect();
        let empty_frames = (uses[trace.stacks.len()] > 1).then(|| Value::list(Vec::new()));
        EntryMaker {
            trace,
            keys: Keys::new(),
            frames,
            empty_frames,
            op_stack,
            // The recorded time of the entry each op came from; an entry of an op without one
            // (a trace from another format) counts entries, as a clock that only goes forward.
            op_time: trace.op_times.iter().copied().collect(),
            // Each op's annotation, or PyTorch's defaults.
            op_annotation: trace.op_annotations.iter().map(|&(op, a)| (op, a as usize)).collect(),
            annotations: (trace.annotations.iter())
                .map(|a| [Value::str(&a.compile_context), Value::str(&a.user_metadata)])
                .collect(),
            no_annotation: [
                Value::str(allocsim_core::Annotation::DEFAULT_COMPILE_CONTEXT),
                Value::str(""),
            ],
            made: 0,
        }
    }

    fn entry(&mut self, p: Parts) -> Result<Value, String> {
        Ok(Value::dict(self.pairs(p)?.into()))
    }

    /// The entry's pairs, for [`Stream::batch_of_dicts`]: no dict allocated.
    fn pairs(&mut self, p: Parts) -> Result<[(Value, Value); 8], String> {
        let keys = &mut self.keys;
        let addr_key = if p.action == "oom" { keys.device_free.clone() } else { keys.addr.clone() };
        let time = p.op.and_then(|o| self.op_time.get(&o).copied()).unwrap_or(self.made as i64);
        self.made += 1;
        let [context, metadata] =
            p.op.and_then(|o| self.op_annotation.get(&o))
                .and_then(|&a| self.annotations.get(a))
                .unwrap_or(&self.no_annotation)
                .clone();
        let stack = p.op.and_then(|o| self.op_stack.get(&o)).copied();
        let frames = match stack.filter(|&s| s < self.trace.stacks.len()) {
            Some(s) => self.frames[s].clone().unwrap_or_else(|| stack_value(self.trace, s)),
            None => self.empty_frames.clone().unwrap_or_else(|| Value::list(Vec::new())),
        };
        // Addresses and stream handles are pointers that PyTorch writes as int64.
        Ok([
            (keys.action.clone(), keys.action(p.action)),
            (addr_key, Value::Int(p.addr as i64)),
            (keys.size.clone(), size_value(p.size)?),
            (keys.stream.clone(), Value::Int(p.stream.0 as i64)),
            (keys.time_us.clone(), Value::Int(time)),
            (keys.compile_context.clone(), context),
            (keys.user_metadata.clone(), metadata),
            (keys.frames.clone(), frames),
        ])
    }
}

/// The snapshot's `allocator_settings`.
fn allocator_settings(trace: &Trace) -> Value {
    let conf = trace.meta.alloc_conf.as_deref().unwrap_or("");
    Value::str_dict([("PYTORCH_CUDA_ALLOC_CONF", Value::str(conf))])
}

/// Build the snapshot dict. Fails only on sizes beyond int64.
pub fn trace_to_snapshot(trace: &Trace) -> Result<Value, String> {
    let mut maker = EntryMaker::new(trace, StackUses::of(trace)?);
    let mut entries = Vec::new();
    for_each_entry(trace, |p| {
        entries.push(maker.entry(p)?);
        Ok(())
    })?;
    drop(maker);
    Ok(Value::str_dict([
        ("segments", Value::list(Vec::new())),
        ("device_traces", Value::list(vec![Value::list(entries)])),
        ("allocator_settings", allocator_settings(trace)),
        ("external_annotations", Value::list(Vec::new())),
    ]))
}

/// Write the snapshot [`trace_to_snapshot`] builds, byte for byte, holding one batch of
/// entries at a time rather than the trace's worth of dicts (a 15-million-entry trace took
/// 6 GB as values). `path` names the file in errors.
pub fn write_streamed<W: std::io::Write>(
    trace: &Trace,
    out: W,
    path: &std::path::Path,
) -> Result<(), TraceError> {
    write_streamed_with(trace, out, path, None)
}

/// What [`write_streamed_with`] writes in place of [`write_streamed`]'s: a simulated run's
/// memory map and its policy's settings, as `replay --export-snapshot` writes them.
#[derive(Debug)]
pub struct RunParts<'v> {
    pub segments: &'v Value,
    pub settings: &'v Value,
}

/// [`write_streamed`], with a run's `segments` and `allocator_settings` if given; then the
/// `device_traces` and `external_annotations` lists are memoized, as the export has always
/// written them (it held them twice), so its files stay byte for byte what they were.
pub fn write_streamed_with<W: std::io::Write>(
    trace: &Trace,
    out: W,
    path: &std::path::Path,
    run: Option<RunParts<'_>>,
) -> Result<(), TraceError> {
    let unwritable = |message| TraceError::Unwritable { path: path.to_path_buf(), message };
    let uses = StackUses::of(trace).map_err(unwritable)?;
    write_entries(trace, uses, out, path, run, |entry| for_each_entry(trace, entry))
}

/// A simulated run as a snapshot ([`write_streamed_with`] of `trace` with the run's events as
/// its `recorded`), written as the events come: `events` hands each to the sink it is given,
/// which returns false once writing failed, and returns an error of its own if it fails.
/// `uses` must have counted the same events. So a run is written without its events held
/// (`replay --export-snapshot` replays a second time to hand them over).
pub fn write_run_streamed<W: std::io::Write>(
    trace: &Trace,
    uses: StackUses,
    out: W,
    path: &std::path::Path,
    run: RunParts<'_>,
    events: impl FnOnce(&mut dyn FnMut(&RecordedEvent) -> bool) -> Result<(), String>,
) -> Result<(), TraceError> {
    write_entries(trace, uses, out, path, Some(run), |entry| {
        let mut failed = None;
        let given = events(&mut |ev| match entry(Parts::of(ev)) {
            Ok(()) => true,
            Err(message) => {
                failed = Some(message);
                false
            }
        });
        failed.map_or(given, Err)
    })
}

/// The snapshot of [`write_streamed_with`], with the entries `entries` hands over (each
/// entry to the sink it is given, stopping at the sink's first error).
fn write_entries<W: std::io::Write>(
    trace: &Trace,
    uses: StackUses,
    out: W,
    path: &std::path::Path,
    run: Option<RunParts<'_>>,
    entries: impl FnOnce(&mut dyn FnMut(Parts) -> Result<(), String>) -> Result<(), String>,
) -> Result<(), TraceError> {
    let empty = Value::list(Vec::new());
    let segments = run.as_ref().map_or(&empty, |r| r.segments);
    let unwritable = |message| TraceError::Unwritable { path: path.to_path_buf(), message };
    let pickle_err = |error| TraceError::Pickle { path: path.to_path_buf(), error };
    let mut maker = EntryMaker::new(trace, uses);
    let mut w = Stream::new(out).map_err(pickle_err)?;
    // The root dict's four pairs are one batch (MARK, the pairs, SETITEMS); the outer list
    // holds one item (no MARK), the entries' list.
    w.empty_dict().map_err(pickle_err)?;
    w.mark().map_err(pickle_err)?;
    w.value(&Value::str("segments")).map_err(pickle_err)?;
    w.value(segments).map_err(pickle_err)?;
    w.value(&Value::str("device_traces")).map_err(pickle_err)?;
    match run {
        Some(_) => w.shared_empty_list().map_err(pickle_err)?,
        None => w.empty_list().map_err(pickle_err)?,
    }
    w.empty_list().map_err(pickle_err)?;
    let mut batch = Vec::with_capacity(BATCH);
    let mut failed = None;
    entries(&mut |p| {
        batch.push(maker.pairs(p)?);
        if batch.len() == BATCH {
            w.batch_of_dicts(&batch).map_err(|e| {
                failed = Some(pickle_err(e));
                String::new()
            })?;
            batch.clear();
        }
        Ok(())
    })
    .map_err(|message| failed.take().unwrap_or_else(|| unwritable(message)))?;
    drop(maker);
    let end = |w: &mut Stream<W>| {
        if !batch.is_empty() {
            w.batch_of_dicts(&batch)?;
        }
        w.append()?;
        w.value(&Value::str("allocator_settings"))?;
        match &run {
            Some(run) => w.value(run.settings)?,
            None => w.value(&allocator_settings(trace))?,
        }
        w.value(&Value::str("external_annotations"))?;
        match run {
            Some(_) => w.shared_empty_list()?,
            None => w.empty_list()?,
        }
        w.setitems()
    };
    end(&mut w).map_err(pickle_err)?;
    w.finish().map_err(pickle_err)
}

/// One stack's `frames` list.
fn stack_value(trace: &Trace, stack: usize) -> Value {
    let (name, filename, line) = (Value::str("name"), Value::str("filename"), Value::str("line"));
    // Frame strings need no interning here: the pickle writer memoizes strings by content.
    let text = Value::str;
    let frames = trace.stacks[stack].frames.iter().map(|f| {
        Value::dict(vec![
            (name.clone(), text(&f.name)),
            (filename.clone(), text(&f.filename)),
            (line.clone(), Value::Int(i64::from(f.line))),
        ])
    });
    Value::list(frames.collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn bundled(name: &str) -> Trace {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces");
        let path = ["pytorch-2.11-h100", "pytorch-2.11-h100-extra", "pytorch-2.11-h100-user"]
            .iter()
            .map(|d| root.join(d).join(name))
            .find(|p| p.exists())
            .expect("a bundled trace");
        crate::read_trace(&path).expect("it reads")
    }

    /// The streamed writer writes what the whole value writes, byte for byte: with recorded
    /// events and stacks, with annotations, and from ops alone (no recorded events).
    #[test]
    fn streamed_snapshots_are_the_whole_values_bytes() {
        for name in ["gpt2_train.pickle.gz", "c_annotated.pickle.gz", "d_cudagraphs.pickle.gz"] {
            let mut trace = bundled(name);
            for _ in 0..2 {
                let whole = crate::pickle::to_vec(&trace_to_snapshot(&trace).unwrap()).unwrap();
                let mut streamed = Vec::new();
                write_streamed(&trace, &mut streamed, Path::new(name)).unwrap();
                assert!(
                    streamed == whole,
                    "{name}: {} against {} bytes",
                    streamed.len(),
                    whole.len()
                );
                // Again from the ops alone, a stack used once and the empty frames list shared.
                trace.recorded.clear();
                trace.op_stacks.truncate(1);
            }
        }
    }
}
