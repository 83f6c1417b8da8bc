//! "Would it fit?": the smallest free memory at a run's start on which its ops complete
//! without an OOM, as a point and a band, held against the GPU in `validation/`.
//!
//! Free memory at the start is what `torch.cuda.mem_get_info()` reports once the CUDA context
//! exists. Two things take it besides the allocator's segments, and the model has both:
//! - **Memory outside the allocator** that the run takes as it goes (kernels loaded lazily,
//!   library handles and workspaces): [`CapacityOptions::outside_bytes`], taken step by step
//!   where the recording profiles it ([`Outside`]), else from the start.
//!   A recording made by `validation/fit.py` measures it (`meta.outside_allocator_bytes`);
//!   otherwise [`OUTSIDE_ALLOCATOR_BYTES`], measured on an H100 (`docs/capacity.md`).
//! - **The driver's addresses**, which break ties between equal free blocks and so decide
//!   fragmentation under pressure. The same program on the same machine gets the layout its
//!   recording shows, and other chunk orders in other runs. The point is the run bisected with
//!   the segments where the recording had them, the driver's rule for the rest
//!   ([`Placement::Recorded`]); the band spreads over
//!   [`CapacityOptions::jitters`] seeded jittered placements (neighbours swapped, as between
//!   real runs), widened below by [`band_margin`]: on the H100 some chunk orders let a run fit
//!   with less than any placement the model has (`validation/README.md`); and above, where the
//!   recording does not profile its outside memory, by [`TRANSIENT_OUTSIDE_BYTES`].

use crate::{run_trace, run_trace_streamed, DeviceChoice, RunOptions, RunReport};
use allocsim_core::{Allocator, ConfigError, Device, Op, PackedOps, Trace};
use allocsim_replay::{Observer, OpOutcome};
use allocsim_sim::{Fault, Placement, PAGE_BYTES};
use rayon::prelude::*;

/// Memory a PyTorch training run takes outside the caching allocator on an H100 with PyTorch
/// 2.11 and CUDA 13 (the largest of the validation workloads: 246 MiB; see `docs/capacity.md`).
pub const OUTSIDE_ALLOCATOR_BYTES: u64 = 257_949_696;

/// Free memory the driver never hands out: with this much left every `cudaMalloc` fails,
/// whatever its size, while `mem_get_info()` still counts it free. On an H200 (PyTorch 2.11,
/// driver 580.159.04) filling the device with `cudaMalloc`s down to 512 bytes, or with
/// PyTorch's allocator with and without expandable segments, left 3,276,800 bytes free every
/// time (`validation/driver_floor.py`), and so did the tightest fitting tries of `validation/`.
pub const H200_DRIVER_FLOOR_BYTES: u64 = 3_276_800;

/// The total memory `mem_get_info()` reports on that H200.
pub const H200_TOTAL_BYTES: u64 = 150_109_880_320;

/// The driver's floor on a device of `total` bytes, where it was measured (the H200); none
/// elsewhere: on the H100 a run of `validation/` ended with 2,293,760 bytes free, so its
/// floor is at most that, and no other device was measured.
pub fn driver_floor_bytes(total: Option<u64>) -> u64 {
    match total {
        Some(H200_TOTAL_BYTES) => H200_DRIVER_FLOOR_BYTES,
        _ => 0,
    }
}

/// Bisection stops when the bracket is this narrow: the driver's page.
pub const CAPACITY_RESOLUTION_BYTES: u64 = PAGE_BYTES;

/// How far below the lowest bisected threshold the band reaches: the bisection's resolution
/// (the threshold lies within it below the end found) plus the spread of the outside memory
/// between runs of one workload on the H100 (255,852,544 to 257,949,696 bytes: a run that dies
/// early has not loaded every kernel).
pub const BAND_MARGIN_BYTES: u64 = CAPACITY_RESOLUTION_BYTES + PAGE_BYTES;

/// How much less than the lowest placement some real chunk order needs, in parts per 10,000
/// of the point: the Llama `max_split` row of `validation/` fitted up to 0.27 % below it under
/// the nine chunk orders measured on the H100 and 0.33 % under one of three on an H200, while
/// the model's placements never went below. The other rows did not move with the chunk order.
pub const ORDER_MARGIN_PER_10K: u64 = 35;

