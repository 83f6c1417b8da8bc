//! The pickle memo: what `MEMOIZE`/`PUT` stored, for `GET`.
//!
//! A memoized container is usually still being filled (`EMPTY_DICT MEMOIZE MARK ...
//! SETITEMS`), so until it leaves the stack the memo only records where it is
//! ([`Memo::OnStack`]); it holds the finished `Value` from then on. Keys are dense in every
//! pickle CPython writes, so they index a `Vec`; a sparse map takes any others.

use super::Value;
use std::collections::HashMap;

#[derive(Clone)]
pub enum Memo {
    /// A finished value and its nesting depth.
    Value(Value, u32),
    /// A container still being built at this stack position.
    OnStack(usize),
    /// A container the record streamer consumed without building it (see `stream`): a `GET`
    /// of it sends the whole file back to the generic reader.
    Streamed,
}

#[derive(Default)]
pub struct MemoTable {
    dense: Vec<Option<Memo>>,
    sparse: HashMap<u64, Memo>,
    len: usize,
}

impl MemoTable {
    /// Number of keys stored (CPython's `len(memo)`, the key `MEMOIZE` uses next).
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<&Memo> {
        match usize::try_from(key).ok().and_then(|i| self.dense.get(i)) {
            Some(slot) => slot.as_ref(),
            None if self.sparse.is_empty() => None,
            None => self.sparse.get(&key),
        }
    }

    pub fn set(&mut self, key: u64, memo: Memo) {
        let is_new = match usize::try_from(key) {
            Ok(i) if i < self.dense.len() => self.dense[i].replace(memo).is_none(),
            Ok(i) if i == self.dense.len() => {
                self.dense.push(Some(memo));
                true
            }
            _ => self.sparse.insert(key, memo).is_none(),
        };
        self.len += usize::from(is_new);
    }
}
