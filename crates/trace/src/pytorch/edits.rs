//! Ops added to a converted trace after the fact (pool contexts, releases, `empty_cache`
//! calls read from the recording), in one pass that keeps every recorded event and stack with
//! its op. An added op takes the recorded time of the op it goes with, so that a snapshot
//! written from the trace keeps a clock that never goes back.

use allocsim_core::{Op, Trace};
use std::collections::BTreeMap;

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
    pub(super) fn before(&mut self, k: usize, op: Op) {
        self.before.entry(k).or_default().push(op);
    }

    pub(super) fn after(&mut self, k: usize, op: Op) {
        self.after.entry(k).or_default().push(op);
    }

    pub(super) fn split(&mut self, k: usize, op: Op, recorded: Vec<usize>) {
        self.splits.entry(k).or_default().push((op, recorded));
    }

    /// Rebuild the ops; every recorded event and stack follows its op to the op's new index,
    /// and events taken by a split go to the op that took them.
    pub(super) fn apply(self, trace: &mut Trace) {
        let old = std::mem::take(&mut trace.ops);
        let mut new_index = Vec::with_capacity(old.len());
        let mut taken: BTreeMap<usize, u64> = BTreeMap::new();
        let mut ops = Vec::with_capacity(old.len() + self.before.len() + self.after.len());
        // The added ops' times: those of the ops they go with.
        let mut added_times = Vec::new();
        let op_times = &trace.op_times;
        let time_of = |k: usize| {
            let at = op_times.binary_search_by_key(&(k as u64), |&(op, _)| op).ok()?;
            Some(op_times[at].1)
        };
        for (k, op) in old.into_iter().enumerate() {
            let first_added = ops.len();
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
            if ops.len() > first_added + 1 {
                if let Some(time) = time_of(k) {
                    let op = new_index[k] as usize;
                    let added = (first_added..ops.len()).filter(|&i| i != op);
                    added_times.extend(added.map(|i| (i as u64, time)));
                }
            }
        }
        trace.ops = ops;
        for (r, e) in trace.recorded.iter_mut().enumerate() {
            e.op = taken.get(&r).copied().unwrap_or(new_index[e.op as usize]);
        }
        for (op, _) in &mut trace.op_stacks {
            *op = new_index[*op as usize];
        }
        for (op, _) in &mut trace.op_times {
            *op = new_index[*op as usize];
        }
        if !added_times.is_empty() {
            trace.op_times.extend(added_times);
            trace.op_times.sort_by_key(|&(op, _)| op);
        }
        for (op, _) in &mut trace.op_annotations {
            *op = new_index[*op as usize];
        }
    }
}
