//! Checking a snapshot's Python structure and pulling out what the conversion needs.
//!
//! This layer only validates and extracts (typed `Entry`s, the blocks alive at the end, the
//! settings string); deciding what the entries mean is `convert`'s job. Every error names the
//! place as a Python-like path (`device_traces[0][17].size`), so a user can find it with
//! `pickle.load` in a minute.

use crate::error::{quoted, TraceError};
use crate::pickle::Value;
use allocsim_core::{BlockState, MemPoolId, Pool, SnapshotBlock, SnapshotSegment, StreamId, MIB};
use std::path::Path;

/// Sizes above this are treated as corrupt: no device has 4 EiB.
pub const MAX_SIZE_BYTES: u64 = 1 << 62;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
}

impl Action {
    #[inline]
    fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            "snapshot" => Action::Snapshot,
            _ => return None,
        })
    }
}

/// One `device_traces[0]` entry. For `oom`, `addr` holds `device_free`. 40 bytes: a
/// snapshot has hundreds of thousands, so its stack lives in [`Entries::frames`].
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    /// `time_us`, or [`NO_TIME`] when the entry has none.
    pub time_us: i64,
    /// Index of its annotation in [`Entries::annotations`] (or the converter's), or
    /// [`NO_ANNOTATION`] for PyTorch's defaults.
    pub annotation: u32,
    /// Index of its `frames` list in [`Entries::frames`], or [`NO_FRAMES`].
    pub frames: u32,
    pub action: Action,
}

/// [`Entry::frames`] of an entry without a stack.
pub const NO_FRAMES: u32 = u32::MAX;
/// [`Entry::time_us`] of an entry without one.
pub const NO_TIME: i64 = i64::MIN;
/// [`Entry::annotation`] of an entry with PyTorch's defaults.
pub const NO_ANNOTATION: u32 = u32::MAX;

/// What an entry carries besides its plain fields, as the pickle holds it: its stack, and its
/// annotation when it is not PyTorch's default (`compile_context`, `user_metadata`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Extras<'v> {
    pub frames: Option<&'v Value>,
    pub annotation: Option<(&'v str, &'v str)>,
}

impl Extras<'_> {
    /// The annotation, owned.
    #[inline]
    pub fn annotation(&self) -> Option<allocsim_core::Annotation> {
        self.annotation.map(|(c, u)| allocsim_core::Annotation {
            compile_context: c.to_string(),
            user_metadata: u.to_string(),
        })
    }
}

/// The entries of `device_traces[0]`, and the `frames` lists of those that have one (each
/// shared with the pickle's value: its `Rc` names the stack).
#[derive(Debug, Default)]
pub struct Entries {
    pub list: Vec<Entry>,
    pub frames: Vec<Value>,
    pub annotations: Vec<allocsim_core::Annotation>,
    /// The bytes of the annotations' strings ([`Entries::held_bytes`]).
    pub(super) annotation_bytes: u64,
}

impl Entries {
    /// Append `entry` with its `frames` list and annotation, if any.
    #[inline]
    pub fn push(&mut self, mut entry: Entry, extras: Extras<'_>) {
        if let Some(f) = extras.frames {
            entry.frames = self.frames.len() as u32;
            self.frames.push(f.clone());
        }
        if let Some(a) = extras.annotation() {
            entry.annotation = self.annotations.len() as u32;
            self.annotation_bytes += crate::built::string_bytes(&a.compile_context)
                + crate::built::string_bytes(&a.user_metadata);
            self.annotations.push(a);
        }
        self.list.push(entry);
    }

    /// The memory the list holds (by capacity, as the allocator gave it), counted against the
    /// trace's bound (`crate::built`): a listing pass builds it as a conversion builds ops.
    pub fn held_bytes(&self) -> u64 {
        let annotations = self.annotations.capacity() * size_of::<allocsim_core::Annotation>();
        let lists = self.list.capacity() * size_of::<Entry>()
            + self.frames.capacity() * size_of::<Value>()
            + annotations;
        lists as u64 + self.annotation_bytes
    }
}

/// The keys of an entry that the conversion reads, in the order of [`Fields`].
pub const ENTRY_FIELDS: [&str; 9] = [
    "action",
    "addr",
    "device_free",
    "size",
    "stream",
    "frames",
    "time_us",
    "compile_context",
    "user_metadata",
];

