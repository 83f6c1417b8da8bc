//! Ops added to a converted trace after the fact (pool contexts, releases, `empty_cache`
//! calls read from the recording), in one pass that keeps every recorded event and stack with
//! its op. An added op takes the recorded time of the op it goes with, so that a snapshot
//! written from the trace keeps a clock that never goes back.

use super::ops::OpList;
use allocsim_core::{Op, PackedOps, Trace};
use std::collections::{BTreeMap, BTreeSet};

/// Ops to add to a trace, by the op index they go with, applied in one pass.
#[derive(Default)]
pub(super) struct Edits {
    before: BTreeMap<usize, Vec<Op>>,
    after: BTreeMap<usize, Vec<Op>>,
    /// Ops that go before op `k` (and before the ops `before` puts there) and take these of its
    /// recorded events.
    splits: BTreeMap<usize, Vec<(Op, Vec<usize>)>>,
}

impl Edits {
    /// `op` before op `k`, or at the end when `k` is the number of ops.
    pub(super) fn before(&mut self, k: usize, op: Op) {
        self.before.entry(k).or_default().push(op);
    }

    pub(super) fn after(&mut self, k: usize, op: Op) {
        self.after.entry(k).or_default().push(op);
    }

    pub(super) fn split(&mut self, k: usize, op: Op, recorded: Vec<usize>) {
        self.splits.entry(k).or_default().push((op, recorded));
    }

    /// Rebuild the trace's ops; every recorded event and stack follows its op to the op's new
    /// index, and events taken by a split go to the op that took them.
    pub(super) fn apply(self, trace: &mut Trace) {
        let mut ops = OpList::Plain(std::mem::take(&mut trace.ops));
        self.apply_to(trace, &mut ops);
        (trace.ops, _) = ops.split();
    }

    /// [`Edits::apply`] to `ops`, the trace's ops held beside it (packed, say), rebuilt as they
    /// are held.
    pub(super) fn apply_to(self, trace: &mut Trace, ops: &mut OpList) {
        let old = std::mem::replace(ops, OpList::Plain(Vec::new()));
        *ops = match &old {
            OpList::Plain(o) => OpList::Plain(Vec::with_capacity(o.len() + self.len())),
            OpList::Packed(_) => OpList::Packed(PackedOps::new()),
        };
        let mut taken: BTreeMap<usize, u64> = BTreeMap::new();
        // The added ops' times: those of the ops they go with.
        let mut added_times = Vec::new();
        let op_times = &trace.op_times;
        let time_of = |k: usize| {
            let at = op_times.binary_search_by_key(&(k as u64), |&(op, _)| op).ok()?;
            Some(op_times[at].1)
        };
        let keys: BTreeSet<usize> = self
            .splits
            .keys()
            .chain(self.before.keys())
            .chain(self.after.keys())
            .copied()
            .collect();
        let mut put = |k: usize, op: Op| {
            if !keys.contains(&k) {
                return ops.push(op);
            }
            let first_added = ops.len();
            for (split, recorded) in self.splits.get(&k).into_iter().flatten() {
                for &r in recorded {
                    taken.insert(r, ops.len() as u64);
                }
                ops.push(split.clone());
            }
            self.before.get(&k).into_iter().flatten().for_each(|op| ops.push(op.clone()));
            let new = ops.len();
            ops.push(op);
            self.after.get(&k).into_iter().flatten().for_each(|op| ops.push(op.clone()));
            if let Some(time) = time_of(k) {
                let added = (first_added..ops.len()).filter(|&i| i != new);
                added_times.extend(added.map(|i| (i as u64, time)));
            }
        };
        let len = old.len();
        match old {
            OpList::Plain(old) => old.into_iter().enumerate().for_each(|(k, op)| put(k, op)),
            OpList::Packed(old) => old.iter().enumerate().for_each(|(k, op)| put(k, op)),
        }
        // Ops before the end.
        self.before.range(len..).flat_map(|(_, added)| added).for_each(|op| ops.push(op.clone()));
        // Op `k`'s new index: `k` and the ops added before it, counted at each edited op.
        let mut shifts = Vec::with_capacity(keys.len());
        let mut added = 0u64;
        for &k in &keys {
            let count = |m: &BTreeMap<usize, Vec<_>>| m.get(&k).map_or(0, Vec::len) as u64;
            let before = count(&self.before) + self.splits.get(&k).map_or(0, Vec::len) as u64;
            shifts.push((k as u64, added + before));
            added += before + count(&self.after);
        }
        let new_index = |k: u64| match shifts.binary_search_by_key(&k, |&(at, _)| at) {
            Ok(i) => k + shifts[i].1,
            Err(0) => k,
            Err(i) => {
                let (at, shift) = shifts[i - 1];
                let after = self.after.get(&(at as usize)).map_or(0, Vec::len) as u64;
                k + shift + after
            }
        };
        for (r, e) in trace.recorded.iter_mut().enumerate() {
            e.op = taken.get(&r).copied().unwrap_or_else(|| new_index(e.op));
        }
        for (op, _) in &mut trace.op_stacks {
            *op = new_index(*op);
        }
        for (op, _) in &mut trace.op_times {
            *op = new_index(*op);
        }
        if !added_times.is_empty() {
            trace.op_times.extend(added_times);
            trace.op_times.sort_by_key(|&(op, _)| op);
        }
        for (op, _) in &mut trace.op_annotations {
            *op = new_index(*op);
        }
    }

    /// How many ops are added.
    fn len(&self) -> usize {
        let count = |m: &BTreeMap<usize, Vec<Op>>| m.values().map(Vec::len).sum::<usize>();
        count(&self.before) + count(&self.after) + self.splits.values().map(Vec::len).sum::<usize>()
    }
}
