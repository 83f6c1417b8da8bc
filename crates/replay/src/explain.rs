//! Why each OOM happened: the figures, and the live blocks that fence the largest free region.
//!
//! "Reserved but unallocated" memory that cannot serve a request is cut into pieces by live
//! blocks. The blocks on either side of the largest free piece are the ones whose lifetime
//! decides whether the request could have fit, so those are the ones worth a stack trace.

use crate::{Observer, OpOutcome};
use allocsim_core::{
    AllocId, Allocator, BlockState, Device, Event, OomInfo, Op, Pool, SnapshotSegment,
};
use std::collections::BTreeMap;

/// A live block next to the largest free region of its pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub addr: u64,
    pub size: u64,
    /// The allocation and the op that made it, when the events showed it.
    pub id: Option<AllocId>,
    pub alloc_op: Option<u64>,
}

/// The largest free block of one pool and its neighbours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeRegion {
    pub pool: Pool,
    pub addr: u64,
    pub size: u64,
    pub fences: Vec<Fence>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OomExplanation {
    pub op_index: u64,
    pub info: OomInfo,
    pub largest_free: Vec<FreeRegion>,
}

/// The observer: keeps where each live block came from and explains every OOM.
#[derive(Debug, Default)]
pub struct OomExplainer {
    live: BTreeMap<u64, (AllocId, u64)>,
    pub explanations: Vec<OomExplanation>,
}

impl OomExplainer {
    fn region(&self, segments: &[SnapshotSegment], pool: Pool) -> Option<FreeRegion> {
        let (seg, i) = segments
            .iter()
            .filter(|s| s.pool == pool)
            .flat_map(|s| s.blocks.iter().enumerate().map(move |(i, b)| (s, i, b)))
            .filter(|(_, _, b)| b.state == BlockState::Inactive)
            .max_by_key(|(_, _, b)| (b.size, std::cmp::Reverse(b.address)))
            .map(|(s, i, _)| (s, i))?;
        let block = &seg.blocks[i];
        let neighbours = [i.checked_sub(1), Some(i + 1)];
        let fences = neighbours
            .into_iter()
            .flatten()
            .filter_map(|j| seg.blocks.get(j))
            .filter(|b| b.state.is_active())
            .map(|b| {
                let origin = self.live.get(&b.address);
                Fence {
                    addr: b.address,
                    size: b.size,
                    id: origin.map(|o| o.0),
                    alloc_op: origin.map(|o| o.1),
                }
            })
            .collect();
        Some(FreeRegion { pool, addr: block.address, size: block.size, fences })
    }
}

impl Observer for OomExplainer {
    fn on_event(&mut self, _event_index: u64, op_index: u64, event: &Event) -> bool {
        match *event {
            Event::Alloc { id, addr, .. } => {
                self.live.insert(addr, (id, op_index));
            }
            Event::FreeCompleted { addr, .. } => {
                self.live.remove(&addr);
            }
            _ => {}
        }
        true
    }

    fn on_op(
        &mut self,
        op_index: u64,
        _op: &Op,
        outcome: &OpOutcome,
        allocator: &dyn Allocator,
        _device: &dyn Device,
    ) -> bool {
        if let OpOutcome::OutOfMemory(info) = outcome {
            let segments = allocator.snapshot();
            let largest_free = [Pool::Small, Pool::Large]
                .into_iter()
                .filter_map(|pool| self.region(&segments, pool))
                .collect();
            self.explanations.push(OomExplanation { op_index, info: *info, largest_free });
        }
        true
    }
}
