//! From a snapshot's trace entries to ops (the program) and recorded events (what PyTorch did).
//!
//! The entries mix two things: the program's requests (`alloc`, `free_requested`, and
//! `free_completed` when it is deferred) and the allocator's own device calls (`segment_*`).
//! Ops are made from the first kind only; each device call becomes a recorded event tagged with
//! the op during which it happened, so a replay can be compared with the recording op by op.
//!
//! Mapping (op indices are positions in `Trace::ops`):
//! - `alloc` -> `Op::Alloc` with a fresh id; `oom` -> `Op::Alloc` with a fresh id that never
//!   becomes live (a failed attempt; its size is the rounded request PyTorch records).
//! - `free_requested` -> `Op::FreeRequested`. When the very next entry is its `free_completed`
//!   (no stream uses), that entry is recorded on the same op. Otherwise the block was used on
//!   another stream: `Op::RecordStream { stream: u64::MAX }` goes right before the
//!   `FreeRequested`, and the later `free_completed` becomes `Op::FreeCompleted` where it is
//!   (PyTorch polled the stream's event at the start of a `malloc`, `process_events`), unless
//!   it was `synchronize_and_free_events` inside an allocation's release path: completions
//!   that empty every pending free, in an attempt that then fails (`oom`) or frees segments.
//!   Those are recorded on the allocation's op and are no ops of their own, since the policy
//!   makes them itself there, after its cache lookup failed. (Still ambiguous: a pending free
//!   whose completion comes right after its request, synchronised in the very next `malloc`,
//!   reads as a free without stream uses.)
//! - `segment_*` entries wait for the op they belong to: the next `alloc`/`oom` (a new
//!   segment, the retry path, or the frees before an OOM). A run of segment frees/unmaps that
//!   reaches a `free_requested` (or the end) without one was no allocation's doing: an
//!   `Op::EmptyCache` is inferred there. So is a run of frees/unmaps alone before an `alloc`:
//!   a successful allocation frees segments only on its retry path, which then reserves one
//!   (and [`split_empty_cache_runs`] reads more runs so, from the free memory at the start). A
//!   deferred `free_completed` does not end a run: PyTorch completes pending frees inside
//!   `malloc`'s retry path and inside `empty_cache`.
//! - `snapshot` entries are skipped.
//! - A trace that starts mid-run (history enabled late, or a ring buffer that wrapped) frees
//!   blocks it never allocated, and its final `segments` show blocks it never allocated: the
//!   allocator's state at the first entry is reconstructed ([`start_state`]) and becomes
//!   `Trace::start`, with a warning; such a trace never fails.
//!
//! `recorded` is in trace order. Its op tags never decrease except around a deferred
//! `free_completed` inside a run, whose own op comes before the allocation the run belongs to.

use super::edits::Edits;
use super::entries::{segment_pool, Action, Ctx, Entries, Entry};
use super::mapped::{self, MapEvent};
use super::ops::OpList;
use super::stacks::Stacks;
use crate::addr_map::{AddrMap, BuildAddrHasher};
use crate::error::TraceError;
use allocsim_core::{
    AllocId, BlockState, MemPoolId, Op, PackedOps, Pool, PoolAction, RecordedEvent, RecordedKind,
    SnapshotBlock, SnapshotSegment, StartState, StreamId, MIB,
};
use std::collections::{BTreeMap, HashSet};

/// The stream of the `RecordStream` inferred for a deferred free: the recording does not say
/// which stream used the block, only that one did.
#[doc(no_inline)]
pub use allocsim_core::UNKNOWN_STREAM;

/// Placeholder op tag of a device event whose op is not known yet.
const UNTAGGED: u64 = u64::MAX;

/// What a conversion keeps besides ops and recorded events, as [`crate::ReadOptions`] says,
/// and how much it may build ([`crate::built`]).
#[derive(Debug, Clone, Copy)]
pub struct Keep {
    /// Most bytes the converted trace may hold.
    pub max_built_bytes: u64,
    /// Each op's stack (`ReadOptions::stacks`).
    pub stacks: bool,
    /// Which op each stack came from (`ReadOptions::op_stacks`).
    pub op_stacks: bool,
    /// Each op's time (`ReadOptions::times`).
    pub times: bool,
    /// Every recorded event (`ReadOptions::events`).
    pub events: bool,
    /// The ops packed past this many (`ReadOptions::packed_ops`).
    pub packed: Option<usize>,
}

impl Keep {
    pub fn of(opts: &crate::ReadOptions, path: &std::path::Path) -> Keep {
        let max_built_bytes = crate::built::Built::for_file(path, opts).limit();
        let (stacks, times, events) = (opts.stacks, opts.times, opts.events);
        let (op_stacks, packed) = (opts.op_stacks, opts.packed_ops);
        Keep { max_built_bytes, stacks, op_stacks, times, events, packed }
    }
}

pub struct Converted {
    pub start: Option<StartState>,
    pub ops: OpList,
    /// The recorded events, all of them or those [`Keep::events`] leaves.
    pub recorded: Vec<RecordedEvent>,
    /// How many events the recording has, kept or not.
    pub recorded_len: u64,
    /// How many of each kind the recording has, kept or not, by [`RecordedKind::action`].
    pub recorded_counts: BTreeMap<&'static str, u64>,
    /// Where the device events (segment allocations, frees, maps and unmaps) are in
    /// `recorded`: a few hundred of its hundreds of thousands, for those that read only them.
    pub device_events: Vec<u32>,
    pub stacks: Vec<allocsim_core::Stack>,
    pub op_stacks: Vec<(u64, u32)>,
    pub op_times: Vec<(u64, i64)>,
    pub annotations: Vec<allocsim_core::Annotation>,
    pub op_annotations: Vec<(u64, u32)>,
    pub warnings: Vec<String>,
}

