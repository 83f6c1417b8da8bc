//! The exact optimum of small cases, the oracle the heuristic is measured against.
//!
//! Placing in some order, each at its lowest free address, reaches the optimum for the right
//! order: sort an optimal placement by address; placed in that order, each allocation finds
//! its optimal address free (everything placed before it that lives at the same time sits at
//! or below its optimal place, so under this one), and so ends at or below it. The search
//! therefore runs over orders, depth first, cut where the partial peak already reaches the
//! best found or where the bound is met.

use crate::place::lowest_fit;
use crate::{lower_bound, Lifetime, Placement};

/// The optimal placement of at most `max_len` allocations (`None` for more: the search is
/// factorial).
pub fn exact(lifetimes: &[Lifetime], max_len: usize) -> Option<Placement> {
    if lifetimes.len() > max_len {
        return None;
    }
    let bound = lower_bound(lifetimes);
    let mut best = crate::place(lifetimes)?;
    if best.peak > bound {
        let mut order = Vec::with_capacity(lifetimes.len());
        let mut used = vec![false; lifetimes.len()];
        search(lifetimes, bound, &mut order, &mut used, &mut best);
    }
    best.order = "exact";
    Some(best)
}

fn search(
    lifetimes: &[Lifetime],
    bound: u64,
    order: &mut Vec<usize>,
    used: &mut [bool],
    best: &mut Placement,
) {
    if best.peak == bound {
        return;
    }
    let partial = lowest_fit(lifetimes, order, "exact");
    if partial.peak >= best.peak {
        return;
    }
    if order.len() == lifetimes.len() {
        *best = partial;
        return;
    }
    for i in 0..lifetimes.len() {
        if !used[i] {
            used[i] = true;
            order.push(i);
            search(lifetimes, bound, order, used, best);
            order.pop();
            used[i] = false;
        }
    }
}
