//! The binary layout of `.allocsim` version 2: a header, then length-prefixed chunks, so a
//! trace of any length is written and replayed without holding its ops in memory.
//!
//! ```text
//! b"ALLOCSIM"  u32 LE 2
//! u32 LE n, then n bytes: bincode (standard) of [`NativeHeader`] (meta, counts, warnings)
//! chunks, each: u8 kind, u32 LE item count, u32 LE n, n bytes of items; in this order:
//!   RECORDED*  STACKS*  OP_STACKS*  OPS*  END
//! ```
//!
//! Recorded events and ops are the bulk of a trace, so their items have a layout of their
//! own, a tag byte and LEB128 varints, that decodes in a few nanoseconds (an op through
//! bincode's serde path costs several times that); ids and op indices are stored as zigzag
//! deltas from the previous one, so most take one byte:
//! - op: tag (0 alloc, 1 free_requested, 2 free_completed, 3 record_stream, 4 empty_cache,
//!   5 set_memory_fraction, 6 set_allocator_settings, 7 pool, 8 alloc_at), then for 0: id,
//!   size, stream;
//!   1, 2: id; 3: id, stream; 5: f64 LE; 6: length, UTF-8 bytes; 7: the action's byte (0
//!   begin_allocate, 1 end_allocate, 2 release), the pool id's two numbers; 8 (alloc_at): id,
//!   size, stream, address.
//! - recorded event: kind (0..8 in [`super::NativeKind`] order), op, addr, size, stream.
//!
//! Stacks and op-stack pairs are rare enough for bincode (a `Vec` of them per chunk). `END`
//! holds nothing: a file that stops before it is truncated, and the counts read must equal
//! the header's. Ops come last so that a reader has the recording (which a device following
//! it needs before the first op) and can then stream the ops.

use super::{
    bincode_config, decode_message, frame_in, frame_out, native_err, recorded_in, recorded_out,
    NativeFrame, NativeKind, NativeMeta, NativeRecorded, FORMAT_NAME,
};
use crate::built::{self, Built};
use crate::error::TraceError;
use allocsim_core::varint::{put, unzigzag, zigzag};
use allocsim_core::{AllocId, MemPoolId, Op, OpSource, RecordedEvent, Stack, StreamId, Trace};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

pub const BINARY_VERSION: u32 = 2;

const RECORDED: u8 = 1;
const STACKS: u8 = 2;
const OP_STACKS: u8 = 3;
const OPS: u8 = 4;
const END: u8 = 0xff;

/// Items per chunk as written: a chunk of ops is a few hundred KiB.
const OPS_PER_CHUNK: usize = 1 << 16;
const STACKS_PER_CHUNK: usize = 1 << 12;
/// A chunk (or the header) claiming more is corrupt: readers never allocate more than this
/// from a length they were told.
const MAX_CHUNK_BYTES: u32 = 64 << 20;

/// Everything but the lists, with their lengths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NativeHeader {
    pub format: String,
    pub version: u32,
    pub meta: NativeMeta,
    pub ops: u64,
    pub recorded: u64,
    pub stacks: u64,
    pub op_stacks: u64,
    pub warnings: Vec<String>,
}

impl NativeHeader {
    /// The header of `trace` as it is, with `ops` ops (its own when streaming none).
    pub fn of(trace: &Trace, ops: u64) -> NativeHeader {
        NativeHeader {
            format: FORMAT_NAME.to_string(),
            version: BINARY_VERSION,
            meta: NativeMeta::from_meta(&trace.meta),
            ops,
            recorded: trace.recorded.len() as u64,
            stacks: trace.stacks.len() as u64,
            op_stacks: trace.op_stacks.len() as u64,
            warnings: trace.warnings.clone(),
        }
    }
}

/// Writes a trace in this layout, its ops one at a time (see the module doc).
#[derive(Debug)]
pub struct NativeWriter<W: Write> {
    out: W,
    path: PathBuf,
    chunk: Vec<u8>,
    items: usize,
    ops_left: u64,
    last_id: u64,
}

