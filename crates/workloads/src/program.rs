//! The op-stream builder every workload writes through: fresh ids, and a count of what is live
//! so that a workload can prove it freed everything.

use allocsim_core::{AllocId, Op, StreamId};
use rand::Rng;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;

/// A tensor handle: the allocation id and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tensor {
    pub id: AllocId,
    pub bytes: u64,
}

#[derive(Debug)]
pub struct Program {
    ops: Vec<Op>,
    next_id: u64,
    live: BTreeSet<AllocId>,
    stream: StreamId,
    pub rng: ChaCha8Rng,
}

impl Program {
    pub fn new(seed: u64) -> Self {
        Program {
            ops: Vec::new(),
            next_id: 1,
            live: BTreeSet::new(),
            stream: StreamId(0),
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Allocate a tensor of `bytes` (at least 1: a framework never asks for 0 from the device).
    pub fn alloc(&mut self, bytes: u64) -> Tensor {
        let id = AllocId(self.next_id);
        self.next_id += 1;
        let bytes = bytes.max(1);
        self.ops.push(Op::Alloc { id, size: bytes, stream: self.stream });
        self.live.insert(id);
        Tensor { id, bytes }
    }

    pub fn free(&mut self, t: Tensor) {
        let was_live = self.live.remove(&t.id);
        debug_assert!(was_live, "workload frees {:?} twice", t.id);
        self.ops.push(Op::FreeRequested { id: t.id });
    }

    /// Free in the order given (a framework drops a list front to back).
    pub fn free_all(&mut self, ts: impl IntoIterator<Item = Tensor>) {
        for t in ts {
            self.free(t);
        }
    }

    /// A temporary: allocated and freed around one operation.
    pub fn temp(&mut self, bytes: u64) {
        let t = self.alloc(bytes);
        self.free(t);
    }

    /// A workspace of seeded random size in `0..=max_bytes`, 256-byte granular, as cuBLAS and
    /// cuDNN pick per call. Nothing is allocated when the draw is 0.
    pub fn workspace(&mut self, max_bytes: u64) {
        let bytes = self.rng.gen_range(0..=max_bytes / 256) * 256;
        if bytes > 0 {
            self.temp(bytes);
        }
    }

    pub fn finish(self) -> Vec<Op> {
        debug_assert!(self.live.is_empty(), "workload leaves {} tensors live", self.live.len());
        self.ops
    }
}
