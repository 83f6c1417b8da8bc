//! PyTorch memory snapshots (`torch.cuda.memory._snapshot()` as `_dump_snapshot` pickles it).
//!
//! Reading goes file -> (gunzip) -> safe pickle VM -> `Value` tree -> checked entries
//! (`entries`) -> ops and recorded events (`convert`) -> `Trace`, plus the optional sidecar
//! JSON (`sidecar`). The stages are separate so each has one kind of error: the pickle names a
//! byte offset, the entries a Python path such as `device_traces[0][17].size`.

mod calls;
mod convert;
mod edits;
mod entries;
mod mapped;
mod ops;
mod overlap;
mod pools;
mod sidecar;
mod stacks;
mod write;

pub use convert::UNKNOWN_STREAM;
pub use overlap::{OpFeed, Overlap};
pub use sidecar::sidecar_path;
pub use write::{
    trace_to_snapshot, write_run_streamed, write_streamed_with, RunParts, StackUses, SYNTHETIC_BASE,
};

use crate::error::TraceError;
use crate::inflate::Inflater;
use crate::pickle::{self, Value};
use crate::ReadOptions;
use allocsim_core::{PackedOps, Trace, TraceMeta};
use entries::Ctx;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

/// The `source_format` of traces read from a snapshot.
pub const SOURCE_FORMAT: &str = "pytorch-snapshot";

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Read a snapshot file, gzipped or not (told by its first bytes, whatever its name), and its
/// sidecar JSON if `opts.sidecar`.
///
/// With `opts.streaming` the entries are first read by the record streamer
/// ([`pickle::read_records`]) without building them as values; anything it does not expect,
/// including every error, makes the file be read again the generic way, which gives the same
/// trace or the same error.
pub fn read_snapshot(path: &Path, opts: &ReadOptions) -> Result<Trace, TraceError> {
    let Replayed { mut trace, packed, .. } = read(path, opts, None)?.0;
    if let Some(packed) = packed {
        trace.ops = packed.to_vec();
    }
    Ok(trace)
}

/// [`read_snapshot`], its ops packed where [`ReadOptions::packed_ops`] asks (then
/// `trace.ops` is empty and [`Replayed::packed`] holds them), and the recording's events
/// counted by kind where [`ReadOptions::events`] leaves most out.
pub fn read_snapshot_packed(path: &Path, opts: &ReadOptions) -> Result<Replayed<()>, TraceError> {
    Ok(read(path, opts, None)?.0)
}

/// What [`read_snapshot_replaying`] gives.
#[derive(Debug)]
pub struct Replayed<R> {
    pub trace: Trace,
    /// The replay's result, if the finished trace is what it assumed.
    pub replay: Option<R>,
    /// How many events the recording has: `trace.recorded.len()`, or more where
    /// [`ReadOptions::events`] is off.
    pub recorded_len: u64,
    /// How many of each kind ([`allocsim_core::RecordedKind::action`]), kept or not.
    pub recorded_counts: BTreeMap<&'static str, u64>,
    /// The ops, where [`ReadOptions::packed_ops`] kept them packed; `trace.ops` is then empty.
    pub packed: Option<PackedOps>,
}

impl<R> Replayed<R> {
    /// How many ops the trace has, packed or not.
    pub fn ops_len(&self) -> usize {
        self.trace.ops.len() + self.packed.as_ref().map_or(0, PackedOps::len)
    }
}

/// [`read_snapshot`], with `replay` run on this thread while the file is read, over the ops
/// as they settle (see the `overlap` module). Its result comes back only if the finished trace
/// is what it assumed: ops, recorded device events and meta the same as those it was given.
pub fn read_snapshot_replaying<R>(
    path: &Path,
    opts: &ReadOptions,
    replay: impl FnOnce(Overlap) -> R,
) -> Result<Replayed<R>, TraceError> {
    let (mut replay, mut result) = (Some(replay), None);
    let mut run = |overlap: Overlap| result = replay.take().map(|f| f(overlap));
    let (read, faithful) = read(path, opts, Some(&mut run))?;
    let Replayed { trace, recorded_len, recorded_counts, packed, .. } = read;
    let replay = result.filter(|_| faithful);
    Ok(Replayed { trace, replay, recorded_len, recorded_counts, packed })
}