impl<W: Write> NativeWriter<W> {
    /// Write the header and everything of `trace` but its ops, which [`NativeWriter::op`]
    /// then takes, `ops` of them. `path` names the file in errors.
    pub fn new(mut out: W, trace: &Trace, ops: u64, path: &Path) -> Result<Self, TraceError> {
        let io = |e| TraceError::io(path, e);
        let header = bincode::serde::encode_to_vec(NativeHeader::of(trace, ops), bincode_config())
            .map_err(|e| native_err(path, format!("encoding: {e}")))?;
        out.write_all(super::MAGIC).map_err(io)?;
        out.write_all(&BINARY_VERSION.to_le_bytes()).map_err(io)?;
        out.write_all(&(header.len() as u32).to_le_bytes()).map_err(io)?;
        out.write_all(&header).map_err(io)?;
        let mut w = NativeWriter {
            out,
            path: path.to_path_buf(),
            chunk: Vec::new(),
            items: 0,
            ops_left: ops,
            last_id: 0,
        };
        let mut last_op = 0;
        for r in &trace.recorded {
            let n = recorded_out(r);
            w.chunk.push(n.kind as u8);
            put(&mut w.chunk, zigzag(n.op.wrapping_sub(last_op) as i64));
            last_op = n.op;
            for x in [n.addr, n.size, n.stream] {
                put(&mut w.chunk, x);
            }
            w.item(RECORDED, OPS_PER_CHUNK)?;
        }
        w.flush(RECORDED)?;
        for part in trace.stacks.chunks(STACKS_PER_CHUNK) {
            let frames: Vec<Vec<NativeFrame>> =
                part.iter().map(|s| s.frames.iter().map(frame_out).collect()).collect();
            w.bincode_chunk(STACKS, part.len(), &frames)?;
        }
        for part in trace.op_stacks.chunks(OPS_PER_CHUNK) {
            w.bincode_chunk(OP_STACKS, part.len(), &part)?;
        }
        Ok(w)
    }

    fn err(&self, message: String) -> TraceError {
        native_err(&self.path, message)
    }

    /// One item was appended to the chunk: write the chunk when full.
    fn item(&mut self, kind: u8, per_chunk: usize) -> Result<(), TraceError> {
        self.items += 1;
        if self.items == per_chunk {
            self.flush(kind)?;
        }
        Ok(())
    }

    fn flush(&mut self, kind: u8) -> Result<(), TraceError> {
        if self.items == 0 {
            return Ok(());
        }
        let len = u32::try_from(self.chunk.len())
            .ok()
            .filter(|&n| n <= MAX_CHUNK_BYTES)
            .ok_or_else(|| self.err(format!("a chunk of {} bytes", self.chunk.len())))?;
        let mut head = [0u8; 9];
        head[0] = kind;
        head[1..5].copy_from_slice(&(self.items as u32).to_le_bytes());
        head[5..9].copy_from_slice(&len.to_le_bytes());
        let io = |e| TraceError::io(&self.path, e);
        self.out.write_all(&head).map_err(io)?;
        self.out.write_all(&self.chunk).map_err(io)?;
        self.chunk.clear();
        self.items = 0;
        Ok(())
    }

    fn bincode_chunk<T: Serialize>(
        &mut self,
        kind: u8,
        items: usize,
        value: &T,
    ) -> Result<(), TraceError> {
        self.chunk = bincode::serde::encode_to_vec(value, bincode_config())
            .map_err(|e| self.err(format!("encoding: {e}")))?;
        self.items = items;
        self.flush(kind)
    }

