//! What a workload asks of an allocator.
//!
//! An op stream is the program, not its outcome: whether an `Alloc` succeeds, where it lands
//! and which device calls it causes are the allocator's decisions, reported as [`crate::Event`]s.
//! The ops mirror the calls a framework makes on PyTorch's caching allocator, because that is
//! the richest interface among the allocators we simulate; simpler policies ignore what they
//! have no use for (a policy without stream semantics treats `RecordStream` as a no-op).

use crate::{AllocId, MemPoolId, StreamId};
use std::borrow::Borrow;

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Allocate `size` bytes (unrounded, as the program asked) for use on `stream`.
    Alloc { id: AllocId, size: u64, stream: StreamId },
    /// The program frees `id`. Without recorded stream uses the free completes at once;
    /// with them it stays pending until `FreeCompleted`.
    FreeRequested { id: AllocId },
    /// The work recorded on other streams for `id` has finished (the CUDA events completed),
    /// so its pending free may complete. Only meaningful after `RecordStream` and
    /// `FreeRequested` of the same id.
    FreeCompleted { id: AllocId },
    /// `id` is used on `stream` besides its allocation stream (`Tensor.record_stream`).
    RecordStream { id: AllocId, stream: StreamId },
    /// `torch.cuda.empty_cache()`: give cached, wholly free memory back to the device.
    EmptyCache,
    /// `torch.cuda.set_per_process_memory_fraction(fraction)`: cap on reserved memory.
    SetMemoryFraction { fraction: f64 },
    /// A `PYTORCH_CUDA_ALLOC_CONF`-style settings string applied at run time
    /// (`torch.cuda.memory._set_allocator_settings`).
    SetAllocatorSettings { conf: String },
    /// Allocate `size` bytes as the free block that starts at `addr`, in place rather than by
    /// the policy's choice: PyTorch's `setCheckpointPoolState`, with which CUDA graph trees
    /// restore a private pool, hands out the blocks of a checkpointed segment so. A policy
    /// that has no free block there serves it as an `Alloc`.
    AllocAt { id: AllocId, size: u64, stream: StreamId, addr: u64 },
    /// A private memory pool (`torch.cuda.MemPool`, a CUDA graph's pool) is entered, left or
    /// dropped; see [`PoolAction`].
    Pool { pool: MemPoolId, action: PoolAction },
}

/// What happens to a private pool, in the order of PyTorch's hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolAction {
    /// `beginAllocateToPool`: from here on allocations are served from the pool (created on
    /// first use), until `EndAllocate` (`use_mem_pool` entered, a graph capture begun).
    BeginAllocate,
    /// `endAllocateToPool`, then the context's `releasePool`: allocations go back to the
    /// default pools.
    EndAllocate,
    /// The pool's owner drops it (`~MemPool`: `releasePool`, then `emptyCache` of the pool):
    /// once no context holds it, its wholly free segments go back to the device, and the rest
    /// when a later `empty_cache` finds them free.
    Release,
}

impl PoolAction {
    pub fn name(self) -> &'static str {
        match self {
            PoolAction::BeginAllocate => "begin_allocate_to_pool",
            PoolAction::EndAllocate => "end_allocate_to_pool",
            PoolAction::Release => "release_pool",
        }
    }
}

impl Op {
    /// A short lowercase name, for counts by action and error messages.
    pub fn action(&self) -> &'static str {
        match self {
            Op::Alloc { .. } => "alloc",
            Op::AllocAt { .. } => "alloc_at",
            Op::FreeRequested { .. } => "free_requested",
            Op::FreeCompleted { .. } => "free_completed",
            Op::RecordStream { .. } => "record_stream",
            Op::EmptyCache => "empty_cache",
            Op::SetMemoryFraction { .. } => "set_memory_fraction",
            Op::SetAllocatorSettings { .. } => "set_allocator_settings",
            Op::Pool { action, .. } => action.name(),
        }
    }

    /// The block the op names, if any.
    pub fn id_mut(&mut self) -> Option<&mut AllocId> {
        match self {
            Op::Alloc { id, .. }
            | Op::AllocAt { id, .. }
            | Op::FreeRequested { id }
            | Op::FreeCompleted { id }
            | Op::RecordStream { id, .. } => Some(id),
            Op::EmptyCache
            | Op::SetMemoryFraction { .. }
            | Op::SetAllocatorSettings { .. }
            | Op::Pool { .. } => None,
        }
    }
}

/// Where a replay loop gets its ops. Any iterator of ops (owned or borrowed) is one, stepped
/// op by op. A decoder may instead drive the loop itself: it calls `step` from the place where
/// it has just read the op's kind, so that the replay's own branch on that kind folds into the
/// decoder's, and each op costs one unpredictable jump instead of two (the kind of the next op
/// is data, mispredicted about as often as an allocation follows a free).
pub trait OpSource {
    /// Call `step` with each op in order until it returns false or the ops end.
    fn drive(self, step: impl FnMut(&Op) -> bool);
}

impl<I> OpSource for I
where
    I: IntoIterator,
    I::Item: Borrow<Op>,
{
    #[inline(always)]
    fn drive(self, mut step: impl FnMut(&Op) -> bool) {
        for op in self {
            if !step(op.borrow()) {
                break;
            }
        }
    }
}