/// [`read_snapshot`], and whether `replay` (if given, and if the file came through the
/// pipelined pass) saw the finished trace's ops, recorded device events and meta.
fn read(
    path: &Path,
    opts: &ReadOptions,
    replay: Option<&mut dyn FnMut(Overlap)>,
) -> Result<(Replayed<()>, bool), TraceError> {
    // What the replay may assume of the meta before the end: the sidecar's, default settings.
    let mut meta = TraceMeta { source_format: SOURCE_FORMAT.to_string(), ..TraceMeta::default() };
    if opts.sidecar {
        // A profile of the memory outside the allocator is placed on the ops by their times.
        let profiled = !sidecar::apply(path, &mut meta)?.outside_profile.is_empty();
        if profiled && !opts.times {
            return read(path, &ReadOptions { times: true, ..opts.clone() }, replay).map(
                |(mut read, faithful)| {
                    read.trace.op_times = Vec::new();
                    (read, faithful)
                },
            );
        }
    }
    let (streamed, sent) = match opts.streaming {
        true => streaming(path, opts, replay.map(|r| (meta.clone(), r)))?,
        false => (None, None),
    };
    let Assembled {
        mut trace,
        mut packed,
        device_events,
        recorded_len,
        recorded_counts,
        needs_events,
        ..
    } = match streamed {
        Some(assembled) => assembled,
        None => {
            let root = parse(open(path, opts)?, path, opts)?;
            convert_root(&root, path, opts, None)?
        }
    };
    if needs_events {
        // A private pool shows, and its inference reads the allocations' events.
        return read(path, &ReadOptions { events: true, ..opts.clone() }, None);
    }
    let sidecar = match opts.sidecar {
        true => sidecar::apply(path, &mut trace.meta)?,
        false => sidecar::Applied::default(),
    };
    let calls = sidecar.calls;
    // The passes that follow read the ops where they are, packed or not, and add ops to them.
    let mut ops = match packed.take() {
        Some(packed) => ops::OpList::Packed(packed),
        None => ops::OpList::Plain(std::mem::take(&mut trace.ops)),
    };
    // The calls the capture recorded say which runs of frees were `empty_cache`; without them,
    // the free memory at the start says which could not have been a retry path.
    let placed = calls.as_deref().and_then(|c| calls::apply(&mut trace, &mut ops, c));
    if calls.is_some() && placed.is_none() {
        trace.warnings.push(
            "the sidecar's empty_cache and memory fraction calls were left out: the history \
             starts mid-run and the sidecar has no memory_stats to place them by"
                .to_string(),
        );
    }
    let read_as_empty_cache = match placed {
        Some(_) => 0,
        None => convert::split_empty_cache_runs(&mut trace, &mut ops, &device_events),
    };
    (trace.ops, packed) = ops.split();
    if read_as_empty_cache > 0 {
        trace.warnings.push(format!(
            "{read_as_empty_cache} runs of device frees before an allocation were read as \
             empty_cache calls: the free memory at the start says the allocation's cudaMalloc \
             could not have failed first (the recording shows both alike)"
        ));
    }
    trace.meta.outside_profile = on_ops(&sidecar.outside_profile, &trace.op_times);
    let faithful = sent.is_some_and(|sent| {
        sent.events_sent
            && !sent.pools_inferred
            && read_as_empty_cache == 0
            && placed.unwrap_or(0) == 0
            && trace.start.is_none()
            && sent.ops == trace.ops.len() + packed.as_ref().map_or(0, PackedOps::len)
            && TraceMeta { outside_profile: Vec::new(), ..trace.meta.clone() } == meta
    });
    Ok((Replayed { trace, replay: None, recorded_len, recorded_counts, packed }, faithful))
}