    /// The next op.
    pub fn op(&mut self, op: &Op) -> Result<(), TraceError> {
        if self.ops_left == 0 {
            return Err(self.err("more ops than the header announced".to_string()));
        }
        self.ops_left -= 1;
        let c = &mut self.chunk;
        let mut id = |c: &mut Vec<u8>, id: u64| {
            put(c, zigzag(id.wrapping_sub(self.last_id) as i64));
            self.last_id = id;
        };
        match op {
            Op::Alloc { id: i, size, stream } => {
                c.push(0);
                id(c, i.0);
                put(c, *size);
                put(c, stream.0);
            }
            Op::FreeRequested { id: i } => {
                c.push(1);
                id(c, i.0);
            }
            Op::FreeCompleted { id: i } => {
                c.push(2);
                id(c, i.0);
            }
            Op::RecordStream { id: i, stream } => {
                c.push(3);
                id(c, i.0);
                put(c, stream.0);
            }
            Op::EmptyCache => c.push(4),
            Op::SetMemoryFraction { fraction } => {
                c.push(5);
                c.extend_from_slice(&fraction.to_le_bytes());
            }
            Op::SetAllocatorSettings { conf } => {
                c.push(6);
                put(c, conf.len() as u64);
                c.extend_from_slice(conf.as_bytes());
            }
            Op::AllocAt { id: i, size, stream, addr } => {
                c.push(8);
                id(c, i.0);
                put(c, *size);
                put(c, stream.0);
                put(c, *addr);
            }
            Op::Pool { pool, action } => {
                c.push(7);
                c.push(super::pool_action_tag(*action));
                put(c, pool.0);
                put(c, pool.1);
            }
        }
        self.item(OPS, OPS_PER_CHUNK)
    }

    /// Write the end marker, after exactly the ops the header announced.
    pub fn finish(mut self) -> Result<W, TraceError> {
        if self.ops_left != 0 {
            return Err(self.err(format!("{} ops fewer than the header announced", self.ops_left)));
        }
        self.flush(OPS)?;
        let io = |e| TraceError::io(&self.path, e);
        self.out.write_all(&[END, 0, 0, 0, 0, 0, 0, 0, 0]).map_err(io)?;
        Ok(self.out)
    }
}

/// A chunk read from the input: its kind and items, and a cursor over its bytes.
#[derive(Debug, Default)]
struct Chunk {
    kind: u8,
    items: u32,
    bytes: Vec<u8>,
    pos: usize,
}

impl Chunk {
    #[inline]
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    #[inline]
    fn varint(&mut self) -> Option<u64> {
        varint(&self.bytes, &mut self.pos)
    }
}

/// Reads the chunks of one file in order, checking each against the header's counts.
struct ChunkReader<R> {
    input: R,
    path: PathBuf,
    /// The chunk whose kind was read ahead.
    peeked: Option<(u8, u32, u32)>,
}

impl<R: Read> ChunkReader<R> {
    fn corrupt(&self, what: impl std::fmt::Display) -> TraceError {
        native_err(&self.path, format!("corrupt or truncated: {what}"))
    }

    fn exact(&mut self, buf: &mut [u8], what: &str) -> Result<(), TraceError> {
        self.input.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => self.corrupt(format!("the file ends in {what}")),
            _ => TraceError::io(&self.path, e),
        })
    }

    fn next_head(&mut self) -> Result<(u8, u32, u32), TraceError> {
        if let Some(head) = self.peeked.take() {
            return Ok(head);
        }
        let mut head = [0u8; 9];
        self.exact(&mut head, "a chunk header")?;
        let items = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        let len = u32::from_le_bytes([head[5], head[6], head[7], head[8]]);
        if len > MAX_CHUNK_BYTES {
            return Err(self.corrupt(format!("a chunk claims {len} bytes")));
        }
        Ok((head[0], items, len))
    }

    fn peek_kind(&mut self) -> Result<u8, TraceError> {
        let head = self.next_head()?;
        self.peeked = Some(head);
        Ok(head.0)
    }

    /// The next chunk, which must be of `kind`, into `chunk`.
    fn read(&mut self, chunk: &mut Chunk) -> Result<(), TraceError> {
        let (kind, items, len) = self.next_head()?;
        chunk.kind = kind;
        chunk.items = items;
        chunk.pos = 0;
        chunk.bytes.clear();
        // Read into the buffer's spare room: no zeroing first.
        let read = (&mut self.input).take(u64::from(len)).read_to_end(&mut chunk.bytes);
        match read {
            Ok(n) if n == len as usize => Ok(()),
            Ok(_) => Err(self.corrupt("the file ends in a chunk")),
            Err(e) => Err(TraceError::io(&self.path, e)),
        }
    }

    fn bincode<T: for<'de> Deserialize<'de>>(&self, chunk: &Chunk) -> Result<T, TraceError> {
        let (value, used) = bincode::serde::decode_from_slice(&chunk.bytes, bincode_config())
            .map_err(|e| self.corrupt(decode_message(&e)))?;
        if used != chunk.bytes.len() {
            return Err(self.corrupt("bytes left over in a chunk"));
        }
        Ok(value)
    }
}