/// An entry's values for [`ENTRY_FIELDS`], `None` where the key is absent.
pub type Fields<'v> = [Option<&'v Value>; 9];

/// Whether `compile_context` and `user_metadata` say nothing (absent, or PyTorch's defaults).
#[inline]
fn default_annotation(compile_context: Option<&Value>, user_metadata: Option<&Value>) -> bool {
    // Byte patterns, not `==` on `str`: this runs for every entry, and a `memcmp` call for
    // three bytes costs more than the comparison.
    let context = |v: &Value| matches!(v.as_str().map(str::as_bytes), Some(b"N/A"));
    let metadata = |v: &Value| matches!(v.as_str().map(str::as_bytes), Some(b""));
    compile_context.is_none_or(context) && user_metadata.is_none_or(metadata)
}

/// Builds errors that name the file.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub path: &'a Path,
    /// The GPU whose `device_traces` list is read.
    pub device: usize,
}

impl Ctx<'_> {
    pub fn err(&self, place: impl Into<String>, message: impl Into<String>) -> TraceError {
        TraceError::Snapshot {
            path: self.path.to_path_buf(),
            place: place.into(),
            message: message.into(),
        }
    }

    /// Where entry `i` of the device's trace is, as a Python path.
    pub fn entry_place(&self, i: usize) -> String {
        format!("device_traces[{}][{i}]", self.device)
    }

    pub fn expected(&self, place: impl Into<String>, what: &str, got: &Value) -> TraceError {
        // None, True and False name their type themselves ("got None", not "got None None").
        let got = match got {
            Value::None | Value::Bool(_) => got.to_string(),
            _ => format!("{} {got}", got.type_name()),
        };
        self.err(place, format!("expected {what}, got {got}"))
    }

    pub fn seq<'v>(
        &self,
        v: &'v Value,
        place: impl Fn() -> String,
    ) -> Result<&'v [Value], TraceError> {
        v.as_seq().ok_or_else(|| self.expected(place(), "a list", v))
    }

    pub fn int(&self, v: &Value, place: impl Fn() -> String) -> Result<i64, TraceError> {
        v.as_int().ok_or_else(|| self.expected(place(), "an int", v))
    }

    /// A byte count: an int in `0..=2^62`.
    pub fn size(&self, v: &Value, place: impl Fn() -> String) -> Result<u64, TraceError> {
        let i = self.int(v, &place)?;
        match u64::try_from(i) {
            Err(_) => Err(self.err(place(), format!("negative size {i}"))),
            Ok(s) if s > MAX_SIZE_BYTES => {
                Err(self.err(place(), format!("size {s} is larger than 2^62 bytes")))
            }
            Ok(s) => Ok(s),
        }
    }

    /// An address or stream handle: PyTorch writes pointers as int64, so a negative value is
    /// the same bit pattern read back as unsigned.
    pub fn handle(&self, v: &Value, place: impl Fn() -> String) -> Result<u64, TraceError> {
        Ok(self.int(v, place)? as u64)
    }
}