/// A profile in the recording's clock, `(time_us, bytes)`, on the ops of `op_times`: each
/// point's time becomes the first op recorded after it (one past the last op with a time if
/// none is).
fn on_ops(profile: &[(i64, u64)], op_times: &[(u64, i64)]) -> Vec<(u64, u64)> {
    let after_last = op_times.last().map_or(0, |&(op, _)| op + 1);
    let first_after = |time| {
        let at = op_times.partition_point(|&(_, t)| t <= time);
        op_times.get(at).map_or(after_last, |&(op, _)| op)
    };
    profile.iter().map(|&(time, bytes)| (first_after(time), bytes)).collect()
}

/// The decompressed pickle stream of a snapshot file.
enum Source {
    Plain(BufReader<Counted>),
    Gzip(Box<Inflater>),
}

/// A file that adds the bytes read from it to [`ReadOptions::bytes_read`], if set.
struct Counted {
    file: File,
    bytes_read: Option<Arc<AtomicU64>>,
}

impl Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        if let Some(count) = &self.bytes_read {
            count.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(n)
    }
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::Plain(r) => r.read(buf),
            Source::Gzip(r) => r.read(buf),
        }
    }
}

fn open(path: &Path, opts: &ReadOptions) -> Result<Source, TraceError> {
    let file = crate::error::open_regular(path)?;
    let file = Counted { file, bytes_read: opts.bytes_read.clone() };
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let head = reader.fill_buf().map_err(|e| TraceError::io(path, e))?;
    if head.is_empty() {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    Ok(if head.starts_with(&GZIP_MAGIC) {
        Source::Gzip(Box::new(Inflater::new(flate2::bufread::MultiGzDecoder::new(reader))))
    } else {
        Source::Plain(reader)
    })
}

fn parse<R: Read>(reader: R, path: &Path, opts: &ReadOptions) -> Result<Value, TraceError> {
    pickle::from_reader_with(reader, &opts.limits)
        .map_err(|error| TraceError::Pickle { path: path.to_path_buf(), error })
}

/// The trace by way of the record streamer alone, or `None` where [`read_snapshot`] would
/// fall back to the generic reader (without the sidecar; for tests and benchmarks).
///
/// The entries are converted as they stream in (`convert::StreamConvert`); a trace that
/// needs the whole list first (one without `free_completed` entries) is streamed again into a
/// list of entries and converted from it.
pub fn read_snapshot_streaming(
    path: &Path,
    opts: &ReadOptions,
) -> Result<Option<Trace>, TraceError> {
    Ok(streaming(path, opts, None)?.0.map(|assembled| assembled.trace))
}

/// [`read_snapshot_streaming`] with a replay beside the pipelined pass, and what its feed
/// handed over if the trace came from that pass.
fn streaming(
    path: &Path,
    opts: &ReadOptions,
    replay: Option<(TraceMeta, &mut dyn FnMut(Overlap))>,
) -> Result<(Option<Assembled>, Option<overlap::Sent>), TraceError> {
    let (first, sent) = match pipelined_pass(path, opts, replay)? {
        (Pass::TooBig(error), _) => return Err(error),
        (Pass::NotPlain, _) => (stream_pass(path, opts, true)?, None),
        pass => pass,
    };
    let refused = |error| TraceError::Pickle { path: path.to_path_buf(), error };
    Ok(match first {
        Pass::Done(trace) => (Some(*trace), sent),
        Pass::NeedsEntries => match stream_pass(path, opts, false)? {
            Pass::Done(trace) => (Some(*trace), None),
            Pass::Refused(error) => return Err(refused(error)),
            Pass::TooBig(error) => return Err(error),
            _ => (None, None),
        },
        Pass::Refused(error) => return Err(refused(error)),
        Pass::TooBig(error) => return Err(error),
        Pass::Unusual | Pass::NotPlain => (None, None),
    })
}

enum Pass {
    Done(Box<Assembled>),
    /// The entries must be listed first: convert from the list.
    NeedsEntries,
    /// For the generic reader.
    Unusual,
    /// A stack the reading thread's table refused: for [`stream_pass`], which says why.
    NotPlain,
    /// A limit of the reader was reached: the generic reader would reach it too.
    Refused(pickle::PickleError),
    /// The trace outgrew its bound (`crate::built`): any other pass would build it too.
    TooBig(TraceError),
}

/// An entry as the reading thread of [`pipelined_pass`] hands it over: its `frames` the index
/// of its stack in the reading thread's table (or [`entries::NO_FRAMES`]), and its annotation
/// if it is not PyTorch's default (boxed: rare, and the batches are fresh memory, 56 bytes an
/// entry so).
type ReadEntry = (entries::Entry, Option<Box<allocsim_core::Annotation>>);

/// What the reading thread of [`pipelined_pass`] hands over.
enum Read2Convert {
    /// Before the entries: the final segments show a private pool, whose inference reads every
    /// recorded event ([`ReadOptions::events`] notwithstanding).
    KeepEvents,
    Entries(Vec<ReadEntry>),
    /// The file is read: the rest of the snapshot, or how the pass ends; and the stacks the
    /// entries' indices name.
    End(Result<Head, Pass>, Vec<allocsim_core::Stack>),
}

/// Entries per message of [`pipelined_pass`]: `FIRST_BATCH` in the first (so the converter
/// starts at once), `SMALL_BATCH` up to `SMALL_UNTIL` entries, then `BATCH`. The batches in
/// flight are fresh memory ([`ReadEntry`]), which a small snapshot feels; a large one feels
/// each hand-over between the threads more.
const FIRST_BATCH: usize = 64;
const SMALL_BATCH: usize = 1024;
const SMALL_UNTIL: usize = 16 * 1024;
const BATCH: usize = 4096;

/// The length of the batch that starts with entry `count` (from 0).
fn batch_len(count: usize) -> usize {
    if count < FIRST_BATCH {
        FIRST_BATCH
    } else if count < SMALL_UNTIL {
        SMALL_BATCH
    } else {
        BATCH
    }
}

/// Batches [`pipelined_pass`] may have sent and the converter not taken yet.
const AHEAD: usize = 4;

/// [`stream_pass`] converting as the entries come, with the reading (inflating and the pickle)
/// on one thread and the conversion on this one. Reading is most of the work and converting
/// the rest, so side by side they take about as long as reading alone. Stacks (`frames`, pickle
/// values tied to the reading thread) are interned there, and the entries carry their index
/// ([`convert::Frames::Interned`]); a stack the table refuses ends the pass with
/// [`Pass::NotPlain`], for [`stream_pass`] to say why. Every other outcome is the same as
/// [`stream_pass`]'s.
///
/// With `replay`, this thread runs it over the ops as they settle ([`overlap`]) and the
/// conversion runs on a thread of its own; the pass then also returns what the feed handed
/// over, if the replay took every op.
fn pipelined_pass(
    path: &Path,
    opts: &ReadOptions,
    replay: Option<(TraceMeta, &mut dyn FnMut(Overlap))>,
) -> Result<(Pass, Option<overlap::Sent>), TraceError> {
    let source = open(path, opts)?;
    let ctx = Ctx { path, device: 0 };
    let (send, received) = sync_channel(AHEAD);
    // Batches go back to the reading thread once converted: a fresh one each time cost
    // fresh pages, two microseconds each to fault in on the development VM.
    let (spare, reuse) = sync_channel::<Vec<ReadEntry>>(AHEAD + 2);
    // Set when the converter gives up: the reader stops at its next entry rather than at its
    // next full batch (up to five batches of reading and interning for nothing).
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let stop = &stop;
        let reader = scope.spawn(move || {
            let mut full = batch_len(0);
            let mut batch = Vec::with_capacity(full);
            let (mut count, mut not_plain) = (0, false);
            let mut stacks = opts.stacks.then(stacks::Stacks::default);
            let early = send.clone();
            let before = |root: &[Value]| {
                if !opts.events && entries::private_pool_alive(root) {
                    let _ = early.send(Read2Convert::KeepEvents);
                }
            };
            let limits = &opts.limits;
            let records = pickle::read_records_after(source, limits, ENTRIES, before, |fields| {
                if stop.load(Ordering::Relaxed) {
                    return false;
                }
                let Some((mut entry, extras)) = streamed_entry(ctx, count, fields) else {
                    return false;
                };
                if let (Some(list), Some(table)) = (extras.frames, stacks.as_mut()) {
                    match table.intern(ctx, list, count) {
                        Ok(Some(stack)) => entry.frames = stack,
                        Ok(None) => {}
                        Err(_) => {
                            not_plain = true;
                            return false;
                        }
                    }
                }
                batch.push((entry, extras.annotation().map(Box::new)));
                count += 1;
                if batch.len() < full {
                    return true;
                }
                // Sized for the batch it will be: one that grows reallocates into fresh pages.
                full = batch_len(count);
                let mut next = reuse.try_recv().unwrap_or_default();
                next.reserve_exact(full);
                // A converter that stopped has dropped its end: stop reading too.
                send.send(Read2Convert::Entries(std::mem::replace(&mut batch, next))).is_ok()
            });
            let end = match records {
                _ if not_plain => Err(Pass::NotPlain),
                // No `device_traces[0]` streamed: the tree is whole, for the generic conversion.
                Ok(Some(records)) if records.streamed => {
                    head_of(ctx, &records.root, count, opts).map_err(|_| Pass::Unusual)
                }
                Err(error) => Err(Pass::Refused(error)),
                Ok(_) => Err(Pass::Unusual),
            };
            let _ = send.send(Read2Convert::Entries(batch));
            let _ = send.send(Read2Convert::End(end, stacks.map(|s| s.stacks).unwrap_or_default()));
        });
        let convert = move |feeder| {
            let done =
                convert_received(ctx, convert::Keep::of(opts, path), received, spare, feeder);
            stop.store(true, Ordering::Relaxed);
            done
        };
        let (pass, sent) = match replay {
            None => convert(None),
            Some((meta, replay)) => {
                let (overlap, feeder, complete) = overlap::feed(meta);
                let converter = scope.spawn(move || convert(Some(feeder)));
                replay(overlap);
                let (pass, sent) = converter.join().unwrap_or((Pass::Unusual, None));
                (pass, sent.filter(|_| complete.get()))
            }
        };
        // A reading thread that panicked said nothing: the generic reader decides.
        Ok(if reader.join().is_ok() { (pass, sent) } else { (Pass::Unusual, None) })
    })
}