/// What [`read_head`] keeps of the recorded events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepRecorded {
    All,
    /// Only segment events and ooms: what a device following the recording needs.
    DeviceEvents,
}

/// The items of a bincode list in a chunk, decoded one at a time.
struct Items<'c, 'r, R> {
    reader: &'r ChunkReader<R>,
    bytes: &'c [u8],
    pos: usize,
}

impl<'c, 'r, R: Read> Items<'c, 'r, R> {
    fn new(reader: &'r ChunkReader<R>, chunk: &'c Chunk) -> Self {
        Items { reader, bytes: &chunk.bytes, pos: 0 }
    }

    fn next<T: for<'de> Deserialize<'de>>(&mut self) -> Result<T, TraceError> {
        let (value, used) =
            bincode::serde::decode_from_slice(&self.bytes[self.pos..], bincode_config())
                .map_err(|e| self.reader.corrupt(decode_message(&e)))?;
        self.pos += used;
        Ok(value)
    }

    /// A list's length, as bincode writes it (a varint).
    fn len(&mut self) -> Result<u64, TraceError> {
        self.next::<u64>()
    }

    fn end(&self) -> Result<(), TraceError> {
        if self.pos != self.bytes.len() {
            return Err(self.reader.corrupt("bytes left over in a chunk"));
        }
        Ok(())
    }
}

/// The header holds the meta and the warnings: a few KiB in real files. A header of empty
/// warnings makes 24 bytes of each byte before anything can be counted, so it is kept small.
const MAX_HEADER_BYTES: u32 = 16 << 20;

