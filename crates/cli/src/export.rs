//! `replay --export-snapshot OUT.pickle[.gz]`: a simulated run as a PyTorch memory snapshot
//! that `torch.cuda._memory_viz` and pytorch.org/memory_viz open.

use allocsim_core::{RecordedEvent, SnapshotSegment, Trace, TraceMeta};
use allocsim_trace::pickle::{self, Value};
use anyhow::{anyhow, Context};
use std::path::Path;

fn int(v: u64) -> Value {
    Value::Int(v as i64)
}

/// The `segments` list, in the layout of `torch.cuda.memory._snapshot()`.
fn segments_value(segments: &[SnapshotSegment]) -> Value {
    let empty_frames = Value::list(Vec::new());
    let items = segments
        .iter()
        .map(|seg| {
            let blocks = seg
                .blocks
                .iter()
                .map(|b| {
                    Value::str_dict([
                        ("address", int(b.address)),
                        ("size", int(b.size)),
                        ("requested_size", int(b.requested_size)),
                        ("state", Value::str(b.state.name())),
                        ("frames", empty_frames.clone()),
                    ])
                })
                .collect();
            Value::str_dict([
                ("device", Value::Int(0)),
                ("address", int(seg.address)),
                ("total_size", int(seg.total_size)),
                ("allocated_size", int(seg.allocated_size())),
                ("active_size", int(seg.active_size())),
                ("requested_size", int(seg.requested_size())),
                ("stream", int(seg.stream.0)),
                ("segment_type", Value::str(seg.pool.segment_type())),
                ("segment_pool_id", pool_id(seg.pool_id)),
                ("is_expandable", Value::Bool(seg.is_expandable)),
                ("frames", empty_frames.clone()),
                ("blocks", Value::list(blocks)),
            ])
        })
        .collect();
    Value::list(items)
}

/// `allocator_settings` as PyTorch 2.11 writes it, for the pytorch policy's settings string.
fn settings_value(policy: &str, alloc_conf: &str) -> Value {
    let mut pairs = vec![("PYTORCH_CUDA_ALLOC_CONF", Value::str(alloc_conf))];
    if policy == "pytorch" {
        if let Ok(c) = allocsim_policies::pytorch::Config::parse(alloc_conf) {
            let divisions = c
                .roundup_power2_divisions
                .iter()
                .enumerate()
                .map(|(i, &d)| (Value::str(&(1u64 << i).to_string()), int(d)))
                .collect();
            pairs.extend([
                ("max_split_size", Value::Int(c.max_split_size_stat())),
                ("garbage_collection_threshold", Value::Float(c.garbage_collection_threshold)),
                ("expandable_segments", Value::Bool(c.expandable_segments)),
                ("pinned_num_register_threads", int(c.pinned_num_register_threads)),
                ("release_lock_on_cudamalloc", Value::Bool(c.release_lock_on_cudamalloc)),
                ("pinned_use_cuda_host_register", Value::Bool(c.pinned_use_cuda_host_register)),
                (
                    "graph_capture_record_stream_reuse",
                    Value::Bool(c.graph_capture_record_stream_reuse),
                ),
                ("roundup_power2_divisions", Value::dict(divisions)),
            ]);
        }
    }
    Value::str_dict(pairs)
}

/// Write the run: `recorded` holds its events, `segments` the memory map at the end.
pub fn write_snapshot(
    path: &Path,
    source: &Trace,
    recorded: Vec<RecordedEvent>,
    segments: &[SnapshotSegment],
    policy: &str,
    alloc_conf: &str,
) -> anyhow::Result<()> {
    let run = Trace {
        meta: TraceMeta { alloc_conf: Some(alloc_conf.to_string()), ..TraceMeta::default() },
        recorded,
        stacks: source.stacks.clone(),
        op_stacks: source.op_stacks.clone(),
        op_times: source.op_times.clone(),
        annotations: source.annotations.clone(),
        op_annotations: source.op_annotations.clone(),
        ..Trace::default()
    };
    let dict = allocsim_trace::pytorch::trace_to_snapshot(&run).map_err(|e| anyhow!(e))?;
    let Value::Dict(pairs) = dict else { return Err(anyhow!("snapshot is not a dict")) };
    let pairs = pairs
        .iter()
        .map(|(k, v)| match k.as_str() {
            Some("segments") => (k.clone(), segments_value(segments)),
            Some("allocator_settings") => (k.clone(), settings_value(policy, alloc_conf)),
            _ => (k.clone(), v.clone()),
        })
        .collect();
    let bytes = pickle::to_vec(&Value::dict(pairs)).map_err(|e| anyhow!("{e}"))?;
    let bytes = if path.to_string_lossy().ends_with(".gz") {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&bytes)?;
        gz.finish()?
    } else {
        bytes
    };
    crate::write_atomically(path, &bytes).with_context(|| format!("exporting {}", path.display()))
}

/// A `MempoolId` as PyTorch writes it: a tuple of two ints.
fn pool_id(id: allocsim_core::MemPoolId) -> Value {
    let int = |n: u64| Value::Int(i64::try_from(n).unwrap_or(i64::MAX));
    Value::tuple(vec![int(id.0), int(id.1)])
}