/// The converting side of [`pipelined_pass`], handing the settled ops to `feeder` after each
/// batch if there is one. Returning drops `received`, which stops the reading thread if it is
/// still at work.
fn convert_received(
    ctx: Ctx<'_>,
    keep: convert::Keep,
    received: Receiver<Read2Convert>,
    spare: SyncSender<Vec<ReadEntry>>,
    mut feeder: Option<overlap::Feeder>,
) -> (Pass, Option<overlap::Sent>) {
    let mut conv = convert::StreamConvert::new(ctx, keep);
    let mut count = 0;
    for message in received {
        match message {
            Read2Convert::KeepEvents => conv.keep_events(),
            Read2Convert::Entries(mut entries) => {
                for (mut entry, annotation) in entries.drain(..) {
                    let stack = std::mem::replace(&mut entry.frames, entries::NO_FRAMES);
                    let frames =
                        (stack != entries::NO_FRAMES).then_some(convert::Frames::Interned(stack));
                    if !conv.push(count, entry, frames, annotation.map(|a| *a)) {
                        if let Some(error) = conv.take_too_big() {
                            return (Pass::TooBig(error), None);
                        }
                        return (Pass::NeedsEntries, None);
                    }
                    count += 1;
                }
                // The first, small batch is dropped, and any the reader has no room for.
                if entries.capacity() >= SMALL_BATCH {
                    let _ = spare.try_send(entries);
                }
                // A history that starts mid-run, or a replay that stopped, ends the feed.
                if let Some(f) = feeder.as_mut() {
                    if !conv.settled().is_some_and(|(ops, recorded)| f.send(ops, recorded)) {
                        feeder = None;
                    }
                }
            }
            // An error from here on is left to the generic reader too, so every message comes
            // from one place.
            Read2Convert::End(Ok(head), stacks) => {
                return finish_streamed(conv, head, stacks, feeder)
            }
            Read2Convert::End(Err(pass), _) => return (pass, None),
        }
    }
    (Pass::Unusual, None)
}

