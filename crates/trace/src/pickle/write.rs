//! Writing a [`Value`] as a protocol 4 pickle that CPython (and `torch.cuda._memory_viz`)
//! loads with plain `pickle.load`.
//!
//! Strings are memoized by content and shared containers (an `Rc` held more than once, like a
//! stack referenced by thousands of trace entries) by identity, as CPython's pickler does by
//! object identity: a snapshot's keys and frames are then written once. Frames (`FRAME`) are
//! optional in protocol 4 and left out.

use super::opcodes as op;
use super::{PickleError, PickleErrorKind as K, Value};
use std::collections::HashMap;
use std::io::Write;
use std::rc::Rc;

/// Deeper values are refused rather than risking the writer's own stack.
const MAX_WRITE_DEPTH: u32 = 1000;
/// CPython's batch size for APPENDS/SETITEMS.
pub const BATCH: usize = 1000;
/// Bytes a writer gathers before it writes them out.
const BUF_BYTES: usize = 64 * 1024;

struct Writer<W> {
    out: W,
    /// Bytes put and not yet written to `out`, a `BufWriter`'s buffer inlined: most puts are
    /// one or two bytes, which its `write_all` each took a call and a check for (a tenth of
    /// writing a long trace).
    buf: Vec<u8>,
    written: u64,
    strs: HashMap<Rc<String>, u32>,
    /// The memo index of each string of `strs` by its address, looked up first: a shared key
    /// is found without hashing its bytes (a fifth of writing a long trace). `strs` holds
    /// each of those `Rc`s, so no other string can take its address while this one is alive.
    str_addrs: crate::addr_map::AddrMap<usize, u32>,
    shared: crate::addr_map::AddrMap<usize, u32>,
    next_memo: u32,
}

/// Write `value` as a protocol 4 pickle to `out`.
pub fn write<W: Write>(value: &Value, out: W) -> Result<(), PickleError> {
    let mut w = Writer::new(out);
    w.put(&[op::PROTO, 4])?;
    w.value(value, 0)?;
    w.put(&[op::STOP])?;
    w.flush()
}

/// A pickle written a piece at a time, for a value too big to build whole: the opcodes of
/// [`write`], in the order the caller gives, with the same memo (strings by content, shared
/// containers by identity), so a value written in pieces is byte for byte the value written
/// whole.
pub struct Stream<W: Write> {
    w: Writer<W>,
}

impl<W: Write> std::fmt::Debug for Stream<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("written", &self.w.written).finish()
    }
}

impl<W: Write> Stream<W> {
    /// Start the pickle (`PROTO 4`).
    pub fn new(out: W) -> Result<Self, PickleError> {
        let mut w = Writer::new(out);
        w.put(&[op::PROTO, 4])?;
        Ok(Stream { w })
    }

    /// A whole value.
    pub fn value(&mut self, v: &Value) -> Result<(), PickleError> {
        self.w.value(v, 1)
    }

    /// An empty dict, not memoized (as [`write`] writes a dict held once).
    pub fn empty_dict(&mut self) -> Result<(), PickleError> {
        self.w.put(&[op::EMPTY_DICT])
    }

    /// An empty list, not memoized.
    pub fn empty_list(&mut self) -> Result<(), PickleError> {
        self.w.put(&[op::EMPTY_LIST])
    }

    /// An empty list, memoized (as [`write`] writes a list held more than once).
    pub fn shared_empty_list(&mut self) -> Result<(), PickleError> {
        self.w.put(&[op::EMPTY_LIST])?;
        self.w.memoize().map(drop)
    }

    pub fn mark(&mut self) -> Result<(), PickleError> {
        self.w.put(&[op::MARK])
    }

    /// Append one item to the list below it.
    pub fn append(&mut self) -> Result<(), PickleError> {
        self.w.put(&[op::APPEND])
    }

    /// Set the pairs since the last mark in the dict below it.
    pub fn setitems(&mut self) -> Result<(), PickleError> {
        self.w.put(&[op::SETITEMS])
    }

    /// Up to [`BATCH`] items appended to the list on top, as [`write`] writes each batch.
    pub fn batch(&mut self, items: &[Value]) -> Result<(), PickleError> {
        if items.len() > 1 {
            self.mark()?;
        }
        for item in items {
            self.w.value(item, 2)?;
        }
        self.w.put(&[if items.len() > 1 { op::APPENDS } else { op::APPEND }])
    }

