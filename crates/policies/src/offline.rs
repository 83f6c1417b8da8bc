//! `offline`: a plan made knowing the whole trace, replayed as a policy, so that the best an
//! allocator with hindsight does (`allocsim bound`'s offline placement) gives an event log,
//! statistics and a snapshot like any policy's, and the checker watches it like any policy's.
//!
//! Why it has this shape: the placement knows every lifetime in advance, which no online
//! policy can, so it cannot be built from a settings string and fed op by op like the others
//! (it is not in [`crate::POLICIES`], whose suites feed arbitrary generated programs). It is
//! built from a plan instead: the arena's size and, for each allocation the replay will ask
//! for, in the order it will ask, its offset in the arena or a failure (a request the
//! recording shows failing). The plan comes from the trace it replays (`allocsim-run` makes
//! it with `allocsim_bound::allocations` and `place`; this crate knows nothing of how). The
//! policy makes no decision of its own: it reserves the arena, one segment of whole 2 MiB
//! pages, at the first allocation, answers each request with its planned offset, and frees
//! by bookkeeping alone; the arena is never given back (`empty_cache` keeps it: the plan is
//! made for one arena). Its peak reserved is therefore the arena.
//!
//! It is safe whatever the plan: a request larger than its planned slot, or beyond the plan,
//! fails with an OOM; a plan from a placement the bound's `check` accepts never overlaps two
//! live blocks, since a replay ends each block's life where the plan's lifetime ends or
//! earlier. If the device refuses the arena, every request fails: nothing is placed off plan.

use crate::zoo::common::{rounded_request, Books, PAGE_2MIB};
use allocsim_core::{
    AllocId, Allocator, BlockState, ConfigError, Env, Granted, MemPoolId, MemoryStats, OomInfo,
    Pool, SnapshotBlock, SnapshotSegment, StreamId,
};
use std::collections::HashMap;

/// What PyTorch rounds a request to, and what the plan's offsets are multiples of.
const ALIGN_BYTES: u64 = 512;

/// The arena's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arena {
    NotYet,
    At {
        addr: u64,
        stream: StreamId,
    },
    /// The device or the memory fraction refused it: every request fails.
    Refused,
}

/// The offline plan as a policy. See the module doc.
#[derive(Debug)]
pub struct Offline {
    books: Books,
    arena_bytes: u64,
    arena: Arena,
    /// Each id's planned requests, the next one last: (offset, slot size) or a failure.
    plan: HashMap<AllocId, Vec<Option<(u64, u64)>>>,
}

impl Offline {
    /// The policy that follows `plan`: for each request in the order the replay makes them,
    /// the id, and the offset and size of its slot in an arena of `arena_bytes` (rounded up to
    /// whole 2 MiB pages), or `None` for a request that fails.
    pub fn new(
        arena_bytes: u64,
        plan: impl IntoIterator<Item = (AllocId, Option<(u64, u64)>)>,
    ) -> Self {
        let mut by_id: HashMap<AllocId, Vec<Option<(u64, u64)>>> = HashMap::new();
        for (id, slot) in plan {
            by_id.entry(id).or_default().push(slot);
        }
        for slots in by_id.values_mut() {
            slots.reverse();
        }
        Offline {
            books: Books::default(),
            arena_bytes: arena_bytes.div_ceil(PAGE_2MIB).saturating_mul(PAGE_2MIB),
            arena: Arena::NotYet,
            plan: by_id,
        }
    }

    /// The arena's address, reserving it on first use.
    fn arena(&mut self, env: &mut Env<'_>, stream: StreamId) -> Option<u64> {
        if self.arena == Arena::NotYet {
            self.arena = match self.books.device_malloc(env, self.arena_bytes, stream) {
                Some(addr) => Arena::At { addr, stream },
                None => Arena::Refused,
            };
        }
        match self.arena {
            Arena::At { addr, .. } => Some(addr),
            _ => None,
        }
    }
}

impl Allocator for Offline {
    fn name(&self) -> &str {
        "offline"
    }

    fn block_alignment(&self) -> u64 {
        ALIGN_BYTES
    }