/// The device whose trace to read (`want`, or else the only one with entries) and its
/// entries, checked. `streamed`: the entries of `device_traces[0]` as the record streamer read
/// them (`streamed_len` of them; the caller may hold them elsewhere), which left that list
/// empty in `root`; a choice of another device is then an error, which sends the caller to
/// the generic reader.
pub fn device_trace(
    ctx: Ctx<'_>,
    root: &Value,
    streamed: Option<Entries>,
    streamed_len: usize,
    want: Option<usize>,
) -> Result<(usize, Entries), TraceError> {
    if root.as_dict().is_none() {
        return Err(ctx.expected("top level", "a dict (a torch.cuda.memory._snapshot())", root));
    }
    let traces = root
        .get("device_traces")
        .ok_or_else(|| ctx.err("device_traces", "missing: was _record_memory_history enabled?"))?;
    let devices = ctx.seq(traces, || "device_traces".into())?;
    let mut with_entries = Vec::new();
    for (d, t) in devices.iter().enumerate() {
        let empty = if d == 0 && streamed.is_some() {
            streamed_len == 0
        } else {
            ctx.seq(t, || format!("device_traces[{d}]"))?.is_empty()
        };
        if !empty {
            with_entries.push(d);
        }
    }
    let device = match (want, with_entries.as_slice()) {
        (Some(d), _) if with_entries.contains(&d) => d,
        (Some(d), []) => {
            let msg = format!("device {d} was asked for, but no device has trace entries");
            return Err(ctx.err("device_traces", msg));
        }
        (Some(d), with) => {
            let msg = format!("device {d} has no trace entries; devices with entries: {with:?}");
            return Err(ctx.err("device_traces", msg));
        }
        (None, []) => 0,
        (None, [d]) => *d,
        (None, with) => {
            let msg =
                format!("devices {with:?} all have trace entries: choose one with --cuda-device N");
            return Err(ctx.err("device_traces", msg));
        }
    };
    let ctx = Ctx { device, ..ctx };
    if let Some(entries) = streamed {
        if device != 0 {
            return Err(ctx.err("device_traces", NEEDS_OTHER_DEVICE));
        }
        return Ok((0, entries));
    }
    let Some(list) = devices.get(device) else {
        return Ok((device, Entries::default()));
    };
    let list = ctx.seq(list, || format!("device_traces[{device}]"))?;
    let mut entries = Entries { list: Vec::with_capacity(list.len()), ..Entries::default() };
    for (i, e) in list.iter().enumerate() {
        let (entry, extras) = entry(ctx, i, e)?;
        entries.push(entry, extras);
    }
    Ok((device, entries))
}

/// [`device_trace`]'s error when device 0 was streamed and another one is read.
const NEEDS_OTHER_DEVICE: &str = "the trace of another device than 0 is read";

fn entry<'v>(ctx: Ctx<'_>, i: usize, e: &'v Value) -> Result<(Entry, Extras<'v>), TraceError> {
    let pairs = e.as_dict().ok_or_else(|| ctx.expected(ctx.entry_place(i), "a dict", e))?;
    let mut fields: Fields<'_> = [None; 9];
    // One pass over the keys: a snapshot entry has about eight. The last of repeated keys
    // wins, as in the dict Python builds.
    for (k, v) in pairs {
        if let Some(f) = k.as_str().and_then(|k| ENTRY_FIELDS.iter().position(|f| *f == k)) {
            fields[f] = Some(v);
        }
    }
    entry_from_fields(ctx, i, &fields)
}

/// The entry and its stack when its fields have the plain shape of almost every entry (ints
/// where ints belong, a known action, a list for `frames`, PyTorch's default annotation);
/// `None` for anything else, which [`entry_from_fields`] then judges. Never accepts what that
/// would refuse, and gives the same: it is the same checks, without building an error on the
/// way.
#[inline(always)]
pub fn entry_plain(fields: &[Option<Value>; 9]) -> Option<(Entry, Extras<'_>)> {
    // Each field taken by reference where it is used: mapping the array to `Option<&Value>`
    // first cost the Llama snapshot's reading thread 2 % more instructions.
    let [action, addr, device_free, size, stream, frames, time_us, context, metadata] = fields;
    if !default_annotation(context.as_ref(), metadata.as_ref()) {
        return None;
    }
    if let Some(f) = frames {
        f.as_seq()?;
    }
    let time_us = match time_us {
        Some(v) => v.as_int().filter(|&t| t >= 0)?,
        None => NO_TIME,
    };
    let action = Action::parse(action.as_ref()?.as_str()?)?;
    if action == Action::Snapshot {
        return None;
    }
    let addr = if action == Action::Oom {
        u64::try_from(device_free.as_ref()?.as_int()?).ok().filter(|&s| s <= MAX_SIZE_BYTES)?
    } else {
        addr.as_ref()?.as_int()? as u64
    };
    let size = u64::try_from(size.as_ref()?.as_int()?).ok().filter(|&s| s <= MAX_SIZE_BYTES)?;
    let stream = match stream {
        Some(v) => StreamId(v.as_int()? as u64),
        None => StreamId(0),
    };
    let entry =
        Entry { action, addr, size, stream, frames: NO_FRAMES, time_us, annotation: NO_ANNOTATION };
    Some((entry, Extras { frames: frames.as_ref(), annotation: None }))
}

