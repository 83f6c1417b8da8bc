//! Deduplicating `frames` lists into `Trace::stacks`.
//!
//! PyTorch already shares identical tracebacks as one Python object, and the pickle keeps that
//! sharing (one `Rc` here), so the first lookup is by pointer: a stack seen before costs one
//! hash of a pointer, and only new lists are read frame by frame and hashed by content.

use super::entries::Ctx;
use crate::addr_map::AddrMap;
use crate::error::TraceError;
use crate::pickle::Value;
use allocsim_core::{Stack, StackFrame};
use std::collections::HashMap;

#[derive(Default)]
pub struct Stacks {
    by_ptr: AddrMap<usize, u32>,
    by_content: HashMap<Stack, u32>,
    pub stacks: Vec<Stack>,
}

impl Stacks {
    /// The index of the stack `frames` names; `None` for an empty list.
    pub fn intern(
        &mut self,
        ctx: Ctx<'_>,
        frames: &Value,
        place: &dyn Fn() -> String,
    ) -> Result<Option<u32>, TraceError> {
        let Value::List(list) = frames else {
            return Err(ctx.expected(place(), "a list", frames));
        };
        if list.is_empty() {
            return Ok(None);
        }
        // The Value tree outlives this table, so a pointer names one list for its lifetime.
        let key = std::rc::Rc::as_ptr(list) as usize;
        if let Some(&idx) = self.by_ptr.get(&key) {
            return Ok(Some(idx));
        }
        let mut stack = Stack { frames: Vec::with_capacity(list.len()) };
        for (j, f) in list.iter().enumerate() {
            stack.frames.push(frame(ctx, f, &|| format!("{}[{j}]", place()))?);
        }
        let next = u32::try_from(self.stacks.len())
            .map_err(|_| ctx.err(place(), "more than 2^32 distinct stacks"))?;
        let idx = *self.by_content.entry(stack).or_insert_with_key(|s| {
            self.stacks.push(s.clone());
            next
        });
        self.by_ptr.insert(key, idx);
        Ok(Some(idx))
    }
}

fn frame(ctx: Ctx<'_>, f: &Value, place: &dyn Fn() -> String) -> Result<StackFrame, TraceError> {
    if f.as_dict().is_none() {
        return Err(ctx.expected(place(), "a frame dict", f));
    }
    let text = |field: &str| -> Result<String, TraceError> {
        match f.get(field) {
            Some(Value::Str(s)) => Ok(s.to_string()),
            Some(other) => Err(ctx.expected(format!("{}.{field}", place()), "a str", other)),
            None => Ok(String::new()),
        }
    };
    let line = match f.get("line") {
        Some(v) => {
            let i = ctx.int(v, || format!("{}.line", place()))?;
            // C++ frames without a line carry 0; anything outside u32 is not a line number.
            u32::try_from(i)
                .map_err(|_| ctx.err(format!("{}.line", place()), format!("bad line {i}")))?
        }
        None => 0,
    };
    Ok(StackFrame { name: text("name")?, filename: text("filename")?, line })
}
