//! The calls a snapshot cannot show, which `allocsim.capture` records in the sidecar
//! (`meta.calls`): each `empty_cache()` (one that frees nothing leaves no trace entry, yet
//! PyTorch counts it in `num_sync_all_streams`) and each `set_per_process_memory_fraction()`
//! (its cap decides which failed `cudaMalloc` was retried, which the trace shows like an
//! `empty_cache` before the allocation). Each call carries its place: the allocations and frees
//! the allocator had counted when it came (`allocation.all.allocated` and `.freed`), which are
//! the trace's successful `alloc`s and its `free_requested`s.

use super::edits::Edits;
use super::ops::{OpList, OpReader};
use allocsim_core::{MemPoolId, Op, PoolAction, RecordedKind, Trace};
use std::collections::{BTreeMap, HashSet};

/// One recorded call.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub kind: CallKind,
    /// `allocation.all.allocated` when the call came.
    pub allocations: u64,
    /// `allocation.all.freed` when the call came.
    pub frees: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CallKind {
    EmptyCache,
    MemoryFraction(f64),
}

/// Where a call goes: before op `at` (after the last allocation and free it followed).
struct Placed<'c> {
    call: &'c Call,
    at: usize,
    /// The op of the allocation whose recorded run may open with this `empty_cache`'s frees.
    takes_run_of: Option<usize>,
    /// The recorded events of that run that are this call's frees: it goes right before the
    /// allocation, taking them. Empty when the run does not open with frees.
    frees: Vec<usize>,
}

