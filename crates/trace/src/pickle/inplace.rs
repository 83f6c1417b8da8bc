//! What reading a record in place from the reader's buffer rests on, shared by `flat_record`
//! (in `stream`) and the entry shapes (`template`): the window a record must lie in, and a
//! stack's list of `GET`s read where it lies.

use super::memo::{MemoRef, MemoTable};
use super::opcodes as op;
use super::Value;

/// Bytes a record may take to be read in place: records of a snapshot take about 60.
pub const FLAT_WINDOW_BYTES: usize = 1024;
/// Where the last opcode of a flat record may start (see `flat_record`).
pub const FLAT_LIMIT: usize = FLAT_WINDOW_BYTES - 260;

/// Where the ops of a list of GETs that starts at `p` of the window end, as the `EMPTY_LIST`
/// arm of `flat_record` reads them: `(MARK GET* APPENDS | GET APPEND)*`, up to the first op
/// that is none of them. `None` where the arm would give up (an op past `FLAT_LIMIT`, or
/// something else in a batch).
pub fn list_end(w: &[u8; FLAT_WINDOW_BYTES], mut p: usize) -> Option<usize> {
    let get_len = |code| match code {
        op::BINGET => Some(2),
        op::LONG_BINGET => Some(5),
        _ => None,
    };
    loop {
        if p >= FLAT_LIMIT {
            return None;
        }
        if w[p] == op::MARK {
            p += 1;
            loop {
                if p >= FLAT_LIMIT {
                    return None;
                }
                if w[p] == op::APPENDS {
                    p += 1;
                    break;
                }
                p += get_len(w[p])?;
            }
            continue;
        }
        match get_len(w[p]) {
            Some(n) if p + n >= FLAT_LIMIT => return None,
            Some(n) if w[p + n] == op::APPEND => p += n + 1,
            // A GET that is the record's next key, or any other op: the list ended.
            _ => return Some(p),
        }
    }
}

/// The items that a list's ops (as [`list_end`] found them) GET, into `items`, the depth of
/// the deepest and the largest key; `None` if one is not a finished value.
pub fn list_items(ops: &[u8], memo: &MemoTable, items: &mut Vec<Value>) -> Option<(u32, u64)> {
    items.clear();
    let (mut deepest, mut largest) = (0, 0);
    let mut q = 0;
    while let Some(&code) = ops.get(q) {
        let key = match code {
            op::BINGET => {
                q += 2;
                u64::from(*ops.get(q - 1)?)
            }
            op::LONG_BINGET => {
                q += 5;
                u64::from(u32::from_le_bytes(ops.get(q - 4..q)?.try_into().ok()?))
            }
            // MARK, APPENDS, APPEND.
            _ => {
                q += 1;
                continue;
            }
        };
        let (v, depth) = memo_value(memo, key)?;
        deepest = deepest.max(depth);
        largest = largest.max(key);
        items.push(v.clone());
    }
    Some((deepest, largest))
}

/// The finished value stored under `key`, and its depth; `None` for anything else.
#[inline(always)]
pub fn memo_value(memo: &MemoTable, key: u64) -> Option<(&Value, u32)> {
    match memo.get(key) {
        Some(MemoRef::Value(v, depth)) => Some((v, depth)),
        _ => None,
    }
}
