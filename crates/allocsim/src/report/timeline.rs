//! The timeline's data, written as the replay goes: every allocation as columns (`pack`),
//! each encoded when it is made, so that what the report holds of an allocation while the run
//! goes on is its start and end op (16 bytes), not the allocation.

use super::pack::Columns;
use allocsim_core::{Pool, Trace};
use serde_json::{json, Value};
use std::collections::HashMap;

/// Frames of a stack shown at most.
const FRAMES: usize = 100;

/// Where an op falls on the x axis: µs since the first recorded entry (a snapshot's
/// `time_us`, made monotone: an entry earlier than one before it takes that one's time), or
/// the op itself for a trace without times.
pub struct Clock {
    /// `(op, time)` where the time so far rises, from the first recorded one.
    times: Vec<(u64, i64)>,
}

impl Clock {
    pub fn new(trace: &Trace) -> Clock {
        let mut times: Vec<(u64, i64)> = Vec::new();
        for &(op, t) in &trace.op_times {
            if times.last().is_none_or(|&(_, last)| t > last) {
                times.push((op, t));
            }
        }
        Clock { times }
    }

    /// The first recorded entry's `time_us`, where the x axis starts; `None` without times.
    pub fn start_us(&self) -> Option<i64> {
        self.times.first().map(|&(_, t)| t)
    }

    pub fn timed(&self) -> bool {
        !self.times.is_empty()
    }

    pub fn x(&self, op: u64) -> u64 {
        let Some(&(_, first)) = self.times.first() else { return op };
        let i = self.times.partition_point(|&(o, _)| o <= op);
        (self.times[i.saturating_sub(1)].1 - first) as u64
    }
}

/// Every allocation, in the order of its `Alloc`, as columns: `start` (the op, as the change
/// from the one before), `ops` (its lifetime in ops plus one; 0: alive at the end), `x0` and
/// `dx` (the same on the x axis, where it is time), `size`, `addr` (as the change from the one
/// before), `stack` and `note` (indices into `stacks` and `notes`, plus one; 0: none), `kind`
/// (its stream's index in `streams` times 4, 2 for the large pool, 1 when it was alive before
/// the history began); the stacks as lists of indices into `frames`.
pub struct Allocations<'t> {
    trace: &'t Trace,
    clock: &'t Clock,
    cols: Columns,
    /// Each allocation's start and end op (`u64::MAX`: alive at the end), for `ops` and `dx`.
    spans: Vec<(u64, u64)>,
    last: (u64, u64, u64),
    streams: Vec<u64>,
    stream_index: HashMap<u64, u64>,
    stacks: Stacks,
    notes: Vec<[&'t str; 2]>,
    note_index: HashMap<u32, u64>,
}

impl<'t> Allocations<'t> {
    pub fn new(trace: &'t Trace, clock: &'t Clock) -> Allocations<'t> {
        let names = ["start", "ops", "x0", "dx", "size", "addr", "stack", "note", "kind"];
        Allocations {
            trace,
            clock,
            cols: Columns::with(&names),
            spans: Vec::new(),
            last: (0, 0, 0),
            streams: Vec::new(),
            stream_index: HashMap::new(),
            stacks: Stacks::default(),
            notes: Vec::new(),
            note_index: HashMap::new(),
        }
    }

    /// An allocation made at op `start` (alive before the history began: `before`); its index.
    pub fn push(
        &mut self,
        start: u64,
        addr: u64,
        size: u64,
        stream: u64,
        pool: Pool,
        before: bool,
    ) -> usize {
        let (last_start, last_x, last_addr) = self.last;
        let x0 = self.clock.x(start);
        self.cols.col("start").push(start - last_start);
        if self.clock.timed() {
            self.cols.col("x0").push(x0 - last_x);
        }
        self.cols.col("size").push(size);
        self.cols.col("addr").push_signed(addr.wrapping_sub(last_addr) as i64);
        self.last = (start, x0, addr);
        let trace = self.trace;
        let at = |pairs: &[(u64, u32)]| {
            let k = pairs.binary_search_by_key(&start, |&(o, _)| o).ok()?;
            (!before).then_some(pairs[k].1)
        };
        let stack = at(&trace.op_stacks).map_or(0, |s| 1 + self.stacks.index(trace, s));
        self.cols.col("stack").push(stack);
        let note = at(&trace.op_annotations).map_or(0, |a| {
            1 + *self.note_index.entry(a).or_insert_with(|| {
                let a = &trace.annotations[a as usize];
                self.notes.push([&a.compile_context, &a.user_metadata]);
                self.notes.len() as u64 - 1
            })
        });
        self.cols.col("note").push(note);
        let streams = &mut self.streams;
        let stream = *self.stream_index.entry(stream).or_insert_with(|| {
            streams.push(stream);
            streams.len() as u64 - 1
        });
        let large = u64::from(pool == Pool::Large);
        self.cols.col("kind").push(stream * 4 + large * 2 + u64::from(before));
        self.spans.push((start, u64::MAX));
        self.spans.len() - 1
    }

    /// Allocation `i` was freed at op `end`.
    pub fn end(&mut self, i: usize, end: u64) {
        self.spans[i].1 = end;
    }

    /// The allocations, their stacks, frames, annotations and streams.
    pub fn into_json(mut self) -> Value {
        for &(start, end) in &self.spans {
            let ended = end != u64::MAX;
            self.cols.col("ops").push(if ended { end - start + 1 } else { 0 });
            if self.clock.timed() {
                let dx = if ended { self.clock.x(end) - self.clock.x(start) } else { 0 };
                self.cols.col("dx").push(dx);
            }
        }
        json!({
            "allocations": self.cols.to_json(),
            "count": self.spans.len(),
            "streams": self.streams,
            "notes": self.notes,
            "stacks": self.stacks.stacks,
            "frames": self.stacks.frames,
        })
    }
}

/// Reserved memory after each op that changed it, as `op`, `x` and `bytes` columns, each as
/// the change from the one before.
pub fn steps(reserved_steps: &[(u64, u64)], clock: &Clock) -> Value {
    let mut steps = Columns::with(&["op", "x", "bytes"]);
    let (mut op0, mut x0, mut bytes0) = (0, 0, 0i64);
    for &(op, bytes) in reserved_steps {
        steps.col("op").push(op - op0);
        let x = clock.x(op);
        steps.col("x").push(x - x0);
        steps.col("bytes").push_signed(bytes as i64 - bytes0);
        (op0, x0, bytes0) = (op, x, bytes as i64);
    }
    steps.to_json()
}

/// The stacks the page shows, each a list of indices into the frames (each written once).
#[derive(Default)]
struct Stacks {
    index: HashMap<u32, u64>,
    stacks: Vec<Vec<u64>>,
    frame_index: HashMap<String, u64>,
    frames: Vec<String>,
}

impl Stacks {
    /// The page's index of the trace's stack `s`.
    fn index(&mut self, trace: &Trace, s: u32) -> u64 {
        if let Some(&i) = self.index.get(&s) {
            return i;
        }
        let stack = trace.stacks[s as usize].frames.iter().take(FRAMES).map(|f| {
            let text = format!("{} ({}:{})", f.name, f.filename, f.line);
            *self.frame_index.entry(text).or_insert_with_key(|text| {
                self.frames.push(text.clone());
                self.frames.len() as u64 - 1
            })
        });
        self.stacks.push(stack.collect());
        self.index.insert(s, self.stacks.len() as u64 - 1);
        self.stacks.len() as u64 - 1
    }
}