/// A block alive before the history starts.
struct Synthetic {
    addr: u64,
    /// The requested size.
    size: u64,
    /// The block's size, when the final segments show it.
    block_size: Option<u64>,
    stream: StreamId,
    /// Its free was requested before the history too: only the completion is in the trace.
    free_requested: bool,
    /// The entry that frees it; `None` for blocks still alive at the end.
    entry: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Life {
    Live,
    PendingFree,
}

/// First pass: which frees name blocks the history never allocated, one entry at a time.
#[derive(Default)]
struct SyntheticFinder {
    state: AddrMap<u64, Life>,
    out: Vec<Synthetic>,
}

impl SyntheticFinder {
    #[inline(always)]
    fn step(
        &mut self,
        ctx: Ctx<'_>,
        i: usize,
        e: &Entry,
        frees_complete_at_once: bool,
    ) -> Result<(), TraceError> {
        let (state, out) = (&mut self.state, &mut self.out);
        let place = || ctx.entry_place(i);
        match e.action {
            Action::Alloc => {
                let previous = state.insert(e.addr, Life::Live);
                if let Some(life) = previous {
                    let what = if life == Life::Live { "live" } else { "pending free" };
                    let msg = format!("alloc at 0x{:x}, which is still {what}", e.addr);
                    return Err(ctx.err(place(), msg));
                }
            }
            Action::FreeRequested => match state.get_mut(&e.addr) {
                Some(life @ Life::Live) => {
                    if frees_complete_at_once {
                        state.remove(&e.addr);
                    } else {
                        *life = Life::PendingFree;
                    }
                }
                None => {
                    out.push(Synthetic {
                        addr: e.addr,
                        size: e.size,
                        block_size: None,
                        stream: e.stream,
                        free_requested: false,
                        entry: Some(i),
                    });
                    if !frees_complete_at_once {
                        state.insert(e.addr, Life::PendingFree);
                    }
                }
                Some(Life::PendingFree) => {
                    let msg = format!("free_requested of 0x{:x}, whose free is pending", e.addr);
                    return Err(ctx.err(place(), msg));
                }
            },
            Action::FreeCompleted => match state.remove(&e.addr) {
                Some(Life::PendingFree) => {}
                Some(Life::Live) => {
                    let msg = format!("free_completed of 0x{:x} without free_requested", e.addr);
                    return Err(ctx.err(place(), msg));
                }
                None => out.push(Synthetic {
                    addr: e.addr,
                    size: e.size,
                    block_size: None,
                    stream: e.stream,
                    free_requested: true,
                    entry: Some(i),
                }),
            },
            _ => {}
        }
        Ok(())
    }

    /// The blocks alive at the end that the history never allocated are synthetic too.
    fn finish(mut self, last: &[SnapshotSegment]) -> Vec<Synthetic> {
        for seg in last {
            for b in seg.blocks.iter().filter(|b| b.state.is_active()) {
                if let std::collections::hash_map::Entry::Vacant(slot) = self.state.entry(b.address)
                {
                    slot.insert(Life::Live);
                    self.out.push(Synthetic {
                        addr: b.address,
                        size: b.requested_size,
                        block_size: Some(b.size),
                        stream: seg.stream,
                        free_requested: b.state == BlockState::ActivePendingFree,
                        entry: None,
                    });
                }
            }
        }
        self.out
    }
}

/// An entry's stack as the converter gets it: its `frames` list, or the index a table on the
/// reading thread gave it ([`Stacks::adopt`]: frames are pickle values tied to that thread).
#[derive(Debug, Clone)]
pub enum Frames {
    Listed(crate::pickle::Value),
    Interned(u32),
}

/// The entry an op comes from: its index and `time_us`.
#[derive(Debug, Clone, Copy)]
struct Origin {
    entry: usize,
    time_us: i64,
}

impl Origin {
    fn of(entry: usize, e: &Entry) -> Origin {
        Origin { entry, time_us: e.time_us }
    }
}

/// A deferred `free_completed` waiting for its op: its block's id, its recorded event, and its
/// stack and entry.
struct Completion {
    id: AllocId,
    recorded: usize,
    frames: Option<Frames>,
    origin: Origin,
}

struct Builder<'a> {
    ctx: Ctx<'a>,
    ops: OpList,
    /// [`Keep::packed`].
    pack_from: Option<usize>,
    recorded: Vec<RecordedEvent>,
    /// See [`Converted::device_events`].
    device_events: Vec<u32>,
    op_stacks: Vec<(u64, u32)>,
    op_times: Vec<(u64, i64)>,
    /// Whether `op_times` is kept ([`Keep::times`]).
    times: bool,
    /// Whether `op_stacks` is kept ([`Keep::op_stacks`]).
    keep_op_stacks: bool,
    /// Whether every recorded event is kept ([`Keep::events`]), and how many were not.
    events: bool,
    /// [`Keep::max_built_bytes`].
    max_built_bytes: u64,
    events_left_out: u64,
    /// The events left out by kind: allocations, free requests, free completions.
    left_out_by_kind: [u64; 3],
    /// The times and stack pairs left out ([`Keep::times`], [`Keep::op_stacks`]).
    pairs_left_out: u64,
    /// The annotations entries refer to ([`Entry::annotation`]).
    annotations: Vec<allocsim_core::Annotation>,
    /// The annotated entries' annotations, by entry index, for the op each becomes.
    entry_annotations: AddrMap<usize, u32>,
    op_annotations: Vec<(u64, u32)>,
    stacks: Option<Stacks>,
    next_id: u64,
    /// Addresses of live and pending-free blocks.
    ids: AddrMap<u64, AllocId>,
    /// Ids of synthetic blocks, by the entry that frees them.
    synthetic_ids: AddrMap<usize, AllocId>,
    /// Indices into `recorded` of device events waiting for their op.
    run: Vec<usize>,
    run_has_alloc_side: bool,
    /// Stack and entry of the run's first device event (an inferred empty_cache's call, which
    /// takes that entry's time and annotation).
    run_frames: Option<Frames>,
    run_origin: Origin,
    /// The FreeRequested op of the free whose completion may come next, and its address.
    direct: Option<(u64, u64)>,
    /// Frees requested and not yet completed (blocks used on another stream).
    pending_frees: usize,
    /// Deferred completions since the last program entry, whose op is decided by what ends
    /// them (see [`Builder::settle_completions`]).
    completions: Vec<Completion>,
    /// `pending_frees` before the first of `completions`.
    pending_before_completions: usize,
    /// The run holds a segment free or unmap: the allocation went down its release path.
    run_has_release: bool,
    inferred_empty_cache: usize,
    misplaced_device_events: usize,
}

