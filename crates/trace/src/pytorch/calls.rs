//! The calls a snapshot cannot show, which `allocsim.capture` records in the sidecar
//! (`meta.calls`): each `empty_cache()` (one that frees nothing leaves no trace entry, yet
//! PyTorch counts it in `num_sync_all_streams`) and each `set_per_process_memory_fraction()`
//! (its cap decides which failed `cudaMalloc` was retried, which the trace shows like an
//! `empty_cache` before the allocation). Each call carries its place: the allocations and frees
//! the allocator had counted when it came (`allocation.all.allocated` and `.freed`), which are
//! the trace's successful `alloc`s and its `free_requested`s.

use super::edits::Edits;
use allocsim_core::{Op, PoolAction, RecordedKind, Trace};
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
    /// The op of the allocation whose recorded run opens with this `empty_cache`'s frees.
    takes_run_of: Option<usize>,
}

/// Put `calls` into `trace` as ops: an `empty_cache` that freed segments is the inferred
/// `EmptyCache` at its place (or the frees that open the next allocation's run, which
/// otherwise read as that allocation's retry path); one that freed nothing becomes an
/// `EmptyCache` of its own; a fraction becomes `SetMemoryFraction`, or the fraction at the
/// start when it came before a history that starts later. Returns how many ops were added or
/// split off, or `None` when the calls cannot be placed (a trace that starts mid-run without
/// the statistics at its end).
pub fn apply(trace: &mut Trace, calls: &[Call]) -> Option<usize> {
    let failed: HashSet<u64> =
        trace.recorded.iter().filter(|r| r.kind == RecordedKind::Oom).map(|r| r.op).collect();
    let counts = |k: usize, op: &Op| match op {
        Op::Alloc { .. } | Op::AllocAt { .. } if !failed.contains(&(k as u64)) => (1, 0),
        Op::FreeRequested { .. } => (0, 1),
        _ => (0, 0),
    };
    let (allocs, frees) = trace
        .ops
        .iter()
        .enumerate()
        .map(|(k, op)| counts(k, op))
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
    for call in calls {
        let Some(want) = call.allocations.checked_sub(base.0).zip(call.frees.checked_sub(base.1))
        else {
            // Before the history began: only a fraction still holds at its start.
            if let CallKind::MemoryFraction(fraction) = call.kind {
                trace.meta.memory_fraction = Some(fraction);
            }
            continue;
        };
        while (a < want.0 || f < want.1) && at < trace.ops.len() {
            let (x, y) = counts(at, &trace.ops[at]);
            (a, f) = (a + x, f + y);
            at += 1;
        }
        // A failed allocation counts neither way: the call comes after those at its place (a
        // program that catches an OOM acts after it).
        while at < trace.ops.len() && failed.contains(&(at as u64)) {
            at += 1;
        }
        let mut takes_run_of = None;
        if call.kind == CallKind::EmptyCache {
            // The ops up to the next allocation or free: the call's own `EmptyCache` if the
            // conversion inferred one, else the allocation whose run its frees open.
            let next = (at..trace.ops.len()).find(|&k| counts(k, &trace.ops[k]) != (0, 0));
            let inferred = (at..next.unwrap_or(trace.ops.len()))
                .find(|&k| matches!(trace.ops[k], Op::EmptyCache) && !claimed.contains(&k));
            if let Some(k) = inferred {
                // A later call at the same place comes after this one.
                claimed.insert(k);
                at = k + 1;
                continue;
            }
            // An allocation's run opens with the frees of one `empty_cache` at most.
            takes_run_of =
                next.filter(|&k| counts(k, &trace.ops[k]) == (1, 0) && runs_taken.insert(k));
        }
        placed.push(Placed { call, at, takes_run_of });
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
    let mut edits = Edits::default();
    let last = trace.ops.len().saturating_sub(1);
    let mut added = 0;
    for p in &placed {
        let op = match p.call.kind {
            CallKind::EmptyCache => Op::EmptyCache,
            CallKind::MemoryFraction(fraction) => Op::SetMemoryFraction { fraction },
        };
        added += 1;
        let run = p
            .takes_run_of
            .and_then(|k| runs.get(&k))
            .map(|events| opening_frees(events.iter().map(|&r| (r, trace.recorded[r].kind))));
        match (run, p.takes_run_of) {
            // Right before the allocation and the pool contexts begun for it: the program
            // empties the cache, then enters them (a pool dropped before stays before).
            (Some(frees), Some(k)) if !frees.is_empty() => {
                let contexts = trace.ops[..k]
                    .iter()
                    .rev()
                    .take_while(|o| matches!(o, Op::Pool { action: PoolAction::BeginAllocate, .. }))
                    .count();
                edits.split(k - contexts, op, frees)
            }
            _ if p.at < trace.ops.len() => edits.before(p.at, op),
            _ if trace.ops.is_empty() => trace.ops.push(op),
            _ => edits.after(last, op),
        }
    }
    if added > 0 {
        edits.apply(trace);
    }
    Some(added)
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
    use allocsim_core::{AllocId, RecordedEvent, StreamId};

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
