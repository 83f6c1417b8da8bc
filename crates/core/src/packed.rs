//! [`PackedOps`]: a list of ops in a few bytes each, for traces too long to hold as `Op`s.
//!
//! An `Op` takes 40 bytes, and a 50 M-entry snapshot has 33 M of them: 1.3 GB. Most are
//! allocations on the stream of the one before, whose id is the one before's plus one, and
//! frees of an allocation made shortly before; written as a tag byte and varints of the
//! differences, an op takes about five bytes. Ops of other kinds (settings, pool contexts,
//! `empty_cache`) are rare and kept whole beside.

use crate::varint::{put, unzigzag, zigzag};
use crate::{AllocId, Op, StreamId};
use std::cell::Cell;

const ALLOC: u8 = 0;
/// An allocation on another stream than the last allocation's.
const ALLOC_STREAM: u8 = 1;
const FREE_REQUESTED: u8 = 2;
const FREE_COMPLETED: u8 = 3;
const RECORD_STREAM: u8 = 4;
/// The next of the ops kept whole.
const OTHER: u8 = 5;

/// Every `MARK`th op's position is kept, so an op is found by its index after decoding fewer
/// than `MARK` others ([`Reader`]): 32 bytes each, less than a hundredth of a byte an op.
const MARK: usize = 4096;

/// What encoding and decoding both track: each id is written as its difference from the last
/// allocation's, each allocation's stream only when it changes.
#[derive(Debug, Clone, Copy, Default)]
struct Context {
    last_id: u64,
    last_stream: u64,
}

/// Ops, appended one at a time and read back in order.
#[derive(Debug, Clone, Default)]
pub struct PackedOps {
    bytes: Vec<u8>,
    /// The ops other than allocations, frees and stream uses, in order.
    other: Vec<Op>,
    len: usize,
    at: Context,
    /// The position of op `MARK * i`, for each `i`.
    marks: Vec<Position>,
}

impl PackedOps {
    pub fn new() -> Self {
        PackedOps::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn push(&mut self, op: Op) {
        if self.len.is_multiple_of(MARK) {
            let at = Position { byte: self.bytes.len(), other: self.other.len(), at: self.at };
            self.marks.push(at);
        }
        self.len += 1;
        let id_delta = |at: &Context, id: AllocId| zigzag(id.0.wrapping_sub(at.last_id) as i64);
        match op {
            Op::Alloc { id, size, stream } => {
                let delta = id_delta(&self.at, id);
                let same = stream.0 == self.at.last_stream;
                self.bytes.push(if same { ALLOC } else { ALLOC_STREAM });
                put(&mut self.bytes, delta);
                put(&mut self.bytes, size);
                if !same {
                    put(&mut self.bytes, stream.0);
                }
                self.at = Context { last_id: id.0, last_stream: stream.0 };
            }
            Op::FreeRequested { id } | Op::FreeCompleted { id } => {
                let requested = matches!(op, Op::FreeRequested { .. });
                self.bytes.push(if requested { FREE_REQUESTED } else { FREE_COMPLETED });
                put(&mut self.bytes, id_delta(&self.at, id));
            }
            Op::RecordStream { id, stream } => {
                self.bytes.push(RECORD_STREAM);
                put(&mut self.bytes, id_delta(&self.at, id));
                put(&mut self.bytes, stream.0);
            }
            other => {
                self.bytes.push(OTHER);
                self.other.push(other);
            }
        }
    }

    /// The ops in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter { ops: self, byte: 0, other: 0, at: Context::default() }
    }

    /// The ops from the `n`th on (`n` at most [`PackedOps::len`]), by decoding those before
    /// it from the last mark.
    pub fn iter_from(&self, n: usize) -> Iter<'_> {
        let end = Position { byte: self.bytes.len(), other: self.other.len(), at: self.at };
        let mut iter = Iter::resume(self, self.marks.get(n / MARK).copied().unwrap_or(end));
        iter.by_ref().take(n % MARK).for_each(drop);
        iter
    }

    /// The ops as a `Vec`.
    pub fn to_vec(&self) -> Vec<Op> {
        let mut ops = Vec::with_capacity(self.len);
        ops.extend(self.iter());
        ops
    }

    /// Ops read by their index, in any order (cheapest going forwards).
    pub fn reader(&self) -> Reader<'_> {
        Reader { ops: self, next: Cell::new((0, Position::default())) }
    }

    /// The memory held, by capacity.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
            + self.other.capacity() * size_of::<Op>()
            + self.marks.capacity() * size_of::<Position>()
    }
}

