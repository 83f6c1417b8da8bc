//! The memo's dense keys: a `u32` slot number per key, packed in blocks.
//!
//! A snapshot memoizes one or two keys per trace entry (the entry's dict, its frames list),
//! so the key table is as long as the trace: a `u32` a key was 400 MB of a 50 M-entry file,
//! twice that while its `Vec` doubled. The slots the keys name are few, though (a marker, the
//! distinct stacks' lists, some strings), so each full block of [`BLOCK`] keys is packed as a
//! palette of its distinct slots and an index into it per key: one byte a key while a block
//! names at most 256 slots, two while it names at most 65,536. The keys of the last block stay
//! plain, so appending costs what a `Vec::push` does; a block is packed once, when it fills
//! (about 10 instructions a key), and unpacked only where an entry in it is replaced or a
//! rollback reaches into it (a record read in place that straddled a block's end). The first
//! [`PLAIN_BLOCKS`] blocks stay plain: a snapshot of a few hundred thousand entries (2 MiB of
//! keys) reads as fast as before.

/// log2 of the keys a block holds.
const BLOCK_BITS: u32 = 12;
/// Keys a block holds.
pub const BLOCK: usize = 1 << BLOCK_BITS;
/// Blocks kept plain before the rest are packed (524,288 keys).
const PLAIN_BLOCKS: usize = 128;

/// A full block, packed.
enum Packed {
    /// At most 256 distinct slots: a byte a key.
    Bytes { palette: Box<[u32]>, index: Box<[u8]> },
    /// At most 65,536: two bytes a key.
    Halves { palette: Box<[u32]>, index: Box<[u16]> },
    /// More: the slots themselves.
    Plain(Box<[u32]>),
}

/// What packing a block reuses: per slot number, the block that last named it and its place in
/// that block's palette; and the palette and indexes being built.
#[derive(Default)]
struct Packer {
    seen: Vec<(u32, u16)>,
    /// Bumped per block packed, so `seen` needs no clearing.
    block: u32,
    palette: Vec<u32>,
    index: Vec<u16>,
}

impl Packer {
    fn pack(&mut self, keys: &[u32]) -> Packed {
        self.block = self.block.wrapping_add(1);
        if self.block == 0 {
            self.seen.iter_mut().for_each(|s| s.0 = 0);
            self.block = 1;
        }
        let (block, seen) = (self.block, &mut self.seen);
        self.palette.clear();
        self.index.clear();
        for &key in keys {
            let k = key as usize;
            if k >= seen.len() {
                seen.resize(k + 1, (0, 0));
            }
            if seen[k].0 != block {
                if self.palette.len() == 1 << 16 {
                    return Packed::Plain(keys.into());
                }
                seen[k] = (block, self.palette.len() as u16);
                self.palette.push(key);
            }
            self.index.push(seen[k].1);
        }
        let palette = self.palette.as_slice().into();
        if self.palette.len() <= 1 << 8 {
            Packed::Bytes { palette, index: self.index.iter().map(|&i| i as u8).collect() }
        } else {
            Packed::Halves { palette, index: self.index.as_slice().into() }
        }
    }

    fn heap_bytes(&self) -> usize {
        self.seen.capacity() * size_of::<(u32, u16)>()
            + self.palette.capacity() * size_of::<u32>()
            + self.index.capacity() * size_of::<u16>()
    }
}

impl Packed {
    #[inline(always)]
    fn get(&self, i: usize) -> u32 {
        match self {
            Packed::Bytes { palette, index } => palette[usize::from(index[i])],
            Packed::Halves { palette, index } => palette[usize::from(index[i])],
            Packed::Plain(keys) => keys[i],
        }
    }

    fn unpack(&self) -> Vec<u32> {
        let mut keys = Vec::with_capacity(BLOCK);
        keys.extend((0..BLOCK).map(|i| self.get(i)));
        keys
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Packed::Bytes { palette, index } => palette.len() * 4 + index.len(),
            Packed::Halves { palette, index } => palette.len() * 4 + index.len() * 2,
            Packed::Plain(keys) => keys.len() * 4,
        }
    }
}

/// The most a block takes packed (the palette and the index of the plain case).
const MAX_PACKED_BYTES: usize = BLOCK * size_of::<u32>();

/// A `Vec<u32>` of slot numbers, the full blocks packed.
#[derive(Default)]
pub struct Keys {
    packed: Vec<Packed>,
    packer: Packer,
    /// What the packed blocks hold on the heap.
    packed_bytes: usize,
    /// The keys after the packed blocks: fewer than `BLOCK` after every call.
    open: Vec<u32>,
}

impl Keys {
    #[inline(always)]
    pub fn len(&self) -> usize {
        (self.packed.len() << BLOCK_BITS) + self.open.len()
    }

    #[inline(always)]
    pub fn get(&self, i: usize) -> Option<u32> {
        let block = i >> BLOCK_BITS;
        match block.cmp(&self.packed.len()) {
            std::cmp::Ordering::Less => Some(self.packed[block].get(i & (BLOCK - 1))),
            _ => self.open.get(i - (self.packed.len() << BLOCK_BITS)).copied(),
        }
    }

