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
use crate::pickle::Value;
use allocsim_core::{AllocId, Op, StreamId, Trace};
use std::collections::{HashMap, HashSet};

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
    actions: HashMap<&'static str, Value>,
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
            actions: HashMap::new(),
        }
    }

    fn action(&mut self, name: &'static str) -> Value {
        self.actions.entry(name).or_insert_with(|| Value::str(name)).clone()
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

/// Build the snapshot dict. Fails only on sizes beyond int64.
pub fn trace_to_snapshot(trace: &Trace) -> Result<Value, String> {
    let mut keys = Keys::new();
    let frames = stack_values(trace);
    let op_stack: AddrMap<u64, usize> =
        trace.op_stacks.iter().map(|&(op, s)| (op, s as usize)).collect();
    // The recorded time of the entry each op came from; an entry of an op without one (a
    // trace from another format) counts entries, as a clock that only goes forward.
    let op_time: AddrMap<u64, i64> = trace.op_times.iter().copied().collect();
    // Each op's annotation, or PyTorch's defaults.
    let op_annotation: AddrMap<u64, usize> =
        trace.op_annotations.iter().map(|&(op, a)| (op, a as usize)).collect();
    let annotations: Vec<[Value; 2]> = trace
        .annotations
        .iter()
        .map(|a| [Value::str(&a.compile_context), Value::str(&a.user_metadata)])
        .collect();
    let no_annotation =
        [Value::str(allocsim_core::Annotation::DEFAULT_COMPILE_CONTEXT), Value::str("")];
    let empty_frames = Value::list(Vec::new());
    let mut entries = Vec::new();
    let mut entry = |keys: &mut Keys,
                     action: &'static str,
                     addr: u64,
                     size: u64,
                     stream: StreamId,
                     op: Option<u64>| {
        let addr_key = if action == "oom" { keys.device_free.clone() } else { keys.addr.clone() };
        let time = op.and_then(|o| op_time.get(&o).copied()).unwrap_or(entries.len() as i64);
        let [context, metadata] = op
            .and_then(|o| op_annotation.get(&o))
            .and_then(|&a| annotations.get(a))
            .unwrap_or(&no_annotation)
            .clone();
        let f =
            op.and_then(|o| op_stack.get(&o)).and_then(|&s| frames.get(s)).unwrap_or(&empty_frames);
        // Addresses and stream handles are pointers that PyTorch writes as int64.
        let v = Value::dict(vec![
            (keys.action.clone(), keys.action(action)),
            (addr_key, Value::Int(addr as i64)),
            (keys.size.clone(), size_value(size)?),
            (keys.stream.clone(), Value::Int(stream.0 as i64)),
            (keys.time_us.clone(), Value::Int(time)),
            (keys.compile_context.clone(), context),
            (keys.user_metadata.clone(), metadata),
            (keys.frames.clone(), f.clone()),
        ]);
        entries.push(v);
        Ok::<(), String>(())
    };
    if trace.recorded.is_empty() {
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
                            next_addr =
                                next_addr.saturating_add(size.next_multiple_of(512).max(512));
                            addr
                        }
                    };
                    blocks.insert(*id, (*size, *stream, addr));
                    if *size > 0 {
                        entry(&mut keys, "alloc", addr, *size, *stream, o)?;
                    }
                }
                Op::FreeRequested { id } | Op::FreeCompleted { id } if empty(id) => {}
                Op::RecordStream { id, .. } => {
                    deferred.insert(*id);
                }
                Op::FreeRequested { id } => {
                    let (size, stream, addr) = blocks.get(id).copied().unwrap_or_default();
                    entry(&mut keys, "free_requested", addr, size, stream, o)?;
                    if !deferred.contains(id) {
                        entry(&mut keys, "free_completed", addr, size, stream, o)?;
                    }
                }
                Op::FreeCompleted { id } => {
                    let (size, stream, addr) = blocks.get(id).copied().unwrap_or_default();
                    entry(&mut keys, "free_completed", addr, size, stream, o)?;
                }
                Op::EmptyCache
                | Op::SetMemoryFraction { .. }
                | Op::SetAllocatorSettings { .. }
                | Op::Pool { .. } => {}
            }
        }
    } else {
        for ev in &trace.recorded {
            entry(&mut keys, ev.kind.action(), ev.addr, ev.size, ev.stream, Some(ev.op))?;
        }
    }
    let conf = trace.meta.alloc_conf.as_deref().unwrap_or("");
    Ok(Value::str_dict([
        ("segments", Value::list(Vec::new())),
        ("device_traces", Value::list(vec![Value::list(entries)])),
        ("allocator_settings", Value::str_dict([("PYTORCH_CUDA_ALLOC_CONF", Value::str(conf))])),
        ("external_annotations", Value::list(Vec::new())),
    ]))
}

/// One shared `frames` list per stack, as PyTorch shares identical tracebacks.
fn stack_values(trace: &Trace) -> Vec<Value> {
    let (name, filename, line) = (Value::str("name"), Value::str("filename"), Value::str("line"));
    // Frame strings need no interning here: the pickle writer memoizes strings by content.
    let text = Value::str;
    trace
        .stacks
        .iter()
        .map(|stack| {
            Value::list(
                stack
                    .frames
                    .iter()
                    .map(|f| {
                        Value::dict(vec![
                            (name.clone(), text(&f.name)),
                            (filename.clone(), text(&f.filename)),
                            (line.clone(), Value::Int(i64::from(f.line))),
                        ])
                    })
                    .collect(),
            )
        })
        .collect()
}
