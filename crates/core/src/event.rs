//! What an allocator did, in the order it did it.
//!
//! Events are the allocator's only output that the checker (`allocsim-check`) reads, so they
//! carry everything needed to rebuild the memory map without trusting the policy: addresses,
//! block sizes after rounding, pools. Their names follow PyTorch's trace actions so that a
//! simulated event log lines up with a recorded `device_traces` list entry for entry.

use crate::{AllocId, OomInfo, Pool, StreamId};

/// `repr(u8)`: a plain tag byte, which observers dispatch on directly. Without it the tag is
/// folded into `OomInfo`'s `Option` (a niche), and every `match` first rebuilds it from that
/// word: a longer chain before each jump on the kind of event.
#[derive(Debug, Clone, PartialEq)]
#[repr(u8)]
pub enum Event {
    /// A whole segment was reserved from the device (`cudaMalloc`).
    SegmentAlloc { addr: u64, size: u64, stream: StreamId, pool: Pool },
    /// A whole segment went back to the device (`cudaFree`).
    SegmentFree { addr: u64, size: u64, stream: StreamId, pool: Pool },
    /// Physical pages were mapped into a reserved address range (expandable segments).
    SegmentMap { addr: u64, size: u64, stream: StreamId, pool: Pool },
    /// Physical pages were unmapped from a reserved address range.
    SegmentUnmap { addr: u64, size: u64, stream: StreamId, pool: Pool },
    /// A block was handed out: `size` is the block (after rounding and splitting),
    /// `requested` what the program asked for.
    Alloc { id: AllocId, addr: u64, size: u64, requested: u64, stream: StreamId, pool: Pool },
    /// The program freed `id`; the block stops counting as allocated.
    FreeRequested { id: AllocId, addr: u64, size: u64, requested: u64 },
    /// The free of `id` completed; the block's memory is free for reuse.
    FreeCompleted { id: AllocId, addr: u64, size: u64, requested: u64 },
    /// The allocator gave up on `id`: `size` is the rounded request; `info` explains why.
    Oom { id: AllocId, size: u64, stream: StreamId, info: OomInfo },
}

impl Event {
    /// The PyTorch trace action this event corresponds to.
    pub fn action(&self) -> &'static str {
        match self {
            Event::SegmentAlloc { .. } => "segment_alloc",
            Event::SegmentFree { .. } => "segment_free",
            Event::SegmentMap { .. } => "segment_map",
            Event::SegmentUnmap { .. } => "segment_unmap",
            Event::Alloc { .. } => "alloc",
            Event::FreeRequested { .. } => "free_requested",
            Event::FreeCompleted { .. } => "free_completed",
            Event::Oom { .. } => "oom",
        }
    }

    /// True for the events that are device calls or their refusal (`oom`): the sequence the
    /// fidelity check compares with a recording.
    pub fn is_segment_event(&self) -> bool {
        !matches!(
            self,
            Event::Alloc { .. } | Event::FreeRequested { .. } | Event::FreeCompleted { .. }
        )
    }
}