/// How far below the lowest placement's threshold the band reaches, for a run whose point is
/// `point`: [`BAND_MARGIN_BYTES`] or [`ORDER_MARGIN_PER_10K`] of the point, the larger.
pub fn band_margin(point: u64) -> u64 {
    BAND_MARGIN_BYTES.max(point / 10_000 * ORDER_MARGIN_PER_10K)
}

/// How far above the highest placement's threshold the band reaches for a recording that does
/// not profile its memory outside the allocator: what libraries take late beside the
/// allocator's peak (kernels loaded for new shapes, cuDNN's attention plans), which such a
/// recording, measuring the outside memory at its end, cannot place. Under pressure such a run
/// fails in the library (`mha_graph.execute`, `CUDNN_STATUS_INTERNAL_ERROR`, `CUDA error: out
/// of memory`) with no allocator OOM: on an H200 the Llama `expandable` row needed 9.5-15.8 MB
/// more than the point before the driver's floor and the profile were in the model
/// (`validation/README.md`). It reaches no higher than [`Capacity::unconstrained_bytes`].
pub const TRANSIENT_OUTSIDE_BYTES: u64 = 10 << 20;

/// What a capacity question is asked under.
#[derive(Debug, Clone)]
pub struct CapacityOptions {
    /// Policy, settings and device; the free memory is what is searched, and the device is the
    /// model (a smaller device leaves any recording at its first refusal).
    pub run: RunOptions,
    /// Memory the run takes outside the allocator, counted as taken from the start.
    pub outside_bytes: u64,
    /// Free memory the driver never hands out ([`driver_floor_bytes`]).
    pub floor_bytes: u64,
    /// How many seeded jittered placements the band is taken over, besides the driver placement.
    pub jitters: u32,
}

impl CapacityOptions {
    /// What free memory at the start the allocator cannot have by the run's end: all of the
    /// outside memory and the driver's floor (with a profile, less of it early on: [`Outside`]).
    fn taken_bytes(&self) -> u64 {
        self.outside_bytes + self.floor_bytes
    }
}

/// The threshold under one placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementThreshold {
    pub placement: Placement,
    /// `None`: not even all of the device's free memory is enough.
    pub capacity_bytes: Option<u64>,
}

/// The answer: free memory at the start (outside memory included) the run needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    /// Under the recording's own placement ([`Placement::Recorded`]). `None` if the run does
    /// not fit the device at all.
    pub capacity_bytes: Option<u64>,
    /// The least any placement needed less `band_margin`, and the most any needed (plus
    /// [`TRANSIENT_OUTSIDE_BYTES`] without a profile of the outside memory, but no more than
    /// [`Capacity::unconstrained_bytes`]; `None` if under some placement the run does not fit
    /// the device at all).
    pub low_bytes: Option<u64>,
    pub high_bytes: Option<u64>,
    /// What the run takes unconstrained: its peak reserved, the outside memory and the floor
    /// (`None` if it had an OOM or starts mid-run). With this much free no reservation is
    /// refused and every kernel the run loads finds the memory it took when recorded, so the
    /// run fits, unless a library takes memory outside the allocator for a moment while the
    /// allocator holds its peak. For a run that caches little (decoding) it is within a page
    /// or two of the point: on an H200 the tightest fit of Llama decoding took exactly this
    /// much (`validation/README.md`).
    pub unconstrained_bytes: Option<u64>,
    pub outside_bytes: u64,
    /// Whether the recording's profile said when the outside memory was taken (the sidecar's
    /// `outside_profile`), so that it is taken step by step.
    pub outside_profiled: bool,
    pub floor_bytes: u64,
    /// The device's free memory at the start, the most that was tried.
    pub searched_up_to_bytes: u64,
    pub placements: Vec<PlacementThreshold>,
}