pub fn convert(
    ctx: Ctx<'_>,
    all: &Entries,
    last: &[SnapshotSegment],
    keep: Keep,
) -> Result<Converted, TraceError> {
    let entries = &all.list[..];
    let frames = |e: &Entry| all.frames.get(e.frames as usize).cloned().map(Frames::Listed);
    let any = |a: Action| entries.iter().any(|e| e.action == a);
    // `skip_actions=["free_completed"]` drops every completion: then frees complete at once.
    let frees_complete_at_once = !any(Action::FreeCompleted) && any(Action::FreeRequested);
    let mut finder = SyntheticFinder::default();
    let mut history = History::default();
    for (i, e) in entries.iter().enumerate() {
        finder.step(ctx, i, e, frees_complete_at_once)?;
        history.step(i, e);
    }
    let synthetic = finder.finish(last);
    let mut b = Builder::new(ctx, entries.len(), keep);
    b.annotations = all.annotations.clone();
    let start = (!synthetic.is_empty()).then(|| {
        let ids: Vec<AllocId> = synthetic
            .iter()
            .map(|s| {
                let id = b.fresh_id();
                if let Some(entry) = s.entry {
                    b.synthetic_ids.insert(entry, id);
                }
                id
            })
            .collect();
        start_state(history, last, &synthetic, &ids)
    });
    if let Some(problem) = start.as_ref().and_then(|(state, _)| state.problem()) {
        let msg = format!("the state at the history's first entry cannot be rebuilt: {problem}");
        return Err(ctx.err("device_traces", msg));
    }
    for (i, e) in entries.iter().enumerate() {
        if e.action == Action::Snapshot {
            continue;
        }
        let next = entries[i + 1..].iter().find(|n| n.action != Action::Snapshot);
        b.step(i, e, frames(e).as_ref(), next, frees_complete_at_once)?;
    }
    b.finish(start, frees_complete_at_once)
}

/// What [`start_state`] needs of the entries, gathered as they come.
#[derive(Default)]
struct History {
    /// The addresses device calls were seen at.
    seen: HashSet<u64, BuildAddrHasher>,
    /// The segments whose first device call frees them: they were there before the history.
    released_first: Vec<SnapshotSegment>,
    /// Every `segment_map` and `segment_unmap`, for the expandable segments' mapped ranges
    /// ([`mapped::ranges_at_start`]).
    maps: Vec<MapEvent>,
    /// The address and entry index of every `alloc` of more than 1 MiB: only those lie in a
    /// large pool's segments, where [`first_alloc_after`] looks (a request of at most 1 MiB
    /// rounds to at most 1 MiB, a small pool's size).
    allocs: Vec<(u64, usize)>,
}

impl History {
    #[inline(always)]
    fn step(&mut self, i: usize, e: &Entry) {
        match e.action {
            Action::Alloc if e.size > MIB => self.allocs.push((e.addr, i)),
            Action::SegmentAlloc => {
                self.seen.insert(e.addr);
            }
            Action::SegmentFree if self.seen.insert(e.addr) => {
                self.released_first.push(new_segment(e.addr, e.size, e.stream, false));
            }
            Action::SegmentMap | Action::SegmentUnmap => self.maps.push(MapEvent {
                addr: e.addr,
                size: e.size,
                stream: e.stream,
                map: e.action == Action::SegmentMap,
            }),
            _ => {}
        }
    }
}

/// A segment of the default pools, without blocks.
fn new_segment(
    address: u64,
    total_size: u64,
    stream: StreamId,
    is_expandable: bool,
) -> SnapshotSegment {
    SnapshotSegment {
        address,
        total_size,
        stream,
        pool: segment_pool(total_size),
        pool_id: MemPoolId::DEFAULT,
        is_expandable,
        blocks: Vec::new(),
    }
}

/// What [`start_state`] could not tell from the recording.
#[derive(Debug, Default)]
struct StartGuesses {
    /// Large blocks whose size was taken as their request rounded to 512 B, with a free gap
    /// after them (PyTorch may have left up to 1 MiB of it unsplit in the block).
    rounded_sizes: usize,
    /// Blocks in no known segment (an expandable segment's range, say): each is its own.
    outside_segments: usize,
}

/// The allocator's state at the first entry of a history that starts mid-run.
///
/// Segments: those the trace frees before it reserves them (address, size and stream from
/// the `segment_free`), those alive at the end that it never reserved, and the mapped ranges
/// of expandable segments ([`mapped::ranges_at_start`]). Blocks: those the
/// trace frees without having allocated them (their request and stream from the free), and
/// those alive at the end that it never allocated (their size from the final segments).
/// Between two active blocks of a segment lies one free block, since PyTorch merges free
/// neighbours. An active block's size is its request rounded to 512 B (small and expandable
/// blocks are split for any remainder of 512 B), extended in the large pool to the next
/// boundary when what is left is 1 MiB or less (PyTorch splits a large block only for a
/// remainder over 1 MiB, so no free large block is that small), or else to where the trace
/// first allocates after it ([`first_alloc_after`]).
fn start_state(
    history: History,
    last: &[SnapshotSegment],
    synthetic: &[Synthetic],
    ids: &[AllocId],
) -> (StartState, StartGuesses) {
    let mut segments = history.released_first;
    let whole = last.iter().filter(|s| !s.is_expandable && !history.seen.contains(&s.address));
    for seg in whole {
        segments.push(SnapshotSegment { blocks: Vec::new(), ..seg.clone() });
    }
    segments.extend(mapped::ranges_at_start(last, &history.maps));
    segments.sort_by_key(|s| s.address);

    let mut guesses = StartGuesses::default();
    let mut by_segment: Vec<Vec<(usize, &Synthetic)>> = vec![Vec::new(); segments.len()];
    for (k, syn) in synthetic.iter().enumerate() {
        let i = segments.partition_point(|s| s.address <= syn.addr);
        match i
            .checked_sub(1)
            .filter(|&i| syn.addr < segments[i].address.saturating_add(segments[i].total_size))
        {
            Some(i) => by_segment[i].push((k, syn)),
            None => {
                guesses.outside_segments += 1;
                let size = syn.block_size.unwrap_or_else(|| round_512(syn.size));
                segments.push(new_segment(syn.addr, size, syn.stream, true));
                by_segment.push(vec![(k, syn)]);
            }
        }
    }
    let mut allocs = history.allocs;
    allocs.sort_unstable();
    let mut state = StartState::default();
    for (seg, mut blocks) in segments.iter_mut().zip(by_segment) {
        blocks.sort_by_key(|(_, b)| b.addr);
        let end = seg.address.saturating_add(seg.total_size);
        let mut cursor = seg.address;
        for (j, &(k, b)) in blocks.iter().enumerate() {
            if b.addr > cursor {
                seg.blocks.push(free_block(cursor, b.addr - cursor));
            }
            let next = blocks.get(j + 1).map_or(end, |(_, n)| n.addr);
            let room = next.saturating_sub(b.addr);
            let size = match b.block_size {
                Some(size) => size,
                None => {
                    let rounded = round_512(b.size).min(room);
                    // Small and expandable blocks are split for any remainder of 512 B.
                    if seg.pool == Pool::Small || seg.is_expandable {
                        rounded
                    } else if room - rounded <= MIB {
                        room
                    } else if let Some(end) = first_alloc_after(&allocs, b, rounded, next) {
                        end - b.addr
                    } else {
                        guesses.rounded_sizes += 1;
                        rounded
                    }
                }
            };
            let state_of = if b.free_requested {
                BlockState::ActivePendingFree
            } else {
                BlockState::ActiveAllocated
            };
            seg.blocks.push(SnapshotBlock {
                address: b.addr,
                size,
                requested_size: b.size,
                state: state_of,
            });
            state.ids.push((b.addr, ids[k]));
            cursor = b.addr.saturating_add(size);
        }
        if cursor < end {
            seg.blocks.push(free_block(cursor, end - cursor));
        }
    }
    state.ids.sort_unstable();
    segments.sort_by_key(|s| s.address);
    state.segments = segments;
    (state, guesses)
}