/// [`PackedOps::reader`]: the op at an index, decoded from where the last one read ended when
/// that is at most `MARK` ops before it, else from the last mark before it. Passes that look
/// at ops here and there, mostly forwards, read packed ops so without unpacking them.
#[derive(Debug)]
pub struct Reader<'a> {
    ops: &'a PackedOps,
    /// The index of the op after the last one read, and its position.
    next: Cell<(usize, Position)>,
}

impl<'a> Reader<'a> {
    /// The ops from the `k`th on, in order.
    pub fn iter_from(&self, k: usize) -> Iter<'a> {
        self.ops.iter_from(k.min(self.ops.len))
    }

    pub fn len(&self) -> usize {
        self.ops.len
    }

    pub fn is_empty(&self) -> bool {
        self.ops.len == 0
    }

    /// The op at index `k`, `None` past the end.
    pub fn get(&self, k: usize) -> Option<Op> {
        if k >= self.ops.len {
            return None;
        }
        let (at, position) = self.next.get();
        let mut iter = match k >= at && k - at <= MARK {
            true => {
                let mut iter = Iter::resume(self.ops, position);
                iter.by_ref().take(k - at).for_each(drop);
                iter
            }
            false => self.ops.iter_from(k),
        };
        let op = iter.next();
        self.next.set((k + 1, iter.position()));
        op
    }
}

impl<'a> IntoIterator for &'a PackedOps {
    type Item = Op;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl FromIterator<Op> for PackedOps {
    fn from_iter<I: IntoIterator<Item = Op>>(iter: I) -> Self {
        let mut packed = PackedOps::new();
        iter.into_iter().for_each(|op| packed.push(op));
        packed
    }
}

/// [`PackedOps::iter`]. Also what a reader of ops as they are appended keeps between reads:
/// [`Iter::resume`] goes on from where it stopped.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    ops: &'a PackedOps,
    byte: usize,
    other: usize,
    at: Context,
}

/// Where an [`Iter`] stopped, to go on from with [`Iter::resume`] once more ops were pushed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Position {
    byte: usize,
    other: usize,
    at: Context,
}

impl<'a> Iter<'a> {
    pub fn position(&self) -> Position {
        Position { byte: self.byte, other: self.other, at: self.at }
    }

    /// The ops of `ops` from `position` (where an iterator over the same ops stopped) on.
    pub fn resume(ops: &'a PackedOps, position: Position) -> Self {
        Iter { ops, byte: position.byte, other: position.other, at: position.at }
    }

    #[inline]
    fn varint(&mut self) -> u64 {
        let (value, used) = get(&self.ops.bytes[self.byte..]);
        self.byte += used;
        value
    }

    #[inline]
    fn id(&mut self) -> AllocId {
        AllocId(self.at.last_id.wrapping_add(unzigzag(self.varint()) as u64))
    }
}

impl Iterator for Iter<'_> {
    type Item = Op;

    #[inline]
    fn next(&mut self) -> Option<Op> {
        let &tag = self.ops.bytes.get(self.byte)?;
        self.byte += 1;
        Some(match tag {
            ALLOC | ALLOC_STREAM => {
                let id = self.id();
                let size = self.varint();
                let stream = if tag == ALLOC { self.at.last_stream } else { self.varint() };
                self.at = Context { last_id: id.0, last_stream: stream };
                Op::Alloc { id, size, stream: StreamId(stream) }
            }
            FREE_REQUESTED => Op::FreeRequested { id: self.id() },
            FREE_COMPLETED => Op::FreeCompleted { id: self.id() },
            RECORD_STREAM => {
                let id = self.id();
                Op::RecordStream { id, stream: StreamId(self.varint()) }
            }
            _ => {
                self.other += 1;
                self.ops.other[self.other - 1].clone()
            }
        })
    }
}

