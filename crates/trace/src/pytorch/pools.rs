//! Which private pool each allocation went to, inferred: trace entries carry no pool id.
//!
//! - A segment's pool: the final `segments` name it (`segment_pool_id`) for those alive at
//!   the end, and the state at a mid-run history's start for those alive then. A segment the
//!   history frees is in the default pools unless its release shows otherwise: PyTorch frees
//!   cached segments one pool at a time, each walk in (stream, size, address) order, the
//!   default pools large first and a private pool small first. Frees that do not read as one
//!   default release hold a private pool's ([`infer_released_pools`]); the pool gets the first
//!   user pool id, `(0, n)`, that no segment alive at the end has (ids are handed out in
//!   order).
//! - An allocation's pool is its segment's. A run of consecutive allocations into one private
//!   pool is a context (`use_mem_pool`, a graph capture): `Op::Pool` begin before its first,
//!   end after its last. A failed allocation (`oom`) stays in the context it is in. A release
//!   of default-pool segments ends a run: inside a context PyTorch leaves those pools alone
//!   (`torch.cuda.graph` empties the cache between warm-up and capture, say).
//! - A pool whose release walk is found is released (`~MemPool`) where that walk starts: the
//!   `empty_cache` op that held the walk is split, the release taking the pool's frees.
//! - A run of consecutive allocations that tiles an earlier private segment with no live block
//!   from start to end restores a checkpoint (CUDA graph trees): `Op::AllocAt`, in place
//!   ([`place_restored_blocks`]).

use super::edits::Edits;
use super::entries::segment_pool;
use allocsim_core::{
    MemPoolId, Op, Pool, PoolAction, RecordedEvent, RecordedKind, SnapshotSegment, Trace, MIB,
};
use std::collections::{BTreeMap, BTreeSet};

/// One segment's life in the recording: a cudaMalloc'ed segment, or an expandable segment's
/// address reservation.
struct Instance {
    pool: Option<MemPoolId>,
    /// The op that reserved the segment; `None` for one alive at the start.
    reserved_by: Option<u64>,
    /// Of an expandable segment, the bytes mapped in it: the reservation goes with its last
    /// page (`release_expandable_segment`).
    mapped: Option<u64>,
}

/// The bytes PyTorch reserves for an expandable segment of `page`-byte pages: the device's
/// memory and an eighth, in whole pages. One reservation holds every page a pool maps on a
/// stream, so which pool a `segment_map` serves shows in where it lands.
fn reservation_bytes(total: u64, page: u64) -> u64 {
    total.saturating_add(total / 8).div_ceil(page).max(1).saturating_mul(page)
}

/// The device's memory when the recording does not say: an H100's (80 GB).
const DEFAULT_TOTAL_BYTES: u64 = 85_017_493_504;

/// Where an allocation landed: its recorded event, its segment (instance, start and size: an
/// expandable segment's mapped range), and whether the segment held no live block before it.
struct Site {
    r: usize,
    instance: usize,
    segment: (u64, u64),
    empty: bool,
}

/// Allocations that restore a private pool's checkpoint become `Op::AllocAt`: CUDA graph
/// trees reset a pool to the state after an earlier graph (`setCheckpointPoolState`), which
/// hands out every block of each checkpointed segment in place, in address order, then frees
/// the dead ones. In the trace that is a run of consecutive allocations that tile a private
/// segment reserved earlier and holding no live block, from its start to its end. Returns how
/// many.
fn place_restored_blocks(trace: &mut Trace, sites: &[Site], instances: &[Instance]) -> usize {
    let op_of = |s: &Site| trace.recorded[s.r].op;
    let private = |s: &Site| {
        let i = &instances[s.instance];
        i.pool.is_some_and(|p| !p.is_default()) && i.reserved_by.is_none_or(|op| op < op_of(s))
    };
    let event = |s: &Site| trace.recorded[s.r];
    let mut restored = Vec::new();
    let mut j = 0;
    while j < sites.len() {
        let first = &sites[j];
        let (start, size) = first.segment;
        let mut end = event(first).addr.saturating_add(event(first).size);
        let seg_end = start.saturating_add(size);
        let mut k = j;
        if first.empty && private(first) && event(first).addr == start {
            while end < seg_end {
                let Some(next) = sites.get(k + 1) else { break };
                let e = event(next);
                if next.r != sites[k].r + 1 || next.instance != first.instance || e.addr != end {
                    break;
                }
                k += 1;
                end = end.saturating_add(e.size);
            }
            if end == seg_end {
                restored.extend(j..=k);
                j = k + 1;
                continue;
            }
        }
        j += 1;
    }
    for &s in &restored {
        let e = event(&sites[s]);
        if let Some(Op::Alloc { id, size, stream }) = trace.ops.get(e.op as usize).cloned() {
            trace.ops[e.op as usize] = Op::AllocAt { id, size, stream, addr: e.addr };
        }
    }
    restored.len()
}

