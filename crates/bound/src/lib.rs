//! How far from the best possible: for a trace, the least device memory any allocator needs
//! ([`lower_bound`]) and what an allocator that knows every allocation's lifetime in advance
//! achieves ([`place`]): the room a policy leaves above the best.
//!
//! The problem is dynamic storage allocation: each allocation is a rectangle, its lifetime (op
//! indices) by its size, to be placed at an address so that no two rectangles that live at the
//! same time overlap, minimising the highest address. It is NP-hard; the placement here is
//! heuristic, checked against the exact optimum on small generated cases ([`exact`]), and
//! never below the bound ([`lower_bound`] holds for every allocator: at the op where the most
//! bytes are live, they all need a place). No crate offers this (the planners of TFLite and
//! XLA are C++ inside their compilers), so it is written here; the heuristics are theirs:
//! greedy by size and greedy by breadth.
//!
//! **Architecture Invariant:** depends on `allocsim-core` only, does no IO.

mod exact;
mod place;

pub use exact::exact;
pub use place::{check, place, Placement};

use allocsim_core::{AllocId, BlockState, Op, RecordedKind, Trace};
use std::collections::{HashMap, HashSet};

/// PyTorch's block rounding and the alignment every placement keeps: 512 bytes.
pub const ALIGN_BYTES: u64 = 512;
/// The driver's page: device memory is reserved in whole pages of 2 MiB.
pub const PAGE_BYTES: u64 = 2 << 20;

/// One allocation: live over the ops `start..end` (its free completes at `end`), `size` bytes
/// rounded up to [`ALIGN_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    pub start: u64,
    pub end: u64,
    pub size: u64,
}

impl Lifetime {
    /// Whether the two are live at some op at the same time.
    pub fn overlaps(&self, other: &Lifetime) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// Every allocation of `trace` with its lifetime: the blocks alive when a mid-run recording
/// starts (from op 0), then those its ops make, in order. A free ends a lifetime when it
/// completes: at `FreeRequested`, or at `FreeCompleted` for a block with recorded stream uses
/// or already waiting for one. What is never freed lives to the end. Allocations the recording
/// shows failing (an OOM the program caught) are left out: the run went on without them.
pub fn lifetimes(trace: &Trace) -> Vec<Lifetime> {
    let mut out: Vec<Lifetime> = Vec::new();
    let mut live: HashMap<AllocId, (usize, bool)> = HashMap::new();
    let end = trace.ops.len() as u64;
    let rounded = |size: u64| size.div_ceil(ALIGN_BYTES).max(1) * ALIGN_BYTES;
    let failed: HashSet<u64> =
        trace.recorded.iter().filter(|r| r.kind == RecordedKind::Oom).map(|r| r.op).collect();
    if let Some(start) = &trace.start {
        for block in start.segments.iter().flat_map(|s| &s.blocks) {
            let Some(id) =
                start.id_at(block.address).filter(|_| block.state != BlockState::Inactive)
            else {
                continue;
            };
            live.insert(id, (out.len(), block.state == BlockState::ActivePendingFree));
            out.push(Lifetime { start: 0, end, size: rounded(block.size) });
        }
    }
    for (i, op) in trace.ops.iter().enumerate() {
        let i = i as u64;
        match op {
            Op::Alloc { id, size, .. } | Op::AllocAt { id, size, .. } if !failed.contains(&i) => {
                live.insert(*id, (out.len(), false));
                out.push(Lifetime { start: i, end, size: rounded(*size) });
            }
            Op::RecordStream { id, .. } => {
                if let Some(entry) = live.get_mut(id) {
                    entry.1 = true;
                }
            }
            Op::FreeRequested { id } => {
                if let Some(&(k, false)) = live.get(id) {
                    out[k].end = i;
                    live.remove(id);
                }
            }
            Op::FreeCompleted { id } => {
                if let Some((k, _)) = live.remove(id) {
                    out[k].end = i;
                }
            }
            _ => {}
        }
    }
    out
}

/// The most bytes live at any op: no allocator can do with less. [`PAGE_BYTES`] rounding is
/// left to the caller (`reserved_bound`).
pub fn lower_bound(lifetimes: &[Lifetime]) -> u64 {
    live_bytes(lifetimes).into_iter().map(|(_, live)| live).max().unwrap_or(0)
}

/// The bytes live after each op where some lifetime starts or ends, in op order.
pub(crate) fn live_bytes(lifetimes: &[Lifetime]) -> Vec<(u64, u64)> {
    let mut edges: Vec<(u64, i128)> = Vec::with_capacity(lifetimes.len() * 2);
    for l in lifetimes.iter().filter(|l| l.start < l.end) {
        edges.push((l.start, l.size as i128));
        edges.push((l.end, -(l.size as i128)));
    }
    edges.sort_unstable_by_key(|&(at, _)| at);
    let mut points: Vec<(u64, u64)> = Vec::new();
    let mut live = 0i128;
    for (k, &(at, delta)) in edges.iter().enumerate() {
        live += delta;
        if edges.get(k + 1).is_none_or(|next| next.0 != at) {
            points.push((at, live as u64));
        }
    }
    points
}

/// What `allocsim bound` and `compare` report of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub allocations: usize,
    pub peak_live_bytes: u64,
    /// `peak_live_bytes` in whole pages: no allocator reserves less.
    pub bound_bytes: u64,
    /// The offline placement's peak in whole pages, and the order that gave it; `None` when
    /// too many allocations live at once for one ([`place`]).
    pub offline: Option<(u64, &'static str)>,
}

impl Bound {
    /// What a placement knowing every lifetime would save against a policy's `peak_reserved`:
    /// negative where the policy needs less (it can free segments and take them again, which
    /// one contiguous arena cannot).
    pub fn headroom(&self, peak_reserved: u64) -> Option<i64> {
        self.offline.map(|(offline, _)| peak_reserved as i64 - offline as i64)
    }
}

/// The bound and the offline placement of `trace`.
pub fn bound(trace: &Trace) -> Bound {
    let lifetimes = lifetimes(trace);
    let peak_live_bytes = lower_bound(&lifetimes);
    Bound {
        allocations: lifetimes.len(),
        peak_live_bytes,
        bound_bytes: reserved(peak_live_bytes),
        offline: place(&lifetimes).map(|p| (reserved(p.peak), p.order)),
    }
}

/// The peak live bytes of `trace` in whole pages, without the offline placement: the cheap
/// part of [`bound`] (a sweep), for reports that show it beside every setting.
pub fn bound_bytes(trace: &Trace) -> u64 {
    reserved(lower_bound(&lifetimes(trace)))
}

/// Device memory reserved in whole pages to hold `bytes`.
pub fn reserved(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE_BYTES) * PAGE_BYTES
}
