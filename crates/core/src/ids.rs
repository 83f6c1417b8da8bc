//! Identifiers and units. Sizes and addresses are plain `u64` bytes throughout, with the unit
//! last in every name (`reserved_bytes_peak`), as in TigerBeetle's style.

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// A stream as the recording names it: the raw `cudaStream_t` value (0 is the legacy default
/// stream). Opaque to policies except for its numeric order, which PyTorch's free-block ordering
/// (stream, size, address) depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId(pub u64);

/// Names one allocation for the whole run: `Op::Alloc` introduces it, every later op that
/// concerns the same memory names it. Ids are never reused within a trace, so a checker can tell
/// a double free from a free of a new allocation at the same address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllocId(pub u64);

/// The statistics pool a block or segment counts under. PyTorch splits `memory_stats()` into
/// `small_pool` (blocks of at most 1 MiB, 2 MiB segments) and `large_pool`; every policy reports
/// under the same two names so that the statistics of all policies are comparable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pool {
    Small,
    Large,
}

impl Pool {
    /// The pool a request of `size` bytes (after rounding) falls in, by PyTorch's 1 MiB rule.
    pub fn for_size(size: u64) -> Pool {
        if size <= MIB {
            Pool::Small
        } else {
            Pool::Large
        }
    }

    /// The name PyTorch uses in `memory_stats()` keys.
    pub fn stats_name(self) -> &'static str {
        match self {
            Pool::Small => "small_pool",
            Pool::Large => "large_pool",
        }
    }

    /// The name PyTorch uses as a snapshot segment's `segment_type`.
    pub fn segment_type(self) -> &'static str {
        match self {
            Pool::Small => "small",
            Pool::Large => "large",
        }
    }
}

/// A memory pool as PyTorch names it (`MempoolId_t`, a snapshot's `segment_pool_id`): `(0, 0)`
/// is the default pools; `(0, n)` a pool the user made (`torch.cuda.MemPool`, or a graph pool
/// handle), `(n, 0)` one a CUDA graph made for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MemPoolId(pub u64, pub u64);

impl MemPoolId {
    pub const DEFAULT: MemPoolId = MemPoolId(0, 0);

    pub fn is_default(self) -> bool {
        self == MemPoolId::DEFAULT
    }
}

impl std::fmt::Display for MemPoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({}, {})", self.0, self.1)
    }
}
