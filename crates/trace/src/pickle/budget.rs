//! What the reader holds, in bytes, and what its values cost.
//!
//! [`Limits::max_held_bytes`](super::Limits) is a ceiling on memory the reader really holds:
//! its stack, marks, memo and buffers by their capacity, and every value it made, from the
//! moment it is made until it is dropped. A value is charged once, when it is made (for a
//! container, again when it grows, before it grows), and refunded by the bytes its drop
//! frees: the parts nobody else holds ([`unique_bytes`]). Shared parts (a string in the
//! string cache, a memoized frame) stay charged, so an error of the count only ever
//! overstates what is held. The record streamer charges only what outlives a record (its
//! memo entries): a record's fields go to the caller's sink.

use super::Value;
use std::rc::Rc;

/// The allocation behind an `Rc<String>` or `Rc<Vec<_>>` besides its items: two counts
/// and the `String`/`Vec` itself.
pub(super) const BOX: u64 = 16 + 24;
/// One item of a list or tuple, one pair of a dict.
pub(super) const ITEM: u64 = size_of::<Value>() as u64;
pub(super) const PAIR: u64 = 2 * ITEM;

/// [`own_bytes`] of a string.
#[inline]
pub(super) fn str_bytes(s: &String) -> u64 {
    BOX + s.capacity() as u64
}

/// The bytes of `v`'s own allocation, without what its items hold.
#[inline]
pub(super) fn own_bytes(v: &Value) -> u64 {
    match v {
        Value::Str(s) => str_bytes(s),
        Value::Bytes(b) => BOX + b.capacity() as u64,
        Value::List(items) | Value::Tuple(items) => BOX + items.capacity() as u64 * ITEM,
        Value::Dict(pairs) => BOX + pairs.capacity() as u64 * PAIR,
        Value::None | Value::Bool(_) | Value::Int(_) | Value::Float(_) => 0,
    }
}

/// The bytes that dropping `v` frees now: its allocation and its items' if nothing else
/// holds them. Walks what it frees (as dropping does), no deeper than the value's nesting.
pub(super) fn unique_bytes(v: &Value) -> u64 {
    fn unique<T: ?Sized>(rc: &Rc<T>) -> bool {
        Rc::strong_count(rc) == 1 && Rc::weak_count(rc) == 0
    }
    let owned = match v {
        Value::Str(s) => unique(s),
        Value::Bytes(b) => unique(b),
        Value::List(items) | Value::Tuple(items) => {
            if !unique(items) {
                return 0;
            }
            return own_bytes(v) + items.iter().map(unique_bytes).sum::<u64>();
        }
        Value::Dict(pairs) => {
            if !unique(pairs) {
                return 0;
            }
            let items: u64 = pairs.iter().map(|(k, v)| unique_bytes(k) + unique_bytes(v)).sum();
            return own_bytes(v) + items;
        }
        Value::None | Value::Bool(_) | Value::Int(_) | Value::Float(_) => false,
    };
    if owned {
        own_bytes(v)
    } else {
        0
    }
}

/// What the reader holds from its start whatever the file: the input buffer and the caches
/// of strings and keys.
pub(super) const FIXED: u64 = 128 << 10;
