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
//! The bound counts every stream and private pool together. PyTorch keeps them apart, but
//! not every allocator must: a block whose free has completed (after the other streams' work,
//! `FreeCompleted`) may serve any stream, and an allocator that knows the future may share one
//! arena between pools, as [`place`] does; a bound per stream or pool would be PyTorch's cost,
//! not every allocator's. (A CUDA graph's pool is stricter: its replays write to the blocks of
//! its capture until the pool goes. The ops do not say which pools are graphs', so neither the
//! bound nor the placement assumes it.)
//!
//! **Architecture Invariant:** depends on `allocsim-core` only, does no IO.

mod exact;
mod place;

pub use exact::exact;
pub use place::{check, place, Placement};

use allocsim_core::{AllocId, BlockState, Op, RecordedKind, StreamId, Trace};
use std::collections::{HashMap, HashSet};

/// PyTorch's block rounding and the alignment every placement keeps: 512 bytes.
pub const ALIGN_BYTES: u64 = 512;
/// The driver's page: device memory is reserved in whole pages of 2 MiB.
pub const PAGE_BYTES: u64 = 2 << 20;

/// One allocation: live over the times `start..end` (its free completes at `end`), `size` bytes
/// rounded up to [`ALIGN_BYTES`]. Op `i` of a trace happens at time `i + 1`; time 0 is the
/// state a mid-run recording starts from, so that a block alive then and freed by op 0 lives
/// while the other blocks alive then do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    pub start: u64,
    pub end: u64,
    pub size: u64,
}

impl Lifetime {
    /// Whether the two are live at the same time.
    pub fn overlaps(&self, other: &Lifetime) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// Every allocation of `trace` with its lifetime ([`allocations`]).
pub fn lifetimes(trace: &Trace) -> Vec<Lifetime> {
    allocations(trace).lifetimes
}

/// A trace's allocations as a replay of it makes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocations {
    pub lifetimes: Vec<Lifetime>,
    /// Every allocation a replay asks the allocator for, in the order it asks: its id and the
    /// index of its lifetime, `None` for one the recording shows failing. What the offline
    /// policy follows (`allocsim_policies::offline`).
    pub requests: Vec<(AllocId, Option<usize>)>,
}

/// Where an allocation stands, as the replay engine sees it.
enum State {
    Live {
        lifetime: usize,
        stream: StreamId,
        other_stream: bool,
    },
    /// Freed by the program, waiting for another stream's work.
    Pending {
        lifetime: usize,
    },
}

/// The allocations of `trace` and their lifetimes: the blocks alive when a mid-run recording
/// starts (from time 0, in the order `StartState::prologue` lays them out), then those its ops
/// make, in order. Each op is read as the replay engine passes it on, so that a replay meets
/// the same allocations: an `Alloc` of an id still live is skipped; a free ends a lifetime
/// when it completes, at `FreeRequested`, or at `FreeCompleted` for a block used on a stream
/// other than its own (`RecordStream`, which PyTorch ignores for the block's own stream). What
/// is never freed lives to the end. Allocations the recording shows failing (an OOM the
/// program caught) get no lifetime: the run went on without them.
pub fn allocations(trace: &Trace) -> Allocations {
    let mut out = Allocations::default();
    let mut live: HashMap<AllocId, State> = HashMap::new();
    let end = trace.ops.len() as u64 + 1;
    // Saturating: a corrupt trace's request of u64::MAX bytes must not wrap to a small one.
    let rounded = |size: u64| size.div_ceil(ALIGN_BYTES).max(1).saturating_mul(ALIGN_BYTES);
    let failed: HashSet<u64> =
        trace.recorded.iter().filter(|r| r.kind == RecordedKind::Oom).map(|r| r.op).collect();
    if let Some(start) = &trace.start {
        for seg in &start.segments {
            for block in seg.blocks.iter().filter(|b| b.state.is_active()) {
                let Some(id) = start.id_at(block.address) else { continue };
                let lifetime = out.lifetimes.len();
                out.lifetimes.push(Lifetime { start: 0, end, size: rounded(block.requested_size) });
                out.requests.push((id, Some(lifetime)));
                let state = match block.state {
                    BlockState::ActivePendingFree => State::Pending { lifetime },
                    _ => State::Live { lifetime, stream: seg.stream, other_stream: false },
                };
                live.insert(id, state);
            }
        }
    }
    for (i, op) in trace.ops.iter().enumerate() {
        let (i, at) = (i as u64, i as u64 + 1);
        match *op {
            Op::Alloc { id, size, stream } | Op::AllocAt { id, size, stream, .. } => {
                if live.contains_key(&id) {
                    continue;
                }
                if failed.contains(&i) {
                    out.requests.push((id, None));
                    continue;
                }
                let lifetime = out.lifetimes.len();
                out.lifetimes.push(Lifetime { start: at, end, size: rounded(size) });
                out.requests.push((id, Some(lifetime)));
                live.insert(id, State::Live { lifetime, stream, other_stream: false });
            }
            Op::RecordStream { id, stream: used } => {
                if let Some(State::Live { stream, other_stream, .. }) = live.get_mut(&id) {
                    *other_stream |= *stream != used;
                }
            }
            Op::FreeRequested { id } => match live.get(&id) {
                Some(&State::Live { lifetime, other_stream: true, .. }) => {
                    live.insert(id, State::Pending { lifetime });
                }
                Some(&State::Live { lifetime, .. }) => {
                    out.lifetimes[lifetime].end = at;
                    live.remove(&id);
                }
                _ => {}
            },
            Op::FreeCompleted { id } => {
                if let Some(&State::Pending { lifetime }) = live.get(&id) {
                    out.lifetimes[lifetime].end = at;
                    live.remove(&id);
                }
            }
            _ => {}
        }
    }
    out
}

/// The most bytes live at any time: no allocator can do with less. [`PAGE_BYTES`] rounding is
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
            points.push((at, live.min(u64::MAX as i128) as u64));
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
    bytes.div_ceil(PAGE_BYTES).saturating_mul(PAGE_BYTES)
}