    #[inline(always)]
    pub fn last(&self) -> Option<u32> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    #[inline(always)]
    pub fn push(&mut self, slot: u32) {
        self.open.push(slot);
        if self.open.len() == BLOCK {
            self.close();
        }
    }

    #[cold]
    fn close(&mut self) {
        let block = match self.packed.len() < PLAIN_BLOCKS {
            true => {
                Packed::Plain(std::mem::replace(&mut self.open, Vec::with_capacity(BLOCK)).into())
            }
            false => self.packer.pack(&self.open),
        };
        self.packed_bytes += block.heap_bytes();
        self.packed.push(block);
        self.open.clear();
    }

    /// [`Packer::pack`], or a plain block among the first.
    fn pack(&mut self, block: usize, keys: &[u32]) -> Packed {
        match block < PLAIN_BLOCKS {
            true => Packed::Plain(keys.into()),
            false => self.packer.pack(keys),
        }
    }

    /// Key `i`'s slot becomes `slot`; `i` is below [`Keys::len`].
    pub fn set(&mut self, i: usize, slot: u32) {
        let block = i >> BLOCK_BITS;
        if block >= self.packed.len() {
            self.open[i & (BLOCK - 1)] = slot;
            return;
        }
        let mut keys = self.packed[block].unpack();
        keys[i & (BLOCK - 1)] = slot;
        let repacked = self.pack(block, &keys);
        self.packed_bytes =
            self.packed_bytes - self.packed[block].heap_bytes() + repacked.heap_bytes();
        self.packed[block] = repacked;
    }

    /// Keep the first `len` keys.
    pub fn truncate(&mut self, len: usize) {
        while len < self.packed.len() << BLOCK_BITS {
            let Some(block) = self.packed.pop() else { break };
            self.packed_bytes -= block.heap_bytes();
            self.open = block.unpack();
        }
        self.open.truncate(len - (self.packed.len() << BLOCK_BITS));
    }

    /// The memory held, by capacity.
    pub fn heap_bytes(&self) -> usize {
        self.packed.capacity() * size_of::<Packed>()
            + self.packed_bytes
            + self.packer.heap_bytes()
            + self.open.capacity() * size_of::<u32>()
    }

    /// At most how many bytes `n` more pushes may allocate.
    pub fn growth_bytes(&self, n: usize) -> usize {
        let need = self.open.len().saturating_add(n);
        let open = if need.min(BLOCK) <= self.open.capacity() {
            0
        } else {
            need.min(BLOCK).max(2 * self.open.capacity()) * size_of::<u32>()
        };
        let closes = need / BLOCK;
        let table = if self.packed.len().saturating_add(closes) <= self.packed.capacity() {
            0
        } else {
            (self.packed.len() + closes).max(2 * self.packed.capacity()) * size_of::<Packed>()
        };
        // A new open block, or the packer's palette and index, and its table grown to the
        // highest slot (at most the slots there are: `Keys` knows not, so a block's worth).
        let packing = if closes > 0 { 3 * MAX_PACKED_BYTES } else { 0 };
        open + table + closes.saturating_mul(MAX_PACKED_BYTES) + packing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes, sets and truncations across block ends read back what a plain `Vec` holds,
    /// whichever way the blocks pack.
    #[test]
    fn keys_read_back_as_a_vec() {
        for distinct in [3u32, 300, 70_000] {
            let (mut keys, mut plain) = (Keys::default(), Vec::new());
            let mut x = 12345u64;
            let mut next = || {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 33) as u32
            };
            for step in 0..(PLAIN_BLOCKS + 5) * BLOCK + 17 {
                let slot = next() % distinct;
                keys.push(slot);
                plain.push(slot);
                if step % 1000 == 999 || step % 100_003 == 0 {
                    let i = next() as usize % plain.len();
                    let slot = next() % distinct;
                    keys.set(i, slot);
                    plain[i] = slot;
                }
                if step % 2001 == 2000 || step == (PLAIN_BLOCKS + 1) * BLOCK + 5 {
                    let back = (next() as usize % (2 * BLOCK)).min(plain.len());
                    keys.truncate(plain.len() - back);
                    plain.truncate(plain.len() - back);
                }
            }
            assert_eq!(keys.len(), plain.len());
            assert!((0..plain.len()).all(|i| keys.get(i) == Some(plain[i])));
            assert_eq!(keys.get(plain.len()), None);
            assert_eq!(keys.last(), plain.last().copied());
        }
    }

    /// A block of few distinct slots takes a byte a key.
    #[test]
    fn few_slots_take_a_byte_a_key() {
        let mut keys = Keys::default();
        let blocks = PLAIN_BLOCKS + 64;
        for i in 0..blocks * BLOCK {
            keys.push([1, 7, 1, (i % 200) as u32][i % 4]);
        }
        let plain = PLAIN_BLOCKS * BLOCK * 4;
        let packed = keys.heap_bytes() - plain;
        assert!(packed < 64 * BLOCK * 5 / 4, "{packed} bytes");
    }
}