/// Live segments by start address: (size, instance index).
#[derive(Default)]
struct LiveSegments {
    by_start: BTreeMap<u64, (u64, usize)>,
    /// The segment the last lookup found: blocks come and go far more often than segments,
    /// and one mostly lands where the last did (a B-tree search for each was half of
    /// [`infer_pools`]).
    last: Option<(u64, u64, usize)>,
}

impl LiveSegments {
    fn insert(&mut self, start: u64, size: u64, instance: usize) {
        self.last = None;
        self.by_start.insert(start, (size, instance));
    }

    fn remove(&mut self, start: u64) -> Option<(u64, usize)> {
        self.last = None;
        self.by_start.remove(&start)
    }

    /// The segment `addr` lies in: (start, size, instance).
    fn containing(&mut self, addr: u64) -> Option<(u64, u64, usize)> {
        let within = |&(start, size, _): &(u64, u64, usize)| {
            start <= addr && addr < start.saturating_add(size)
        };
        if let Some(hit) = self.last.filter(within) {
            return Some(hit);
        }
        let (&start, &(size, i)) = self.by_start.range(..=addr).next_back()?;
        let hit = Some((start, size, i)).filter(within);
        self.last = hit.or(self.last);
        hit
    }
}

/// The mapped ranges of expandable segments, joined where they touch, by start: what a
/// snapshot shows as segments.
#[derive(Default)]
struct MappedRanges {
    by_start: BTreeMap<u64, u64>,
}

impl MappedRanges {
    fn map(&mut self, addr: u64, size: u64) {
        let (mut start, mut end) = (addr, addr.saturating_add(size));
        if let Some((&s, &e)) = self.by_start.range(..addr).next_back().filter(|(_, &e)| e == addr)
        {
            (start, end) = (s, end.max(e));
        }
        if let Some(after) = self.by_start.remove(&end) {
            end = after;
        }
        self.by_start.insert(start, end);
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(size);
        let Some((&s, &e)) = self.by_start.range(..=addr).next_back() else { return };
        if e <= addr {
            return;
        }
        self.by_start.remove(&s);
        if s < addr {
            self.by_start.insert(s, addr);
        }
        if e > end {
            self.by_start.insert(end, e);
        }
    }

    /// The range `addr` lies in: (start, size).
    fn containing(&self, addr: u64) -> Option<(u64, u64)> {
        let (&s, &e) = self.by_start.range(..=addr).next_back()?;
        (addr < e).then_some((s, e - s))
    }
}

/// What one pass over the recording finds (see [`scan`]).
struct Scan {
    instances: Vec<Instance>,
    /// Live segments at the end.
    live: LiveSegments,
    /// The instance each allocation landed in, by op.
    alloc_in: Vec<(u64, usize)>,
    /// The instance each segment free ended: (recorded index, instance).
    freed: Vec<(usize, usize)>,
    /// Every allocation's place, when asked for.
    sites: Vec<Site>,
}

/// How much of the allocations [`scan`] follows.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Detail {
    /// Segments only: enough to read the releases of a trace whose final segments show no
    /// private pool, which mostly has none (finding each allocation's segment was most of
    /// [`infer_pools`]' work).
    Segments,
    /// Each allocation's segment too ([`Scan::alloc_in`]).
    Allocations,
    /// And each allocation's [`Site`]: at 40 bytes an allocation, only for a trace with
    /// private pools.
    Sites,
}