/// The list the record streamer reads, and the fields it keeps of each entry.
const ENTRIES: pickle::RecordSpec<'static> =
    pickle::RecordSpec { top_key: "device_traces", fields: &entries::ENTRY_FIELDS };

/// Entry `i` from the fields of a streamed record, and its `frames`; `None` for a record that
/// is no valid entry (the generic reader then says why). `inline(always)`, with the unusual
/// entries out of line: 1.6 M instructions fewer on the Llama snapshot's reading thread (the
/// plain entry is returned into the sink's frame).
#[inline(always)]
fn streamed_entry<'v>(
    ctx: Ctx<'_>,
    i: usize,
    fields: &'v [Option<Value>],
) -> Option<(entries::Entry, entries::Extras<'v>)> {
    let fields: &[Option<Value>; 9] = fields.try_into().ok()?;
    entries::entry_plain(fields).or_else(|| unusual_entry(ctx, i, fields))
}

/// [`streamed_entry`] of an entry that is not plain (an annotation, a snapshot marker, an
/// error to find).
#[cold]
#[inline(never)]
fn unusual_entry<'v>(
    ctx: Ctx<'_>,
    i: usize,
    fields: &'v [Option<Value>; 9],
) -> Option<(entries::Entry, entries::Extras<'v>)> {
    let fields = fields.each_ref().map(Option::as_ref);
    entries::entry_from_fields(ctx, i, &fields).ok()
}