/// Put `calls` into `trace` as ops: an `empty_cache` that freed segments is the inferred
/// `EmptyCache` at its place (or the frees that open the next allocation's run, which
/// otherwise read as that allocation's retry path); one that freed nothing becomes an
/// `EmptyCache` of its own; a fraction becomes `SetMemoryFraction`, or the fraction at the
/// start when it came before a history that starts later. `ops` are the trace's ops, held
/// beside it. Returns how many ops were added or split off, or `None` when the calls cannot be
/// placed (a trace that starts mid-run without the statistics at its end).
pub fn apply(trace: &mut Trace, ops: &mut OpList, calls: &[Call]) -> Option<usize> {
    let reader = ops.reader();
    let failed: HashSet<u64> =
        trace.recorded.iter().filter(|r| r.kind == RecordedKind::Oom).map(|r| r.op).collect();
    let counts = |k: usize, op: &Op| match op {
        Op::Alloc { .. } | Op::AllocAt { .. } if !failed.contains(&(k as u64)) => (1, 0),
        Op::FreeRequested { .. } => (0, 1),
        _ => (0, 0),
    };
    let (allocs, frees) = (reader.from(0).enumerate())
        .map(|(k, op)| counts(k, &op))
        .fold((0, 0), |(a, f), (x, y)| (a + x, f + y));
    // The counts before the trace's first entry.
    let stat = |key: &str| {
        let stats = trace.meta.expected_stats.as_ref()?;
        stats.iter().find(|(k, _)| k == key).map(|&(_, v)| v.max(0) as u64)
    };
    let base = match (stat("allocation.all.allocated"), stat("allocation.all.freed")) {
        (Some(a), Some(f)) => (a.saturating_sub(allocs), f.saturating_sub(frees)),
        _ if trace.start.is_none() => (0, 0),
        _ => return None,
    };
    let mut placed = Vec::new();
    let (mut at, mut a, mut f) = (0, 0, 0);
    let (mut claimed, mut runs_taken) = (HashSet::new(), HashSet::new());
    // The `empty_cache` calls that came during the history.
    let mut in_history = 0;
    for call in calls {
        let Some(want) = call.allocations.checked_sub(base.0).zip(call.frees.checked_sub(base.1))
        else {
            // Before the history began: only a fraction still holds at its start.
            if let CallKind::MemoryFraction(fraction) = call.kind {
                trace.meta.memory_fraction = Some(fraction);
            }
            continue;
        };
        while (a < want.0 || f < want.1) && at < reader.len() {
            let (x, y) = counts(at, &reader.at(at));
            (a, f) = (a + x, f + y);
            at += 1;
        }
        // A failed allocation counts neither way: the call comes after those at its place (a
        // program that catches an OOM acts after it).
        while at < reader.len() && failed.contains(&(at as u64)) {
            at += 1;
        }
        let mut takes_run_of = None;
        if call.kind == CallKind::EmptyCache {
            in_history += 1;
            // The ops up to the next allocation or free: the call's own `EmptyCache` if the
            // conversion inferred one, else the allocation whose run its frees open.
            let next = (at..reader.len()).find(|&k| counts(k, &reader.at(k)) != (0, 0));
            let inferred = (at..next.unwrap_or(reader.len()))
                .find(|&k| matches!(reader.at(k), Op::EmptyCache) && !claimed.contains(&k));
            if let Some(k) = inferred {
                // A later call at the same place comes after this one.
                claimed.insert(k);
                at = k + 1;
                continue;
            }
            // An allocation's run opens with the frees of one `empty_cache` at most.
            takes_run_of =
                next.filter(|&k| counts(k, &reader.at(k)) == (1, 0) && runs_taken.insert(k));
        }
        placed.push(Placed { call, at, takes_run_of, frees: Vec::new() });
    }
    // The recorded events of the allocations whose runs may open with a call's frees.
    let mut runs: BTreeMap<usize, Vec<usize>> =
        placed.iter().filter_map(|p| p.takes_run_of).map(|k| (k, Vec::new())).collect();
    if !runs.is_empty() {
        for (r, e) in trace.recorded.iter().enumerate() {
            if let Some(run) = runs.get_mut(&(e.op as usize)) {
                run.push(r);
            }
        }
    }
    for p in &mut placed {
        if let Some(events) = p.takes_run_of.and_then(|k| runs.get(&k)) {
            p.frees = opening_frees(events.iter().map(|&r| (r, trace.recorded[r].kind)));
        }
    }
    let mut edits = Edits::default();
    let last = reader.len().saturating_sub(1);
    let mut added = 0;
    let mut between = Between::new(trace, &reader, &placed, in_history);
    for p in &placed {
        let op = match p.call.kind {
            CallKind::EmptyCache => Op::EmptyCache,
            CallKind::MemoryFraction(fraction) => Op::SetMemoryFraction { fraction },
        };
        added += 1;
        match p.takes_run_of {
            // Right before the allocation and the pool contexts begun for it: the program
            // empties the cache, then enters them (a pool dropped before stays before).
            Some(k) if !p.frees.is_empty() => {
                let contexts = (0..k)
                    .rev()
                    .take_while(|&k| {
                        matches!(reader.at(k), Op::Pool { action: PoolAction::BeginAllocate, .. })
                    })
                    .count();
                edits.split(k - contexts, op, p.frees.clone())
            }
            _ if between.take(p, &op, &reader, &mut edits) => {}
            // A trace with no ops at all: the calls are its ops.
            _ if p.at < reader.len() || reader.is_empty() => edits.before(p.at, op),
            _ => edits.after(last, op),
        }
    }
    if added > 0 {
        between.close(&mut edits);
        edits.apply_to(trace, ops);
    }
    trace.warnings.extend(between.note());
    Some(added)
}

/// Calls the sidecar places inside a private pool's context, which the conversion infers as a
/// run of allocations into the pool from its first to its last: the run may be several
/// contexts, one after another (CUDA graph trees allocate a graph's inputs in the pool, then
/// `torch.cuda.graph` empties the cache and begins the capture), and PyTorch synchronizes for
/// an `empty_cache` only with no context open. As many calls as the statistics say came
/// outside every context are put between two contexts of the run: after the context's end
/// when no allocation or free of it follows, otherwise in a gap the context is split by.
struct Between {
    /// The contexts (`BeginAllocate` op, `EndAllocate` op, pool), by start; the pool inference
    /// opens one at a time.
    contexts: Vec<(usize, usize, MemPoolId)>,
    /// How many more calls inside contexts to move out.
    to_move: usize,
    /// Whether the statistics did not say how many.
    guessed: bool,
    /// The gap a context is split by now (before op `at`), which the next call that does not
    /// go in it closes by beginning the context again.
    gap: Option<(usize, MemPoolId)>,
    moved: usize,
}