/// Entry `i` from its fields, checked, and its `frames` list and annotation. Shared by the tree
/// reader and the record streamer, so both accept exactly the same entries.
pub fn entry_from_fields<'v>(
    ctx: Ctx<'_>,
    i: usize,
    fields: &Fields<'v>,
) -> Result<(Entry, Extras<'v>), TraceError> {
    let place = |field: &str| format!("{}.{field}", ctx.entry_place(i));
    let [action, addr, device_free, size, stream, frames, time_us, context, metadata] = *fields;
    let annotation = if default_annotation(context, metadata) {
        None
    } else {
        let text = |v: Option<&'v Value>, key: &str, default: &'static str| match v {
            None => Ok(default),
            Some(v) => v.as_str().ok_or_else(|| ctx.expected(place(key), "a str", v)),
        };
        let context =
            text(context, "compile_context", allocsim_core::Annotation::DEFAULT_COMPILE_CONTEXT)?;
        Some((context, text(metadata, "user_metadata", "")?))
    };
    let time_us = match time_us {
        // Microseconds since the epoch. The pickle reader keeps a 9-byte int below 2^64 in
        // 64 bits (a frame's `size_t(-1)` line), so 2^64 - 1 reads as -1: refused here.
        Some(v) => match ctx.int(v, || place("time_us"))? {
            t if t < 0 => {
                let message = format!("expected a time in µs (0 to 2^63 - 1), got {v}");
                return Err(ctx.err(place("time_us"), message));
            }
            t => t,
        },
        None => NO_TIME,
    };
    let action_v = action.ok_or_else(|| ctx.err(place("action"), "missing"))?;
    let name = action_v.as_str().ok_or_else(|| ctx.expected(place("action"), "a str", action_v))?;
    let action = Action::parse(name)
        .ok_or_else(|| ctx.err(place("action"), format!("unknown action {}", quoted(name))))?;
    if action == Action::Snapshot {
        let (frames, annotation) = (NO_FRAMES, NO_ANNOTATION);
        let entry =
            Entry { action, addr: 0, size: 0, stream: StreamId(0), frames, time_us, annotation };
        return Ok((entry, Extras::default()));
    }
    let addr = if action == Action::Oom {
        let v = device_free.ok_or_else(|| ctx.err(place("device_free"), "missing"))?;
        ctx.size(v, || place("device_free"))?
    } else {
        let v = addr.ok_or_else(|| ctx.err(place("addr"), "missing"))?;
        ctx.handle(v, || place("addr"))?
    };
    let size =
        ctx.size(size.ok_or_else(|| ctx.err(place("size"), "missing"))?, || place("size"))?;
    let stream = match stream {
        Some(v) => StreamId(ctx.handle(v, || place("stream"))?),
        None => StreamId(0),
    };
    if let Some(f) = frames {
        ctx.seq(f, || place("frames"))?;
    }
    let entry =
        Entry { action, addr, size, stream, frames: NO_FRAMES, time_us, annotation: NO_ANNOTATION };
    Ok((entry, Extras { frames, annotation }))
}

/// Whether the final `segments`, among the top-level dict's keys and values given as they
/// come (key, value, ...), show a segment of a private pool (`segment_pool_id` other than
/// `(0, 0)`); false where they do not say, for [`final_segments`] to judge later.
pub fn private_pool_alive(root_items: &[Value]) -> bool {
    let segments = root_items.chunks_exact(2).find(|kv| kv[0].as_str() == Some("segments"));
    let Some(segments) = segments.and_then(|kv| kv[1].as_seq()) else { return false };
    segments.iter().any(|seg| {
        let Some([a, b]) = seg.get("segment_pool_id").and_then(Value::as_seq) else { return false };
        match (a.as_int(), b.as_int()) {
            (Some(a), Some(b)) => !MemPoolId(a as u64, b as u64).is_default(),
            _ => false,
        }
    })
}

