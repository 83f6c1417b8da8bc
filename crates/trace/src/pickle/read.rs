//! The pickle virtual machine, restricted to building data.
//!
//! Shape, and why:
//! - Opcodes that import or call anything (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`,
//!   `OBJ`, `NEWOBJ`, `NEWOBJ_EX`, `EXT*`, `PERSID`) are refused where they stand, with their
//!   byte offset: there is no object model behind this VM, so nothing can be executed.
//! - Python mutates memoized containers after memoizing them (`EMPTY_DICT MEMOIZE MARK ...
//!   SETITEMS`) and shares them by reference. So a memoized container moves into an arena and
//!   the stack keeps a `Ref` to it; mutations go to the arena, and references are resolved
//!   once at `STOP` into shared `Rc`s. A reference cycle is found there and refused.
//! - Every container's nesting depth is tracked as it is built, so neither building, resolving
//!   nor dropping a value can recurse deeper than [`Limits::max_depth`].
//! - Memory is charged as values are made (an estimate per node plus payload bytes) against
//!   [`Limits::max_value_bytes`], so a small compressed file cannot expand into unbounded memory.

use super::input::{Input, InputError};
use super::opcodes::{self as op, name};
use super::{Limits, PickleError, PickleErrorKind as K, Value};
use std::collections::HashMap;
use std::io::Read;
use std::rc::Rc;

/// A value under construction. Containers hold nodes so they can contain `Ref`s.
enum Node {
    V(Value),
    List(Vec<Node>),
    Tuple(Vec<Node>),
    Dict(Vec<(Node, Node)>),
    /// An arena entry: a memoized container.
    Ref(u32),
}

impl Node {
    fn is_container(&self) -> bool {
        matches!(self, Node::List(_) | Node::Tuple(_) | Node::Dict(_))
    }

    fn type_name(&self) -> &'static str {
        match self {
            Node::V(v) => v.type_name(),
            Node::List(_) => "list",
            Node::Tuple(_) => "tuple",
            Node::Dict(_) => "dict",
            Node::Ref(_) => "memoized object",
        }
    }

    /// A copy for `GET`/`DUP`: scalars share their payload, references stay references.
    fn share(&self) -> Option<Node> {
        match self {
            Node::V(v) => Some(Node::V(v.clone())),
            Node::Ref(id) => Some(Node::Ref(*id)),
            _ => None,
        }
    }
}

struct Slot {
    node: Node,
    depth: u32,
}

/// A memoized container: being built (the build depth lives in its stack slot or in
/// `arena_depth`), being resolved (seeing it again means a cycle), or resolved with its height.
enum Arena {
    Building(Node),
    Busy,
    Done(Value, u32),
}

/// Estimated bytes of one node, charged against the memory limit.
const NODE_COST: u64 = 48;

struct Vm<'l, R> {
    input: Input<R>,
    limits: &'l Limits,
    stack: Vec<Slot>,
    marks: Vec<usize>,
    memo: Vec<Option<Node>>,
    sparse_memo: HashMap<u64, Node>,
    memo_len: usize,
    arena: Vec<Arena>,
    /// Nesting depth of each arena container as built so far.
    arena_depth: Vec<u32>,
    charged: u64,
    scratch: Vec<u8>,
    /// Offset and opcode being executed, for errors.
    at: u64,
    opcode: u8,
}

/// Read one pickle from `reader` and return its value, then read the rest of the stream (which
/// is ignored, as Python does) so that a compressed stream's checksum is verified. See the
/// module doc.
pub fn read<R: Read>(reader: R, limits: &Limits) -> Result<Value, PickleError> {
    let mut vm = Vm {
        input: Input::new(reader),
        limits,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        sparse_memo: HashMap::new(),
        memo_len: 0,
        arena: Vec::new(),
        arena_depth: Vec::new(),
        charged: 0,
        scratch: Vec::new(),
        at: 0,
        opcode: 0,
    };
    vm.start()?;
    loop {
        vm.at = vm.input.offset();
        vm.opcode = match vm.input.next_byte() {
            Ok(Some(b)) => b,
            Ok(None) => return Err(vm.err(K::NoStop)),
            Err(e) => return Err(vm.input_err(e)),
        };
        if vm.opcode == op::STOP {
            let top = vm.pop()?;
            let (value, _) = vm.finish(top.node, 0)?;
            vm.at = vm.input.offset();
            return match vm.input.drain() {
                Ok(_) => Ok(value),
                Err(InputError::Io(e)) => Err(vm.err(K::AfterStop(e))),
                Err(InputError::Eof) => Ok(value),
            };
        }
        match vm.step() {
            Ok(()) => {}
            Err(Failure::Input(e)) => return Err(vm.input_err(e)),
            Err(Failure::Pickle(e)) => return Err(e),
        }
    }
}

