//! Per-run measurements: peaks, fragmentation, OOMs and a downsampled timeline.
//!
//! Peaks are computed from the events, not read from the policy's statistics, so they mean the
//! same thing for every policy and cannot be wrong in the same way the policy's counters are.

use crate::{Observer, OpOutcome};
use allocsim_core::{Allocator, BlockState, Device, Event, OomInfo, Op, StartState};

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

/// The metrics observer. `expected_ops` sizes the sampling stride (0 if unknown).
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
    frag_sum: f64,
    frag_samples: u64,
    /// The last op seen: the timeline ends with the state after it.
    last_op: u64,
}

/// How many timeline points and fragmentation samples to aim for.
const SAMPLES: u64 = 2000;

impl Metrics {
    pub fn new(expected_ops: u64) -> Self {
        Metrics {
            report: MetricsReport::default(),
            allocated: 0,
            reserved: 0,
            active: 0,
            requested: 0,
            stride: (expected_ops / SAMPLES).max(1),
            next_sample: 0,
            frag_sum: 0.0,
            frag_samples: 0,
            last_op: 0,
        }
    }

    pub fn finish(mut self) -> MetricsReport {
        let r = &mut self.report;
        if r.peak_reserved_bytes > 0 {
            r.fragmentation_at_peak =
                1.0 - r.peak_allocated_bytes as f64 / r.peak_reserved_bytes as f64;
        }
        if self.frag_samples > 0 {
            r.external_fragmentation_mean = self.frag_sum / self.frag_samples as f64;
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
        let space = allocator.free_space();
        if space.cached_bytes > 0 {
            let frag = (space.cached_bytes - space.largest_free_block_bytes.min(space.cached_bytes))
                as f64
                / space.cached_bytes as f64;
            self.report.external_fragmentation_max =
                self.report.external_fragmentation_max.max(frag);
            self.frag_sum += frag;
            self.frag_samples += 1;
        }
        self.report.timeline.push(TimelinePoint {
            op_index,
            allocated_bytes: self.allocated,
            reserved_bytes: self.reserved,
        });
    }
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
                r.peak_allocated_bytes = r.peak_allocated_bytes.max(self.allocated);
                r.peak_active_bytes = r.peak_active_bytes.max(self.active);
                r.peak_requested_bytes = r.peak_requested_bytes.max(self.requested);
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
            self.next_sample = op_index + self.stride;
            self.sample(op_index, allocator);
        }
        self.last_op = op_index;
        true
    }
}