/// The final `segments` list of the device read, each with its blocks, sorted by address.
pub fn final_segments(ctx: Ctx<'_>, root: &Value) -> Result<Vec<SnapshotSegment>, TraceError> {
    let Some(segments) = root.get("segments") else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (s, seg) in ctx.seq(segments, || "segments".into())?.iter().enumerate() {
        let place = |field: &str| format!("segments[{s}].{field}");
        if seg.as_dict().is_none() {
            return Err(ctx.expected(format!("segments[{s}]"), "a dict", seg));
        }
        if let Some(d) = seg.get("device") {
            if ctx.int(d, || place("device"))? != ctx.device as i64 {
                continue;
            }
        }
        let seg_addr = match seg.get("address") {
            Some(v) => ctx.handle(v, || place("address"))?,
            None => 0,
        };
        let stream = match seg.get("stream") {
            Some(v) => StreamId(ctx.handle(v, || place("stream"))?),
            None => StreamId(0),
        };
        let is_expandable = match seg.get("is_expandable") {
            Some(Value::Bool(b)) => *b,
            _ => false,
        };
        let blocks = seg.get("blocks").ok_or_else(|| ctx.err(place("blocks"), "missing"))?;
        let mut offset = 0u64;
        let mut out_blocks = Vec::new();
        for (b, block) in ctx.seq(blocks, || place("blocks"))?.iter().enumerate() {
            let bplace = |field: &str| format!("segments[{s}].blocks[{b}].{field}");
            if block.as_dict().is_none() {
                return Err(ctx.expected(format!("segments[{s}].blocks[{b}]"), "a dict", block));
            }
            let get =
                |field: &str| block.get(field).ok_or_else(|| ctx.err(bplace(field), "missing"));
            let size = ctx.size(get("size")?, || bplace("size"))?;
            // PyTorch 2.0 blocks have no address: it is the segment's plus the sizes before.
            let address = match block.get("address") {
                Some(v) => ctx.handle(v, || bplace("address"))?,
                None => seg_addr.wrapping_add(offset),
            };
            offset = offset.saturating_add(size);
            let state_v = get("state")?;
            let state =
                state_v.as_str().ok_or_else(|| ctx.expected(bplace("state"), "a str", state_v))?;
            let state = match state {
                "active_allocated" => BlockState::ActiveAllocated,
                "active_pending_free" => BlockState::ActivePendingFree,
                _ => BlockState::Inactive,
            };
            let requested_size = match block.get("requested_size") {
                Some(v) => ctx.size(v, || bplace("requested_size"))?,
                None => size,
            };
            out_blocks.push(SnapshotBlock { address, size, requested_size, state });
        }
        let total_size = match seg.get("total_size") {
            Some(v) => ctx.size(v, || place("total_size"))?,
            None => offset,
        };
        let pool_id = match seg.get("segment_pool_id") {
            Some(v) => {
                let parts = ctx.seq(v, || place("segment_pool_id"))?;
                let [a, b] = parts else {
                    let msg = format!("expected a pair of ints, got {} items", parts.len());
                    return Err(ctx.err(place("segment_pool_id"), msg));
                };
                MemPoolId(
                    ctx.handle(a, || place("segment_pool_id"))?,
                    ctx.handle(b, || place("segment_pool_id"))?,
                )
            }
            None => MemPoolId::DEFAULT,
        };
        let pool = match seg.get("segment_type") {
            Some(Value::Str(t)) if t.as_str() == "small" => Pool::Small,
            Some(_) => Pool::Large,
            None => segment_pool(total_size),
        };
        out.push(SnapshotSegment {
            address: seg_addr,
            total_size,
            stream,
            pool,
            pool_id,
            is_expandable,
            blocks: out_blocks,
        });
    }
    out.sort_by_key(|s| s.address);
    Ok(out)
}

/// The pool of a segment of the default pools by its size: small segments are 2 MiB
/// (`kSmallBuffer`), large ones at least 10 MiB.
pub fn segment_pool(size: u64) -> Pool {
    if size <= 2 * MIB {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// `allocator_settings['PYTORCH_CUDA_ALLOC_CONF']` (or a fork's `PYTORCH_ALLOC_CONF`).
pub fn alloc_conf(ctx: Ctx<'_>, root: &Value) -> Result<Option<String>, TraceError> {
    let Some(settings) = root.get("allocator_settings") else {
        return Ok(None);
    };
    if settings.as_dict().is_none() {
        return Err(ctx.expected("allocator_settings", "a dict", settings));
    }
    for key in ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"] {
        if let Some(v) = settings.get(key) {
            let place = format!("allocator_settings[{}]", quoted(key));
            return match v {
                Value::Str(s) => Ok(Some(s.to_string())),
                Value::None => Ok(None),
                other => Err(ctx.expected(place, "a str", other)),
            };
        }
    }
    Ok(None)
}
