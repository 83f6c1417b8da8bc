//! The offline placement: each allocation at the lowest address where nothing live at the same
//! time is, taken in an order; the best of a few orders.

use crate::Lifetime;

/// Where each allocation goes (`offsets[i]` for `lifetimes[i]`), and the highest end address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub offsets: Vec<u64>,
    pub peak: u64,
    /// Which order gave it: `size`, `breadth`, `length` or `start` (each tried with the lowest
    /// gap and with the tightest).
    pub order: &'static str,
}

/// The best placement of the orders that planners use: by size (largest first, TFLite's
/// greedy-by-size), by breadth (the most bytes live at once over the allocation's lifetime
/// first), by length (longest-lived first: what lives long goes to the bottom), and by start
/// (as an online allocator would see them, with hindsight only in where). Ties broken by the
/// other key, then position: deterministic.
///
/// Each placement visits, for every allocation, every other that lives at the same time: a
/// trace with many allocations live at once (an OOM storm of a hundred thousand) makes that
/// quadratic. The variants tried are cut to what [`PLACEMENT_WORK`] pair visits allow, and
/// `None` says not even one fits: the bound alone is the answer then.
pub fn place(lifetimes: &[Lifetime]) -> Option<Placement> {
    let work = overlap_work(lifetimes).max(1);
    let variants = (PLACEMENT_WORK / work).min(8) as usize;
    if variants == 0 {
        return None;
    }
    let n = lifetimes.len();
    let by = |key: &dyn Fn(usize) -> (u64, u64)| {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| {
            let (a, b) = key(i);
            (std::cmp::Reverse(a), std::cmp::Reverse(b), i)
        });
        order
    };
    let len = |i: usize| lifetimes[i].end - lifetimes[i].start;
    let breadth = breadths(lifetimes);
    let orders: [(&'static str, Vec<usize>); 4] = [
        ("size", by(&|i| (lifetimes[i].size, len(i)))),
        ("breadth", by(&|i| (breadth[i], lifetimes[i].size))),
        ("length", by(&|i| (len(i), lifetimes[i].size))),
        ("start", (0..n).collect()),
    ];
    let mut best: Option<Placement> = None;
    let tries = orders
        .iter()
        .flat_map(|(name, order)| [false, true].map(|tightest| (*name, order, tightest)));
    for (name, order, tightest) in tries.take(variants) {
        let p = fit(lifetimes, order, name, tightest);
        if best.as_ref().is_none_or(|b| p.peak < b.peak) {
            best = Some(p);
        }
    }
    best
}

/// How many pair visits [`place`] may spend: a few seconds on two cores.
pub const PLACEMENT_WORK: u64 = 400_000_000;

/// The pairs of allocations that live at the same time, each counted from both sides: what one
/// placement visits. From sorted starts and ends: for each allocation, all but those that end
/// before it starts or start after it ends.
fn overlap_work(lifetimes: &[Lifetime]) -> u64 {
    let live: Vec<&Lifetime> = lifetimes.iter().filter(|l| l.start < l.end).collect();
    let mut starts: Vec<u64> = live.iter().map(|l| l.start).collect();
    let mut ends: Vec<u64> = live.iter().map(|l| l.end).collect();
    starts.sort_unstable();
    ends.sort_unstable();
    let n = live.len() as u64;
    live.iter()
        .map(|l| {
            let ended = ends.partition_point(|&e| e <= l.start) as u64;
            let not_started = n - starts.partition_point(|&s| s < l.end) as u64;
            n - ended - not_started
        })
        .sum()
}

/// Places `lifetimes` in `order`, each at the lowest address free over its whole lifetime.
pub(crate) fn lowest_fit(lifetimes: &[Lifetime], order: &[usize], name: &'static str) -> Placement {
    fit(lifetimes, order, name, false)
}

/// Places `lifetimes` in `order`, each in a gap free over its whole lifetime: the lowest, or
/// with `tightest` the smallest that holds it (the space above everything when none does).
/// The allocations living at the same time as each one come from an interval tree over all of
/// them (those not placed yet skipped): O(log n + k) per allocation, k those it overlaps.
fn fit(lifetimes: &[Lifetime], order: &[usize], name: &'static str, tightest: bool) -> Placement {
    let tree = IntervalTree::new(lifetimes);
    let mut offsets = vec![0u64; lifetimes.len()];
    let mut placed = vec![false; lifetimes.len()];
    let mut peak = 0;
    let mut busy: Vec<(u64, u64)> = Vec::new();
    for &i in order {
        let me = lifetimes[i];
        busy.clear();
        tree.overlapping(me.start, me.end, &mut |j| {
            if placed[j] {
                busy.push((offsets[j], offsets[j].saturating_add(lifetimes[j].size)));
            }
        });
        busy.sort_unstable();
        // The gaps [top, lo) between what is placed, lowest first; above them all, `top`.
        let (mut top, mut lowest, mut tight) = (0u64, None::<u64>, None::<(u64, u64)>);
        for &(lo, hi) in &busy {
            if lo >= top.saturating_add(me.size) {
                lowest.get_or_insert(top);
                if tight.is_none_or(|(gap, _)| lo - top < gap) {
                    tight = Some((lo - top, top));
                }
            }
            top = top.max(hi);
        }
        let at =
            if tightest { tight.map_or(top, |(_, start)| start) } else { lowest.unwrap_or(top) };
        offsets[i] = at;
        peak = peak.max(at.saturating_add(me.size));
        placed[i] = true;
    }
    Placement { offsets, peak, order: name }
}

/// A centred interval tree over the lifetimes (static: every lifetime is known in advance).
/// Each node holds the lifetimes that contain its centre, sorted by start and by end.
struct IntervalTree {
    nodes: Vec<Node>,
    lifetimes: Vec<(u64, u64)>,
}

