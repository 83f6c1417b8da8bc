//! A small cache of recently made lists, shared when a list with the same items comes again.
//!
//! PyTorch's snapshots give each allocation a list of its frames (shared frame dicts), and the
//! pickle memoizes every such list: a reader must keep each one for as long as a later `GET`
//! could ask for it, that is to the end. A two-million-entry snapshot holds over a million
//! such lists of about 40 items, far more than the reader's memory budget, though they repeat
//! a few hundred stacks. Lists read in place hold only finished values, and a finished list in
//! the memo is never changed (the reader refuses to mutate a shared container), so one `Rc`
//! can stand for every equal list: no reader of the value can tell.
//!
//! Only memoized lists come here, charged to the budget when first held. The cache itself
//! keeps at most `SLOTS` lists of a flat record's size (under 17 MiB in all), which outlive
//! their memo entry only when a record read in place is rolled back.

use super::value::Value;
use std::rc::Rc;

/// log2 of the number of slots, and of the ways of a set.
const SLOT_BITS: u32 = 11;
const WAY_BITS: u32 = 2;
const SLOTS: usize = 1 << SLOT_BITS;

pub struct ListCache {
    slots: Vec<Option<Rc<Vec<Value>>>>,
}

impl Default for ListCache {
    fn default() -> Self {
        ListCache { slots: vec![None; SLOTS] }
    }
}

impl ListCache {
    /// The shared list of `items` and whether it was cached (then nothing new is held), else
    /// a new list of them, remembered for the next.
    #[inline]
    pub fn get(&mut self, items: &mut Vec<Value>) -> (Value, bool) {
        // FNV-1a over the items' identities: a collision only costs a miss.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for v in items.iter() {
            h = (h ^ identity(v)).wrapping_mul(0x0100_0000_01b3);
        }
        // Four ways per set, the last used first. The set is the top bits of a Fibonacci
        // product: FNV's low bits depend only on the items' low bits, which their alignment
        // makes alike. (One way per set indexed by the low bits missed 29 % of a 510,714-entry
        // snapshot's lists, colliding stacks taking turns; two ways by the top bits in 512
        // sets, 1.5 %; four ways in 512 sets miss once per stack, 186 times in 339,261.)
        let set = (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOT_BITS + WAY_BITS)) as usize;
        let ways = &mut self.slots[set << WAY_BITS..(set + 1) << WAY_BITS];
        let equal = |rc: &Rc<Vec<Value>>| {
            rc.len() == items.len() && rc.iter().zip(items.iter()).all(|(a, b)| same(a, b))
        };
        for way in 0..ways.len() {
            if let Some(rc) = ways[way].as_ref().filter(|rc| equal(rc)) {
                let list = Value::List(rc.clone());
                ways[..=way].rotate_right(1);
                items.clear();
                return (list, true);
            }
        }
        // An exact-size copy; the buffer keeps its room for the next list.
        #[allow(clippy::drain_collect)]
        let rc = Rc::new(items.drain(..).collect::<Vec<_>>());
        ways.rotate_right(1);
        ways[0] = Some(rc.clone());
        (Value::List(rc), false)
    }
}

/// Memoized lists found again by the opcodes that build them, without reading their items.
///
/// PyTorch writes each stack's frames as GETs of the frame dicts' memo keys, so the entries of
/// one stack carry the same bytes for it: `MARK BINGET a LONG_BINGET b ... APPENDS`. Read by
/// their keys, those bytes name the same items for as long as no finished value in the memo
/// is replaced ([`super::memo::MemoTable::epoch`]), so a list found by its bytes in the same
/// epoch is the list those items make, and the per-item lookups ([`ListCache`]) are skipped.
/// A list is remembered only if it GETs no key of its own record, the keys a rollback takes
/// back. It holds at most 1,024 lists, each also in the memo unless a rollback took it back,
/// and their ops (under a kilobyte each: a flat record's window).
pub struct ListsByBytes {
    slots: Vec<Option<ByBytes>>,
}

struct ByBytes {
    epoch: u64,
    depth: u32,
    bytes: Box<[u8]>,
    list: Rc<Vec<Value>>,
}

/// log2 of the slots of [`ListsByBytes`] (direct-mapped: a stack that collides is read item
/// by item).
const BYTES_SLOT_BITS: u32 = 10;

