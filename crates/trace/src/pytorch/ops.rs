//! A trace's ops as a conversion holds them, as `Op`s or packed, and read by their index
//! either way: the conversion appends them, and the passes after it read and add to them
//! where they are.

use allocsim_core::{Op, PackedOps};

/// [`OpList::reader`]: what the passes after the conversion read the ops by, so that packed
/// ops stay packed (a few bytes an op where an `Op` takes 40).
pub(super) enum OpReader<'a> {
    Plain(&'a [Op]),
    Packed(allocsim_core::packed::Reader<'a>),
}

impl OpReader<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            OpReader::Plain(ops) => ops.len(),
            OpReader::Packed(ops) => ops.len(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn get(&self, k: usize) -> Option<Op> {
        match self {
            OpReader::Plain(ops) => ops.get(k).cloned(),
            OpReader::Packed(ops) => ops.get(k),
        }
    }

    /// The op at `k`, which is less than [`OpReader::len`].
    pub(super) fn at(&self, k: usize) -> Op {
        self.get(k).expect("an op index within the ops")
    }

    /// The ops from `from` on, in order.
    pub(super) fn from(&self, from: usize) -> Box<dyn Iterator<Item = Op> + '_> {
        match self {
            OpReader::Plain(ops) => Box::new(ops[from.min(ops.len())..].iter().cloned()),
            OpReader::Packed(ops) => Box::new(ops.iter_from(from)),
        }
    }
}

/// A conversion's ops: as `Op`s, or packed (`Keep::packed`).
#[derive(Debug)]
pub enum OpList {
    Plain(Vec<Op>),
    Packed(PackedOps),
}

impl OpList {
    pub fn len(&self) -> usize {
        match self {
            OpList::Plain(ops) => ops.len(),
            OpList::Packed(ops) => ops.len(),
        }
    }

    #[inline]
    pub(super) fn push(&mut self, op: Op) {
        match self {
            OpList::Plain(ops) => ops.push(op),
            OpList::Packed(ops) => ops.push(op),
        }
    }

    /// The ops by their index, wherever they are held.
    pub(super) fn reader(&self) -> OpReader<'_> {
        match self {
            OpList::Plain(ops) => OpReader::Plain(ops),
            OpList::Packed(ops) => OpReader::Packed(ops.reader()),
        }
    }

    /// The ops packed from here on, if they were not.
    #[cold]
    pub(super) fn pack(&mut self) {
        if let OpList::Plain(ops) = self {
            *self = OpList::Packed(ops.drain(..).collect());
        }
    }

    /// What the ops count for `Keep::max_built_bytes`: as `Op`s, packed or not. Packed ones
    /// may be unpacked (a pass that needs every op, a reader that hands a whole trace), and a
    /// file's bound, a ratio to its size that real snapshots stay far under, stays what it was
    /// (45 M identical entries in 5 MB are refused as before, though they pack into 180 MB).
    pub(super) fn bytes(&self) -> usize {
        self.len() * size_of::<Op>()
    }

    /// The ops as `Op`s, unpacked here if they were packed.
    pub fn plain(&mut self) -> &mut Vec<Op> {
        if let OpList::Packed(ops) = self {
            *self = OpList::Plain(ops.to_vec());
        }
        match self {
            OpList::Plain(ops) => ops,
            OpList::Packed(_) => unreachable!("unpacked above"),
        }
    }

    /// The ops as `Op`s, and the packed ones as they are.
    pub fn split(self) -> (Vec<Op>, Option<PackedOps>) {
        match self {
            OpList::Plain(ops) => (ops, None),
            OpList::Packed(ops) => (Vec::new(), Some(ops)),
        }
    }
}