impl Between {
    fn new(trace: &Trace, ops: &OpReader, placed: &[Placed], in_history: usize) -> Between {
        let contexts = contexts(ops);
        let inside = |p: &&Placed| moves(p) && context_at(&contexts, p.at).is_some();
        let inside = placed.iter().filter(inside).count();
        let in_contexts = calls_in_contexts(trace, ops, in_history);
        // Without the statistics, every call moves, as PyTorch's own calls come.
        let to_move = inside.saturating_sub(in_contexts.unwrap_or(0));
        Between { contexts, to_move, guessed: in_contexts.is_none(), gap: None, moved: 0 }
    }

    /// Put `op`, the call `p` (calls come in the order of their places), between contexts if
    /// it is one to move; false if it is not.
    fn take(&mut self, p: &Placed, op: &Op, ops: &OpReader, edits: &mut Edits) -> bool {
        let context = context_at(&self.contexts, p.at).filter(|_| moves(p) && self.to_move > 0);
        let Some((_, end, pool)) = context else {
            self.close(edits);
            return false;
        };
        self.to_move -= 1;
        self.moved += 1;
        if (p.at..end).all(|k| matches!(ops.at(k), Op::Pool { .. })) {
            edits.after(end, op.clone());
            return true;
        }
        if self.gap != Some((p.at, pool)) {
            self.close(edits);
            edits.before(p.at, Op::Pool { pool, action: PoolAction::EndAllocate });
            self.gap = Some((p.at, pool));
        }
        edits.before(p.at, op.clone());
        true
    }

    /// Begin the split context again after the calls put in its gap.
    fn close(&mut self, edits: &mut Edits) {
        if let Some((at, pool)) = self.gap.take() {
            edits.before(at, Op::Pool { pool, action: PoolAction::BeginAllocate });
        }
    }

    /// The trace's note on the calls moved, if any.
    fn note(&self) -> Option<String> {
        let (guessed, counted) = match self.guessed {
            true => ("guessed: ", ""),
            false => ("", ", and counted a synchronization for each of them"),
        };
        (self.moved > 0).then(|| {
            format!(
                "{guessed}{} empty_cache calls that came, by the allocations and frees counted \
                 before them, within a run of allocations into one private pool were put \
                 between two contexts of it (PyTorch synchronizes for a call only with no \
                 context open{counted}; torch.cuda.graph empties the cache between a graph's \
                 warm-up and its capture)",
                self.moved
            )
        })
    }
}

/// Whether `p` is an `empty_cache` that goes at its place, not with the frees of a run.
fn moves(p: &Placed) -> bool {
    p.call.kind == CallKind::EmptyCache && p.frees.is_empty()
}

/// The private-pool contexts of `ops`: (`BeginAllocate` op, `EndAllocate` op, pool), by start.
fn contexts(ops: &OpReader) -> Vec<(usize, usize, MemPoolId)> {
    let mut open: Vec<(usize, MemPoolId)> = Vec::new();
    let mut contexts = Vec::new();
    for (k, op) in ops.from(0).enumerate() {
        match op {
            Op::Pool { pool, action: PoolAction::BeginAllocate } => open.push((k, pool)),
            Op::Pool { pool, action: PoolAction::EndAllocate } => {
                if let Some(i) = open.iter().rposition(|&(_, p)| p == pool) {
                    contexts.push((open.remove(i).0, k, pool));
                }
            }
            _ => {}
        }
    }
    contexts.sort_by_key(|c| c.0);
    contexts
}

/// The context open where a call goes before op `at`.
fn context_at(
    contexts: &[(usize, usize, MemPoolId)],
    at: usize,
) -> Option<(usize, usize, MemPoolId)> {
    let n = contexts.partition_point(|&(begin, _, _)| begin < at);
    contexts[..n].last().copied().filter(|&(_, end, _)| at <= end)
}

/// How many of the history's `calls` to `empty_cache` PyTorch made inside a context, by the
/// statistics: it synchronizes all streams once for a call with no context open, once for each
/// retry path (`num_alloc_retries`) and once for each pool's release, and for nothing else.
/// `None` when the statistics of the history's start or end are not known.
fn calls_in_contexts(trace: &Trace, ops: &OpReader, calls: usize) -> Option<usize> {
    let value = |stats: &Option<Vec<(String, i64)>>, key: &str| {
        let stats = stats.as_ref()?;
        stats.iter().find(|(k, _)| k == key).map(|&(_, v)| v)
    };
    let counted = |key: &str| {
        let start = match trace.start {
            Some(_) => value(&trace.meta.stats_at_start, key)?,
            None => 0,
        };
        let end = value(&trace.meta.expected_stats, key)?;
        u64::try_from(end.checked_sub(start)?).ok()
    };
    let releases = (ops.from(0))
        .filter(|op| matches!(op, Op::Pool { action: PoolAction::Release, .. }))
        .count() as u64;
    let syncs = counted("num_sync_all_streams")?;
    let outside = syncs.checked_sub(counted("num_alloc_retries")?)?.checked_sub(releases)?;
    Some((calls as u64).saturating_sub(outside) as usize)
}

