//! `replay --export-snapshot OUT.pickle[.gz]`: a simulated run as a PyTorch memory snapshot
//! that `torch.cuda._memory_viz` and pytorch.org/memory_viz open.

use allocsim_core::{RecordedEvent, SnapshotSegment, Trace};
use allocsim_trace::pickle::Value;
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

/// Write the run: `recorded` holds its events, `segments` the memory map at the end; `source`
/// is the trace run, whose stacks, times and annotations the entries carry.
pub fn write_snapshot(
    path: &Path,
    source: &Trace,
    recorded: Vec<RecordedEvent>,
    segments: &[SnapshotSegment],
    policy: &str,
    alloc_conf: &str,
) -> anyhow::Result<()> {
    let mut uses = allocsim_trace::pytorch::StackUses::new(source);
    recorded.iter().for_each(|e| uses.count(e));
    let events = |sink: &mut dyn FnMut(&RecordedEvent) -> bool| {
        recorded.iter().all(sink);
        Ok(())
    };
    write_snapshot_streamed(path, source, uses, events, segments, policy, alloc_conf)
}

/// [`write_snapshot`], with the events handed over by `events` (as
/// `allocsim_trace::pytorch::write_run_streamed` asks, `uses` having counted them),
/// `segments` is the memory map at the end; `source` is the trace run, whose stacks, times and
/// annotations the entries carry.
pub fn write_snapshot_streamed(
    path: &Path,
    source: &Trace,
    uses: allocsim_trace::pytorch::StackUses,
    events: impl FnOnce(&mut dyn FnMut(&RecordedEvent) -> bool) -> Result<(), String>,
    segments: &[SnapshotSegment],
    policy: &str,
    alloc_conf: &str,
) -> anyhow::Result<()> {
    // Written as the entries are made, straight to the file: the whole snapshot as values
    // and bytes took gigabytes for a long run.
    let (segments, settings) = (segments_value(segments), settings_value(policy, alloc_conf));
    let parts = allocsim_trace::pytorch::RunParts { segments: &segments, settings: &settings };
    let write = |out: &mut dyn std::io::Write| {
        allocsim_trace::pytorch::write_run_streamed(source, uses, out, path, parts, events)
    };
    let mut file = allocsim_trace::atomic::AtomicFile::create(path)?;
    let written: anyhow::Result<()> = if path.to_string_lossy().ends_with(".gz") {
        let mut gz = flate2::write::GzEncoder::new(&mut file, flate2::Compression::default());
        write(&mut gz).map_err(|e| anyhow!(e)).and_then(|()| Ok(gz.finish().map(drop)?))
    } else {
        write(&mut file).map_err(|e| anyhow!(e))
    };
    written
        .and_then(|()| Ok(file.commit()?))
        .with_context(|| format!("exporting {}", path.display()))
}

/// A `MempoolId` as PyTorch writes it: a tuple of two ints.
fn pool_id(id: allocsim_core::MemPoolId) -> Value {
    let int = |n: u64| Value::Int(i64::try_from(n).unwrap_or(i64::MAX));
    Value::tuple(vec![int(id.0), int(id.1)])
}