    fn malloc(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        size: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo> {
        let rounded = rounded_request(size, ALIGN_BYTES);
        let slot = self.plan.get_mut(&id).and_then(Vec::pop).flatten();
        let fits = slot.filter(|&(_, slot_bytes)| rounded <= slot_bytes);
        match fits.and_then(|(offset, _)| Some(self.arena(env, stream)? + offset)) {
            Some(addr) => Ok(self.books.grant(env, id, (addr, rounded), size, stream)),
            None => Err(self.books.oom(env, id, rounded, stream, (0, 0))),
        }
    }

    fn free(&mut self, env: &mut Env<'_>, id: AllocId) {
        self.books.free_requested(env, id);
    }

    fn record_stream(&mut self, id: AllocId, stream: StreamId) {
        self.books.record_stream(id, stream);
    }

    fn free_completed(&mut self, env: &mut Env<'_>, id: AllocId) {
        self.books.free_completed(env, id);
    }

    /// The arena is the plan: nothing goes back.
    fn empty_cache(&mut self, _: &mut Env<'_>) {}

    fn set_memory_fraction(&mut self, env: &mut Env<'_>, fraction: f64) -> Result<(), ConfigError> {
        self.books.set_fraction(env, fraction)
    }

    fn stats(&self) -> MemoryStats {
        self.books.stats.clone()
    }

    fn reset_peak_stats(&mut self) {
        self.books.stats.reset_peak();
    }

    /// The arena, tiled by its live blocks and the free gaps between them.
    fn snapshot(&self) -> Vec<SnapshotSegment> {
        let Arena::At { addr, stream } = self.arena else { return Vec::new() };
        let mut live: Vec<SnapshotBlock> = self
            .books
            .live
            .values()
            .map(|b| SnapshotBlock {
                address: b.addr,
                size: b.size,
                requested_size: b.requested,
                state: match b.pending {
                    true => BlockState::ActivePendingFree,
                    false => BlockState::ActiveAllocated,
                },
            })
            .collect();
        live.sort_unstable_by_key(|b| b.address);
        let mut blocks = Vec::with_capacity(live.len() * 2 + 1);
        let mut at = addr;
        let gap = |from: u64, to: u64| SnapshotBlock {
            address: from,
            size: to - from,
            requested_size: 0,
            state: BlockState::Inactive,
        };
        for b in live {
            if b.address > at {
                blocks.push(gap(at, b.address));
            }
            at = b.address + b.size;
            blocks.push(b);
        }
        if at < addr + self.arena_bytes {
            blocks.push(gap(at, addr + self.arena_bytes));
        }
        vec![SnapshotSegment {
            address: addr,
            total_size: self.arena_bytes,
            stream,
            pool: Pool::Large,
            pool_id: MemPoolId::DEFAULT,
            is_expandable: false,
            blocks,
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocsim_core::Event;
    use allocsim_sim::{SimConfig, SimDevice};

    #[test]
    fn requests_off_the_plan_fail_and_the_rest_land_where_planned() {
        let mut device = SimDevice::new(SimConfig::default());
        let mut events: Vec<Event> = Vec::new();
        let mut env = Env::new(&mut device, &mut events);
        let (a, b, c, s) = (AllocId(1), AllocId(2), AllocId(3), StreamId(0));
        let plan = [(a, Some((1024, 1024))), (b, None), (a, Some((0, 512)))];
        let mut offline = Offline::new(4096, plan);
        let first = offline.malloc(&mut env, a, 1000, s).expect("planned");
        assert!(offline.malloc(&mut env, b, 512, s).is_err(), "planned to fail");
        assert!(offline.malloc(&mut env, c, 512, s).is_err(), "not in the plan");
        offline.free(&mut env, a);
        assert!(offline.malloc(&mut env, a, 600, s).is_err(), "larger than its slot");
        let base = offline.snapshot()[0].address;
        assert_eq!(first, Granted { addr: base + 1024, size: 1024 });
        let segments = events.iter().filter(|e| matches!(e, Event::SegmentAlloc { .. }));
        assert_eq!(segments.map(Event::action).collect::<Vec<_>>(), ["segment_alloc"]);
        assert_eq!(offline.stats().reserved_bytes.all.current as u64, PAGE_2MIB);
    }
}