enum Failure {
    Input(InputError),
    Pickle(PickleError),
}

impl From<InputError> for Failure {
    fn from(e: InputError) -> Self {
        Failure::Input(e)
    }
}

impl From<PickleError> for Failure {
    fn from(e: PickleError) -> Self {
        Failure::Pickle(e)
    }
}

type Step = Result<(), Failure>;

impl<R: Read> Vm<'_, R> {
    fn err(&self, kind: K) -> PickleError {
        PickleError { offset: self.at, kind }
    }

    fn input_err(&self, e: InputError) -> PickleError {
        match e {
            InputError::Eof if self.input.offset() == 0 => self.err(K::Empty),
            InputError::Eof => self.err(K::Truncated(name(self.opcode))),
            InputError::Io(e) => self.err(K::Io(e)),
        }
    }

    /// The first opcode must be `PROTO` 2..=5: anything else is not a file we read.
    fn start(&mut self) -> Result<(), PickleError> {
        let first = self.input.next_byte().map_err(|e| self.input_err(e))?;
        match first {
            None => Err(self.err(K::Empty)),
            Some(op::PROTO) => {
                self.opcode = op::PROTO;
                let v = self.input.byte().map_err(|e| self.input_err(e))?;
                if (2..=5).contains(&v) {
                    Ok(())
                } else {
                    Err(self.err(K::Protocol(v)))
                }
            }
            Some(b) => Err(self.err(K::NotAPickle(b))),
        }
    }

    fn charge(&mut self, bytes: u64) -> Result<(), PickleError> {
        self.charged = self.charged.saturating_add(bytes);
        if self.charged > self.limits.max_value_bytes {
            return Err(self.err(K::MemoryLimit(self.limits.max_value_bytes)));
        }
        Ok(())
    }

    fn push_value(&mut self, v: Value) -> Step {
        self.charge(NODE_COST)?;
        self.stack.push(Slot { node: Node::V(v), depth: 0 });
        Ok(())
    }

    fn pop(&mut self) -> Result<Slot, PickleError> {
        match self.stack.pop() {
            Some(s) if self.marks.last().is_none_or(|&m| m <= self.stack.len()) => Ok(s),
            Some(s) => {
                // Python refuses to pop through a MARK too (it is not on its stack).
                self.stack.push(s);
                Err(self.err(K::StackUnderflow(name(self.opcode))))
            }
            None => Err(self.err(K::StackUnderflow(name(self.opcode)))),
        }
    }

    /// Items pushed since the last MARK, with the mark removed.
    fn pop_mark(&mut self) -> Result<Vec<Slot>, PickleError> {
        let m = self.marks.pop().ok_or_else(|| self.err(K::NoMark(name(self.opcode))))?;
        Ok(self.stack.split_off(m))
    }

    fn check_depth(&self, depth: u32) -> Result<u32, PickleError> {
        if depth > self.limits.max_depth {
            Err(self.err(K::TooDeep(self.limits.max_depth)))
        } else {
            Ok(depth)
        }
    }

    fn push_container(&mut self, node: Node, children: &[u32]) -> Step {
        let depth = self.check_depth(1 + children.iter().copied().max().unwrap_or(0))?;
        self.charge(NODE_COST)?;
        self.stack.push(Slot { node, depth });
        Ok(())
    }

    fn make_tuple(&mut self, slots: Vec<Slot>) -> Step {
        let depths: Vec<u32> = slots.iter().map(|s| s.depth).collect();
        let items = slots.into_iter().map(|s| s.node).collect();
        self.push_container(Node::Tuple(items), &depths)
    }

    fn small_tuple(&mut self, n: usize) -> Step {
        if self.stack.len() < n + self.marks.last().copied().unwrap_or(0) {
            return Err(self.err(K::StackUnderflow(name(self.opcode))).into());
        }
        let slots = self.stack.split_off(self.stack.len() - n);
        self.make_tuple(slots)
    }

    fn text_arg(&mut self) -> Result<String, Failure> {
        let mut line = std::mem::take(&mut self.scratch);
        let complete = self.input.line(64, &mut line)?;
        let text = String::from_utf8_lossy(&line).into_owned();
        self.scratch = line;
        if !complete {
            return Err(self.err(K::BadText(name(self.opcode), text)).into());
        }
        Ok(text)
    }

    fn text_int(&mut self) -> Result<i64, Failure> {
        let text = self.text_arg()?;
        let digits = text.strip_suffix('L').unwrap_or(&text);
        digits.parse().map_err(|_| self.err(K::BadText(name(self.opcode), text.clone())).into())
    }

    fn text_index(&mut self) -> Result<u64, Failure> {
        let text = self.text_arg()?;
        text.parse().map_err(|_| self.err(K::BadText(name(self.opcode), text.clone())).into())
    }

    fn string(&mut self, n: u64, as_str: bool) -> Step {
        self.charge(n)?;
        let mut scratch = std::mem::take(&mut self.scratch);
        let v = self.input.with_bytes(n, &mut scratch, |b| {
            if !as_str {
                return Value::Bytes(Rc::from(b));
            }
            // Python writes lone surrogates with `surrogatepass`; they become U+FFFD here
            // rather than failing a whole trace over one odd file name.
            match std::str::from_utf8(b) {
                Ok(s) => Value::Str(Rc::from(s)),
                Err(_) => Value::Str(Rc::from(String::from_utf8_lossy(b).as_ref())),
            }
        });
        self.scratch = scratch;
        self.push_value(v?)
    }

    fn long(&mut self, n: u64) -> Step {
        if n > 8 {
            return Err(self.err(K::IntTooWide(n)).into());
        }
        let mut bytes = [0u8; 8];
        let mut scratch = std::mem::take(&mut self.scratch);
        let got = self.input.with_bytes(n, &mut scratch, |b| bytes[..b.len()].copy_from_slice(b));
        self.scratch = scratch;
        got?;
        let n = n as usize;
        if n > 0 && bytes[n - 1] & 0x80 != 0 {
            bytes[n..].fill(0xff);
        }
        self.push_value(Value::Int(i64::from_le_bytes(bytes)))
    }

    fn memo_get(&mut self, idx: u64) -> Step {
        let found = match usize::try_from(idx).ok().and_then(|i| self.memo.get(i)) {
            Some(Some(n)) => n.share(),
            _ => self.sparse_memo.get(&idx).and_then(Node::share),
        };
        let node = found.ok_or_else(|| self.err(K::MemoMissing(idx)))?;
        self.charge(NODE_COST)?;
        self.stack.push(Slot { node, depth: 0 });
        Ok(())
    }

    /// Store the top of the stack under `idx`; a container moves to the arena first.
    fn memo_put(&mut self, idx: u64) -> Step {
        let top = self.stack.last_mut().ok_or_else(|| PickleError {
            offset: self.at,
            kind: K::StackUnderflow(name(self.opcode)),
        })?;
        if top.node.is_container() {
            let id = u32::try_from(self.arena.len()).unwrap_or(u32::MAX);
            let node = std::mem::replace(&mut top.node, Node::Ref(id));
            self.arena.push(Arena::Building(node));
            self.arena_depth.push(top.depth);
            top.depth = 0;
        }
        let shared = top.node.share().expect("containers were moved to the arena");
        let is_new = match usize::try_from(idx) {
            Ok(i) if i < self.memo.len() => self.memo[i].replace(shared).is_none(),
            Ok(i) if i == self.memo.len() => {
                self.memo.push(Some(shared));
                true
            }
            _ => self.sparse_memo.insert(idx, shared).is_none(),
        };
        self.memo_len += usize::from(is_new);
        if self.memo_len.max(self.arena.len()) > self.limits.max_memo {
            return Err(self.err(K::MemoLimit(self.limits.max_memo)).into());
        }
        self.charge(NODE_COST)?;
        Ok(())
    }

    /// The container that APPEND(S)/SETITEM(S) adds to: the slot at `index`, or the arena
    /// entry it refers to. Returns the container and its depth.
    fn target(&mut self, index: usize) -> Result<(&mut Node, &mut u32), PickleError> {
        let at = self.at;
        let opname = name(self.opcode);
        let Some(slot) = self.stack.get_mut(index) else {
            return Err(PickleError { offset: at, kind: K::StackUnderflow(opname) });
        };
        match slot.node {
            Node::Ref(id) => {
                match (self.arena.get_mut(id as usize), self.arena_depth.get_mut(id as usize)) {
                    (Some(Arena::Building(node)), Some(depth)) => Ok((node, depth)),
                    _ => Err(PickleError { offset: at, kind: K::Cycle }),
                }
            }
            _ => Ok((&mut slot.node, &mut slot.depth)),
        }
    }

    fn extend_list(&mut self, items: Vec<Slot>) -> Step {
        let below = self.stack.len().checked_sub(1).ok_or_else(|| PickleError {
            offset: self.at,
            kind: K::StackUnderflow(name(self.opcode)),
        })?;
        let child_depth = items.iter().map(|s| s.depth + 1).max().unwrap_or(0);
        let (at, opname, max_depth) = (self.at, name(self.opcode), self.limits.max_depth);
        let (node, depth) = self.target(below)?;
        let Node::List(list) = node else {
            let kind = K::BadTarget { op: opname, target: node.type_name(), expected: "list" };
            return Err(PickleError { offset: at, kind }.into());
        };
        list.extend(items.into_iter().map(|s| s.node));
        *depth = (*depth).max(child_depth);
        if *depth > max_depth {
            return Err(PickleError { offset: at, kind: K::TooDeep(max_depth) }.into());
        }
        Ok(())
    }

    fn extend_dict(&mut self, items: Vec<Slot>) -> Step {
        if items.len() & 1 != 0 {
            return Err(self.err(K::OddItems).into());
        }
        let below = self.stack.len().checked_sub(1).ok_or_else(|| PickleError {
            offset: self.at,
            kind: K::StackUnderflow(name(self.opcode)),
        })?;
        let child_depth = items.iter().map(|s| s.depth + 1).max().unwrap_or(0);
        let (at, opname, max_depth) = (self.at, name(self.opcode), self.limits.max_depth);
        let (node, depth) = self.target(below)?;
        let Node::Dict(pairs) = node else {
            let kind = K::BadTarget { op: opname, target: node.type_name(), expected: "dict" };
            return Err(PickleError { offset: at, kind }.into());
        };
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            pairs.push((k.node, v.node));
        }
        *depth = (*depth).max(child_depth);
        if *depth > max_depth {
            return Err(PickleError { offset: at, kind: K::TooDeep(max_depth) }.into());
        }
        Ok(())
    }

    /// Pop the `n` topmost items (above the last MARK) for APPEND/SETITEM.
    fn pop_n(&mut self, n: usize) -> Result<Vec<Slot>, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() < floor + n {
            return Err(self.err(K::StackUnderflow(name(self.opcode))));
        }
        Ok(self.stack.split_off(self.stack.len() - n))
    }

    fn step(&mut self) -> Step {
        let code = self.opcode;
        match code {
            op::PROTO => {
                let v = self.input.byte()?;
                if !(2..=5).contains(&v) {
                    return Err(self.err(K::Protocol(v)).into());
                }
            }
            op::FRAME => {
                // Framing only groups opcodes for buffered reading; the length is not needed.
                self.input.array::<8>()?;
            }
            op::MARK => self.marks.push(self.stack.len()),
            op::POP => {
                if self.marks.last() == Some(&self.stack.len()) {
                    self.marks.pop();
                } else {
                    self.pop()?;
                }
            }
            op::POP_MARK => {
                self.pop_mark()?;
            }
            op::DUP => {
                let top = self.stack.last().ok_or_else(|| self.err(K::StackUnderflow("DUP")))?;
                let unsupported = K::Unsupported("DUP of a container");
                let node =
                    top.node.share().ok_or(PickleError { offset: self.at, kind: unsupported })?;
                self.charge(NODE_COST)?;
                self.stack.push(Slot { node, depth: 0 });
            }
            op::NONE => self.push_value(Value::None)?,
            op::NEWTRUE => self.push_value(Value::Bool(true))?,
            op::NEWFALSE => self.push_value(Value::Bool(false))?,
            op::BININT1 => {
                let b = self.input.byte()?;
                self.push_value(Value::Int(i64::from(b)))?
            }
            op::BININT2 => {
                let b = self.input.array::<2>()?;
                self.push_value(Value::Int(i64::from(u16::from_le_bytes(b))))?
            }
            op::BININT => {
                let b = self.input.array::<4>()?;
                self.push_value(Value::Int(i64::from(i32::from_le_bytes(b))))?
            }
            op::LONG1 => {
                let n = self.input.byte()?;
                self.long(u64::from(n))?
            }
            op::LONG4 => {
                let n = u32::from_le_bytes(self.input.array::<4>()?);
                self.long(u64::from(n))?
            }
            op::INT => {
                let text = self.text_arg()?;
                let v = match text.as_str() {
                    "00" => Value::Bool(false),
                    "01" => Value::Bool(true),
                    t => Value::Int(
                        t.parse().map_err(|_| self.err(K::BadText("INT", text.clone())))?,
                    ),
                };
                self.push_value(v)?
            }
            op::LONG => {
                let v = self.text_int()?;
                self.push_value(Value::Int(v))?
            }
            op::FLOAT => {
                let text = self.text_arg()?;
                let v = text.parse().map_err(|_| self.err(K::BadText("FLOAT", text.clone())))?;
                self.push_value(Value::Float(v))?
            }
            op::BINFLOAT => {
                let b = self.input.array::<8>()?;
                self.push_value(Value::Float(f64::from_be_bytes(b)))?
            }
            op::SHORT_BINUNICODE => {
                let n = self.input.byte()?;
                self.string(u64::from(n), true)?
            }
            op::BINUNICODE => {
                let n = u32::from_le_bytes(self.input.array::<4>()?);
                self.string(u64::from(n), true)?
            }
            op::BINUNICODE8 => {
                let n = u64::from_le_bytes(self.input.array::<8>()?);
                self.string(n, true)?
            }
            // Python 2 `str`: Python 3 reads it as text (encoding='ASCII' by default).
            op::SHORT_BINSTRING => {
                let n = self.input.byte()?;
                self.string(u64::from(n), true)?
            }
            op::BINSTRING => {
                let n = i32::from_le_bytes(self.input.array::<4>()?);
                let n = u64::try_from(n).map_err(|_| self.err(K::NegativeLength(n.into())))?;
                self.string(n, true)?
            }
            op::SHORT_BINBYTES => {
                let n = self.input.byte()?;
                self.string(u64::from(n), false)?
            }
            op::BINBYTES => {
                let n = u32::from_le_bytes(self.input.array::<4>()?);
                self.string(u64::from(n), false)?
            }
            op::BINBYTES8 | op::BYTEARRAY8 => {
                let n = u64::from_le_bytes(self.input.array::<8>()?);
                self.string(n, false)?
            }
            op::EMPTY_LIST => self.push_container(Node::List(Vec::new()), &[])?,
            op::EMPTY_DICT => self.push_container(Node::Dict(Vec::new()), &[])?,
            op::EMPTY_TUPLE => self.push_container(Node::Tuple(Vec::new()), &[])?,
            op::TUPLE1 => self.small_tuple(1)?,
            op::TUPLE2 => self.small_tuple(2)?,
            op::TUPLE3 => self.small_tuple(3)?,
            op::TUPLE => {
                let slots = self.pop_mark()?;
                self.make_tuple(slots)?
            }
            op::LIST => {
                let slots = self.pop_mark()?;
                let depths: Vec<u32> = slots.iter().map(|s| s.depth).collect();
                let items = slots.into_iter().map(|s| s.node).collect();
                self.push_container(Node::List(items), &depths)?
            }
            op::DICT => {
                let slots = self.pop_mark()?;
                self.push_container(Node::Dict(Vec::new()), &[])?;
                self.extend_dict(slots)?
            }
            op::APPEND => {
                let items = self.pop_n(1)?;
                self.extend_list(items)?
            }
            op::APPENDS => {
                let items = self.pop_mark()?;
                self.extend_list(items)?
            }
            op::SETITEM => {
                let items = self.pop_n(2)?;
                self.extend_dict(items)?
            }
            op::SETITEMS => {
                let items = self.pop_mark()?;
                self.extend_dict(items)?
            }
            op::MEMOIZE => self.memo_put(self.memo_len as u64)?,
            op::PUT => {
                let idx = self.text_index()?;
                self.memo_put(idx)?
            }
            op::BINPUT => {
                let idx = self.input.byte()?;
                self.memo_put(u64::from(idx))?
            }
            op::LONG_BINPUT => {
                let idx = u32::from_le_bytes(self.input.array::<4>()?);
                self.memo_put(u64::from(idx))?
            }
            op::GET => {
                let idx = self.text_index()?;
                self.memo_get(idx)?
            }
            op::BINGET => {
                let idx = self.input.byte()?;
                self.memo_get(u64::from(idx))?
            }
            op::LONG_BINGET => {
                let idx = u32::from_le_bytes(self.input.array::<4>()?);
                self.memo_get(u64::from(idx))?
            }
            op::GLOBAL
            | op::STACK_GLOBAL
            | op::REDUCE
            | op::BUILD
            | op::INST
            | op::OBJ
            | op::NEWOBJ
            | op::NEWOBJ_EX
            | op::EXT1
            | op::EXT2
            | op::EXT4
            | op::PERSID
            | op::BINPERSID => {
                return Err(self.err(K::Refused { name: name(code), code }).into());
            }
            op::EMPTY_SET | op::ADDITEMS | op::FROZENSET => {
                return Err(self.err(K::Unsupported("sets are in no trace format")).into());
            }
            op::NEXT_BUFFER | op::READONLY_BUFFER => {
                return Err(self.err(K::Unsupported("out-of-band buffers")).into());
            }
            op::STRING | op::UNICODE => {
                return Err(self.err(K::Unsupported("protocol 0 text strings")).into());
            }
            other => return Err(self.err(K::UnknownOpcode(other)).into()),
        }
        Ok(())
    }

    /// Turn the final node into a `Value`, resolving arena references. `depth` is where the
    /// node sits; the result comes with its own height, so a shared value reused deeper down
    /// is still held to the depth limit.
    fn finish(&mut self, node: Node, depth: u32) -> Result<(Value, u32), PickleError> {
        self.check_depth(depth)?;
        Ok(match node {
            Node::V(v) => (v, 0),
            Node::List(items) => {
                let (items, height) = self.finish_all(items, depth)?;
                (Value::List(Rc::new(items)), height)
            }
            Node::Tuple(items) => {
                let (items, height) = self.finish_all(items, depth)?;
                (Value::Tuple(Rc::new(items)), height)
            }
            Node::Dict(pairs) => {
                let mut out = Vec::with_capacity(pairs.len());
                let mut height = 1;
                for (k, v) in pairs {
                    let (k, hk) = self.finish(k, depth + 1)?;
                    let (v, hv) = self.finish(v, depth + 1)?;
                    height = height.max(1 + hk.max(hv));
                    out.push((k, v));
                }
                (Value::Dict(Rc::new(out)), height)
            }
            Node::Ref(id) => self.resolve(id, depth)?,
        })
    }

    fn finish_all(
        &mut self,
        items: Vec<Node>,
        depth: u32,
    ) -> Result<(Vec<Value>, u32), PickleError> {
        let mut out = Vec::with_capacity(items.len());
        let mut height = 1;
        for item in items {
            let (v, h) = self.finish(item, depth + 1)?;
            height = height.max(1 + h);
            out.push(v);
        }
        Ok((out, height))
    }

    fn resolve(&mut self, id: u32, depth: u32) -> Result<(Value, u32), PickleError> {
        let Some(slot) = self.arena.get_mut(id as usize) else {
            return Err(self.err(K::Cycle));
        };
        match std::mem::replace(slot, Arena::Busy) {
            Arena::Building(node) => {
                let (v, height) = self.finish(node, depth)?;
                self.arena[id as usize] = Arena::Done(v.clone(), height);
                Ok((v, height))
            }
            Arena::Done(v, height) => {
                self.arena[id as usize] = Arena::Done(v.clone(), height);
                self.check_depth(depth + height)?;
                Ok((v, height))
            }
            Arena::Busy => Err(self.err(K::Cycle)),
        }
    }
}