    /// Up to [`BATCH`] dicts appended to the list on top, each held by no other value (so
    /// not memoized), as [`Stream::batch`] writes the same dicts made as values: a long
    /// trace's entries are written without a dict allocated for each.
    pub fn batch_of_dicts<const N: usize>(
        &mut self,
        dicts: &[[(Value, Value); N]],
    ) -> Result<(), PickleError> {
        if dicts.len() > 1 {
            self.mark()?;
        }
        for pairs in dicts {
            self.w.unshared_dict(pairs, 2)?;
        }
        self.w.put(&[if dicts.len() > 1 { op::APPENDS } else { op::APPEND }])
    }

    /// `STOP`, and everything flushed.
    pub fn finish(mut self) -> Result<(), PickleError> {
        self.w.put(&[op::STOP])?;
        self.w.flush()
    }
}

/// Write `value` as a protocol 4 pickle into a new buffer.
pub fn to_vec(value: &Value) -> Result<Vec<u8>, PickleError> {
    let mut out = Vec::new();
    write(value, &mut out)?;
    Ok(out)
}

impl<W: Write> Writer<W> {
    fn new(out: W) -> Self {
        Writer {
            out,
            buf: Vec::with_capacity(BUF_BYTES),
            written: 0,
            strs: HashMap::new(),
            str_addrs: Default::default(),
            shared: Default::default(),
            next_memo: 0,
        }
    }

