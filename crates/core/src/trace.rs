//! A workload as read from a file: the ops, and, when the file is a recording, what the
//! recorded allocator did while running them.

use crate::{Op, StartState, StreamId};

/// A recorded program plus what is known of the run that produced it.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub meta: TraceMeta,
    pub ops: Vec<Op>,
    /// What was alive at the first recorded entry, for a recording that starts mid-run.
    pub start: Option<StartState>,
    /// What the recorded allocator did, in order; empty when the source records only requests.
    pub recorded: Vec<RecordedEvent>,
    /// Distinct call stacks, referred to by index from `op_stacks`.
    pub stacks: Vec<Stack>,
    /// Sparse `(op index, stack index)` pairs, sorted by op index: where each op came from.
    pub op_stacks: Vec<(u64, u32)>,
    /// Sparse `(op index, time_us)` pairs, sorted by op index: when the entry the op came from
    /// was recorded (a snapshot's `time_us`; only PyTorch snapshots carry it).
    pub op_times: Vec<(u64, i64)>,
    /// Distinct annotations of entries (`torch.compile` context, user metadata), referred to
    /// by index from `op_annotations`.
    pub annotations: Vec<Annotation>,
    /// Sparse `(op index, annotation index)` pairs, sorted by op index, for the ops whose
    /// entry had other than PyTorch's defaults.
    pub op_annotations: Vec<(u64, u32)>,
    /// Things the reader tolerated but the user should know (history enabled late, ...).
    pub warnings: Vec<String>,
}

impl Trace {
    /// The same trace with its state at the start ([`Trace::start`]) made into ops that
    /// allocate the live blocks before the recorded ones ([`StartState::prologue`]), for
    /// formats and policies that take ops only. Recorded events and stacks keep their ops.
    pub fn with_start_as_ops(mut self) -> Trace {
        let Some(start) = self.start.take() else { return self };
        let mut ops = start.prologue();
        let shift = ops.len() as u64;
        ops.append(&mut self.ops);
        self.ops = ops;
        for r in &mut self.recorded {
            r.op += shift;
        }
        for (op, _) in &mut self.op_stacks {
            *op += shift;
        }
        for (op, _) in &mut self.op_times {
            *op += shift;
        }
        for (op, _) in &mut self.op_annotations {
            *op += shift;
        }
        self.warnings.push(format!(
            "the live blocks at the history's start are laid out by {shift} ops before it"
        ));
        self
    }
}

/// Settings and device facts a trace carries. Every field is optional: a what-if run
/// overrides them, and formats that lack them leave them empty.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceMeta {
    /// The format it was read from (`pytorch-snapshot`, `rmm-log`, `allocsim-native`).
    pub source_format: String,
    /// The allocator settings string in force when recording (`PYTORCH_CUDA_ALLOC_CONF`).
    pub alloc_conf: Option<String>,
    /// A per-process memory fraction in force from the start.
    pub memory_fraction: Option<f64>,
    pub device_total_bytes: Option<u64>,
    /// Free device memory when the run started (other contexts take the rest).
    pub device_free_bytes: Option<u64>,
    /// Memory the run took outside the allocator (free at start − free at end − reserved at
    /// end), as `validation/fit.py` measures it.
    pub outside_allocator_bytes: Option<u64>,
    /// How that memory grew: `(op, bytes)`, taken by the end of each step of the run, `op`
    /// the first op recorded after that end (`validation/fit.py`'s `outside_profile`, placed
    /// on the ops by their times); empty if not measured.
    pub outside_profile: Vec<(u64, u64)>,
    /// `torch.cuda.memory_stats()` as the recorded run reported it at the end, if known.
    pub expected_stats: Option<Vec<(String, i64)>>,
    /// `torch.cuda.memory_stats()` when a history that starts mid-run began, if known.
    pub stats_at_start: Option<Vec<(String, i64)>>,
    /// The version of the library that recorded it, as that library writes it (for a PyTorch
    /// snapshot, `torch.__version__` from the sidecar: `2.13.0+cu130`), if known.
    pub recorded_with: Option<String>,
    /// Whether the recording lists every `empty_cache()` and memory fraction call (the sidecar
    /// of `allocsim.capture`): else an `empty_cache()` that freed nothing is not in the trace,
    /// and `num_sync_all_streams` is not determined by it.
    pub calls_recorded: bool,
    /// The process's rank in a distributed job (`torch.distributed.get_rank()`, the sidecar's
    /// `meta.rank`), if known: a job of per-rank recordings numbers its ranks by it.
    pub rank: Option<u32>,
    /// The number of ranks in that job (the sidecar's `meta.world_size`), if known.
    pub world_size: Option<u32>,
}

/// What kind of thing the recording shows the allocator doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordedKind {
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Alloc,
    FreeRequested,
    FreeCompleted,
    /// `addr` holds the driver's free memory at the time (`device_free`), `size` the rounded
    /// request.
    Oom,
}

impl RecordedKind {
    pub fn action(self) -> &'static str {
        match self {
            RecordedKind::SegmentAlloc => "segment_alloc",
            RecordedKind::SegmentFree => "segment_free",
            RecordedKind::SegmentMap => "segment_map",
            RecordedKind::SegmentUnmap => "segment_unmap",
            RecordedKind::Alloc => "alloc",
            RecordedKind::FreeRequested => "free_requested",
            RecordedKind::FreeCompleted => "free_completed",
            RecordedKind::Oom => "oom",
        }
    }

    pub fn is_segment_event(self) -> bool {
        !matches!(
            self,
            RecordedKind::Alloc | RecordedKind::FreeRequested | RecordedKind::FreeCompleted
        )
    }
}

/// One entry of a recording, tagged with the op during which it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedEvent {
    pub op: u64,
    pub kind: RecordedKind,
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
}

/// What a snapshot entry says besides the allocator's action: `compile_context` (the
/// `torch.compile` frame, `"N/A"` outside one) and `user_metadata` (set with
/// `torch._C._cuda_setMemoryMetadata`, empty by default).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Annotation {
    pub compile_context: String,
    pub user_metadata: String,
}

impl Annotation {
    /// PyTorch's values when there is nothing to say.
    pub const DEFAULT_COMPILE_CONTEXT: &'static str = "N/A";
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StackFrame {
    pub name: String,
    pub filename: String,
    pub line: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Stack {
    pub frames: Vec<StackFrame>,
}