struct Node {
    centre: u64,
    by_start: Vec<usize>,
    by_end_desc: Vec<usize>,
    left: Option<usize>,
    right: Option<usize>,
}

impl IntervalTree {
    fn new(lifetimes: &[Lifetime]) -> IntervalTree {
        let spans: Vec<(u64, u64)> = lifetimes.iter().map(|l| (l.start, l.end)).collect();
        let mut tree = IntervalTree { nodes: Vec::new(), lifetimes: spans };
        let all: Vec<usize> =
            (0..lifetimes.len()).filter(|&i| lifetimes[i].start < lifetimes[i].end).collect();
        tree.build(all);
        tree
    }

    fn build(&mut self, items: Vec<usize>) -> Option<usize> {
        if items.is_empty() {
            return None;
        }
        let mut points: Vec<u64> = items.iter().map(|&i| self.lifetimes[i].0).collect();
        points.sort_unstable();
        let centre = points[points.len() / 2];
        let (mut here, mut left, mut right) = (Vec::new(), Vec::new(), Vec::new());
        for i in items {
            let (s, e) = self.lifetimes[i];
            if e <= centre {
                left.push(i);
            } else if s > centre {
                right.push(i);
            } else {
                here.push(i);
            }
        }
        let mut by_end_desc = here.clone();
        here.sort_unstable_by_key(|&i| self.lifetimes[i].0);
        by_end_desc.sort_unstable_by_key(|&i| std::cmp::Reverse(self.lifetimes[i].1));
        let at = self.nodes.len();
        self.nodes.push(Node { centre, by_start: here, by_end_desc, left: None, right: None });
        let left = self.build(left);
        let right = self.build(right);
        self.nodes[at].left = left;
        self.nodes[at].right = right;
        Some(at)
    }

    /// Calls `f` with every lifetime that overlaps `start..end`.
    fn overlapping(&self, start: u64, end: u64, f: &mut impl FnMut(usize)) {
        let mut stack: Vec<usize> = if self.nodes.is_empty() { Vec::new() } else { vec![0] };
        while let Some(n) = stack.pop() {
            let node = &self.nodes[n];
            if end <= node.centre {
                // Left of the centre: this node's lifetimes overlap when they start before end.
                node.by_start
                    .iter()
                    .take_while(|&&i| self.lifetimes[i].0 < end)
                    .for_each(|&i| f(i));
                stack.extend(node.left);
            } else if start > node.centre {
                node.by_end_desc
                    .iter()
                    .take_while(|&&i| self.lifetimes[i].1 > start)
                    .for_each(|&i| f(i));
                stack.extend(node.right);
            } else {
                node.by_start.iter().for_each(|&i| f(i));
                stack.extend(node.left);
                stack.extend(node.right);
            }
        }
    }
}

/// For each allocation, the most bytes live at one op during its lifetime (itself included).
fn breadths(lifetimes: &[Lifetime]) -> Vec<u64> {
    let points = crate::live_bytes(lifetimes);
    let table = SparseMax::new(points.iter().map(|p| p.1).collect());
    lifetimes
        .iter()
        .map(|l| {
            let lo = points.partition_point(|p| p.0 < l.start);
            let hi = points.partition_point(|p| p.0 < l.end);
            table.max(lo, hi).max(l.size)
        })
        .collect()
}

/// Range maximum in O(1) after O(n log n): a sparse table.
struct SparseMax(Vec<Vec<u64>>);

impl SparseMax {
    fn new(values: Vec<u64>) -> SparseMax {
        let mut levels = vec![values];
        let mut width = 1;
        while width * 2 <= levels[0].len() {
            let prev = levels.last().expect("one level at least");
            let next = (0..prev.len() - width).map(|i| prev[i].max(prev[i + width])).collect();
            levels.push(next);
            width *= 2;
        }
        SparseMax(levels)
    }

    /// The maximum over `lo..hi`, 0 when empty.
    fn max(&self, lo: usize, hi: usize) -> u64 {
        if lo >= hi {
            return 0;
        }
        let level = (usize::BITS - 1 - (hi - lo).leading_zeros()) as usize;
        let row = &self.0[level];
        row[lo].max(row[hi - (1 << level)])
    }
}

/// Whether `placement` places every allocation without two that live at the same time
/// overlapping, aligned, under its peak: the oracle every placement is held to.
pub fn check(lifetimes: &[Lifetime], placement: &Placement) -> Result<(), String> {
    if placement.offsets.len() != lifetimes.len() {
        return Err(format!(
            "{} offsets for {} allocations",
            placement.offsets.len(),
            lifetimes.len()
        ));
    }
    let mut order: Vec<usize> = (0..lifetimes.len()).collect();
    order.sort_by_key(|&i| lifetimes[i].start);
    let mut active: Vec<usize> = Vec::new();
    for &i in &order {
        let (me, at) = (lifetimes[i], placement.offsets[i]);
        if at % crate::ALIGN_BYTES != 0 || at.saturating_add(me.size) > placement.peak {
            return Err(format!(
                "allocation {i} at {at} (+{}) unaligned or above {}",
                me.size, placement.peak
            ));
        }
        active.retain(|&j| lifetimes[j].end > me.start);
        for &j in &active {
            let other = placement.offsets[j];
            if me.overlaps(&lifetimes[j])
                && at < other.saturating_add(lifetimes[j].size)
                && other < at.saturating_add(me.size)
            {
                return Err(format!(
                    "allocations {j} and {i} overlap at {other} and {at} while both live"
                ));
            }
        }
        active.push(i);
    }
    Ok(())
}