/// Where the free block after `b` begins, if the trace allocates from it before `b` is
/// freed: PyTorch carves an allocation from the start of a free block, so the lowest address
/// allocated in `[b.addr + rounded, next)` while `b` lives is the end of `b`. Only an end
/// within 1 MiB of the rounded size is taken (PyTorch leaves no larger remainder unsplit).
fn first_alloc_after(
    allocs: &[(u64, usize)],
    b: &Synthetic,
    rounded: u64,
    next: u64,
) -> Option<u64> {
    let from = b.addr.saturating_add(rounded);
    let lived_until = b.entry.unwrap_or(usize::MAX);
    let at = allocs.partition_point(|&(addr, _)| addr < from);
    allocs[at..]
        .iter()
        .take_while(|&&(addr, _)| addr < next && addr <= from.saturating_add(MIB))
        .find(|&&(_, i)| i < lived_until)
        .map(|&(addr, _)| addr)
}

fn free_block(address: u64, size: u64) -> SnapshotBlock {
    SnapshotBlock { address, size, requested_size: 0, state: BlockState::Inactive }
}

/// A request rounded as PyTorch rounds it by default (`kMinBlockSize`, 512 B).
fn round_512(size: u64) -> u64 {
    size.max(1).div_ceil(512) * 512
}

/// The conversion done as the entries stream in, for a recording with `free_completed`
/// entries. It never holds the entries: what [`start_state`] needs of them for a history that
/// starts mid-run is gathered on the way ([`History`]), and a block the history never
/// allocated gets a provisional id ([`SYNTHETIC_ID`]) until [`StreamConvert::finish`] numbers
/// them first, as [`convert`] does. [`StreamConvert::push`] returns false, and
/// [`StreamConvert::finish`] `None`, as soon as the trace turns out to be another kind or
/// wrong, and the caller converts the entries with [`convert`] instead, which gives every
/// error and every other kind of trace.
pub struct StreamConvert<'a> {
    ctx: Ctx<'a>,
    finder: SyntheticFinder,
    history: History,
    builder: Builder<'a>,
    /// The last entry that is not a `snapshot`, waiting for the next one (a free needs to
    /// know whether its completion comes right after).
    waiting: Option<(usize, Entry)>,
    /// Its stack: apart, so that replacing the entry (`Copy`) drops nothing.
    waiting_frames: Option<Frames>,
    seen_free_requested: bool,
    seen_free_completed: bool,
    /// The trace outgrew [`Keep::max_built_bytes`]: final, no other pass would build less.
    too_big: Option<TraceError>,
}

impl<'a> StreamConvert<'a> {
    /// Why [`StreamConvert::push`] stopped, when the trace outgrew its bound.
    pub fn take_too_big(&mut self) -> Option<TraceError> {
        self.too_big.take()
    }

    pub fn new(ctx: Ctx<'a>, keep: Keep) -> Self {
        StreamConvert {
            ctx,
            finder: SyntheticFinder::default(),
            history: History::default(),
            builder: Builder::new(ctx, 0, keep),
            waiting: None,
            waiting_frames: None,
            seen_free_requested: false,
            seen_free_completed: false,
            too_big: None,
        }
    }

    /// Entry `i` with its stack and its annotation (when not PyTorch's default); false when
    /// the trace needs [`convert`].
    pub fn push(
        &mut self,
        i: usize,
        mut e: Entry,
        frames: Option<Frames>,
        annotation: Option<allocsim_core::Annotation>,
    ) -> bool {
        if let Some(a) = annotation {
            e.annotation = self.builder.annotations.len() as u32;
            self.builder.annotations.push(a);
        }
        self.seen_free_requested |= e.action == Action::FreeRequested;
        self.seen_free_completed |= e.action == Action::FreeCompleted;
        let synthetic = self.finder.out.len();
        if self.finder.step(self.ctx, i, &e, false).is_err() {
            return false;
        }
        if self.finder.out.len() > synthetic {
            let id = AllocId(SYNTHETIC_ID | synthetic as u64);
            self.builder.synthetic_ids.insert(i, id);
        }
        self.history.step(i, &e);
        if e.action == Action::Snapshot {
            return true;
        }
        // The entry waiting is stepped where it lies, then replaced: moving it out first
        // cost the Llama snapshot's conversion 4 M instructions more.
        if let Some((j, w)) = &self.waiting {
            match self.builder.step(*j, w, self.waiting_frames.as_ref(), Some(&e), false) {
                Ok(_) => {}
                Err(e @ TraceError::TooBig { .. }) => {
                    self.too_big = Some(e);
                    return false;
                }
                Err(_) => return false,
            }
        }
        self.waiting = Some((i, e));
        self.waiting_frames = frames;
        true
    }

    /// Keep every recorded event from here on ([`Keep::events`]), before the first entry.
    pub fn keep_events(&mut self) {
        self.builder.events = true;
    }

