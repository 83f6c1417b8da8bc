//! Deduplicating `frames` lists into `Trace::stacks`.
//!
//! PyTorch already shares identical tracebacks as one Python object, and the pickle keeps that
//! sharing (one `Rc` here), so the first lookup is by pointer: a stack seen before costs one
//! hash of a pointer. Other lists are read frame by frame into string ids and line numbers and
//! looked up by those; only a stack never seen before is built out of `String`s.

use super::entries::Ctx;
use crate::addr_map::AddrMap;
use crate::error::TraceError;
use crate::pickle::Value;
use allocsim_core::{Stack, StackFrame};
use std::rc::Rc;

#[derive(Default)]
pub struct Stacks {
    /// Each `frames` list interned, by address.
    by_ptr: AddrMap<usize, u32>,
    /// Keeps every list looked up by address alive, so its address names it: a streamed
    /// reader drops a list no memo entry holds once its entry is read, and a later list may
    /// take its place.
    held_lists: Vec<Value>,
    /// Each stack read so far, by the addresses of the frame dicts it lists: PyTorch writes a
    /// frame once and every later stack refers to it (a pickle GET, one `Rc` here), so a new
    /// list of frames seen before costs one hash, not one per frame.
    by_frame_ptrs: AddrMap<Box<[usize]>, u32>,
    /// Each frame dict read so far, by pointer.
    frames_by_ptr: AddrMap<usize, [u32; 3]>,
    /// Keeps every frame dict looked up by pointer alive, so its address names it.
    held_frames: Vec<Value>,
    /// Each distinct stack as the ids of its strings and its lines, three per frame (flat, so
    /// a key hashes as one run of bytes).
    by_content: AddrMap<Box<[u32]>, u32>,
    /// The frame addresses of the list being looked up: reused, so that a lookup allocates
    /// nothing.
    scratch: Vec<usize>,
    strings: Strings,
    pub stacks: Vec<Stack>,
    /// Stacks another table interned ([`Stacks::adopt`]): their index there by ours.
    adopted: Vec<u32>,
    /// Our index of each of theirs seen so far.
    adopted_as: AddrMap<u32, u32>,
}

/// Frame strings by id. A file name or function name recurs in thousands of frames, usually
/// as one shared Python string (one `Rc` here), so a string is looked up by pointer first and
/// by content once per pointer; no `String` is built for a frame of a stack seen before.
#[derive(Default)]
struct Strings {
    by_ptr: AddrMap<usize, u32>,
    by_content: AddrMap<String, u32>,
    text: Vec<String>,
    /// Keeps every string looked up by pointer alive, so its address names it.
    held: Vec<Rc<String>>,
}

impl Strings {
    fn id(&mut self, s: &Rc<String>) -> u32 {
        let ptr = Rc::as_ptr(s) as usize;
        if let Some(&id) = self.by_ptr.get(&ptr) {
            return id;
        }
        let id = self.by_text(s);
        self.by_ptr.insert(ptr, id);
        self.held.push(s.clone());
        id
    }

    fn by_text(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.by_content.get(s) {
            return id;
        }
        let id = self.text.len() as u32;
        self.by_content.insert(s.to_owned(), id);
        self.text.push(s.to_owned());
        id
    }
}