/// The events that open an allocation's run with device frees (with the completions among
/// them), up to its first reservation: what an `empty_cache` right before it freed. None if
/// the run does not open with a free.
fn opening_frees(events: impl Iterator<Item = (usize, RecordedKind)>) -> Vec<usize> {
    let mut taken = Vec::new();
    let mut freed = false;
    for (r, kind) in events {
        match kind {
            RecordedKind::SegmentFree | RecordedKind::SegmentUnmap => freed = true,
            RecordedKind::FreeCompleted => {}
            _ => break,
        }
        taken.push(r);
    }
    if freed {
        taken
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocsim_core::{AllocId, MemPoolId, RecordedEvent, StreamId};

    fn alloc(id: u64) -> Op {
        Op::Alloc { id: AllocId(id), size: 1 << 20, stream: StreamId(0) }
    }

    fn free(id: u64) -> Op {
        Op::FreeRequested { id: AllocId(id) }
    }

    fn event(op: u64, kind: RecordedKind) -> RecordedEvent {
        RecordedEvent { op, kind, addr: 0, size: 2 << 20, stream: StreamId(0) }
    }

    fn call(kind: CallKind, allocations: u64, frees: u64) -> Call {
        Call { kind, allocations, frees }
    }

    /// [`apply`] to a trace that holds its ops.
    fn apply(trace: &mut Trace, calls: &[Call]) -> Option<usize> {
        let mut ops = OpList::Plain(std::mem::take(&mut trace.ops));
        let added = super::apply(trace, &mut ops, calls);
        (trace.ops, _) = ops.split();
        added
    }

    fn names(trace: &Trace) -> Vec<&'static str> {
        trace.ops.iter().map(Op::action).collect()
    }

    #[test]
    fn a_call_that_freed_nothing_goes_after_the_allocations_and_frees_it_followed() {
        let mut trace =
            Trace { ops: vec![alloc(0), alloc(1), free(0), alloc(2)], ..Trace::default() };
        let calls = [
            call(CallKind::EmptyCache, 2, 1),
            call(CallKind::MemoryFraction(0.5), 3, 1),
            call(CallKind::EmptyCache, 3, 1),
        ];
        assert_eq!(apply(&mut trace, &calls), Some(3));
        assert_eq!(
            names(&trace),
            [
                "alloc",
                "alloc",
                "free_requested",
                "empty_cache",
                "alloc",
                "set_memory_fraction",
                "empty_cache"
            ]
        );
    }

    #[test]
    fn the_calls_into_a_trace_without_ops_are_its_ops() {
        let mut trace = Trace::default();
        let calls = [call(CallKind::MemoryFraction(0.5), 0, 0), call(CallKind::EmptyCache, 0, 0)];
        assert_eq!(apply(&mut trace, &calls), Some(2));
        assert_eq!(names(&trace), ["set_memory_fraction", "empty_cache"]);
    }

    #[test]
    fn a_call_takes_the_frees_it_made_and_a_second_one_at_its_place_comes_after() {
        // The frees of the first call open the next allocation's run (it reads as that
        // allocation's retry path); the conversion inferred an `EmptyCache` for none of them.
        let mut trace = Trace {
            ops: vec![alloc(0), free(0), alloc(1)],
            recorded: vec![
                event(0, RecordedKind::SegmentAlloc),
                event(0, RecordedKind::Alloc),
                event(1, RecordedKind::FreeRequested),
                event(2, RecordedKind::SegmentFree),
                event(2, RecordedKind::SegmentAlloc),
                event(2, RecordedKind::Alloc),
            ],
            ..Trace::default()
        };
        let calls = [call(CallKind::EmptyCache, 1, 1), call(CallKind::EmptyCache, 1, 1)];
        assert_eq!(apply(&mut trace, &calls), Some(2));
        assert_eq!(
            names(&trace),
            ["alloc", "free_requested", "empty_cache", "empty_cache", "alloc"]
        );
        let ops: Vec<u64> = trace.recorded.iter().map(|e| e.op).collect();
        assert_eq!(ops, [0, 0, 1, 2, 4, 4], "the segment free goes to the first call");
    }

    #[test]
    fn an_inferred_empty_cache_is_the_call_and_a_caught_oom_comes_before_a_call() {
        let mut trace = Trace {
            ops: vec![alloc(0), free(0), Op::EmptyCache, alloc(1), alloc(2)],
            recorded: vec![event(2, RecordedKind::SegmentFree), event(3, RecordedKind::Oom)],
            ..Trace::default()
        };
        let calls = [call(CallKind::EmptyCache, 1, 1), call(CallKind::MemoryFraction(1.0), 1, 1)];
        assert_eq!(apply(&mut trace, &calls), Some(1));
        assert_eq!(
            names(&trace),
            ["alloc", "free_requested", "empty_cache", "alloc", "set_memory_fraction", "alloc"]
        );
    }

    fn pool(action: PoolAction) -> Op {
        Op::Pool { pool: MemPoolId(0, 1), action }
    }

    /// A graph's inputs and its capture read as one run of allocations into its pool.
    fn one_run_of_two_contexts(syncs: i64) -> Trace {
        let mut trace = Trace {
            ops: vec![
                pool(PoolAction::BeginAllocate),
                alloc(0),
                free(0),
                alloc(1),
                alloc(2),
                pool(PoolAction::EndAllocate),
            ],
            ..Trace::default()
        };
        let stats = [("num_sync_all_streams", syncs), ("num_alloc_retries", 0)];
        trace.meta.expected_stats = Some(stats.map(|(k, v)| (k.to_string(), v)).to_vec());
        trace
    }

    #[test]
    fn a_call_the_statistics_count_as_synchronized_ends_the_context_it_falls_in() {
        let mut trace = one_run_of_two_contexts(2);
        let calls = [call(CallKind::EmptyCache, 1, 1), call(CallKind::EmptyCache, 3, 1)];
        assert_eq!(apply(&mut trace, &calls), Some(2));
        let want = [
            "begin_allocate_to_pool",
            "alloc",
            "free_requested",
            "end_allocate_to_pool",
            "empty_cache",
            "begin_allocate_to_pool",
            "alloc",
            "alloc",
            "end_allocate_to_pool",
            "empty_cache",
        ];
        assert_eq!(names(&trace), want, "the second after the context's end");
        assert!(trace.warnings[0].starts_with("2 empty_cache calls"), "{:?}", trace.warnings);
        // Without the statistics, as PyTorch's own calls come; with a count of none, inside.
        for (stats, want_guessed) in [(None, true), (Some(0), false)] {
            let mut trace = one_run_of_two_contexts(stats.unwrap_or(0));
            if stats.is_none() {
                trace.meta.expected_stats = None;
            }
            apply(&mut trace, &calls[..1]);
            let split = names(&trace)[3] == "end_allocate_to_pool";
            assert_eq!(split, want_guessed, "{:?}", names(&trace));
            assert_eq!(trace.warnings.iter().any(|w| w.starts_with("guessed")), want_guessed);
        }
    }

    #[test]
    fn the_statistics_at_the_end_place_calls_in_a_history_that_starts_later() {
        // 10 allocations and 4 frees came before the history's first entry.
        let stats =
            vec![("allocation.all.allocated".into(), 12), ("allocation.all.freed".into(), 5)];
        let mut trace = Trace { ops: vec![alloc(0), free(0), alloc(1)], ..Trace::default() };
        trace.meta.expected_stats = Some(stats);
        trace.start = Some(Default::default());
        let calls = [call(CallKind::MemoryFraction(0.25), 3, 0), call(CallKind::EmptyCache, 11, 5)];
        assert_eq!(apply(&mut trace, &calls), Some(1));
        assert_eq!(trace.meta.memory_fraction, Some(0.25), "set before the history began");
        assert_eq!(names(&trace), ["alloc", "free_requested", "empty_cache", "alloc"]);
        trace.meta.expected_stats = None;
        assert_eq!(apply(&mut trace, &calls), None, "no statistics to place them by");
    }
}