/// Entries listed between two checks of the list's memory against the trace's bound.
const LISTED_CHECK_EVERY: usize = 4096;

/// One streaming read, converting as the entries come (`as_they_come`) or from their list,
/// which counts against the trace's bound (`crate::built`) with what is converted from it.
fn stream_pass(path: &Path, opts: &ReadOptions, as_they_come: bool) -> Result<Pass, TraceError> {
    let source = open(path, opts)?;
    let ctx = Ctx { path, device: 0 };
    let mut entries = entries::Entries::default();
    let mut conv =
        as_they_come.then(|| convert::StreamConvert::new(ctx, convert::Keep::of(opts, path)));
    let mut needs_entries = false;
    let mut too_big = None;
    let mut count = 0;
    // The list is built as a conversion builds ops, so it counts against the same bound: tens
    // of millions of entries listed took gigabytes before the conversion's count began.
    let built = (!as_they_come).then(|| crate::built::Built::for_file(path, opts));
    let records = pickle::read_records(source, &opts.limits, ENTRIES, |fields| {
        let Some((entry, extras)) = streamed_entry(ctx, count, fields) else { return false };
        count += 1;
        match conv.as_mut() {
            Some(conv) => {
                let frames = extras.frames.cloned().map(convert::Frames::Listed);
                needs_entries = !conv.push(count - 1, entry, frames, extras.annotation());
                too_big = conv.take_too_big();
                !needs_entries
            }
            None => {
                entries.push(entry, extras);
                if count % LISTED_CHECK_EVERY != 0 {
                    return true;
                }
                let listed = || format!("{count} entries listed so far");
                let checked =
                    built.as_ref().map_or(Ok(()), |b| b.check(entries.held_bytes(), listed));
                too_big = checked.err();
                too_big.is_none()
            }
        }
    });
    if let Some(error) = too_big {
        return Ok(Pass::TooBig(error));
    }
    let records = match records {
        Ok(Some(records)) => records,
        Ok(None) if needs_entries => return Ok(Pass::NeedsEntries),
        Ok(None) => return Ok(Pass::Unusual),
        Err(error) => return Ok(Pass::Refused(error)),
    };
    if !records.streamed {
        // No `device_traces[0]` streamed: the tree is whole, for the generic conversion.
        return Ok(Pass::Unusual);
    }
    // An error from here on is left to the generic reader too, so every message comes from
    // one place.
    Ok(match conv {
        Some(conv) => match head_of(ctx, &records.root, count, opts) {
            Ok(head) => finish_streamed(conv, head, Vec::new(), None).0,
            Err(_) => Pass::Unusual,
        },
        None => match convert_root(&records.root, path, opts, Some(entries)) {
            Ok(assembled) => Pass::Done(Box::new(assembled)),
            Err(error @ TraceError::TooBig { .. }) => Pass::TooBig(error),
            Err(_) => Pass::Unusual,
        },
    })
}

