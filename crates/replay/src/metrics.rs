//! Per-run measurements: peaks, fragmentation, OOMs and a downsampled timeline.
//!
//! Peaks are computed from the events, not read from the policy's statistics, so they mean the
//! same thing for every policy and cannot be wrong in the same way the policy's counters are.

use crate::{Observer, OpOutcome};
use allocsim_core::{raise_peak, Allocator, BlockState, Device, Event, OomInfo, Op, StartState};

/// One OOM and the figures that explain it.
#[derive(Debug, Clone, PartialEq)]
pub struct OomRecord {
    pub op_index: u64,
    pub info: OomInfo,
}

/// Allocated and reserved bytes after an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelinePoint {
    pub op_index: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricsReport {
    pub ops: u64,
    pub events: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// The op after which reserved bytes first reached their peak.
    pub peak_reserved_op: u64,
    pub peak_active_bytes: u64,
    pub peak_requested_bytes: u64,
    /// 1 - peak allocated / peak reserved: the share of the reservation peak never used.
    pub fragmentation_at_peak: f64,
    /// (cached free - largest free block) / cached free, sampled over the run: how cut up the
    /// cache is. Max and mean over the samples with something cached.
    pub external_fragmentation_max: f64,
    pub external_fragmentation_mean: f64,
    pub ooms: Vec<OomRecord>,
    pub timeline: Vec<TimelinePoint>,
}

/// The metrics observer.
///
/// The timeline and the fragmentation samples are taken after every `stride`-th op from op
/// 0, `stride` the smallest power of two that leaves at most `SAMPLES` of them. The run's
/// length need not be known: the stride starts at 1 and doubles, keeping every other sample,
/// whenever the samples would pass `SAMPLES`, which ends at the same samples as that stride
/// from the start (so a replay that starts before its trace is read whole reports what one
/// after it does).
#[derive(Debug)]
pub struct Metrics {
    report: MetricsReport,
    allocated: u64,
    reserved: u64,
    active: u64,
    requested: u64,
    stride: u64,
    /// The op after which the next sample is taken.
    next_sample: u64,
    /// The external fragmentation at each timeline point, `NaN` where nothing was cached.
    frag: Vec<f64>,
    /// The last op seen: the timeline ends with the state after it.
    last_op: u64,
}

/// The most timeline points and fragmentation samples kept.
pub const SAMPLES: usize = 2000;

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Metrics {
            report: MetricsReport::default(),
            allocated: 0,
            reserved: 0,
            active: 0,
            requested: 0,
            stride: 1,
            next_sample: 0,
            frag: Vec::new(),
            last_op: 0,
        }
    }

    pub fn finish(mut self) -> MetricsReport {
        let r = &mut self.report;
        if r.peak_reserved_bytes > 0 {
            r.fragmentation_at_peak =
                1.0 - r.peak_allocated_bytes as f64 / r.peak_reserved_bytes as f64;
        }
        let cached: Vec<f64> = self.frag.iter().copied().filter(|f| !f.is_nan()).collect();
        if !cached.is_empty() {
            r.external_fragmentation_max = cached.iter().copied().fold(0.0, f64::max);
            r.external_fragmentation_mean = cached.iter().sum::<f64>() / cached.len() as f64;
        }
        if r.ops > 0 {
            let p = TimelinePoint {
                op_index: self.last_op,
                allocated_bytes: self.allocated,
                reserved_bytes: self.reserved,
            };
            if r.timeline.last() != Some(&p) {
                r.timeline.push(p);
            }
        }
        self.report
    }

    fn sample(&mut self, op_index: u64, allocator: &dyn Allocator) {
        if self.frag.len() == SAMPLES {
            // The samples at odd multiples of the stride go; the next one is at a multiple of
            // the new stride already (op_index is 2000 strides on).
            self.stride *= 2;
            every_other(&mut self.frag);
            every_other(&mut self.report.timeline);
        }
        let space = allocator.free_space();
        let frag = if space.cached_bytes > 0 {
            (space.cached_bytes - space.largest_free_block_bytes.min(space.cached_bytes)) as f64
                / space.cached_bytes as f64
        } else {
            f64::NAN
        };
        self.frag.push(frag);
        self.report.timeline.push(TimelinePoint {
            op_index,
            allocated_bytes: self.allocated,
            reserved_bytes: self.reserved,
        });
        self.next_sample = op_index + self.stride;
    }
}

/// Keep the first item of `v`, the third, and so on.
fn every_other<T>(v: &mut Vec<T>) {
    let mut i = 0;
    v.retain(|_| {
        i += 1;
        i % 2 == 1
    });
}

impl Observer for Metrics {
    /// The live blocks and segments at the start count from the start, peaks included.
    fn on_start(&mut self, start: &StartState, _allocator: &dyn Allocator) {
        for seg in &start.segments {
            self.reserved += seg.total_size;
            for b in seg.blocks.iter().filter(|b| b.state.is_active()) {
                self.active += b.size;
                self.requested += b.requested_size;
                if b.state == BlockState::ActiveAllocated {
                    self.allocated += b.size;
                }
            }
        }
        let r = &mut self.report;
        r.peak_reserved_bytes = self.reserved;
        r.peak_allocated_bytes = self.allocated;
        r.peak_active_bytes = self.active;
        r.peak_requested_bytes = self.requested;
    }

    #[inline]
    fn on_event(&mut self, _event_index: u64, op_index: u64, event: &Event) -> bool {
        let r = &mut self.report;
        r.events += 1;
        match *event {
            Event::SegmentAlloc { size, .. } | Event::SegmentMap { size, .. } => {
                self.reserved += size;
                if self.reserved > r.peak_reserved_bytes {
                    r.peak_reserved_bytes = self.reserved;
                    r.peak_reserved_op = op_index;
                }
            }
            Event::SegmentFree { size, .. } | Event::SegmentUnmap { size, .. } => {
                self.reserved = self.reserved.saturating_sub(size)
            }
            Event::Alloc { size, requested, .. } => {
                self.allocated += size;
                self.active += size;
                self.requested += requested;
                raise_peak(&mut r.peak_allocated_bytes, self.allocated);
                raise_peak(&mut r.peak_active_bytes, self.active);
                raise_peak(&mut r.peak_requested_bytes, self.requested);
            }
            Event::FreeRequested { size, .. } => {
                self.allocated = self.allocated.saturating_sub(size)
            }
            Event::FreeCompleted { size, requested, .. } => {
                self.active = self.active.saturating_sub(size);
                self.requested = self.requested.saturating_sub(requested);
            }
            Event::Oom { .. } => {}
        }
        true
    }

    #[inline]
    fn on_op(
        &mut self,
        op_index: u64,
        _op: &Op,
        outcome: &OpOutcome,
        allocator: &dyn Allocator,
        _device: &dyn Device,
    ) -> bool {
        self.report.ops += 1;
        if let OpOutcome::OutOfMemory(info) = outcome {
            self.report.ooms.push(OomRecord { op_index, info: *info });
        }
        // Every `stride`-th op from op 0.
        if op_index >= self.next_sample {
            self.sample(op_index, allocator);
        }
        self.last_op = op_index;
        true
    }
}