/// Follow the segments, and as much of the allocations as `detail` says, through the
/// recording, whose device events are at `device_events` (all a scan of the segments reads).
fn scan(trace: &Trace, device_events: &[u32], detail: Detail) -> Scan {
    let mut instances: Vec<Instance> = Vec::new();
    let mut live = LiveSegments::default();
    // The addresses of live blocks (read for the sites only), and the expandable segments'
    // mapped ranges: a snapshot's segments, what a checkpoint restore tiles.
    let mut blocks: BTreeSet<u64> = BTreeSet::new();
    let mut ranges = MappedRanges::default();
    let total = trace.meta.device_total_bytes.unwrap_or(DEFAULT_TOTAL_BYTES);
    let reservation = |size: u64| {
        let page = if segment_pool(size) == Pool::Small { 2 * MIB } else { 20 * MIB };
        reservation_bytes(total, page)
    };
    for seg in trace.start.iter().flat_map(|s| &s.segments) {
        blocks.extend(seg.blocks.iter().filter(|b| b.state.is_active()).map(|b| b.address));
        if seg.is_expandable {
            ranges.map(seg.address, seg.total_size);
        }
        // A mapped range inside a reservation already listed is more of its pages.
        if let Some((_, _, i)) = live.containing(seg.address).filter(|_| seg.is_expandable) {
            *instances[i].mapped.get_or_insert(0) += seg.total_size;
            continue;
        }
        let (size, mapped) = match seg.is_expandable {
            true => (reservation(seg.total_size), Some(seg.total_size)),
            false => (seg.total_size, None),
        };
        live.insert(seg.address, size, instances.len());
        instances.push(Instance { pool: Some(seg.pool_id), reserved_by: None, mapped });
    }
    let mut alloc_in = Vec::new();
    let mut freed = Vec::new();
    let mut sites = Vec::new();
    let mut visit = |r: usize, e: &RecordedEvent| match e.kind {
        RecordedKind::SegmentAlloc => {
            live.insert(e.addr, e.size, instances.len());
            instances.push(Instance { pool: None, reserved_by: Some(e.op), mapped: None });
        }
        RecordedKind::SegmentFree => {
            if let Some((_, i)) = live.remove(e.addr) {
                freed.push((r, i));
            }
        }
        // A reservation's first map is at its start (`find_expandable_block` maps a new
        // segment from its first page).
        RecordedKind::SegmentMap => {
            ranges.map(e.addr, e.size);
            match live.containing(e.addr) {
                Some((_, _, i)) => *instances[i].mapped.get_or_insert(0) += e.size,
                None => {
                    live.insert(e.addr, reservation(e.size), instances.len());
                    let reserved_by = Some(e.op);
                    instances.push(Instance { pool: None, reserved_by, mapped: Some(e.size) });
                }
            }
        }
        RecordedKind::SegmentUnmap => {
            ranges.unmap(e.addr, e.size);
            if let Some((start, _, i)) = live.containing(e.addr) {
                freed.push((r, i));
                let mapped = instances[i].mapped.get_or_insert(0);
                *mapped = mapped.saturating_sub(e.size);
                if *mapped == 0 {
                    live.remove(start);
                }
            }
        }
        RecordedKind::Alloc if detail >= Detail::Allocations => {
            if let Some((start, size, i)) = live.containing(e.addr) {
                alloc_in.push((e.op, i));
                if detail == Detail::Sites {
                    let segment = match instances[i].mapped {
                        Some(_) => ranges.containing(e.addr).unwrap_or((e.addr, e.size)),
                        None => (start, size),
                    };
                    let end = segment.0.saturating_add(segment.1);
                    let empty = blocks.range(segment.0..end).next().is_none();
                    sites.push(Site { r, instance: i, segment, empty });
                    blocks.insert(e.addr);
                }
            }
        }
        RecordedKind::FreeCompleted if detail == Detail::Sites => {
            blocks.remove(&e.addr);
        }
        _ => {}
    };
    if detail == Detail::Segments {
        for &r in device_events {
            visit(r as usize, &trace.recorded[r as usize]);
        }
    } else {
        trace.recorded.iter().enumerate().for_each(|(r, e)| visit(r, e));
    }
    Scan { instances, live, alloc_in, freed, sites }
}