/// Bisect the smallest `x` in `(lo, hi]` with `fits(x)`, to `CAPACITY_RESOLUTION_BYTES`, given that
/// `fits(hi)`. Feasibility is not strictly monotonic for every policy (a bigger card can change
/// an early decision), so this is the boundary bisection finds, checked to fit.
pub(crate) fn bisect(
    mut lo: u64,
    mut hi: u64,
    mut fits: impl FnMut(u64) -> Result<bool, ConfigError>,
) -> Result<u64, ConfigError> {
    while hi - lo > CAPACITY_RESOLUTION_BYTES {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

/// The smallest `x` in `(lo, hi]` with `fits(x)`, searched outwards from `start`: down from
/// it while it fits, else up to `hi` (`None` if even `hi` does not fit), in steps that double
/// from [`CAPACITY_RESOLUTION_BYTES`], then [`bisect`]ed within the last step.
pub(crate) fn gallop(
    start: u64,
    lo: u64,
    hi: u64,
    mut fits: impl FnMut(u64) -> Result<bool, ConfigError>,
) -> Result<Option<u64>, ConfigError> {
    let start = start.max(lo + 1).min(hi);
    let mut step = CAPACITY_RESOLUTION_BYTES;
    if fits(start)? {
        let mut fit = start;
        loop {
            let x = start.saturating_sub(step).max(lo);
            if x == lo || !fits(x)? {
                return bisect(x, fit, &mut fits).map(Some);
            }
            fit = x;
            step *= 2;
        }
    }
    let mut failed = start;
    loop {
        let x = start.saturating_add(step).min(hi);
        if fits(x)? {
            return bisect(failed, x, &mut fits).map(Some);
        }
        if x == hi {
            return Ok(None);
        }
        failed = x;
        step *= 2;
    }
}

/// A trace that runs again and again: whole, or its head (the trace without ops) and its ops
/// packed (`allocsim_trace::pytorch::read_snapshot_packed`: a few bytes an op instead of 40),
/// of a recording of `recorded_len` events. Runs that may stream their ops run either.
#[derive(Debug, Clone, Copy)]
pub enum Runs<'t> {
    Whole(&'t Trace),
    Packed { head: &'t Trace, ops: &'t PackedOps, recorded_len: u64 },
}

impl<'t> Runs<'t> {
    /// The trace, or its head: everything but the ops.
    pub fn head(self) -> &'t Trace {
        match self {
            Runs::Whole(trace) => trace,
            Runs::Packed { head, .. } => head,
        }
    }

    /// One run, no observers besides the run's own.
    pub fn run(self, opts: &RunOptions) -> Result<RunReport, ConfigError> {
        self.run_observed(opts, &mut [])
    }

    fn run_observed(
        self,
        opts: &RunOptions,
        extra: &mut [&mut dyn Observer],
    ) -> Result<RunReport, ConfigError> {
        match self {
            Runs::Whole(trace) => run_trace(trace, opts, extra, |_| {}),
            Runs::Packed { head, ops, recorded_len } => {
                run_trace_streamed(head, recorded_len, ops, opts, extra, |_| {})
            }
        }
    }
}

/// Whether `trace` completes without an OOM on the modelled device as `run` sets it up; the
/// run stops at its first OOM. Every bisection's question (here and in the grid).
pub(crate) fn completes(trace: Runs<'_>, run: RunOptions) -> Result<bool, ConfigError> {
    completes_taking(trace, run, &[])
}

/// [`completes`], the run taking `later` outside the allocator as it goes ([`Outside`]): a
/// take the device has no room for ends the run as an OOM does.
fn completes_taking(
    trace: Runs<'_>,
    run: RunOptions,
    later: &[(u64, u64)],
) -> Result<bool, ConfigError> {
    let mut faults = run.faults;
    faults.extend(later.iter().map(|&(at_op, bytes)| Fault::TakeMemory { at_op, bytes }));
    let run = RunOptions {
        device: DeviceChoice::Sim,
        check: false,
        fidelity: false,
        until_oom: true,
        faults,
        ..run
    };
    if later.is_empty() {
        return Ok(trace.run(&run)?.metrics.ooms.is_empty());
    }
    let mut takes = Takes { later, next: 0, refused: false };
    let report = trace.run_observed(&run, &mut [&mut takes])?;
    Ok(report.metrics.ooms.is_empty() && !takes.refused)
}

/// Memory outside the allocator as the run takes it: `first` before its first op, then each
/// of `later` at an op the recording does not pin down: a kernel module or a library's handle
/// gets none of the allocator's cache (PyTorch frees cached blocks only for its own failed
/// `cudaMalloc`), so a take that finds too little free fails the run.
///
/// From the recording's profile ([`allocsim_core::TraceMeta::outside_profile`], what was taken
/// by the end of each step): the first step's from the start (library handles and workspaces
/// come with the first kernels, before the allocator's peak), each later step's somewhere in
/// that step, and what the run took after its last step as that ended. Decoding loads kernels
/// for new shapes until its last step: on the H200 its real threshold is where that last load
/// fits beside the allocator's peak (`validation/README.md`). Without a profile, or with the
/// figure not the recording's, all of it is taken from the start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outside {
    /// Whether the recording's profile said when it was taken.
    pub(crate) profiled: bool,
    pub(crate) first: u64,
    /// `(begins, ends, bytes)`: taken during the ops from `begins` to `ends`.
    pub(crate) later: Vec<(u64, u64, u64)>,
}