    /// `bytes` put, handed on as `BufWriter` hands them on (a full buffer before the piece
    /// that does not fit, a piece as large as the buffer by itself), so that what compresses
    /// them sees the same writes and gives the same bytes.
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> Result<(), PickleError> {
        if self.buf.len() + bytes.len() > BUF_BYTES {
            self.write_buf()?;
        }
        self.written += bytes.len() as u64;
        if bytes.len() >= BUF_BYTES {
            let written = self.written;
            return self
                .out
                .write_all(bytes)
                .map_err(|e| PickleError { offset: written, kind: K::Io(e) });
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// `buf` written to `out`.
    fn write_buf(&mut self) -> Result<(), PickleError> {
        let written = self.written;
        let result = self.out.write_all(&self.buf);
        self.buf.clear();
        result.map_err(|e| PickleError { offset: written, kind: K::Io(e) })
    }

    /// Everything put written to `out`, and `out` flushed.
    fn flush(&mut self) -> Result<(), PickleError> {
        self.write_buf()?;
        let written = self.written;
        self.out.flush().map_err(|e| PickleError { offset: written, kind: K::Io(e) })
    }

    fn memoize(&mut self) -> Result<u32, PickleError> {
        self.put(&[op::MEMOIZE])?;
        self.next_memo += 1;
        Ok(self.next_memo - 1)
    }

    fn get(&mut self, idx: u32) -> Result<(), PickleError> {
        match u8::try_from(idx) {
            Ok(i) => self.put(&[op::BINGET, i]),
            Err(_) => {
                self.put(&[op::LONG_BINGET])?;
                self.put(&idx.to_le_bytes())
            }
        }
    }

    fn int(&mut self, i: i64) -> Result<(), PickleError> {
        if let Ok(b) = u8::try_from(i) {
            self.put(&[op::BININT1, b])
        } else if let Ok(h) = u16::try_from(i) {
            self.put(&[op::BININT2])?;
            self.put(&h.to_le_bytes())
        } else if let Ok(w) = i32::try_from(i) {
            self.put(&[op::BININT])?;
            self.put(&w.to_le_bytes())
        } else {
            // Minimal little-endian two's complement, as CPython's encode_long.
            let bytes = i.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let (last, prev) = (bytes[n - 1], bytes[n - 2]);
                if (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.put(&[op::LONG1, n as u8])?;
            self.put(&bytes[..n])
        }
    }

    fn sized(&mut self, short: u8, long: u8, huge: u8, payload: &[u8]) -> Result<(), PickleError> {
        let n = payload.len();
        if let Ok(b) = u8::try_from(n) {
            self.put(&[short, b])?;
        } else if let Ok(w) = u32::try_from(n) {
            self.put(&[long])?;
            self.put(&w.to_le_bytes())?;
        } else {
            self.put(&[huge])?;
            self.put(&(n as u64).to_le_bytes())?;
        }
        self.put(payload)
    }

    fn string(&mut self, s: &Rc<String>) -> Result<(), PickleError> {
        let addr = Rc::as_ptr(s) as usize;
        if let Some(&idx) = self.str_addrs.get(&addr) {
            return self.get(idx);
        }
        if let Some(&idx) = self.strs.get(s) {
            return self.get(idx);
        }
        self.sized(op::SHORT_BINUNICODE, op::BINUNICODE, op::BINUNICODE8, s.as_bytes())?;
        let idx = self.memoize()?;
        self.strs.insert(s.clone(), idx);
        self.str_addrs.insert(addr, idx);
        Ok(())
    }

    /// A dict of `pairs` that no other value holds, as [`Writer::value`] writes one.
    fn unshared_dict(&mut self, pairs: &[(Value, Value)], depth: u32) -> Result<(), PickleError> {
        self.put(&[op::EMPTY_DICT])?;
        self.pairs(pairs, depth)
    }

    /// A dict's pairs after its `EMPTY_DICT` (and memo put, if any).
    fn pairs(&mut self, pairs: &[(Value, Value)], depth: u32) -> Result<(), PickleError> {
        for batch in pairs.chunks(BATCH) {
            if batch.len() > 1 {
                self.put(&[op::MARK])?;
            }
            for (k, v) in batch {
                self.value(k, depth + 1)?;
                self.value(v, depth + 1)?;
            }
            self.put(&[if batch.len() > 1 { op::SETITEMS } else { op::SETITEM }])?;
        }
        Ok(())
    }

    /// For a container held more than once: its memo index if written before, and the key
    /// under which to remember it otherwise.
    fn shared_key<T>(&self, rc: &Rc<T>) -> (Option<u32>, Option<usize>) {
        if Rc::strong_count(rc) < 2 {
            return (None, None);
        }
        let key = Rc::as_ptr(rc) as *const u8 as usize;
        (self.shared.get(&key).copied(), Some(key))
    }

    fn value(&mut self, v: &Value, depth: u32) -> Result<(), PickleError> {
        if depth > MAX_WRITE_DEPTH {
            return Err(PickleError { offset: self.written, kind: K::TooDeep(MAX_WRITE_DEPTH) });
        }
        match v {
            Value::None => self.put(&[op::NONE]),
            Value::Bool(true) => self.put(&[op::NEWTRUE]),
            Value::Bool(false) => self.put(&[op::NEWFALSE]),
            Value::Int(i) => self.int(*i),
            Value::Float(x) => {
                self.put(&[op::BINFLOAT])?;
                self.put(&x.to_be_bytes())
            }
            Value::Str(s) => self.string(s),
            Value::Bytes(b) => self.sized(op::SHORT_BINBYTES, op::BINBYTES, op::BINBYTES8, b),
            Value::List(items) => {
                let (done, key) = self.shared_key(items);
                if let Some(idx) = done {
                    return self.get(idx);
                }
                self.put(&[op::EMPTY_LIST])?;
                self.remember(key)?;
                for batch in items.chunks(BATCH) {
                    if batch.len() > 1 {
                        self.put(&[op::MARK])?;
                    }
                    for item in batch {
                        self.value(item, depth + 1)?;
                    }
                    self.put(&[if batch.len() > 1 { op::APPENDS } else { op::APPEND }])?;
                }
                Ok(())
            }
            Value::Tuple(items) => {
                let (done, key) = self.shared_key(items);
                if let Some(idx) = done {
                    return self.get(idx);
                }
                if items.is_empty() {
                    return self.put(&[op::EMPTY_TUPLE]);
                }
                if items.len() > 3 {
                    self.put(&[op::MARK])?;
                }
                for item in items.iter() {
                    self.value(item, depth + 1)?;
                }
                self.put(&[match items.len() {
                    1 => op::TUPLE1,
                    2 => op::TUPLE2,
                    3 => op::TUPLE3,
                    _ => op::TUPLE,
                }])?;
                self.remember(key)
            }
            Value::Dict(pairs) => {
                let (done, key) = self.shared_key(pairs);
                if let Some(idx) = done {
                    return self.get(idx);
                }
                self.put(&[op::EMPTY_DICT])?;
                self.remember(key)?;
                self.pairs(pairs, depth)
            }
        }
    }

    fn remember(&mut self, key: Option<usize>) -> Result<(), PickleError> {
        if let Some(key) = key {
            let idx = self.memoize()?;
            self.shared.insert(key, idx);
        }
        Ok(())
    }
}