    /// The ops converted so far and the recorded events whose op is settled, from the start:
    /// later entries only append to both. `None` once the history shows it starts mid-run (its
    /// ids are renumbered at the end).
    pub fn settled(&self) -> Option<(&OpList, &[RecordedEvent])> {
        if !self.finder.out.is_empty() {
            return None;
        }
        let b = &self.builder;
        // Device events wait in the run, completions for what ends them: their op is not
        // known yet, and none before them is retagged.
        let waiting = b.run.iter().copied().chain(b.completions.iter().map(|c| c.recorded)).min();
        Some((&b.ops, &b.recorded[..waiting.unwrap_or(b.recorded.len())]))
    }

    /// The conversion, or `None` when the trace needs [`convert`]. `interned`: the stacks
    /// [`Frames::Interned`] indexes (none if every stack came listed).
    pub fn finish(
        mut self,
        last: &[SnapshotSegment],
        interned: Vec<allocsim_core::Stack>,
    ) -> Option<Converted> {
        if !self.seen_free_completed && self.seen_free_requested {
            return None;
        }
        if let Some((j, w)) = self.waiting.take() {
            let w_frames = self.waiting_frames.take();
            self.builder.step(j, &w, w_frames.as_ref(), None, false).ok()?;
        }
        let synthetic = self.finder.finish(last);
        let start = (!synthetic.is_empty()).then(|| {
            let ids: Vec<AllocId> = (0..synthetic.len() as u64).map(AllocId).collect();
            start_state(self.history, last, &synthetic, &ids)
        });
        if start.as_ref().is_some_and(|(state, _)| state.problem().is_some()) {
            return None;
        }
        // What finishing adds (the completions settled, the `empty_cache` a last run of device
        // events is) adopts its stacks before the table takes them.
        self.builder.settle_completions(false).ok()?;
        self.builder.close_run(None).ok()?;
        if let Some(stacks) = &mut self.builder.stacks {
            stacks.take_adopted(interned);
        }
        let mut converted = self.builder.finish(start, false).ok()?;
        if !synthetic.is_empty() {
            // The ids as `convert` gives them: the blocks alive at the start first, in the
            // order they were found, then the history's own.
            let first = synthetic.len() as u64;
            let renumber = |id: &mut AllocId| {
                id.0 = if id.0 & SYNTHETIC_ID != 0 { id.0 & !SYNTHETIC_ID } else { id.0 + first };
            };
            converted.ops.plain().iter_mut().filter_map(Op::id_mut).for_each(renumber);
        }
        Some(converted)
    }
}

/// Marks the provisional id [`StreamConvert`] gives a block alive before the history; the
/// rest of the id is the block's place among those found so far.
const SYNTHETIC_ID: u64 = 1 << 63;

/// Ops between two looks at what the trace holds.
const BUILT_CHECK_EVERY: u64 = 4096;

impl<'a> Builder<'a> {
    fn new(ctx: Ctx<'a>, entries: usize, keep: Keep) -> Self {
        Builder {
            ctx,
            ops: match keep.packed {
                Some(0) => OpList::Packed(PackedOps::new()),
                _ => OpList::Plain(Vec::with_capacity(entries / 2)),
            },
            pack_from: keep.packed,
            recorded: Vec::with_capacity(if keep.events { entries } else { 0 }),
            device_events: Vec::new(),
            op_stacks: Vec::new(),
            op_times: Vec::with_capacity(if keep.times { entries / 2 } else { 0 }),
            times: keep.times,
            keep_op_stacks: keep.op_stacks,
            events: keep.events,
            max_built_bytes: keep.max_built_bytes,
            events_left_out: 0,
            left_out_by_kind: [0; 3],
            pairs_left_out: 0,
            annotations: Vec::new(),
            entry_annotations: AddrMap::default(),
            op_annotations: Vec::new(),
            stacks: keep.stacks.then(Stacks::default),
            next_id: 0,
            ids: AddrMap::default(),
            synthetic_ids: AddrMap::default(),
            run: Vec::new(),
            run_has_alloc_side: false,
            run_frames: None,
            run_origin: Origin { entry: 0, time_us: super::entries::NO_TIME },
            direct: None,
            pending_frees: 0,
            completions: Vec::new(),
            pending_before_completions: 0,
            run_has_release: false,
            inferred_empty_cache: 0,
            misplaced_device_events: 0,
        }
    }

    /// Close the last run and say what was inferred.
    fn finish(
        mut self,
        start: Option<(StartState, StartGuesses)>,
        frees_complete_at_once: bool,
    ) -> Result<Converted, TraceError> {
        self.settle_completions(false)?;
        self.close_run(None)?;
        let mut warnings = Vec::new();
        if frees_complete_at_once {
            warnings.push(
                "the trace has free_requested but no free_completed entries (skip_actions?): \
                 every free is taken to complete at once"
                    .to_string(),
            );
        }
        if let Some((state, guesses)) = &start {
            let blocks = state.ids.len();
            warnings.push(format!(
                "the history starts mid-run: {} segments ({} bytes) and {blocks} live blocks \
                 were alive at its first entry, reconstructed from the final segments and the \
                 trace; cumulative statistics count from there unless the stats at history \
                 start are known",
                state.segments.len(),
                state.reserved_bytes()
            ));
            if guesses.rounded_sizes > 0 {
                warnings.push(format!(
                    "guessed: {} large blocks alive at the start are taken as their request \
                     rounded to 512 B (an unsplit remainder of up to 1 MiB would not show)",
                    guesses.rounded_sizes
                ));
            }
            if guesses.outside_segments > 0 {
                warnings.push(format!(
                    "guessed: {} blocks alive at the start lie in no segment the recording \
                     shows; each is taken as a segment of its own",
                    guesses.outside_segments
                ));
            }
        }
        if self.inferred_empty_cache > 0 {
            warnings.push(format!(
                "{} empty_cache ops were inferred from device frees that no allocation explains",
                self.inferred_empty_cache
            ));
        }
        if self.misplaced_device_events > 0 {
            warnings.push(format!(
                "{} segment_alloc/segment_map entries were not followed by an alloc or oom; \
                 they are tagged with the next op",
                self.misplaced_device_events
            ));
        }
        let mut recorded_counts = BTreeMap::new();
        for r in &self.recorded {
            *recorded_counts.entry(r.kind.action()).or_default() += 1;
        }
        let program =
            [RecordedKind::Alloc, RecordedKind::FreeRequested, RecordedKind::FreeCompleted];
        for (kind, n) in program.into_iter().zip(self.left_out_by_kind).filter(|&(_, n)| n > 0) {
            *recorded_counts.entry(kind.action()).or_default() += n;
        }
        Ok(Converted {
            start: start.map(|(state, _)| state),
            ops: self.ops,
            recorded_len: self.recorded.len() as u64 + self.events_left_out,
            recorded_counts,
            recorded: self.recorded,
            device_events: self.device_events,
            stacks: self.stacks.map(|s| s.stacks).unwrap_or_default(),
            op_stacks: self.op_stacks,
            op_times: self.op_times,
            annotations: self.annotations,
            op_annotations: self.op_annotations,
            warnings,
        })
    }