/// A varint written by [`put`], and the bytes it took.
#[inline]
fn get(bytes: &[u8]) -> (u64, usize) {
    let mut v = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return (v, i + 1);
        }
    }
    (v, bytes.len().min(10))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemPoolId, PoolAction};

    /// Every kind of op, ids and streams far apart and close, reads back as pushed, from the
    /// start and from any position.
    #[test]
    fn ops_read_back_as_pushed() {
        let ops = vec![
            Op::Alloc { id: AllocId(0), size: 512, stream: StreamId(0) },
            Op::Alloc { id: AllocId(1), size: 1 << 40, stream: StreamId(0) },
            Op::Alloc { id: AllocId(u64::MAX), size: u64::MAX, stream: StreamId(u64::MAX) },
            Op::FreeRequested { id: AllocId(1) },
            Op::RecordStream { id: AllocId(0), stream: StreamId(7) },
            Op::FreeRequested { id: AllocId(0) },
            Op::FreeCompleted { id: AllocId(0) },
            Op::EmptyCache,
            Op::SetMemoryFraction { fraction: 0.5 },
            Op::SetAllocatorSettings { conf: "expandable_segments:True".into() },
            Op::AllocAt { id: AllocId(2), size: 3, stream: StreamId(4), addr: 5 },
            Op::Pool { pool: MemPoolId(0, 1), action: PoolAction::BeginAllocate },
            Op::Alloc { id: AllocId(3), size: 0, stream: StreamId(u64::MAX) },
            Op::FreeCompleted { id: AllocId(u64::MAX) },
        ];
        let packed: PackedOps = ops.iter().cloned().collect();
        assert_eq!(packed.len(), ops.len());
        assert_eq!(packed.to_vec(), ops);
        for n in 0..=ops.len() {
            assert_eq!(packed.iter_from(n).collect::<Vec<_>>(), ops[n..]);
        }
        let mut iter = packed.iter();
        iter.by_ref().take(5).for_each(drop);
        let resumed = Iter::resume(&packed, iter.position());
        assert_eq!(resumed.collect::<Vec<_>>(), ops[5..]);
    }

    /// Ops read by index, forwards, backwards and by jumps across marks, and from any index
    /// on, are the ops pushed.
    #[test]
    fn a_reader_finds_any_op_by_its_index() {
        let ops: Vec<Op> = (0..3 * MARK as u64 + 17)
            .map(|i| match i % 7 {
                0 => Op::EmptyCache,
                1 | 4 => Op::FreeRequested { id: AllocId(i / 2) },
                _ => Op::Alloc { id: AllocId(i), size: i * 512, stream: StreamId(i % 3) },
            })
            .collect();
        let packed: PackedOps = ops.iter().cloned().collect();
        let reader = packed.reader();
        let n = ops.len();
        let order = (0..n).chain((0..n).rev()).chain((0..n).map(|i| i * 7919 % n));
        for k in order {
            assert_eq!(reader.get(k).as_ref(), Some(&ops[k]), "op {k}");
        }
        assert_eq!(reader.get(n), None);
        assert_eq!(reader.len(), n);
        for from in [0, 1, MARK - 1, MARK, MARK + 1, 3 * MARK, n - 1, n] {
            assert_eq!(packed.iter_from(from).collect::<Vec<_>>(), ops[from..], "from {from}");
        }
        let whole: PackedOps = ops[..2 * MARK].iter().cloned().collect();
        assert_eq!(whole.iter_from(2 * MARK).next(), None, "from the end, a multiple of MARK");
    }

    /// Allocations in sequence on one stream and their frees take a few bytes each (an `Op` 40).
    #[test]
    fn a_training_loop_takes_a_few_bytes_an_op() {
        let mut packed = PackedOps::new();
        for i in 0..10_000u64 {
            packed.push(Op::Alloc { id: AllocId(i), size: 4 << 20, stream: StreamId(0) });
            if i >= 10 {
                packed.push(Op::FreeRequested { id: AllocId(i - 10) });
            }
        }
        // Six bytes an allocation (a 4-byte size), two a free, the vector at most doubled.
        assert!(packed.heap_bytes() < 20_000 * 8, "{} bytes", packed.heap_bytes());
    }
}