/// The header and every list but the ops, read; the reader is left at the first op chunk.
pub(super) fn read_head<R: Read>(
    mut input: R,
    path: &Path,
    keep: KeepRecorded,
    built: &Built,
) -> Result<(NativeHeader, Trace, NativeOps<R>), TraceError> {
    let mut reader = ChunkReader { input: &mut input, path: path.to_path_buf(), peeked: None };
    let mut len = [0u8; 4];
    reader.exact(&mut len, "the header")?;
    let len = u32::from_le_bytes(len);
    if len > MAX_HEADER_BYTES {
        return Err(reader.corrupt(format!("the header claims {len} bytes")));
    }
    let mut chunk = Chunk { bytes: vec![0; len as usize], ..Chunk::default() };
    reader.exact(&mut chunk.bytes, "the header")?;
    let mut header: NativeHeader = reader.bincode(&chunk)?;
    if header.format != FORMAT_NAME || header.version != BINARY_VERSION {
        return Err(reader.corrupt("the header does not name allocsim version 2"));
    }
    let mut trace = Trace {
        meta: header.meta.clone().into_meta().map_err(|e| reader.corrupt(e))?,
        warnings: std::mem::take(&mut header.warnings),
        ..Trace::default()
    };
    // What the trace holds, as `built` counts it.
    let mut held: u64 = trace.warnings.iter().map(|w| built::string_bytes(w)).sum();
    built.check(held, || format!("{} warnings", trace.warnings.len()))?;
    let (mut recorded, mut stacks) = (0u64, 0u64);
    let mut last_op = 0u64;
    // Each list's count is checked as its chunks arrive, so a file cannot make the reader hold
    // more than its header announced.
    let more_than_announced = |what: &str| format!("more {what} than the header announced");
    while reader.peek_kind()? == RECORDED {
        reader.read(&mut chunk)?;
        if u64::from(chunk.items) > header.recorded - recorded {
            return Err(reader.corrupt(more_than_announced("recorded events")));
        }
        for _ in 0..chunk.items {
            let r = decode_recorded(&mut chunk, &mut last_op)
                .ok_or_else(|| reader.corrupt(format!("recorded[{recorded}]")))?;
            if r.op >= header.ops {
                let msg =
                    format!("recorded[{recorded}].op is {} but there are {} ops", r.op, header.ops);
                return Err(native_err(path, msg));
            }
            if keep == KeepRecorded::All || r.kind.is_segment_event() {
                trace.recorded.push(r);
            }
            recorded += 1;
        }
        if chunk.pos != chunk.bytes.len() {
            return Err(reader.corrupt("bytes left over in a recorded chunk"));
        }
        let events = trace.recorded.len() as u64;
        built.check(held + events * size_of::<RecordedEvent>() as u64, || {
            format!("{events} recorded events")
        })?;
    }
    held += (trace.recorded.len() * size_of::<RecordedEvent>()) as u64;
    // Stacks and op stacks are decoded an item at a time, each counted as it is made: a
    // chunk of empty frames or stacks (a byte or three each) would otherwise make tens of
    // bytes of each before anything could be counted.
    while reader.peek_kind()? == STACKS {
        reader.read(&mut chunk)?;
        let mut items = Items::new(&reader, &chunk);
        let count = items.len()?;
        if count > header.stacks - stacks {
            return Err(reader.corrupt(more_than_announced("stacks")));
        }
        for _ in 0..count {
            let frames = items.len()?;
            let mut stack = Stack { frames: Vec::new() };
            held += size_of::<Stack>() as u64;
            for _ in 0..frames {
                let f: NativeFrame = items.next()?;
                held += (size_of::<allocsim_core::StackFrame>() + f.name.len() + f.filename.len())
                    as u64;
                built.check(held, || format!("{} stacks", trace.stacks.len() + 1))?;
                stack.frames.push(frame_in(f));
            }
            built.check(held, || format!("{} stacks", trace.stacks.len() + 1))?;
            trace.stacks.push(stack);
        }
        items.end()?;
        stacks += count;
    }
    while reader.peek_kind()? == OP_STACKS {
        reader.read(&mut chunk)?;
        let mut items = Items::new(&reader, &chunk);
        let count = items.len()?;
        if count > header.op_stacks - trace.op_stacks.len() as u64 {
            return Err(reader.corrupt(more_than_announced("op stacks")));
        }
        held += count * size_of::<(u64, u32)>() as u64;
        built.check(held, || format!("{count} more op stacks"))?;
        for _ in 0..count {
            let (op, s): (u64, u32) = items.next()?;
            if op >= header.ops || u64::from(s) >= header.stacks {
                let i = trace.op_stacks.len();
                let msg = format!(
                    "op_stacks[{i}] = ({op}, {s}) but there are {} ops and {} stacks",
                    header.ops, header.stacks
                );
                return Err(native_err(path, msg));
            }
            trace.op_stacks.push((op, s));
        }
        items.end()?;
    }
    if recorded != header.recorded
        || stacks != header.stacks
        || trace.op_stacks.len() as u64 != header.op_stacks
    {
        return Err(reader.corrupt("fewer recorded events, stacks or op stacks than announced"));
    }
    let peeked = reader.peeked.take();
    let ops = NativeOps {
        reader: ChunkReader { input, path: path.to_path_buf(), peeked },
        chunk: Chunk { bytes: Vec::with_capacity(1 << 20), ..Chunk::default() },
        left: 0,
        stopped_by: None,
        total: header.ops,
        read: 0,
        last_id: 0,
        done: false,
    };
    Ok((header, trace, ops))
}

