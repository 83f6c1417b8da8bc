//! Which private pool each allocation went to, inferred: trace entries carry no pool id.
//!
//! - A segment's pool: the final `segments` name it (`segment_pool_id`) for those alive at
//!   the end, and the state at a mid-run history's start for those alive then. A segment the
//!   history frees is in the default pools unless its release shows otherwise: PyTorch frees a
//!   private pool's cached segments small pool first (`release_blocks(pool.small)`, then
//!   large), each walk in (stream, size, address) order, while the default pools go large
//!   first. So an ascending walk of frees in which a small segment comes before a large one is
//!   one private pool's release; its pool is given the first user pool id, `(0, n)`, that no
//!   segment alive at the end has (ids are handed out in order).
//! - An allocation's pool is its segment's. A run of consecutive allocations into one private
//!   pool is a context (`use_mem_pool`, a graph capture): `Op::Pool` begin before its first,
//!   end after its last. A failed allocation (`oom`) stays in the context it is in. A release
//!   of default-pool segments ends a run: inside a context PyTorch leaves those pools alone
//!   (`torch.cuda.graph` empties the cache between warm-up and capture, say).
//! - A pool whose release walk is found is released (`~MemPool`) where that walk starts: the
//!   `empty_cache` op that held the walk is split, the release taking the pool's frees.

use super::entries::segment_pool;
use allocsim_core::{
    MemPoolId, Op, Pool, PoolAction, RecordedEvent, RecordedKind, SnapshotSegment, Trace,
};
use std::collections::{BTreeMap, BTreeSet};

/// One segment's life in the recording.
struct Instance {
    pool: Option<MemPoolId>,
}

/// Infer the pools and add their ops (see the module doc). Returns what was inferred and
/// what had to be guessed, for the trace's warnings; nothing when no private pool shows.
pub fn infer_pools(trace: &mut Trace, last: &[SnapshotSegment]) -> Vec<String> {
    let known: BTreeSet<MemPoolId> =
        last.iter().map(|s| s.pool_id).filter(|p| !p.is_default()).collect();
    let mut instances: Vec<Instance> = Vec::new();
    // Live segments by address: instance index.
    let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for seg in trace.start.iter().flat_map(|s| &s.segments) {
        live.insert(seg.address, (seg.total_size, instances.len()));
        instances.push(Instance { pool: Some(seg.pool_id) });
    }
    // The instance each allocation landed in, by op; the instance each segment free ended.
    let mut alloc_in: BTreeMap<u64, usize> = BTreeMap::new();
    let mut freed: Vec<(usize, usize)> = Vec::new(); // (recorded index, instance)
    for (r, e) in trace.recorded.iter().enumerate() {
        match e.kind {
            RecordedKind::SegmentAlloc => {
                live.insert(e.addr, (e.size, instances.len()));
                instances.push(Instance { pool: None });
            }
            RecordedKind::SegmentFree => {
                if let Some((_, i)) = live.remove(&e.addr) {
                    freed.push((r, i));
                }
            }
            RecordedKind::Alloc => {
                if let Some((&start, &(size, i))) = live.range(..=e.addr).next_back() {
                    if e.addr < start + size {
                        alloc_in.insert(e.op, i);
                    }
                }
            }
            _ => {}
        }
    }
    for seg in last {
        if let Some(&(_, i)) = live.get(&seg.address) {
            instances[i].pool = Some(seg.pool_id);
        }
    }
    let released = infer_released_pools(trace, &freed, &mut instances, &known);
    if known.is_empty() && released.is_empty() {
        return Vec::new();
    }
    let pool_of_op = |op: u64| {
        alloc_in.get(&op).and_then(|&i| instances[i].pool).unwrap_or(MemPoolId::DEFAULT)
    };
    let mut edits = Edits::default();
    let mut context: Option<MemPoolId> = None;
    let mut last_in_context = 0usize;
    let failed: BTreeSet<u64> =
        trace.recorded.iter().filter(|e| e.kind == RecordedKind::Oom).map(|e| e.op).collect();
    // Ops that free default-pool segments: releases no context can be open across (inside
    // one, PyTorch leaves the default pools alone).
    let frees_default: BTreeSet<u64> = (freed.iter())
        .filter(|&&(_, i)| instances[i].pool.is_none_or(MemPoolId::is_default))
        .map(|&(r, _)| trace.recorded[r].op)
        .collect();
    let mut contexts = 0usize;
    for (k, op) in trace.ops.iter().enumerate() {
        if frees_default.contains(&(k as u64)) {
            if let Some(c) = context.take() {
                edits.after(last_in_context, Op::Pool { pool: c, action: PoolAction::EndAllocate });
            }
        }
        if !matches!(op, Op::Alloc { .. }) || failed.contains(&(k as u64)) {
            continue;
        }
        let pool = pool_of_op(k as u64);
        let wanted = (!pool.is_default()).then_some(pool);
        if wanted == context {
            last_in_context = k;
            continue;
        }
        if let Some(c) = context {
            edits.after(last_in_context, Op::Pool { pool: c, action: PoolAction::EndAllocate });
        }
        if let Some(p) = wanted {
            edits.before(k, Op::Pool { pool: p, action: PoolAction::BeginAllocate });
            contexts += 1;
        }
        context = wanted;
        last_in_context = k;
    }
    if let Some(c) = context {
        edits.after(last_in_context, Op::Pool { pool: c, action: PoolAction::EndAllocate });
    }
    for (pool, first_free) in &released {
        let op = trace.recorded[*first_free].op as usize;
        let takes: Vec<usize> = freed
            .iter()
            .filter(|&&(_, i)| instances[i].pool == Some(*pool))
            .map(|&(r, _)| r)
            .filter(|&r| trace.recorded[r].op as usize == op)
            .collect();
        edits.split(op, Op::Pool { pool: *pool, action: PoolAction::Release }, takes);
    }
    edits.apply(trace);

    let mut notes = Vec::new();
    let names = |pools: &mut dyn Iterator<Item = &MemPoolId>| {
        pools.map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
    };
    if !known.is_empty() {
        notes.push(format!(
            "private pools {} from the final segments; {contexts} runs of allocations into \
             private pools were made contexts (trace entries carry no pool id)",
            names(&mut known.iter())
        ));
    }
    if !released.is_empty() {
        notes.push(format!(
            "guessed: private pools {} were released during the history (their segments were \
             freed small pool first, as only a private pool's are), with the first pool ids \
             the final segments do not use",
            names(&mut released.iter().map(|(p, _)| p))
        ));
    }
    notes
}