    /// What the trace holds so far against [`Keep::max_built_bytes`]: the trace the file
    /// describes, with the events, times and stack pairs left out counted as if kept, so a
    /// file is refused where it was whatever a command keeps of it (45 M identical entries in
    /// 5 MB, which `info` now holds in 60 MB, would take it seconds more to refuse).
    fn check_built(&self) -> Result<(), TraceError> {
        let pairs = self.op_stacks.len() as u64
            + self.op_times.len() as u64
            + self.op_annotations.len() as u64
            + self.pairs_left_out;
        let events = self.recorded.len() as u64 + self.events_left_out;
        let ids = self.ids.len() + self.synthetic_ids.len();
        let bytes = (self.ops.bytes() + self.device_events.len() * size_of::<u32>() + ids * 32)
            as u64
            + events * size_of::<RecordedEvent>() as u64
            + pairs * 16;
        if bytes <= self.max_built_bytes {
            return Ok(());
        }
        let built = crate::built::Built::with_limit(self.ctx.path, self.max_built_bytes);
        built.check(bytes, || format!("{} ops and {events} recorded events so far", self.ops.len()))
    }

    fn fresh_id(&mut self) -> AllocId {
        self.next_id += 1;
        AllocId(self.next_id - 1)
    }

    fn record(&mut self, op: u64, kind: RecordedKind, e: &Entry) {
        // Left out unless kept: the program's own events, whose op is known here (so no
        // index into `recorded` is taken of them). A deferred completion's op comes later.
        let program = matches!(kind, RecordedKind::Alloc | RecordedKind::FreeRequested)
            || (kind == RecordedKind::FreeCompleted && op != UNTAGGED);
        if program && !self.events {
            self.events_left_out += 1;
            self.left_out_by_kind[match kind {
                RecordedKind::Alloc => 0,
                RecordedKind::FreeRequested => 1,
                _ => 2,
            }] += 1;
            return;
        }
        let (addr, size, stream) = (e.addr, e.size, e.stream);
        if kind.is_segment_event() {
            self.device_events.push(self.recorded.len() as u32);
        }
        self.recorded.push(RecordedEvent { op, kind, addr, size, stream });
    }

    /// Push an op, attaching the entry's stack if stacks are kept.
    fn push_op(&mut self, op: Op, frames: Option<&Frames>, at: Origin) -> Result<u64, TraceError> {
        let (index, i) = (self.ops.len() as u64, at.entry);
        if index % BUILT_CHECK_EVERY == 0 {
            self.check_built()?;
        }
        self.ops.push(op);
        if let (OpList::Plain(ops), Some(n)) = (&self.ops, self.pack_from) {
            if ops.len() > n {
                self.ops.pack();
            }
        }
        if at.time_us != super::entries::NO_TIME {
            match self.times {
                true => self.op_times.push((index, at.time_us)),
                false => self.pairs_left_out += 1,
            }
        }
        if let Some(&a) = self.entry_annotations.get(&i) {
            self.op_annotations.push((index, a));
        }
        if let (Some(stacks), Some(frames)) = (self.stacks.as_mut(), frames) {
            let stack = match frames {
                Frames::Listed(list) => stacks.intern(self.ctx, list, i)?,
                &Frames::Interned(theirs) => Some(stacks.adopt(theirs)),
            };
            match stack {
                Some(s) if self.keep_op_stacks => self.op_stacks.push((index, s)),
                Some(_) => self.pairs_left_out += 1,
                None => {}
            }
        }
        Ok(index)
    }

    /// The live id at `e.addr`, or the synthetic one made for entry `i`.
    fn id_at(&self, i: usize, e: &Entry) -> Result<AllocId, TraceError> {
        self.ids.get(&e.addr).or_else(|| self.synthetic_ids.get(&i)).copied().ok_or_else(|| {
            let place = self.ctx.entry_place(i);
            self.ctx.err(place, format!("free of unknown address 0x{:x}", e.addr))
        })
    }

    /// End the pending run of device events before a free, or at the end (`at` = `None`).
    fn close_run(&mut self, at: Option<usize>) -> Result<(), TraceError> {
        if self.run.is_empty() {
            return Ok(());
        }
        let op = if self.run_has_alloc_side && at.is_some() {
            self.misplaced_device_events += 1;
            self.ops.len() as u64
        } else {
            self.inferred_empty_cache += 1;
            let frames = self.run_frames.take();
            self.push_op(Op::EmptyCache, frames.as_ref(), self.run_origin)?
        };
        self.tag_run(op);
        Ok(())
    }

    fn tag_run(&mut self, op: u64) {
        for &r in &self.run {
            self.recorded[r].op = op;
        }
        self.run.clear();
        self.run_has_alloc_side = false;
        self.run_has_release = false;
        self.run_frames = None;
    }