impl Outside {
    pub(crate) fn of(head: &Trace, outside_bytes: u64) -> Outside {
        let meta = &head.meta;
        let profiled = !meta.outside_profile.is_empty()
            && meta.outside_allocator_bytes == Some(outside_bytes)
            && head.start.is_none();
        let mut outside = Outside { profiled, first: outside_bytes, later: Vec::new() };
        if !profiled {
            return outside;
        }
        let profile = &meta.outside_profile;
        outside.first = profile[0].1;
        let mut level = outside.first;
        let last = profile[profile.len() - 1];
        let steps = profile.windows(2).map(|w| (w[0].0, w[1].0, w[1].1));
        for (begins, ends, bytes) in steps.chain([(last.0, last.0, outside_bytes)]) {
            if bytes > level {
                outside.later.push((begins, ends, bytes - level));
                level = bytes;
            }
        }
        outside
    }

    /// The takes of `later` at the ops they could come at earliest and latest, each `(op,
    /// bytes)` as op `op` begins: the run fits if it fits under both. Taken as its step begins,
    /// the allocator makes room for it under pressure; as it ends, the allocator may have
    /// filled that room with cache (what decoding on the H200 does).
    fn schedules(&self) -> [Vec<(u64, u64)>; 2] {
        let merged = |at: fn(&(u64, u64, u64)) -> u64| {
            let mut takes: Vec<(u64, u64)> = Vec::new();
            for step in &self.later {
                match takes.last_mut() {
                    Some(last) if last.0 == at(step) => last.1 += step.2,
                    _ => takes.push((at(step), step.2)),
                }
            }
            takes
        };
        [merged(|s| s.0), merged(|s| s.1)]
    }
}

/// Watches takes of [`Outside::schedules`]: before op `op` begins (and the device takes the bytes),
/// whether that much is free; a refusal stops the run.
struct Takes<'o> {
    later: &'o [(u64, u64)],
    next: usize,
    refused: bool,
}

impl Observer for Takes<'_> {
    fn on_op(
        &mut self,
        op_index: u64,
        _: &Op,
        _: &OpOutcome,
        _: &dyn Allocator,
        device: &dyn Device,
    ) -> bool {
        match self.later.get(self.next) {
            Some(&(op, bytes)) if op == op_index + 1 => {
                self.next += 1;
                self.refused = device.mem_info().free_bytes < bytes;
                !self.refused
            }
            _ => true,
        }
    }
}