/// The private pools whose release the frees show (see the module doc), with the recorded
/// index of each one's first free; their segments get the pool.
fn infer_released_pools(
    trace: &Trace,
    freed: &[(usize, usize)],
    instances: &mut [Instance],
    known: &BTreeSet<MemPoolId>,
) -> Vec<(MemPoolId, usize)> {
    let mut next_id = (1u64..).map(|n| MemPoolId(0, n)).filter(|id| !known.contains(id));
    let mut released = Vec::new();
    let key = |e: &RecordedEvent| (e.stream.0, e.size, e.addr);
    let mut walk: Vec<(usize, usize)> = Vec::new();
    let mut close = |walk: &mut Vec<(usize, usize)>, instances: &mut [Instance]| {
        let pools: Vec<Pool> = walk.iter().map(|&(r, _)| segment_pool(trace.recorded[r].size)).collect();
        let small_then_large = pools.windows(2).any(|w| w == [Pool::Small, Pool::Large]);
        let unknown = walk.iter().all(|&(_, i)| instances[i].pool.is_none());
        if small_then_large && unknown {
            if let Some(id) = next_id.next() {
                for &(_, i) in walk.iter() {
                    instances[i].pool = Some(id);
                }
                released.push((id, walk[0].0));
            }
        }
        walk.clear();
    };
    for &(r, i) in freed {
        if let Some(&(prev, _)) = walk.last() {
            let (a, b) = (&trace.recorded[prev], &trace.recorded[r]);
            if a.op != b.op || key(b) <= key(a) {
                close(&mut walk, instances);
            }
        }
        walk.push((r, i));
    }
    close(&mut walk, instances);
    released
}

/// Ops to add to a trace, by the op index they go with, applied in one pass.
#[derive(Default)]
struct Edits {
    before: BTreeMap<usize, Vec<Op>>,
    after: BTreeMap<usize, Vec<Op>>,
    /// Ops that go before op `k` (and before the ops `before` puts there) and take these of its
    /// recorded events.
    splits: BTreeMap<usize, Vec<(Op, Vec<usize>)>>,
}

impl Edits {
    fn before(&mut self, k: usize, op: Op) {
        self.before.entry(k).or_default().push(op);
    }

    fn after(&mut self, k: usize, op: Op) {
        self.after.entry(k).or_default().push(op);
    }

    fn split(&mut self, k: usize, op: Op, recorded: Vec<usize>) {
        self.splits.entry(k).or_default().push((op, recorded));
    }

    /// Rebuild the ops; every recorded event and stack follows its op to the op's new index,
    /// and events taken by a split go to the op that took them.
    fn apply(self, trace: &mut Trace) {
        let old = std::mem::take(&mut trace.ops);
        let mut new_index = Vec::with_capacity(old.len());
        let mut taken: BTreeMap<usize, u64> = BTreeMap::new();
        let mut ops = Vec::with_capacity(old.len() + self.before.len() + self.after.len());
        for (k, op) in old.into_iter().enumerate() {
            for (split, recorded) in self.splits.get(&k).into_iter().flatten() {
                for &r in recorded {
                    taken.insert(r, ops.len() as u64);
                }
                ops.push(split.clone());
            }
            ops.extend(self.before.get(&k).into_iter().flatten().cloned());
            new_index.push(ops.len() as u64);
            ops.push(op);
            ops.extend(self.after.get(&k).into_iter().flatten().cloned());
        }
        trace.ops = ops;
        for (r, e) in trace.recorded.iter_mut().enumerate() {
            e.op = taken.get(&r).copied().unwrap_or(new_index[e.op as usize]);
        }
        for (op, _) in &mut trace.op_stacks {
            *op = new_index[*op as usize];
        }
    }
}