    /// Entry `i` (not a `snapshot`), with its stack and the next entry that is not one.
    #[inline(always)]
    fn step(
        &mut self,
        i: usize,
        e: &Entry,
        frames: Option<&Frames>,
        next: Option<&Entry>,
        frees_complete_at_once: bool,
    ) -> Result<(), TraceError> {
        let expecting = self.direct.take();
        if e.annotation != super::entries::NO_ANNOTATION {
            self.entry_annotations.insert(i, e.annotation);
        }
        match e.action {
            Action::Snapshot => {}
            Action::SegmentAlloc
            | Action::SegmentMap
            | Action::SegmentFree
            | Action::SegmentUnmap => self.device_event(i, e, frames),
            Action::Alloc | Action::Oom => self.alloc(i, e, frames)?,
            Action::FreeRequested => {
                let completes_next = frees_complete_at_once
                    || next.is_some_and(|n| n.action == Action::FreeCompleted && n.addr == e.addr);
                let k =
                    self.free_requested(i, e, frames, completes_next, frees_complete_at_once)?;
                if completes_next && !frees_complete_at_once {
                    self.direct = Some((e.addr, k));
                }
            }
            Action::FreeCompleted => match expecting {
                Some((addr, k)) if addr == e.addr => {
                    self.ids.remove(&e.addr);
                    self.record(k, RecordedKind::FreeCompleted, e);
                }
                _ => {
                    let id = self.id_at(i, e)?;
                    self.ids.remove(&e.addr);
                    if self.completions.is_empty() {
                        self.pending_before_completions = self.pending_frees;
                    }
                    self.pending_frees = self.pending_frees.saturating_sub(1);
                    let recorded = self.recorded.len();
                    self.record(UNTAGGED, RecordedKind::FreeCompleted, e);
                    self.completions.push(Completion {
                        id,
                        recorded,
                        frames: frames.cloned(),
                        origin: Origin::of(i, e),
                    });
                }
            },
        }
        Ok(())
    }

    /// A device call joins the pending run; its op is known when the run ends.
    fn device_event(&mut self, i: usize, e: &Entry, frames: Option<&Frames>) {
        let kind = match e.action {
            Action::SegmentAlloc => RecordedKind::SegmentAlloc,
            Action::SegmentMap => RecordedKind::SegmentMap,
            Action::SegmentFree => RecordedKind::SegmentFree,
            _ => RecordedKind::SegmentUnmap,
        };
        if self.run.is_empty() {
            self.run_frames = frames.cloned();
            self.run_origin = Origin::of(i, e);
        }
        self.run_has_alloc_side |= matches!(e.action, Action::SegmentAlloc | Action::SegmentMap);
        self.run_has_release |= matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
        self.run.push(self.recorded.len());
        self.record(UNTAGGED, kind, e);
    }

    /// `alloc` or `oom`: an allocation attempt, which the pending device calls belong to.
    fn alloc(&mut self, i: usize, e: &Entry, frames: Option<&Frames>) -> Result<(), TraceError> {
        // A successful allocation's release path ends with its retry's segment_alloc/map: a
        // run of device frees alone before an `alloc` was an `empty_cache` before it.
        if e.action == Action::Alloc && self.run_has_release && !self.run_has_alloc_side {
            self.settle_completions(false)?;
            self.close_run(None)?;
        }
        // Completions that emptied every pending free, in an attempt that went down the release
        // path (it failed, or freed segments), were `synchronize_and_free_events` inside it.
        let synchronized = !self.completions.is_empty()
            && self.completions.len() == self.pending_before_completions
            && (e.action == Action::Oom || self.run_has_release);
        self.settle_completions(synchronized)?;
        let id = self.fresh_id();
        let at = Origin::of(i, e);
        let k = self.push_op(Op::Alloc { id, size: e.size, stream: e.stream }, frames, at)?;
        self.tag_run(k);
        if e.action == Action::Alloc {
            self.ids.insert(e.addr, id);
            self.record(k, RecordedKind::Alloc, e);
        } else {
            self.record(k, RecordedKind::Oom, e);
        }
        Ok(())
    }

    /// `free_requested`; returns its op. A free that does not complete next was used on
    /// another stream: a `RecordStream` goes before it and the block stays known until its
    /// `free_completed`.
    fn free_requested(
        &mut self,
        i: usize,
        e: &Entry,
        frames: Option<&Frames>,
        completes_next: bool,
        frees_complete_at_once: bool,
    ) -> Result<u64, TraceError> {
        self.settle_completions(false)?;
        self.close_run(Some(i))?;
        let id = self.id_at(i, e)?;
        if !completes_next {
            self.push_op(Op::RecordStream { id, stream: UNKNOWN_STREAM }, None, Origin::of(i, e))?;
        }
        let k = self.push_op(Op::FreeRequested { id }, frames, Origin::of(i, e))?;
        self.record(k, RecordedKind::FreeRequested, e);
        if frees_complete_at_once {
            self.ids.remove(&e.addr);
        } else if !completes_next {
            self.ids.insert(e.addr, id);
            self.pending_frees += 1;
        }
        Ok(k)
    }

    /// Give the deferred completions since the last program entry their op. Polled ones
    /// (`process_events`, at the start of a `malloc`, or `empty_cache`'s synchronisation before
    /// its segment frees) become `Op::FreeCompleted`s where they are. Ones that
    /// `synchronize_and_free_events` made inside an allocation's release path belong to that
    /// allocation: the policy completes them itself there, after its cache lookup failed, so
    /// they must not be ops before it.
    #[inline]
    fn settle_completions(&mut self, synchronized: bool) -> Result<(), TraceError> {
        if self.completions.is_empty() {
            return Ok(());
        }
        self.settle_some_completions(synchronized)
    }

    #[inline(never)]
    fn settle_some_completions(&mut self, synchronized: bool) -> Result<(), TraceError> {
        for c in std::mem::take(&mut self.completions) {
            if synchronized {
                self.run.push(c.recorded);
            } else {
                let k =
                    self.push_op(Op::FreeCompleted { id: c.id }, c.frames.as_ref(), c.origin)?;
                self.recorded[c.recorded].op = k;
            }
        }
        Ok(())
    }
}

/// Free device memory that a failed `cudaMalloc` would still have left, at least, for a run of
/// device frees before a successful allocation to be read as its retry path: below this, the
/// driver may have refused (memory outside the allocator, the CUDA context's growth, is a few
/// hundred MB on an H100).
const RETRY_HEADROOM_BYTES: u64 = 2 << 30;