impl Stacks {
    /// The index of the stack `frames` (entry `entry`'s) names; `None` for an empty list.
    pub fn intern(
        &mut self,
        ctx: Ctx<'_>,
        frames: &Value,
        entry: usize,
    ) -> Result<Option<u32>, TraceError> {
        let place = || format!("{}.frames", ctx.entry_place(entry));
        let Value::List(list) = frames else {
            return Err(ctx.expected(place(), "a list", frames));
        };
        if list.is_empty() {
            return Ok(None);
        }
        let key = Rc::as_ptr(list) as usize;
        if let Some(&idx) = self.by_ptr.get(&key) {
            return Ok(Some(idx));
        }
        self.scratch.clear();
        let all_dicts = list.iter().all(|f| match f {
            Value::Dict(d) => {
                self.scratch.push(Rc::as_ptr(d) as usize);
                true
            }
            _ => false,
        });
        if let Some(&idx) = self.by_frame_ptrs.get(&self.scratch[..]).filter(|_| all_dicts) {
            self.hold(key, frames, idx);
            return Ok(Some(idx));
        }
        let mut ids = Vec::with_capacity(list.len());
        for (j, f) in list.iter().enumerate() {
            ids.push(self.frame(ctx, f, &|| format!("{}[{j}]", place()))?);
        }
        let idx = match self.by_content.get(ids.as_flattened()) {
            Some(&idx) => idx,
            None => {
                let idx = u32::try_from(self.stacks.len())
                    .map_err(|_| ctx.err(place(), "more than 2^32 distinct stacks"))?;
                let text = &self.strings.text;
                let frames = ids.iter().map(|&[name, filename, line]| StackFrame {
                    name: text[name as usize].clone(),
                    filename: text[filename as usize].clone(),
                    line,
                });
                self.stacks.push(Stack { frames: frames.collect() });
                self.by_content.insert(ids.as_flattened().into(), idx);
                idx
            }
        };
        self.hold(key, frames, idx);
        // Every frame dict of the list is held now (`frame` keeps them), so their addresses
        // name them for as long as the table lives.
        if all_dicts {
            self.by_frame_ptrs.insert(self.scratch[..].into(), idx);
        }
        Ok(Some(idx))
    }

    /// Remember that the list `frames` at `key` is stack `idx`, keeping the list alive.
    fn hold(&mut self, key: usize, frames: &Value, idx: u32) {
        self.by_ptr.insert(key, idx);
        self.held_lists.push(frames.clone());
    }

    /// Our index for stack `theirs` of another table (the reading thread's), numbered in order
    /// of first use as [`Stacks::intern`] numbers stacks, so a trace comes out the same
    /// whichever thread read its frames. The stacks themselves come at the end
    /// ([`Stacks::take_adopted`]). A table adopts or interns, never both.
    pub fn adopt(&mut self, theirs: u32) -> u32 {
        debug_assert!(self.stacks.is_empty(), "a table adopts or interns");
        let next = self.adopted.len() as u32;
        *self.adopted_as.entry(theirs).or_insert_with(|| {
            self.adopted.push(theirs);
            next
        })
    }

    /// The stacks adopted, from the table that interned them.
    pub fn take_adopted(&mut self, mut theirs: Vec<Stack>) {
        if self.adopted.is_empty() {
            return;
        }
        self.stacks =
            self.adopted.iter().map(|&t| std::mem::take(&mut theirs[t as usize])).collect();
    }

    /// A frame as (name id, file name id, line); a missing name or file name is "".
    fn frame(
        &mut self,
        ctx: Ctx<'_>,
        f: &Value,
        place: &dyn Fn() -> String,
    ) -> Result<[u32; 3], TraceError> {
        let Value::Dict(dict) = f else {
            return Err(ctx.expected(place(), "a frame dict", f));
        };
        let ptr = Rc::as_ptr(dict) as usize;
        if let Some(&frame) = self.frames_by_ptr.get(&ptr) {
            return Ok(frame);
        }
        let mut text = |field: &str| -> Result<u32, TraceError> {
            match f.get(field) {
                Some(Value::Str(s)) => Ok(self.strings.id(s)),
                Some(other) => Err(ctx.expected(format!("{}.{field}", place()), "a str", other)),
                None => Ok(self.strings.by_text("")),
            }
        };
        let (name, filename) = (text("name")?, text("filename")?);
        let line = match f.get("line") {
            Some(v) => {
                let i = ctx.int(v, || format!("{}.line", place()))?;
                // C++ frames without a line carry 0, generated code `size_t(-1)` (read as -1):
                // both are "no line", as is anything else outside u32.
                u32::try_from(i).unwrap_or(0)
            }
            None => 0,
        };
        let frame = [name, filename, line];
        self.frames_by_ptr.insert(ptr, frame);
        self.held_frames.push(f.clone());
        Ok(frame)
    }
}
