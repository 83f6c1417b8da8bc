//! What the checker reports: every broken rule, with the event that broke it.

use std::fmt;

/// The rule a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ViolationKind {
    /// A block does not lie wholly inside one live segment or mapped range.
    BlockOutsideSegment,
    /// A block overlaps another live block (live: from `Alloc` until `FreeCompleted`).
    BlockOverlap,
    /// A block's address is not a multiple of the configured alignment.
    Misaligned,
    /// A block is smaller than what was requested.
    BlockTooSmall,
    /// A block, segment or mapping of zero bytes.
    ZeroSize,
    /// `Alloc` of an id that is still live.
    DuplicateAllocId,
    /// `FreeRequested`/`FreeCompleted` of an id that is not live.
    UnknownFree,
    /// A second `FreeRequested` of the same allocation.
    DoubleFree,
    /// `FreeCompleted` before the allocation's `FreeRequested`.
    CompletedBeforeRequested,
    /// A free names a different address, size or requested size than its `Alloc`.
    FreeMismatch,
    /// A segment freed or pages unmapped while a live block lies in them.
    SegmentFreedWithLiveBlock,
    /// A segment or mapping overlaps a live segment or mapping.
    SegmentOverlap,
    /// `SegmentFree` of no live segment (or of the wrong size); `SegmentUnmap` of pages not
    /// mapped.
    UnknownSegment,
    /// Live segments plus mapped pages exceed the device's total memory.
    ReservedExceedsDevice,
    /// A statistic differs from what the events imply.
    StatMismatch,
    /// A statistic contradicts itself: `peak < current`, or `allocated - freed != current`.
    StatInconsistent,
}

impl ViolationKind {
    /// A stable kebab-case name, for reports and counts.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::BlockOutsideSegment => "block-outside-segment",
            ViolationKind::BlockOverlap => "block-overlap",
            ViolationKind::Misaligned => "misaligned",
            ViolationKind::BlockTooSmall => "block-too-small",
            ViolationKind::ZeroSize => "zero-size",
            ViolationKind::DuplicateAllocId => "duplicate-alloc-id",
            ViolationKind::UnknownFree => "unknown-free",
            ViolationKind::DoubleFree => "double-free",
            ViolationKind::CompletedBeforeRequested => "completed-before-requested",
            ViolationKind::FreeMismatch => "free-mismatch",
            ViolationKind::SegmentFreedWithLiveBlock => "segment-freed-with-live-block",
            ViolationKind::SegmentOverlap => "segment-overlap",
            ViolationKind::UnknownSegment => "unknown-segment",
            ViolationKind::ReservedExceedsDevice => "reserved-exceeds-device",
            ViolationKind::StatMismatch => "stat-mismatch",
            ViolationKind::StatInconsistent => "stat-inconsistent",
        }
    }
}

/// One broken rule. `event_index` is the event that broke it; for statistics, the number of
/// events seen when the statistics were checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub event_index: u64,
    pub op_index: u64,
    pub kind: ViolationKind,
    /// What was expected and what was seen.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "event {} (op {}): {}: {}",
            self.event_index,
            self.op_index,
            self.kind.name(),
            self.message
        )
    }
}

/// Everything a run of the checker found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckReport {
    /// The first violations, in the order found (at most the configured cap).
    pub violations: Vec<Violation>,
    /// All violations found, stored or not.
    pub total_violations: u64,
    pub events_checked: u64,
    pub stats_checked: u64,
}

impl CheckReport {
    pub fn is_ok(&self) -> bool {
        self.total_violations == 0
    }

    /// All violations found, stored or not (the same as the field, for callers holding
    /// the report behind a trait or a reference chain).
    pub fn total_violations(&self) -> u64 {
        self.total_violations
    }

    /// The stored violations, in the order found.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (events, stats) = (self.events_checked, self.stats_checked);
        if self.is_ok() {
            return write!(f, "checked {events} events and {stats} statistics: no violations");
        }
        write!(f, "checked {events} events and {stats} statistics: ")?;
        write!(f, "{} violations", self.total_violations)?;
        if self.violations.len() as u64 != self.total_violations {
            write!(f, " (the first {} kept)", self.violations.len())?;
        }
        for v in &self.violations {
            write!(f, "\n  {v}")?;
        }
        Ok(())
    }
}