fn decode_recorded(c: &mut Chunk, last_op: &mut u64) -> Option<RecordedEvent> {
    let kind = match c.byte()? {
        0 => NativeKind::SegmentAlloc,
        1 => NativeKind::SegmentFree,
        2 => NativeKind::SegmentMap,
        3 => NativeKind::SegmentUnmap,
        4 => NativeKind::Alloc,
        5 => NativeKind::FreeRequested,
        6 => NativeKind::FreeCompleted,
        7 => NativeKind::Oom,
        _ => return None,
    };
    let op = last_op.wrapping_add(unzigzag(c.varint()?) as u64);
    *last_op = op;
    let (addr, size, stream) = (c.varint()?, c.varint()?, c.varint()?);
    Some(recorded_in(NativeRecorded { op, kind, addr, size, stream }))
}

/// The ops of a version 2 file, read a chunk at a time and decoded one op per `next`: memory
/// stays at one chunk however long the trace. Yields an error (and then nothing) for a corrupt
/// or truncated file.
pub struct NativeOps<R> {
    reader: ChunkReader<R>,
    chunk: Chunk,
    /// Ops of the current chunk still to decode.
    left: u32,
    /// The error that ended [`NativeOps::plain`].
    stopped_by: Option<TraceError>,
    total: u64,
    /// Ops announced by the chunks read so far.
    read: u64,
    last_id: u64,
    done: bool,
}

impl<R> std::fmt::Debug for NativeOps<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeOps")
            .field("path", &self.reader.path)
            .field("total", &self.total)
            .field("read", &self.read)
            .finish_non_exhaustive()
    }
}

impl<R: Read> NativeOps<R> {
    /// How many ops the file holds.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The next op, or the error that ends the ops; `None` after the end or an error.
    #[inline(always)]
    fn decode_next(&mut self) -> Option<Result<Op, TraceError>> {
        if self.left > 0 {
            let (bytes, pos) = (&self.chunk.bytes, &mut self.chunk.pos);
            if let Some(op) = decode_op_then(bytes, pos, &mut self.last_id, |op| op) {
                self.left -= 1;
                return Some(Ok(op));
            }
        }
        // The chunk's end or a bad op, which `next_slow` tells apart.
        self.next_slow()
    }

    /// At the end of a chunk (or at a bad op): the next chunk's first op, the end, or an error.
    #[cold]
    fn next_slow(&mut self) -> Option<Result<Op, TraceError>> {
        loop {
            if self.done {
                return None;
            }
            if self.left > 0 {
                let index = self.read - u64::from(self.left);
                return Some(Err(self.fail(format!("op {index}"))));
            }
            if self.chunk.pos != self.chunk.bytes.len() {
                return Some(Err(self.fail("bytes left over in an op chunk".into())));
            }
            match self.next_chunk() {
                Ok(true) if self.left > 0 => return self.decode_next(),
                Ok(true) => {}
                Ok(false) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }

    fn fail(&mut self, msg: String) -> TraceError {
        self.done = true;
        self.reader.corrupt(msg)
    }

    /// Read the next chunk of ops (`Ok(false)` at the end marker, after all the ops
    /// announced).
    fn next_chunk(&mut self) -> Result<bool, TraceError> {
        self.reader.read(&mut self.chunk)?;
        match self.chunk.kind {
            OPS if u64::from(self.chunk.items) <= self.total - self.read => {}
            OPS => return Err(self.reader.corrupt("more ops than the header announced")),
            END if self.read == self.total => return Ok(false),
            END => {
                return Err(self.reader.corrupt(format!(
                    "{} ops where the header announced {}",
                    self.read, self.total
                )))
            }
            kind => {
                return Err(self.reader.corrupt(format!("a chunk of kind {kind} among the ops")))
            }
        }
        self.left = self.chunk.items;
        self.read += u64::from(self.chunk.items);
        Ok(true)
    }
}

/// The LEB128 varint at `*pos` of `b`; `None` if it runs past `b` or past 64 bits.
///
/// A varint of up to 8 bytes with 8 bytes left to read is decoded from one word, without a
/// loop: the first byte with its high bit clear ends it, and the 7-bit groups are packed in
/// three steps. Sizes take 3 to 5 bytes, and a byte-at-a-time loop pays a mispredicted exit
/// for each.
#[inline(always)]
fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let first = *b.get(*pos)?;
    if first < 0x80 {
        *pos += 1;
        return Some(u64::from(first));
    }
    if let Some(word) = b.get(*pos..*pos + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
        let word = u64::from_le_bytes(word);
        let stops = !word & 0x8080_8080_8080_8080;
        if stops != 0 {
            // Bits up to and including the last byte: 8, 16, .., 64.
            let bits = stops.trailing_zeros() + 1;
            *pos += (bits / 8) as usize;
            return Some(pack7(word & (u64::MAX >> (64 - bits)) & 0x7f7f_7f7f_7f7f_7f7f));
        }
    }
    varint_bytewise(b, pos)
}

/// The 7-bit groups of the bytes of `x` (high bits clear), packed into one number.
#[inline(always)]
fn pack7(x: u64) -> u64 {
    let x = (x & 0x007f_007f_007f_007f) | ((x & 0x7f00_7f00_7f00_7f00) >> 1);
    let x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
    (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4)
}

/// [`varint`] a byte at a time: near the end of a chunk, and for varints over 8 bytes.
#[cold]
fn varint_bytewise(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut x = 0;
    let mut shift = 0;
    loop {
        let byte = *b.get(*pos)?;
        *pos += 1;
        if shift == 63 && byte > 1 {
            return None;
        }
        x |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(x);
        }
        shift += 7;
    }
}

