//! A replay that runs while its snapshot is still being read.
//!
//! Replaying a snapshot used to wait for the whole file: the reading thread is the critical
//! path, and the replay (a fifth of the time on the Llama snapshot) came after it. But
//! converted ops only ever get appended, so the caller's thread can replay them as the
//! converting thread settles them ([`read_snapshot_replaying`]). The replay assumes what only
//! the end of the file tells: the history starts with the allocator's first call, the
//! settings are the sidecar's or PyTorch's defaults, no private pool needs ops of its own and
//! no run of device frees is an `empty_cache` the free memory gives away. The file's end says whether
//! it was so; only then is the replay's result kept, otherwise the caller replays the finished
//! trace as before. Either way the result is the same.
//!
//! [`read_snapshot_replaying`]: super::read_snapshot_replaying

use super::ops::OpList;
use allocsim_core::packed::{Iter, Position};
use allocsim_core::{Op, RecordedEvent, TraceMeta};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// What the replay is handed: the trace's meta as far as it is known before the end (the
/// sidecar's, with default settings), its ops as they settle, and the recorded events of those
/// ops, which `recorded` receives before the ops they belong to.
#[derive(Debug)]
pub struct Overlap {
    pub meta: TraceMeta,
    pub ops: OpFeed,
    /// Appended in op order (the device events of each op whole), as `RecordedDevice` takes
    /// them (`allocsim_sim::RecordedFeed`).
    pub recorded: Rc<RefCell<Vec<RecordedEvent>>>,
}

/// The settled ops and their device events, handed from the converting thread in chunks.
#[derive(Debug)]
struct Chunk {
    ops: Vec<Op>,
    recorded: Vec<RecordedEvent>,
}

/// Chunks the converting thread may have sent and the replay not taken yet.
const AHEAD: usize = 4;

/// The ops as they settle; ends when the conversion does, or gives up on the overlap.
#[derive(Debug)]
pub struct OpFeed {
    chunks: Receiver<Option<Chunk>>,
    spare: SyncSender<Chunk>,
    ops: std::vec::IntoIter<Op>,
    recorded: Rc<RefCell<Vec<RecordedEvent>>>,
    /// Set when the last op came (not when the converting thread gave up).
    complete: Rc<Cell<bool>>,
}

impl Iterator for OpFeed {
    type Item = Op;

    #[inline]
    fn next(&mut self) -> Option<Op> {
        match self.ops.next() {
            Some(op) => Some(op),
            None => self.next_chunk(),
        }
    }
}

impl OpFeed {
    /// The first op of the next chunk, waiting for it.
    #[cold]
    fn next_chunk(&mut self) -> Option<Op> {
        loop {
            if let Some(op) = self.ops.next() {
                return Some(op);
            }
            match self.chunks.recv() {
                Ok(Some(mut chunk)) => {
                    self.recorded.borrow_mut().append(&mut chunk.recorded);
                    let ops = std::mem::replace(
                        &mut self.ops,
                        std::mem::take(&mut chunk.ops).into_iter(),
                    );
                    // The emptied vectors go back for the next chunks.
                    let _ =
                        self.spare.try_send(Chunk { ops: reuse(ops), recorded: chunk.recorded });
                }
                Ok(None) => {
                    self.complete.set(true);
                    return None;
                }
                // The converting thread gave up (or the file is another kind of trace).
                Err(_) => return None,
            }
        }
    }
}

/// An emptied iterator's vector, for another chunk: collecting a `vec::IntoIter` into a
/// `Vec` keeps its allocation.
fn reuse(ops: std::vec::IntoIter<Op>) -> Vec<Op> {
    let mut v: Vec<Op> = ops.collect();
    v.clear();
    v
}

/// The converting thread's side: sends what settled since the last call.
pub(super) struct Feeder {
    chunks: SyncSender<Option<Chunk>>,
    spare: Receiver<Chunk>,
    ops_sent: usize,
    /// Where the packed ops sent end, once some were sent packed (the conversion packs its
    /// ops once there are many: `ReadOptions::packed_ops`).
    packed_sent: Option<Position>,
    recorded_sent: usize,
    /// The device events sent, in the order sent (few: a trace's segment calls).
    pub(super) device_events: Vec<RecordedEvent>,
}

/// A feed and the two ends that share it: the replay's [`Overlap`] (with `meta`), and the
/// converting thread's [`Feeder`]. The flag tells whether the feed ended with the last op.
pub(super) fn feed(meta: TraceMeta) -> (Overlap, Feeder, Rc<Cell<bool>>) {
    let (send, chunks) = sync_channel(AHEAD);
    let (spare, reuse) = sync_channel(AHEAD + 2);
    let complete = Rc::new(Cell::new(false));
    let recorded = Rc::new(RefCell::new(Vec::new()));
    let ops = OpFeed {
        chunks,
        spare,
        ops: Vec::new().into_iter(),
        recorded: recorded.clone(),
        complete: complete.clone(),
    };
    let feeder = Feeder {
        chunks: send,
        spare: reuse,
        ops_sent: 0,
        packed_sent: None,
        recorded_sent: 0,
        device_events: vec![],
    };
    (Overlap { meta, ops, recorded }, feeder, complete)
}

impl Feeder {
    /// Send `ops[sent..]` and the device events of `recorded[sent..]` (whose ops are all
    /// settled), sorted by op as `RecordedDevice` sorts them. False once the replay is gone.
    pub(super) fn send(&mut self, ops: &OpList, recorded: &[RecordedEvent]) -> bool {
        if ops.len() == self.ops_sent && recorded.len() == self.recorded_sent {
            return true;
        }
        let mut chunk = self
            .spare
            .try_recv()
            .unwrap_or_else(|_| Chunk { ops: Vec::new(), recorded: Vec::new() });
        match ops {
            OpList::Plain(ops) => chunk.ops.extend_from_slice(&ops[self.ops_sent..]),
            OpList::Packed(ops) => {
                let mut new = match self.packed_sent {
                    Some(at) => Iter::resume(ops, at),
                    None => ops.iter_from(self.ops_sent),
                };
                chunk.ops.extend(new.by_ref());
                self.packed_sent = Some(new.position());
            }
        }
        let device = recorded[self.recorded_sent..].iter().filter(|e| e.kind.is_segment_event());
        chunk.recorded.extend(device);
        chunk.recorded.sort_by_key(|e| e.op);
        self.device_events.extend_from_slice(&chunk.recorded);
        (self.ops_sent, self.recorded_sent) = (ops.len(), recorded.len());
        self.chunks.send(Some(chunk)).is_ok()
    }

    /// The last ops were sent, `recorded` is the conversion's whole recording, with its device
    /// events at `device` ([`Converted::device_events`](super::convert::Converted)): the feed
    /// ends here. What it sent, held against the recording (the device events sent are those
    /// a `RecordedDevice` of the whole recording expects, in its order).
    pub(super) fn end(self, recorded: &[RecordedEvent], device: &[u32]) -> Sent {
        let _ = self.chunks.send(None);
        let mut device_events: Vec<RecordedEvent> =
            device.iter().map(|&r| recorded[r as usize]).collect();
        device_events.sort_by_key(|e| e.op);
        let events_sent = device_events == self.device_events;
        Sent { ops: self.ops_sent, events_sent, pools_inferred: false }
    }
}

/// What a feed that ended handed over, to hold against the finished trace.
pub(super) struct Sent {
    pub(super) ops: usize,
    /// The device events sent are the recording's.
    pub(super) events_sent: bool,
    /// The pool inference added or changed ops after the last were sent.
    pub(super) pools_inferred: bool,
}