impl Default for ListsByBytes {
    fn default() -> Self {
        ListsByBytes { slots: (0..1 << BYTES_SLOT_BITS).map(|_| None).collect() }
    }
}

impl ListsByBytes {
    /// The list that `bytes` built in memo epoch `epoch`, and its depth.
    #[inline]
    pub fn find(&self, bytes: &[u8], epoch: u64) -> Option<(&Rc<Vec<Value>>, u32)> {
        let hit = self.slots[slot_of(bytes)].as_ref()?;
        (hit.epoch == epoch && *hit.bytes == *bytes).then_some((&hit.list, hit.depth))
    }

    /// Remember that `bytes` built `list` in memo epoch `epoch`.
    pub fn insert(&mut self, bytes: &[u8], epoch: u64, list: &Rc<Vec<Value>>, depth: u32) {
        let list = list.clone();
        self.slots[slot_of(bytes)] = Some(ByBytes { epoch, depth, bytes: bytes.into(), list });
    }
}

/// The slot of `bytes`: a multiplicative hash over their 8-byte words (a collision only costs
/// a miss).
#[inline]
fn slot_of(bytes: &[u8]) -> usize {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut words = bytes.chunks_exact(8);
    let mut h = bytes.len() as u64;
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().unwrap_or_default());
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h.rotate_left(5) ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    (h >> (64 - BYTES_SLOT_BITS)) as usize
}

/// What tells `v` apart from other items: its address for shared values, else its bits.
fn identity(v: &Value) -> u64 {
    match v {
        Value::None => 0,
        Value::Bool(b) => 1 + u64::from(*b),
        Value::Int(i) => *i as u64,
        Value::Float(f) => f.to_bits(),
        Value::Str(s) => Rc::as_ptr(s) as u64,
        Value::Bytes(b) => Rc::as_ptr(b) as u64,
        Value::List(l) | Value::Tuple(l) => Rc::as_ptr(l) as u64,
        Value::Dict(d) => Rc::as_ptr(d) as u64,
    }
}

/// The same value: the same shared object, or equal scalars of the same type.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::None, Value::None) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        (Value::Str(x), Value::Str(y)) => Rc::ptr_eq(x, y),
        (Value::Bytes(x), Value::Bytes(y)) => Rc::ptr_eq(x, y),
        (Value::List(x), Value::List(y)) | (Value::Tuple(x), Value::Tuple(y)) => Rc::ptr_eq(x, y),
        (Value::Dict(x), Value::Dict(y)) => Rc::ptr_eq(x, y),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_items_share_one_list_and_others_do_not() {
        let frame = Value::str_dict([("name", Value::str("f"))]);
        let mut cache = ListCache::default();
        let (a, cached) = cache.get(&mut vec![frame.clone(), Value::Int(3)]);
        assert!(!cached);
        let (b, cached) = cache.get(&mut vec![frame.clone(), Value::Int(3)]);
        assert!(cached);
        let (Value::List(a), Value::List(b)) = (&a, &b) else { panic!() };
        assert!(Rc::ptr_eq(a, b));
        // An equal dict that is another object is another item.
        let twin = Value::str_dict([("name", Value::str("f"))]);
        let (c, cached) = cache.get(&mut vec![twin, Value::Int(3)]);
        assert!(!cached);
        assert_eq!(&c, &Value::List(a.clone()), "equal in value");
        let (_, cached) = cache.get(&mut vec![frame, Value::Int(4)]);
        assert!(!cached);
    }

    #[test]
    fn lists_are_found_by_their_bytes_in_their_epoch_only() {
        let mut by_bytes = ListsByBytes::default();
        let list = Rc::new(vec![Value::Int(1)]);
        // Longer than a word, so the hash reads whole words and a tail.
        let bytes = b"(h\x0bh\x0cj\x00\x01\x00\x00e";
        assert!(by_bytes.find(bytes, 0).is_none());
        by_bytes.insert(bytes, 0, &list, 2);
        let (found, depth) = by_bytes.find(bytes, 0).expect("found");
        assert!(Rc::ptr_eq(found, &list));
        assert_eq!(depth, 2);
        assert!(by_bytes.find(bytes, 1).is_none(), "another epoch");
        assert!(by_bytes.find(&bytes[..bytes.len() - 1], 0).is_none(), "other bytes");
    }
}
