//! Starting from a recording's state at its first entry ([`allocsim_core::StartState`]), for
//! a history that begins mid-run: the segments become blocks linked as PyTorch links them,
//! free blocks enter their pool's free set, active ones are found by their allocation ids, and
//! the statistics start at the state's `current` values.

use super::block::{Block, PrivatePool, NIL};
use super::PyTorchAllocator;
use allocsim_core::{BlockState, Env, MemoryStats, Pool, StartState, StatArray};

/// A state the policy can take: segments in address order, apart, each tiled by its blocks,
/// every active block with its allocation id.
fn check_start(start: &StartState) -> Result<(), String> {
    let mut end = 0;
    for seg in &start.segments {
        if seg.address < end || seg.total_size == 0 {
            return Err(format!(
                "segment at {:#x} overlaps the one before or is empty",
                seg.address
            ));
        }
        end = seg.address + seg.total_size;
        let mut at = seg.address;
        for b in &seg.blocks {
            if b.address != at || b.size == 0 {
                return Err(format!("segment at {:#x}: no block at {at:#x}", seg.address));
            }
            if b.state.is_active() && start.id_at(b.address).is_none() {
                return Err(format!("active block at {:#x} has no id", b.address));
            }
            at += b.size;
        }
        if at != end {
            return Err(format!("segment at {:#x}: blocks end at {at:#x}", seg.address));
        }
    }
    Ok(())
}

impl PyTorchAllocator {
    pub(super) fn seed_impl(
        &mut self,
        env: &mut Env<'_>,
        start: &StartState,
        stats: Option<&MemoryStats>,
    ) -> Result<(), String> {
        if start.segments.iter().any(|s| s.is_expandable) {
            return Err("expandable segments alive at the start are not seeded".to_string());
        }
        let fresh = self.total_allocated_memory == 0 && self.arena.iter_live().next().is_none();
        if !fresh {
            return Err("the allocator has already run".to_string());
        }
        check_start(start)?;
        // Nothing has changed yet: a refusal from here on can only be the device's, at the
        // first segment (a real device adopts none).
        for seg in &start.segments {
            env.device
                .adopt_segment(seg.address, seg.total_size)
                .map_err(|e| format!("segment at {:#x}: {e}", seg.address))?;
            self.seed_segment(seg, start);
        }
        self.stats = self.seeded_stats(stats);
        self.active_is_allocation = false;
        Ok(())
    }

    /// The blocks of one segment (checked by [`check_start`]), linked in address order.
    fn seed_segment(&mut self, seg: &allocsim_core::SnapshotSegment, start: &StartState) {
        let small = seg.pool == Pool::Small;
        // A private pool alive at the start is held by its owner.
        let slot = match seg.pool_id.is_default() {
            true => 0,
            false => self.slot_of(seg.pool_id).unwrap_or_else(|| {
                self.private.push(PrivatePool::new(seg.pool_id, 1));
                u16::try_from(self.private.len()).unwrap_or(u16::MAX)
            }),
        };
        if slot != 0 {
            self.private[usize::from(slot) - 1].segments += 1;
        }
        let mut prev = NIL;
        for b in &seg.blocks {
            let mut block = Block::new(b.address, b.size, seg.stream, small);
            block.requested = b.requested_size;
            block.prev = prev;
            block.slot = slot;
            if let Some(id) = start.id_at(b.address).filter(|_| b.state.is_active()) {
                block.id = id;
                block.allocated = b.state == BlockState::ActiveAllocated;
                block.pending = b.state == BlockState::ActivePendingFree;
            }
            let index = self.arena.insert(block);
            if prev != NIL {
                self.arena[prev].next = index;
            }
            prev = index;
            match b.state {
                BlockState::Inactive => self.insert_into_blocks(index),
                BlockState::ActiveAllocated => self.ids.set(block.id, index),
                BlockState::ActivePendingFree => {
                    self.ids.set(block.id, index);
                    self.pending.push(index);
                }
            }
        }
        self.total_allocated_memory += seg.total_size;
    }

    /// The statistics of the seeded blocks: `current` from the blocks, the rest from `at_start`
    /// when known; otherwise counting from here, the live blocks counted once as allocated
    /// (peaks at the current values).
    fn seeded_stats(&self, at_start: Option<&MemoryStats>) -> MemoryStats {
        let mut s = MemoryStats {
            max_split_size: self.config.max_split_size_stat(),
            ..MemoryStats::default()
        };
        let max_split = self.config.max_split_size;
        let add = |a: &mut StatArray, pool: Pool, n: u64| {
            a.all.current += n as i64;
            a.pool(pool).current += n as i64;
        };
        for (_, b) in self.arena.iter_live() {
            let pool = b.pool();
            if b.prev == NIL {
                let size = self.segment_size_from(b);
                add(&mut s.segment, pool, 1);
                add(&mut s.reserved_bytes, pool, size);
                if size >= max_split {
                    s.oversize_segments.current += 1;
                }
            }
            if b.allocated {
                add(&mut s.allocation, pool, 1);
                add(&mut s.allocated_bytes, pool, b.size);
                if b.size >= max_split {
                    s.oversize_allocations.current += 1;
                }
            }
            if b.allocated || b.pending {
                add(&mut s.active, pool, 1);
                add(&mut s.active_bytes, pool, b.size);
                add(&mut s.requested_bytes, pool, b.requested);
            } else if b.is_split() {
                add(&mut s.inactive_split, pool, 1);
                add(&mut s.inactive_split_bytes, pool, b.size);
            }
        }
        match at_start {
            None => {
                // The blocks alive at the start count as allocated once, so that
                // `allocated - freed == current` holds as in every PyTorch run.
                for (name, value) in s.flat() {
                    if let Some(stat) = name.strip_suffix(".current") {
                        s.set_flat(&format!("{stat}.allocated"), value);
                        s.set_flat(&format!("{stat}.peak"), value);
                    }
                }
                s
            }
            Some(given) => {
                let mut out = given.clone();
                for (name, value) in s.flat() {
                    if name.ends_with(".current") {
                        out.set_flat(&name, value);
                    }
                }
                out
            }
        }
    }

    /// The size of the segment whose first block is `first`.
    fn segment_size_from(&self, first: &Block) -> u64 {
        let (mut size, mut next) = (first.size, first.next);
        while next != NIL {
            size += self.arena[next].size;
            next = self.arena[next].next;
        }
        size
    }
}