/// Infer the pools and add their ops (see the module doc). `device_events`: where the device
/// events are in `trace.recorded`. Returns what was inferred and what had to be guessed, for
/// the trace's warnings; nothing when no private pool shows. `None`, changing nothing, when
/// a private pool shows but `trace.recorded` holds only the device events and deferred
/// completions (`all_events` false): the allocations' events are needed. Ops kept `packed`
/// are unpacked into `trace.ops` where a pool shows (the rest reads the recording only).
pub fn infer_pools(
    trace: &mut Trace,
    packed: &mut Option<allocsim_core::PackedOps>,
    device_events: &[u32],
    last: &[SnapshotSegment],
    all_events: bool,
) -> Option<Vec<String>> {
    let known: BTreeSet<MemPoolId> =
        last.iter().map(|s| s.pool_id).filter(|p| !p.is_default()).collect();
    // Private pools alive at the end show in `last`; one released before is found from the
    // segments' frees, reading the allocations only where the frees alone do not tell.
    let mut detail = if known.is_empty() { Detail::Segments } else { Detail::Sites };
    let (instances, alloc_in, freed, sites, released) = loop {
        let (Scan { instances, mut alloc_in, freed, mut sites, .. }, released) = loop {
            if detail > Detail::Segments && !all_events {
                return None;
            }
            let mut scan = scan(trace, device_events, detail);
            for seg in last {
                if let Some((_, _, i)) = scan.live.containing(seg.address) {
                    scan.instances[i].pool = Some(seg.pool_id);
                }
            }
            let alloc_in = (detail >= Detail::Allocations).then(|| by_op(&mut scan.alloc_in));
            match infer_released_pools(trace, &scan.freed, alloc_in, &mut scan.instances, &known) {
                Some(released) => break (scan, released),
                None => detail = Detail::Allocations,
            }
        };
        if known.is_empty() && released.is_empty() {
            return Some(Vec::new());
        }
        if !all_events {
            return None;
        }
        if detail < Detail::Sites {
            // The same segments in the same order keep the instances found valid; a scan that
            // reads expandable ranges otherwise does not, and the inference starts again there.
            let again = scan(trace, device_events, Detail::Sites);
            if again.instances.len() != instances.len() {
                detail = Detail::Sites;
                continue;
            }
            (alloc_in, sites) = (again.alloc_in, again.sites);
            by_op(&mut alloc_in);
        }
        break (instances, alloc_in, freed, sites, released);
    };
    if let Some(packed) = packed.take() {
        trace.ops = packed.to_vec();
    }
    let restored = place_restored_blocks(trace, &sites, &instances);
    let pool_of_op = |op: u64| match alloc_in.binary_search_by_key(&op, |&(o, _)| o) {
        Ok(at) => instances[alloc_in[at].1].pool.unwrap_or(MemPoolId::DEFAULT),
        Err(_) => MemPoolId::DEFAULT,
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
    if restored > 0 {
        notes.push(format!(
            "{restored} allocations restore a private pool's checkpoint (CUDA graph trees' \
             setCheckpointPoolState: whole segments handed out in place) and are placed where \
             the trace shows them"
        ));
    }
    if !released.is_empty() {
        notes.push(format!(
            "guessed: private pools {} were released during the history (their segments were \
             freed in a walk of their own that no default release explains), with the first \
             pool ids the final segments do not use",
            names(&mut released.iter().map(|(p, _)| p))
        ));
    }
    Some(notes)
}

/// The private pools whose release the frees show (see the module doc), with the recorded
/// index of each one's first free; their segments get the pool.
///
/// The frees of one op are split into walks, each ascending in (stream, size, address): one
/// `release_blocks` each. One default release is a large walk then a small one; frees that
/// cannot be read so hold a private pool's release. Its walk is the one that goes from small
/// segments to large ones, or else one whose segments had several allocations, and all those
/// of their time, to themselves (a context takes every allocation).
///
/// `alloc_in` may be left out ([`Detail::Segments`]): `None` then when the frees alone do not
/// tell (with `instances` half assigned: scan again).
fn infer_released_pools(
    trace: &Trace,
    freed: &[(usize, usize)],
    alloc_in: Option<&[(u64, usize)]>,
    instances: &mut [Instance],
    known: &BTreeSet<MemPoolId>,
) -> Option<Vec<(MemPoolId, usize)>> {
    let key = |r: usize| {
        let e = &trace.recorded[r];
        (e.stream.0, e.size, e.addr)
    };
    let pool_of = |r: usize| segment_pool(trace.recorded[r].size);
    // The walks of each op's frees, in order.
    let mut runs: Vec<Vec<Vec<(usize, usize)>>> = Vec::new();
    for (n, &(r, i)) in freed.iter().enumerate() {
        let previous = n.checked_sub(1).map(|p| freed[p].0);
        let same_op = previous.is_some_and(|p| trace.recorded[p].op == trace.recorded[r].op);
        match (runs.last_mut(), previous) {
            (Some(run), Some(p)) if same_op => match run.last_mut() {
                Some(walk) if key(r) > key(p) => walk.push((r, i)),
                _ => run.push(vec![(r, i)]),
            },
            _ => runs.push(vec![vec![(r, i)]]),
        }
    }
    let small_then_large = |walk: &[(usize, usize)]| {
        walk.windows(2).any(|w| pool_of(w[0].0) == Pool::Small && pool_of(w[1].0) == Pool::Large)
    };
    let all_of =
        |walk: &[(usize, usize)], pool: Pool| walk.iter().all(|&(r, _)| pool_of(r) == pool);
    // Whether several allocations went into `walk`'s segments, and every allocation between
    // the first and the last of them.
    let exclusive = |walk: &[(usize, usize)], alloc_in: &[(u64, usize)]| {
        let mine: BTreeSet<usize> = walk.iter().map(|&(_, i)| i).collect();
        let ops: Vec<u64> =
            alloc_in.iter().filter(|(_, i)| mine.contains(i)).map(|&(op, _)| op).collect();
        let (Some(&first), Some(&last)) = (ops.first(), ops.last()) else { return false };
        let from = alloc_in.partition_point(|&(op, _)| op < first);
        let to = alloc_in.partition_point(|&(op, _)| op <= last);
        ops.len() > 1 && alloc_in[from..to].iter().all(|(_, i)| mine.contains(i))
    };
    // Under these settings an allocation frees segments in other orders too (oversize ones
    // largest first, garbage collection in passes): only `empty_cache` runs are read then.
    let conf = trace.meta.alloc_conf.as_deref().unwrap_or("");
    let other_orders =
        conf.contains("max_split_size_mb") || conf.contains("garbage_collection_threshold");
    let mut next_id = (1u64..).map(|n| MemPoolId(0, n)).filter(|id| !known.contains(id));
    let mut released = Vec::new();
    for run in runs {
        let op = trace.recorded[run[0][0].0].op as usize;
        if other_orders && !matches!(trace.ops.get(op), Some(Op::EmptyCache)) {
            continue;
        }
        let default_release = match run.as_slice() {
            [one] => !small_then_large(one),
            [large, small] => all_of(large, Pool::Large) && all_of(small, Pool::Small),
            _ => false,
        };
        if default_release {
            continue;
        }
        // A walk from small segments to large ones is a private pool's; failing that, one
        // whose segments had their allocations to themselves.
        let signed = run.iter().any(|walk| small_then_large(walk));
        if !signed && alloc_in.is_none() {
            return None;
        }
        for walk in &run {
            let unknown = walk.iter().all(|&(_, i)| instances[i].pool.is_none());
            let private = match alloc_in {
                Some(alloc_in) if !signed => exclusive(walk, alloc_in),
                _ => small_then_large(walk),
            };
            if !unknown || !private {
                continue;
            }
            let Some(id) = next_id.next() else { break };
            for &(_, i) in walk {
                instances[i].pool = Some(id);
            }
            released.push((id, walk[0].0));
        }
    }
    Some(released)
}

/// `alloc_in` by op, as recorded; an op allocates once (the last record wins if not).
fn by_op(alloc_in: &mut Vec<(u64, usize)>) -> &[(u64, usize)] {
    alloc_in.sort_by_key(|&(op, _)| op);
    alloc_in.dedup_by(|later, earlier| {
        let same = later.0 == earlier.0;
        if same {
            earlier.1 = later.1;
        }
        same
    });
    alloc_in
}