/// Read as `empty_cache` the device frees that open an allocation's run when the allocation's
/// `cudaMalloc` could not have failed first: with `device_free_bytes` known at the start and
/// no memory fraction, a
/// reservation that leaves more than [`RETRY_HEADROOM_BYTES`] free was granted at once, so
/// the frees before it were no retry path but an `empty_cache` the program called right before
/// (the recording shows the two alike). Each such allocation gets an `Op::EmptyCache` before
/// it (and before the pool contexts begun right before it), which takes the run's frees and the
/// completions before them. `ops`: the trace's ops, held beside it; `device_events`: where
/// the device events are in `trace.recorded`, ascending. Returns how many.
pub fn split_empty_cache_runs(
    trace: &mut allocsim_core::Trace,
    ops: &mut OpList,
    device_events: &[u32],
) -> usize {
    let Some(free_at_start) = trace.meta.device_free_bytes else { return 0 };
    // Under a memory fraction the cap refuses before the driver does, and garbage collection
    // frees segments before an allocation that then reserves one: leave those runs as they are.
    let fraction_in_conf =
        trace.meta.alloc_conf.as_deref().is_some_and(|c| c.contains("per_process_memory_fraction"));
    if trace.meta.memory_fraction.is_some() || fraction_in_conf {
        return 0;
    }
    let mut reserved = trace.start.as_ref().map_or(0, StartState::reserved_bytes);
    let mut edits = Edits::default();
    let mut splits = 0;
    let recorded = &trace.recorded;
    let reader = ops.reader();
    // Runs of one op's events that hold a device call (most hold none: the program's own
    // events alone), found from their device calls.
    let mut next = 0;
    for at in device_events.iter().map(|&r| r as usize) {
        if at < next {
            // In the run of the device event before.
            continue;
        }
        let op = recorded[at].op;
        let i = at - recorded[next..at].iter().rev().take_while(|r| r.op == op).count();
        let end = at + recorded[at..].iter().take_while(|r| r.op == op).count();
        next = end;
        let run = &recorded[i..end];
        let first_reserve = run
            .iter()
            .position(|r| matches!(r.kind, RecordedKind::SegmentAlloc | RecordedKind::SegmentMap));
        let opens_with_free =
            run.iter().find(|r| r.kind != RecordedKind::FreeCompleted).is_some_and(|r| {
                matches!(r.kind, RecordedKind::SegmentFree | RecordedKind::SegmentUnmap)
            });
        let is_alloc = matches!(reader.get(op as usize), Some(Op::Alloc { .. }));
        if let (Some(k), true, true) = (first_reserve, opens_with_free, is_alloc) {
            if free_at_start.saturating_sub(reserved).saturating_sub(run[k].size)
                > RETRY_HEADROOM_BYTES
            {
                // The `EmptyCache` takes the frees (and completions) before the reservation,
                // and goes before the pool contexts begun right before the allocation: the
                // program empties the cache, then enters them.
                let contexts = (0..op as usize)
                    .rev()
                    .take_while(|&k| {
                        matches!(reader.at(k), Op::Pool { action: PoolAction::BeginAllocate, .. })
                    })
                    .count();
                edits.split(op as usize - contexts, Op::EmptyCache, (i..i + k).collect());
                splits += 1;
            }
        }
        for r in run {
            match r.kind {
                RecordedKind::SegmentAlloc | RecordedKind::SegmentMap => reserved += r.size,
                RecordedKind::SegmentFree | RecordedKind::SegmentUnmap => {
                    reserved = reserved.saturating_sub(r.size)
                }
                _ => {}
            }
        }
    }
    if splits > 0 {
        edits.apply_to(trace, ops);
    }
    splits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pytorch::entries::{NO_ANNOTATION, NO_FRAMES, NO_TIME};
    use std::path::Path;

    fn entry(action: Action, addr: u64, size: u64) -> Entry {
        let (time_us, annotation, frames) = (NO_TIME, NO_ANNOTATION, NO_FRAMES);
        Entry { addr, size, stream: StreamId(0), time_us, annotation, frames, action }
    }

    /// A history that starts mid-run converts as it streams in, to what [`convert`] makes of
    /// the whole list: blocks freed before their alloc, a segment freed before it was
    /// reserved, blocks alive at the end that the history never allocated, ids numbered alike.
    #[test]
    fn a_mid_run_history_streams_to_the_listed_conversion() {
        use Action::*;
        let ctx = Ctx { path: Path::new("mid.pickle"), device: 0 };
        let mib = 1 << 20;
        let list = vec![
            entry(Alloc, 0x10_0000, 512),
            entry(FreeRequested, 0x200_0000, 4 * mib),
            entry(FreeCompleted, 0x200_0000, 4 * mib),
            entry(SegmentFree, 0x200_0000, 20 * mib),
            entry(Snapshot, 0, 0),
            entry(Alloc, 0x400_0000, 6 * mib),
            entry(FreeCompleted, 0x10_0800, 512),
            entry(FreeRequested, 0x10_0000, 512),
            entry(FreeCompleted, 0x10_0000, 512),
        ];
        let block =
            |address, size, state| SnapshotBlock { address, size, requested_size: size, state };
        let last = vec![
            SnapshotSegment {
                blocks: vec![
                    block(0x10_0000, 512, BlockState::Inactive),
                    block(0x10_0200, 1024, BlockState::ActiveAllocated),
                    block(0x10_0600, 2 * mib - 0x600, BlockState::Inactive),
                ],
                ..new_segment(0x10_0000, 2 * mib, StreamId(0), false)
            },
            SnapshotSegment {
                blocks: vec![
                    block(0x400_0000, 6 * mib, BlockState::ActiveAllocated),
                    block(0x460_0000, 14 * mib, BlockState::Inactive),
                ],
                ..new_segment(0x400_0000, 20 * mib, StreamId(0), false)
            },
        ];
        let all = Entries { list: list.clone(), ..Entries::default() };
        let (stacks, op_stacks, times, events, packed) = (false, false, true, true, None);
        let keep = Keep { max_built_bytes: u64::MAX, stacks, op_stacks, times, events, packed };
        let mut listed = convert(ctx, &all, &last, keep).unwrap();
        // The streamed conversion packs its ops: the same ops.
        let mut conv = StreamConvert::new(ctx, Keep { packed: Some(3), ..keep });
        for (i, e) in list.into_iter().enumerate() {
            assert!(conv.push(i, e, None, None), "entry {i}");
        }
        let mut streamed = conv.finish(&last, Vec::new()).expect("converts as it streams");
        let start = streamed.start.as_ref().expect("starts mid-run");
        assert_eq!(start.ids.len(), 3, "{start:?}");
        assert_eq!(streamed.start, listed.start);
        assert_eq!(streamed.ops.plain(), listed.ops.plain());
        assert_eq!(streamed.recorded, listed.recorded);
        assert_eq!(streamed.warnings, listed.warnings);
    }
}