/// Decode the op at `*pos` of `b` (the layout in the module doc) and hand it to `then`;
/// `None` if it is not one. The common kinds each call `then` in an arm of their
/// own, so that a replay step inlined as `then` knows the kind there ([`PlainOps`]).
#[inline(always)]
fn decode_op_then<T>(
    b: &[u8],
    pos: &mut usize,
    last_id: &mut u64,
    then: impl FnOnce(Op) -> T,
) -> Option<T> {
    let tag = *b.get(*pos)?;
    *pos += 1;
    let mut id = |pos: &mut usize| -> Option<AllocId> {
        let id = last_id.wrapping_add(unzigzag(varint(b, pos)?) as u64);
        *last_id = id;
        Some(AllocId(id))
    };
    let op = match tag {
        0 => {
            let id = id(pos)?;
            let size = varint(b, pos)?;
            let stream = StreamId(varint(b, pos)?);
            return Some(then(Op::Alloc { id, size, stream }));
        }
        1 => return Some(then(Op::FreeRequested { id: id(pos)? })),
        2 => return Some(then(Op::FreeCompleted { id: id(pos)? })),
        3 => {
            let id = id(pos)?;
            Op::RecordStream { id, stream: StreamId(varint(b, pos)?) }
        }
        4 => Op::EmptyCache,
        5 => {
            let bytes = b.get(*pos..*pos + 8)?;
            *pos += 8;
            let fraction = f64::from_le_bytes(bytes.try_into().ok()?);
            Op::SetMemoryFraction { fraction: Some(fraction).filter(|f| f.is_finite())? }
        }
        6 => {
            let n = usize::try_from(varint(b, pos)?).ok()?;
            let bytes = b.get(*pos..pos.checked_add(n)?)?;
            *pos += n;
            Op::SetAllocatorSettings { conf: String::from_utf8(bytes.to_vec()).ok()? }
        }
        7 => {
            let action = super::pool_action_of(*b.get(*pos)?)?;
            *pos += 1;
            let pool = MemPoolId(varint(b, pos)?, varint(b, pos)?);
            Op::Pool { pool, action }
        }
        8 => {
            let id = id(pos)?;
            let (size, stream) = (varint(b, pos)?, StreamId(varint(b, pos)?));
            Op::AllocAt { id, size, stream, addr: varint(b, pos)? }
        }
        _ => return None,
    };
    Some(then(op))
}