/// Convert an unpickled snapshot. `path` only names the source in errors.
pub fn snapshot_to_trace(
    root: &Value,
    path: &Path,
    with_stacks: bool,
) -> Result<Trace, TraceError> {
    let opts = ReadOptions { stacks: with_stacks, ..ReadOptions::default() };
    Ok(convert_root(root, path, &opts, None)?.trace)
}

/// What a snapshot says besides its entries.
struct Head {
    /// The GPU whose trace is read.
    device: usize,
    last: Vec<allocsim_core::SnapshotSegment>,
    alloc_conf: Option<String>,
}

/// The snapshot's structure checked, with `device_traces[0]` streamed (so left empty) and
/// `streamed_len` entries long.
fn head_of(
    ctx: Ctx<'_>,
    root: &Value,
    streamed_len: usize,
    opts: &ReadOptions,
) -> Result<Head, TraceError> {
    Ok(read_root(ctx, root, Some(Default::default()), streamed_len, opts)?.0)
}

/// What the tree says besides the entries, and the entries (`streamed`, if they were).
fn read_root(
    ctx: Ctx<'_>,
    root: &Value,
    streamed: Option<entries::Entries>,
    streamed_len: usize,
    opts: &ReadOptions,
) -> Result<(Head, entries::Entries), TraceError> {
    let (device, entries) =
        entries::device_trace(ctx, root, streamed, streamed_len, opts.cuda_device)?;
    let ctx = Ctx { device, ..ctx };
    let last = entries::final_segments(ctx, root)?;
    let alloc_conf = entries::alloc_conf(ctx, root)?;
    Ok((Head { device, last, alloc_conf }, entries))
}

/// The trace of a conversion done as the entries came, or [`Pass::NeedsEntries`].
/// `interned`: the stacks of the reading thread's table, if it had one.
/// `feeder` gets the last ops before the pools are inferred, so a replay beside the pass runs
/// on meanwhile.
fn finish_streamed(
    conv: convert::StreamConvert<'_>,
    head: Head,
    interned: Vec<allocsim_core::Stack>,
    feeder: Option<overlap::Feeder>,
) -> (Pass, Option<overlap::Sent>) {
    let Some(converted) = conv.finish(&head.last, interned) else {
        return (Pass::NeedsEntries, None);
    };
    let feeder = feeder.filter(|_| converted.start.is_none());
    let mut sent = feeder.and_then(|mut f| {
        let (ops, recorded) = (&converted.ops, &converted.recorded);
        f.send(ops, recorded).then(|| f.end(recorded, &converted.device_events))
    });
    let assembled = trace_of(head, converted);
    if let Some(sent) = sent.as_mut() {
        sent.pools_inferred = assembled.pools_inferred;
    }
    (Pass::Done(Box::new(assembled)), sent)
}

/// A snapshot's trace as converted.
struct Assembled {
    trace: Trace,
    /// The ops, where they were kept packed ([`convert::Keep::packed`]; `trace.ops` is empty).
    packed: Option<PackedOps>,
    /// [`Replayed::recorded_counts`].
    recorded_counts: BTreeMap<&'static str, u64>,
    /// Where the device events are in `trace.recorded` (see
    /// [`convert::Converted::device_events`]).
    device_events: Vec<u32>,
    /// Whether private pools were inferred (which adds and changes ops).
    pools_inferred: bool,
    /// How many events the recording has ([`convert::Converted::recorded_len`]).
    recorded_len: u64,
    /// A private pool shows, but the conversion kept too few events to infer it.
    needs_events: bool,
}