/// Whether `trace` completes without an OOM with `free_bytes` free at the start, taking
/// `outside` as it goes.
fn fits(
    trace: Runs<'_>,
    opts: &CapacityOptions,
    outside: &Outside,
    placement: Placement,
    free_bytes: u64,
) -> Result<bool, ConfigError> {
    let free = free_bytes.saturating_sub(outside.first + opts.floor_bytes);
    let run = RunOptions { device_free_bytes: Some(free), placement, ..opts.run.clone() };
    if outside.later.is_empty() {
        return completes(trace, run);
    }
    for takes in outside.schedules() {
        if !completes_taking(trace, run.clone(), &takes)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Where the point's run places its segments: where the recording's run had them (the same
/// program on the same machine gets that layout again: `validation/`), the driver's rule
/// for the rest, and for a trace that recorded no addresses.
const POINT_PLACEMENT: Placement = Placement::Recorded;

/// Whether the run of `trace` completes with `free_bytes` free at the start, as [`capacity`]
/// asks it of the point's placement: the outside memory taken as the recording's profile says
/// and the driver's floor kept. Fitting is not monotonic in the free memory (a run short of
/// memory sooner gives its cache back sooner): this is the question at one amount.
pub fn fits_at(
    trace: Runs<'_>,
    opts: &CapacityOptions,
    free_bytes: u64,
) -> Result<bool, ConfigError> {
    let outside = Outside::of(trace.head(), opts.outside_bytes);
    fits(trace, opts, &outside, POINT_PLACEMENT, free_bytes)
}

/// The capacity of `trace` under `opts`: one bisection per placement, the jittered ones in
/// parallel.
pub fn capacity(trace: &Trace, opts: &CapacityOptions) -> Result<Capacity, ConfigError> {
    capacity_of(Runs::Whole(trace), opts)
}

/// [`capacity`] of a trace whole or with its ops packed.
pub fn capacity_of(trace: Runs<'_>, opts: &CapacityOptions) -> Result<Capacity, ConfigError> {
    let base = trace.run(&RunOptions {
        device: DeviceChoice::Sim,
        placement: POINT_PLACEMENT,
        check: false,
        fidelity: false,
        ..opts.run.clone()
    })?;
    let outside = Outside::of(trace.head(), opts.outside_bytes);

    let device_free = base.device_free_bytes.saturating_add(opts.taken_bytes());
    // Nothing fits below what is live at once, plus the outside memory and the floor. With as
    // much free as the unconstrained run reserved, no reservation is refused, so the run fits:
    // the bracket starts there (and at the whole device for a placement that reserves more).
    let lower = (base.metrics.peak_requested_bytes + opts.taken_bytes()).saturating_sub(1);
    let reserved = base.stats.reserved_bytes.all.peak.max(0) as u64 + opts.taken_bytes();
    // Under the point's placement and as much free as that run reserved, the run is that run
    // again when it had no OOM: no need to run it. Not so for a run from a mid-run state,
    // which the base run seeds as recorded and the searched runs lay out (a what-if).
    let base_fits = base.metrics.ooms.is_empty() && trace.head().start.is_none();
    let threshold = |placement, lower: u64, upper: u64| -> Result<Option<u64>, ConfigError> {
        let known = base_fits && placement == POINT_PLACEMENT && upper == reserved;
        if !known && !fits(trace, opts, &outside, placement, upper)? {
            return Ok(None);
        }
        bisect(lower.min(upper), upper, |x| fits(trace, opts, &outside, placement, x)).map(Some)
    };
    // Over the whole bracket, falling back to the whole device.
    let whole = |placement| -> Result<Option<u64>, ConfigError> {
        for upper in [reserved.min(device_free), device_free] {
            if let Some(t) = threshold(placement, lower, upper)? {
                return Ok(Some(t));
            }
        }
        Ok(None)
    };
    // The modelled device refuses in whole pages of what is free beside the memory taken at the
    // start, so the threshold lies on that grid, at or below where bisection stopped: one run
    // more finds it there. (The ballast of `validation/fit.py` takes free memory in the same
    // pages, so a real bracket's ends lie on the same grid.)
    let grid = outside.first + opts.floor_bytes;
    let point = match whole(POINT_PLACEMENT)? {
        Some(p) => {
            let on_grid = grid + (p.saturating_sub(grid) / PAGE_BYTES) * PAGE_BYTES;
            let below = on_grid < p && fits(trace, opts, &outside, POINT_PLACEMENT, on_grid)?;
            Some(if below { on_grid } else { p })
        }
        None => None,
    };
    // Jittered placements land at the point or a few pages from it: search outwards from it in
    // doubling steps, then bisect the last step. A run that fits is a whole run and one that
    // does not stops at its first OOM, so this costs about one whole run a placement where a
    // bisection of a fixed bracket around the point took two or more.
    let jittered = (0..u64::from(opts.jitters))
        .into_par_iter()
        .map(|seed| {
            let placement = Placement::Jittered { seed };
            let capacity_bytes = match point {
                Some(p) => {
                    gallop(p, lower, device_free, |x| fits(trace, opts, &outside, placement, x))?
                }
                None => whole(placement)?,
            };
            Ok(PlacementThreshold { placement, capacity_bytes })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let placements: Vec<PlacementThreshold> =
        std::iter::once(PlacementThreshold { placement: POINT_PLACEMENT, capacity_bytes: point })
            .chain(jittered)
            .collect();
    let found = || placements.iter().filter_map(|p| p.capacity_bytes);
    let unconstrained = base_fits.then_some(reserved);
    // A placement under which the run does not fit at all makes the band open upwards.
    let all_fit = placements.iter().all(|p| p.capacity_bytes.is_some());
    let high = |most: u64| {
        let transient = most + if outside.profiled { 0 } else { TRANSIENT_OUTSIDE_BYTES };
        unconstrained.map_or(transient, |u| transient.min(u.max(most)))
    };
    Ok(Capacity {
        capacity_bytes: point,
        low_bytes: found().min().map(|b| b.saturating_sub(band_margin(point.unwrap_or(b)))),
        high_bytes: if all_fit { found().max().map(high) } else { None },
        unconstrained_bytes: unconstrained,
        outside_profiled: outside.profiled,
        outside_bytes: opts.outside_bytes,
        floor_bytes: opts.floor_bytes,
        searched_up_to_bytes: device_free,
        placements,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PAGE: u64 = CAPACITY_RESOLUTION_BYTES;

    proptest! {
        /// Searched from anywhere, a monotone threshold is found to within the resolution, at
        /// or above it, as bisecting the whole bracket finds it; and beyond the bracket's top,
        /// not at all.
        #[test]
        fn gallop_finds_what_bisection_finds(
            lo in 0u64..1 << 40,
            threshold in 1u64..1 << 36,
            start in 0u64..1 << 37,
            span in 1u64..1 << 36,
        ) {
            let hi = lo + span;
            let threshold = lo + threshold;
            let mut runs = 0;
            let found = gallop(lo + start, lo, hi, |x| { runs += 1; Ok(x >= threshold) }).unwrap();
            if threshold > hi {
                prop_assert_eq!(found, None);
            } else {
                let found = found.unwrap();
                prop_assert!(found >= threshold && found < threshold + PAGE, "{found}");
                let bisected = bisect(lo, hi, |x| Ok(x >= threshold)).unwrap();
                prop_assert!(bisected >= threshold && bisected < threshold + PAGE);
            }
            prop_assert!(runs <= 2 * 64 + 2, "{runs} runs");
        }
    }

    /// A profile's first step is taken from the start; each later step's growth between the
    /// op after the step before it and the op after it; what came after the last step as that
    /// ended. A step that took nothing takes nothing, and a figure not the recording's, or no
    /// profile, is all taken from the start.
    #[test]
    fn outside_memory_is_taken_step_by_step_as_profiled() {
        let mut trace = Trace::default();
        trace.meta.outside_allocator_bytes = Some(60);
        trace.meta.outside_profile = vec![(10, 40), (20, 40), (30, 52), (45, 56)];
        let outside = Outside::of(&trace, 60);
        assert_eq!((outside.profiled, outside.first), (true, 40));
        assert_eq!(outside.later, [(20, 30, 12), (30, 45, 4), (45, 45, 4)]);
        assert_eq!(
            outside.schedules(),
            [vec![(20, 12), (30, 4), (45, 4)], vec![(30, 12), (45, 8)]]
        );
        for other in [Outside::of(&trace, 61), Outside::of(&Trace::default(), 60)] {
            assert_eq!(other, Outside { profiled: false, first: other.first, later: vec![] });
        }
    }

    /// At the point, the common case costs a run that fits and one that fails.
    #[test]
    fn gallop_at_the_threshold_takes_two_runs() {
        let threshold = 5 << 30;
        let mut asked = vec![];
        let found = gallop(threshold, 1 << 30, 80 << 30, |x| {
            asked.push(x);
            Ok(x >= threshold)
        });
        assert_eq!(found.unwrap(), Some(threshold));
        assert_eq!(asked, [threshold, threshold - PAGE]);
    }
}