impl<R: Read> NativeOps<R> {
    /// The ops as an [`OpSource`] for a replay loop, stopping at the first error, which
    /// [`NativeOps::take_error`] then gives. Cheaper per op than the `Result`s of the iterator
    /// itself: each op goes straight from the decoder into the loop's step.
    pub fn plain(&mut self) -> PlainOps<'_, R> {
        PlainOps { ops: self }
    }

    /// The error that ended [`NativeOps::plain`], if one did.
    pub fn take_error(&mut self) -> Option<TraceError> {
        self.stopped_by.take()
    }
}

/// See [`NativeOps::plain`].
#[derive(Debug)]
pub struct PlainOps<'a, R> {
    ops: &'a mut NativeOps<R>,
}

impl<R: Read> OpSource for PlainOps<'_, R> {
    /// Decodes each op into the step, never into a value returned: the step's branch on the
    /// op's kind folds into the decoder's ([`OpSource`]), and the op is not moved through
    /// memory on the way (a `Result` or an `Option` returned costs a store-forwarding stall
    /// per op, seen with `perf annotate`).
    #[inline(always)]
    fn drive(self, mut step: impl FnMut(&Op) -> bool) {
        let ops = self.ops;
        loop {
            // Until the chunk's end or a bad op, which `next_slow` tells apart. The decoder's
            // place lives in locals meanwhile: stored through `ops`, it went back to memory
            // after every varint, since the step inlined beside it might have read it.
            let (mut pos, mut left, mut last_id) = (ops.chunk.pos, ops.left, ops.last_id);
            let mut going = true;
            while left > 0 && going {
                match decode_op_then(
                    &ops.chunk.bytes,
                    &mut pos,
                    &mut last_id,
                    #[inline(always)]
                    |op| step(&op),
                ) {
                    Some(g) => {
                        left -= 1;
                        going = g;
                    }
                    None => break,
                }
            }
            (ops.chunk.pos, ops.left, ops.last_id) = (pos, left, last_id);
            if !going {
                return;
            }
            match ops.next_slow() {
                Some(Ok(op)) if step(&op) => {}
                Some(Ok(_)) | None => return,
                Some(Err(e)) => {
                    ops.stopped_by = Some(e);
                    return;
                }
            }
        }
    }
}

impl<R: Read> Iterator for NativeOps<R> {
    type Item = Result<Op, TraceError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.decode_next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.total - self.read + u64::from(self.left);
        let left = usize::try_from(left).unwrap_or(usize::MAX);
        (0, Some(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-word decoder agrees with the byte loop on every length, at every distance from
    /// the end of the buffer, on canonical and overlong encodings, overflows and truncations.
    #[test]
    fn varint_fast_path_matches_bytewise() {
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for bits in 0..64 {
            for x in [1u64 << bits, (1u64 << bits) - 1, (1u64 << bits) | 0x55] {
                let mut v = Vec::new();
                put(&mut v, x);
                cases.push(v);
            }
        }
        cases.push(vec![0x80, 0x00]); // overlong zero
        cases.push(vec![0xff; 9]); // runs off the end
        cases.push([vec![0xff; 9], vec![0x01]].concat()); // u64::MAX
        cases.push([vec![0xff; 9], vec![0x02]].concat()); // past 64 bits
        cases.push([vec![0x80; 7], vec![0x7f]].concat()); // 8 bytes, ends on the last
        for case in &cases {
            for tail in 0..10 {
                let mut b = case.clone();
                b.extend(std::iter::repeat_n(0x81, tail));
                for cut in [b.len(), case.len(), case.len().saturating_sub(1)] {
                    let b = &b[..cut];
                    let (mut p1, mut p2) = (0, 0);
                    let fast = varint(b, &mut p1);
                    let slow = varint_bytewise(b, &mut p2);
                    assert_eq!(fast, slow, "{b:02x?}");
                    if fast.is_some() {
                        assert_eq!(p1, p2, "{b:02x?}");
                    }
                }
            }
        }
    }
}