fn trace_of(head: Head, converted: convert::Converted) -> Assembled {
    let mut warnings = Vec::new();
    if head.device != 0 {
        warnings.push(format!("the trace of device {} is read", head.device));
    }
    warnings.extend(converted.warnings);
    let mut trace = Trace {
        meta: TraceMeta {
            source_format: SOURCE_FORMAT.to_string(),
            alloc_conf: head.alloc_conf,
            ..TraceMeta::default()
        },
        ops: Vec::new(),
        start: converted.start,
        recorded: converted.recorded,
        stacks: converted.stacks,
        op_stacks: converted.op_stacks,
        op_times: converted.op_times,
        annotations: converted.annotations,
        op_annotations: converted.op_annotations,
        warnings,
    };
    let (ops, mut packed) = converted.ops.split();
    trace.ops = ops;
    let mut device_events = converted.device_events;
    let (recorded_len, recorded_counts) = (converted.recorded_len, converted.recorded_counts);
    let all_events = trace.recorded.len() as u64 == recorded_len;
    let inferred =
        pools::infer_pools(&mut trace, &mut packed, &device_events, &head.last, all_events);
    let Some(notes) = inferred else {
        return Assembled {
            trace,
            packed,
            recorded_counts,
            device_events,
            pools_inferred: false,
            recorded_len,
            needs_events: true,
        };
    };
    let pools_inferred = !notes.is_empty();
    trace.warnings.extend(notes);
    if pools_inferred {
        // The pools' edits may have moved the events: find them again.
        let device = trace.recorded.iter().enumerate().filter(|(_, e)| e.kind.is_segment_event());
        device_events = device.map(|(r, _)| r as u32).collect();
    }
    Assembled {
        trace,
        packed,
        recorded_counts,
        device_events,
        pools_inferred,
        recorded_len,
        needs_events: false,
    }
}

fn convert_root(
    root: &Value,
    path: &Path,
    opts: &ReadOptions,
    streamed: Option<entries::Entries>,
) -> Result<Assembled, TraceError> {
    let ctx = Ctx { path, device: 0 };
    let streamed_len = streamed.as_ref().map_or(0, |e| e.list.len());
    let mut keep = convert::Keep::of(opts, path);
    // A streamed list is held beside what is converted from it (a generic reader's entries
    // are views of the tree, which the reader's budget held).
    let listed = streamed.as_ref().map_or(0, entries::Entries::held_bytes);
    keep.max_built_bytes = keep.max_built_bytes.saturating_sub(listed);
    let (head, entries) = read_root(ctx, root, streamed, streamed_len, opts)?;
    let ctx = Ctx { device: head.device, ..ctx };
    let converted = convert::convert(ctx, &entries, &head.last, keep)?;
    Ok(trace_of(head, converted))
}

/// Write `trace` as a snapshot pickle (gzipped if `gzip`): [`trace_to_snapshot`]'s, written as
/// its entries are made ([`write::write_streamed`]).
pub fn write_snapshot<W: Write>(
    trace: &Trace,
    out: W,
    gzip: bool,
    path: &Path,
) -> Result<(), TraceError> {
    if gzip {
        let mut enc = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        write::write_streamed(trace, &mut enc, path)?;
        enc.finish().map_err(|e| TraceError::io(path, e))?;
        Ok(())
    } else {
        write::write_streamed(trace, out, path)
    }
}

#[cfg(test)]
mod tests {
    /// Each point of a profile lands on the first op recorded after its time, or one past the
    /// last op with a time.
    #[test]
    fn a_profile_lands_on_the_ops_after_its_times() {
        let op_times = [(0, 100), (1, 100), (3, 150), (7, 200)];
        let profile = [(99, 1), (100, 2), (160, 3), (250, 4)];
        assert_eq!(super::on_ops(&profile, &op_times), [(0, 1), (3, 2), (7, 3), (8, 4)]);
    }
}
