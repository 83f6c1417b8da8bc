//! Streaming the records of one list of flat dicts, without building them.
//!
//! A PyTorch snapshot is a dict whose `device_traces[0]` holds one small dict per allocator
//! event, hundreds of thousands of them. Building each as a [`Value`], memoizing it and
//! dropping the tree again was most of the time of reading a snapshot. [`read_records`] runs
//! the same VM, but when it reaches that list it reads each dict's pairs straight from the
//! stream, puts the values of the keys the caller asked for into a reused array, and hands the
//! array to a sink; the list stays empty in the tree it returns.
//!
//! It is a shortcut, never a second reader with its own rules. Whatever it does not expect (a
//! record that is not `EMPTY_DICT [memo] MARK pairs SETITEMS`, a `GET` of a streamed dict, a
//! list that changes after streaming, a record the sink refuses, and every error) makes it
//! give up with `None`, and the caller reads the file again with the generic reader, which
//! gives the value or the error, with its byte offset, that it always gave. Nothing is ever
//! executed here either: the only opcodes read in place are scalars, memo puts and gets,
//! `MARK`, `SETITEMS`, `FRAME`, and the `EMPTY_LIST`, `APPEND` and `APPENDS` of a list of
//! GETs (a stack whose frames were all seen before); a value that is anything else (a stack
//! with a new frame dict) goes through the generic [`Vm::step`], which refuses the
//! code-running opcodes.

use super::budget::{own_bytes, unique_bytes};
use super::inplace::{list_end, list_items, memo_value, FLAT_LIMIT, FLAT_WINDOW_BYTES};
use super::lists::{ListCache, ListsByBytes};
use super::memo::{Memo, MemoRef, MemoTable};
use super::opcodes as op;
use super::read::{release, Failure, Slot, Vm};
use super::strings::StrCache;
use super::template::{Lists, Seen, Templates};
use super::{Limits, PickleError, Value};
use std::io::Read;
use std::rc::Rc;

/// Which list to stream and what to keep of each record.
#[derive(Debug, Clone, Copy)]
pub struct RecordSpec<'a> {
    /// A key of the top-level dict whose value is a list of lists: the first of those lists
    /// is streamed (`device_traces` streams `device_traces[0]`).
    pub top_key: &'a str,
    /// The keys whose values the sink receives, in this order; other keys are read and
    /// dropped. At most 64.
    pub fields: &'a [&'a str],
}

/// What [`read_records`] returns when it could stream.
#[derive(Debug)]
pub struct Records {
    /// The whole pickle, with the streamed list left empty.
    pub root: Value,
    /// Whether the list was found and its records went to the sink; when false the tree is
    /// complete and the sink was never called.
    pub streamed: bool,
}

/// A key that is none of the spec's fields.
const IGNORED: u8 = u8::MAX;
/// Keys remembered by their position in a record: records repeat their keys in one order.
const KEY_CACHE: usize = 16;

struct State<'k, F> {
    spec: RecordSpec<'k>,
    sink: F,
    /// The fields of the record being read. A field keeps its value from one record to the
    /// next (so an int is updated in place, with no `Value` built) and is cleared at delivery
    /// only if the record did not set it.
    fields: Vec<Option<Value>>,
    /// Bit `f` set iff the record being read set field `f`.
    present: u64,
    /// Bit `f` set iff field `f` holds a value (the last record delivered set it).
    held: u64,
    /// The key string last seen at each position of a record, and its field. The `Rc` is
    /// kept so its address names this string for as long as it is cached.
    key_cache: Vec<Option<(Rc<String>, u8)>>,
    /// The memo key of the key string last read at each position of a flat record, and its
    /// field. Valid while memo entries only get added, so the opcode reader clears it.
    memo_key_cache: [(u64, u8); KEY_CACHE],
    /// The string value last read at each position of a record: most repeat (`"N/A"`).
    value_cache: Vec<Option<Rc<String>>>,
    /// The items of a list being read in place, reused so a list is allocated once, whole.
    items: Vec<Value>,
    /// The lists read in place, so that equal ones (a stack's frames) are held once.
    lists: ListCache,
    /// The same lists by the bytes that build them, found without reading their items.
    by_bytes: ListsByBytes,
    /// The streamed list, once found (for the identity check at the end).
    list: Option<*const Vec<Value>>,
    /// The shapes of the last records read in place, to read the next ones by.
    templates: Templates,
}

impl<F: FnMut(&[Option<Value>]) -> bool> State<'_, F> {
    /// The spec field that `key`, the key at position `at` of its record, names; `IGNORED`
    /// for any other key.
    #[inline]
    fn field_of(&mut self, key: &Value, at: usize) -> u8 {
        match key {
            Value::Str(s) => self.field_of_str(s, at),
            _ => IGNORED,
        }
    }

    /// [`State::field_of`] for a key known to be a string.
    #[inline]
    fn field_of_str(&mut self, s: &Rc<String>, at: usize) -> u8 {
        let slot = at % KEY_CACHE;
        if let Some((cached, field)) = &self.key_cache[slot] {
            if Rc::ptr_eq(cached, s) {
                return *field;
            }
        }
        self.field_of_slow(s, slot)
    }

    #[cold]
    fn field_of_slow(&mut self, s: &Rc<String>, slot: usize) -> u8 {
        let field = self.spec.fields.iter().position(|f| *f == s.as_str());
        let field = field.map_or(IGNORED, |f| f as u8);
        self.key_cache[slot] = Some((s.clone(), field));
        field
    }

    /// The string `bytes`, shared with the one last read at key position `at` when equal.
    #[inline]
    fn string_at(&mut self, at: usize, bytes: &[u8], strings: &mut StrCache) -> Option<Value> {
        let slot = &mut self.value_cache[at % KEY_CACHE];
        if let Some(s) = slot {
            if s.as_bytes() == bytes {
                return Some(Value::Str(s.clone()));
            }
        }
        let s = strings.get(std::str::from_utf8(bytes).ok()?);
        *slot = Some(s.clone());
        Some(Value::Str(s))
    }

    #[inline]
    fn set(&mut self, field: u8, value: Value) {
        self.fields[usize::from(field)] = Some(value);
        self.present |= 1 << field;
    }

    /// Forget the fields read so far (a record read again from its start).
    fn clear(&mut self) {
        self.fields.iter_mut().for_each(|f| *f = None);
        (self.present, self.held) = (0, 0);
    }

    #[inline(always)]
    fn deliver(&mut self) -> Result<(), Failure> {
        // Records mostly set the same fields: only those the last one set and this one did
        // not are cleared.
        let mut stale = self.held & !self.present;
        while stale != 0 {
            self.fields[stale.trailing_zeros() as usize] = None;
            stale &= stale - 1;
        }
        (self.held, self.present) = (self.present, 0);
        let ok = (self.sink)(&self.fields);
        if ok {
            Ok(())
        } else {
            Err(Failure::Unusual)
        }
    }
}

/// Read one pickle like [`super::from_reader_with`], streaming the records of the list that
/// `spec` names into `sink`. `Ok(None)`: read the file with the generic reader instead (see
/// the module doc); the sink may have seen records by then. `Err`: a limit on memory or work
/// was reached ([`super::PickleErrorKind::is_budget`]), which the generic reader, holding
/// more and doing the same work, would reach too.
///
/// The sink gets the fields of one record (`None` where the key is absent; the last of
/// repeated keys wins, as in Python) and returns false to refuse it, which sends the file
/// back to the generic reader.
pub fn read_records<R: Read>(
    reader: R,
    limits: &Limits,
    spec: RecordSpec<'_>,
    sink: impl FnMut(&[Option<Value>]) -> bool,
) -> Result<Option<Records>, PickleError> {
    read_records_after(reader, limits, spec, |_| {}, sink)
}

/// [`read_records`], calling `before` once the list is found, before its first record, with
/// the top-level dict's keys and values read before `top_key` (key, value, key, value, ...).
pub fn read_records_after<R: Read>(
    reader: R,
    limits: &Limits,
    spec: RecordSpec<'_>,
    before: impl FnOnce(&[Value]),
    sink: impl FnMut(&[Option<Value>]) -> bool,
) -> Result<Option<Records>, PickleError> {
    if spec.fields.len() > 64 {
        return Ok(None);
    }
    match stream(reader, limits, spec, before, sink) {
        Ok(records) => Ok(Some(records)),
        Err(Failure::Pickle(e)) if e.kind.is_budget() => Err(e),
        Err(_) => Ok(None),
    }
}

fn stream<R: Read>(
    reader: R,
    limits: &Limits,
    spec: RecordSpec<'_>,
    before: impl FnOnce(&[Value]),
    sink: impl FnMut(&[Option<Value>]) -> bool,
) -> Result<Records, Failure> {
    let mut before = Some(before);
    let mut state = State {
        spec,
        sink,
        fields: vec![None; spec.fields.len()],
        present: 0,
        held: 0,
        key_cache: vec![None; KEY_CACHE],
        memo_key_cache: [(u64::MAX, IGNORED); KEY_CACHE],
        value_cache: vec![None; KEY_CACHE],
        items: Vec::new(),
        lists: ListCache::default(),
        by_bytes: ListsByBytes::default(),
        list: None,
        templates: Templates::default(),
    };
    let mut vm = Vm::new(reader, limits);
    vm.start()?;
    // An opcode the list streamer read but left to the generic loop.
    let mut pending = None;
    loop {
        let code = match pending.take() {
            Some(code) => code,
            None => {
                vm.at = vm.input.offset();
                vm.input.next_byte()?.ok_or(Failure::Unusual)?
            }
        };
        vm.opcode = code;
        if code == op::STOP {
            let top = vm.pop()?;
            let root = release(top, &mut vm.memo);
            vm.input.drain()?;
            let streamed = match state.list {
                Some(list) if still_the_empty_list(&root, spec.top_key, list) => true,
                Some(_) => return Err(Failure::Unusual),
                None => false,
            };
            return Ok(Records { root, streamed });
        }
        vm.step()?;
        if code == op::EMPTY_LIST && state.list.is_none() && vm.at_record_list(spec.top_key) {
            if let Some(before) = before.take() {
                before(&vm.root_items_before_key());
            }
            pending = Some(vm.stream_list(&mut state)?);
        }
    }
}

/// `root[top_key][0]` is the list that was streamed, and nothing was added to it after.
fn still_the_empty_list(root: &Value, top_key: &str, list: *const Vec<Value>) -> bool {
    let first = root.get(top_key).and_then(Value::as_seq).and_then(|lists| lists.first());
    matches!(first, Some(Value::List(l)) if Rc::as_ptr(l) == list && l.is_empty())
}

fn is_memo_put(code: u8) -> bool {
    matches!(code, op::MEMOIZE | op::BINPUT | op::LONG_BINPUT)
}

impl<R: Read> Vm<'_, R> {
    /// Just after `EMPTY_LIST`: is the new list the first item of the list that is the value
    /// of `top_key` in the top-level dict, with both lists still empty and open?
    fn at_record_list(&self, top_key: &str) -> bool {
        let n = self.stack.len();
        if n < 4 {
            return false;
        }
        let open_empty_list = |i: usize| matches!(&self.stack[i].value, Value::List(l) if l.is_empty() && Rc::strong_count(l) == 1);
        let root_open = matches!(&self.stack[0].value, Value::Dict(d) if Rc::strong_count(d) == 1);
        let key = matches!(&self.stack[n - 3].value, Value::Str(s) if s.as_str() == top_key);
        // The key is an item of the root dict: whole pairs lie between the root's MARK (if
        // any) and the key; the outer list may have its own MARK right before the new list.
        let items_before_key = n - 4;
        let marks_fit = match *self.marks.as_slice() {
            [] => items_before_key == 0,
            [1] => items_before_key.is_multiple_of(2),
            [m] => m == n - 1 && items_before_key == 0,
            [1, m] => m == n - 1 && items_before_key.is_multiple_of(2),
            _ => false,
        };
        root_open && key && marks_fit && open_empty_list(n - 2) && open_empty_list(n - 1)
    }

    /// Where [`Vm::at_record_list`] holds: the root dict's keys and values before the key,
    /// which lie between the root's `MARK` (at stack length 1) and the key.
    fn root_items_before_key(&self) -> Vec<Value> {
        let n = self.stack.len();
        match self.stack.get(1..n - 3) {
            Some(items) if self.marks.first() == Some(&1) => {
                items.iter().map(|slot| slot.value.clone()).collect()
            }
            _ => Vec::new(),
        }
    }

    /// The next opcode, skipping `FRAME`s (which only group opcodes for buffering).
    #[inline]
    fn next_op(&mut self) -> Result<u8, Failure> {
        loop {
            self.at = self.input.offset();
            let code = self.input.byte()?;
            if code != op::FRAME {
                self.opcode = code;
                return Ok(code);
            }
            self.idle()?;
            self.input.array::<8>()?;
        }
    }

    /// The key a memo put (`MEMOIZE`, `BINPUT`, `LONG_BINPUT`) stores under.
    fn memo_key(&mut self, code: u8) -> Result<u64, Failure> {
        Ok(match code {
            op::MEMOIZE => self.memo.len() as u64,
            op::BINPUT => u64::from(self.input.byte()?),
            _ => u64::from(u32::from_le_bytes(self.input.array::<4>()?)),
        })
    }

    /// Store `memo` under `key`, charging `cost` (the bytes of a value made for it) and the
    /// memo's growth.
    fn memo_store(&mut self, key: u64, memo: Memo, cost: u64) -> Result<(), Failure> {
        if self.memo.get(key).is_some() {
            self.idle()?;
        }
        self.memo_room(1)?;
        self.charge(cost)?;
        if let Some(Memo::Value(v, _)) = self.memo.set(key, memo) {
            self.dispose(v);
        }
        if self.memo.len() > self.limits.max_memo {
            return Err(Failure::Unusual);
        }
        self.memo_sync()?;
        Ok(())
    }

    /// The items of the record list: `MARK` records `APPENDS` batches or single records with
    /// `APPEND`, as CPython writes them. Returns the first opcode after the list, unread
    /// otherwise, for the generic loop.
    fn stream_list(
        &mut self,
        state: &mut State<'_, impl FnMut(&[Option<Value>]) -> bool>,
    ) -> Result<u8, Failure> {
        let at = self.stack.len() - 1;
        if let Value::List(l) = &self.stack[at].value {
            state.list = Some(Rc::as_ptr(l));
        }
        let (mut in_batch, mut single, mut started) = (false, false, false);
        loop {
            let code = self.next_op()?;
            match code {
                // The list's own memo entry: any GET of it sends the file to the generic reader.
                _ if is_memo_put(code) && !started && !in_batch => {
                    let key = self.memo_key(code)?;
                    self.memo_store(key, Memo::Streamed, 0)?;
                    started = true;
                }
                op::MARK if !in_batch && !single => {
                    in_batch = true;
                    started = true;
                }
                op::EMPTY_DICT if !single => {
                    started = true;
                    self.flat_or_record(state)?;
                    single = !in_batch;
                }
                op::APPENDS if in_batch => in_batch = false,
                op::APPEND if single => single = false,
                _ if in_batch || single => return Err(Failure::Unusual),
                _ => return Ok(code),
            }
        }
    }

    /// One record, just after its `EMPTY_DICT`: read in place from the buffer when it is
    /// flat and lies in the buffer whole, by the shape of one read before ([`Templates`]) or
    /// else by [`flat_record`] (then its shape is learned); else an opcode at a time.
    fn flat_or_record(
        &mut self,
        state: &mut State<'_, impl FnMut(&[Option<Value>]) -> bool>,
    ) -> Result<(), Failure> {
        // A flat record appends at most one memo entry per byte.
        self.growth_room(self.memo.append_growth_bytes(FLAT_WINDOW_BYTES))?;
        let window = self.input.window(FLAT_WINDOW_BYTES)?;
        let mark = self.memo.mark();
        let max_depth = self.limits.max_depth;
        let mut read = None;
        if let Some(w) = window.first_chunk::<FLAT_WINDOW_BYTES>() {
            let lists = Lists {
                by_bytes: &mut state.by_bytes,
                cache: &mut state.lists,
                items: &mut state.items,
                max_depth,
            };
            let (fields, present) = (&mut state.fields, &mut state.present);
            read = state.templates.read(w, &mut self.memo, lists, fields, present);
            if read.is_none() {
                self.memo.rollback(mark);
                state.present = 0;
            }
        }
        if read.is_none() {
            read = flat_record(window, &mut self.memo, &mut self.strings, state, max_depth);
            if let Some((used, _)) = read {
                let seen = Seen {
                    keys: &state.memo_key_cache,
                    fields: &state.fields,
                    strings: &state.value_cache,
                };
                state.templates.learn(&window[..used], &self.memo, seen);
            }
        }
        match read {
            Some((used, cost)) => {
                self.input.consume(used);
                if self.memo.len() > self.limits.max_memo {
                    return Err(Failure::Unusual);
                }
                self.charge(cost)?;
                self.memo_sync()?;
                state.deliver()
            }
            None => {
                self.memo.rollback(mark);
                state.clear();
                self.record(state)
            }
        }
    }

    /// One record, just after its `EMPTY_DICT`: `[memo] MARK (key value [memo])* SETITEMS`.
    fn record(
        &mut self,
        state: &mut State<'_, impl FnMut(&[Option<Value>]) -> bool>,
    ) -> Result<(), Failure> {
        // Memo entries may be replaced from here on.
        state.memo_key_cache = [(u64::MAX, IGNORED); KEY_CACHE];
        let mut code = self.next_op()?;
        if is_memo_put(code) {
            // The dict is never built: a GET of it sends the file to the generic reader.
            let key = self.memo_key(code)?;
            self.memo_store(key, Memo::Streamed, 0)?;
            code = self.next_op()?;
        }
        if code != op::MARK {
            return Err(Failure::Unusual);
        }
        // A key read, waiting for its value: (field, key, depth).
        let mut key: Option<(u8, Value, u32)> = None;
        let mut keys = 0;
        code = self.next_op()?;
        loop {
            let (value, depth) = match code {
                op::SETITEMS if key.is_none() => break,
                op::BINGET | op::LONG_BINGET => {
                    let k = match code {
                        op::BINGET => u64::from(self.input.byte()?),
                        _ => u64::from(u32::from_le_bytes(self.input.array::<4>()?)),
                    };
                    match self.memo.get(k) {
                        Some(MemoRef::Value(v, depth)) => (v.clone(), depth),
                        _ => return Err(Failure::Unusual),
                    }
                }
                op::BININT1 => (Value::Int(i64::from(self.input.byte()?)), 0),
                op::BININT2 => {
                    (Value::Int(i64::from(u16::from_le_bytes(self.input.array::<2>()?))), 0)
                }
                op::BININT => {
                    (Value::Int(i64::from(i32::from_le_bytes(self.input.array::<4>()?))), 0)
                }
                // A MARK where a key belongs opens a batch whose SETITEMS applies to the value
                // below it, which this reader has taken off the stack: only the generic reader
                // can judge that (Python's pickler never writes it inside an entry).
                op::MARK if key.is_none() => return Err(Failure::Unusual),
                _ => match self.scalar(code)? {
                    Some(v) => (v, 0),
                    None => return self.record_generic(state, key, keys, code),
                },
            };
            // A value made here is charged once the memo keeps it; the fields are the sink's.
            let mut cost = unique_bytes(&value);
            code = self.next_op()?;
            while is_memo_put(code) {
                let k = self.memo_key(code)?;
                self.memo_store(k, Memo::Value(value.clone(), depth), std::mem::take(&mut cost))?;
                code = self.next_op()?;
            }
            match key.take() {
                None => {
                    key = Some((state.field_of(&value, keys), value, depth));
                    keys += 1;
                }
                Some((field, _, _)) => {
                    if field != IGNORED {
                        state.set(field, value);
                    }
                }
            }
        }
        state.deliver()
    }

    /// Finish a record the flat reader cannot (a value that is a container, say a new
    /// `frames` list): put an empty dict, its MARK and the key waiting for its value on the
    /// stack, run the generic VM until `SETITEMS` closes the dict, and take the fields of the
    /// pairs it got, which come after those already read. The dict is not the whole record,
    /// but its memo entry (if any) stays `Streamed`, so nothing can see it.
    fn record_generic(
        &mut self,
        state: &mut State<'_, impl FnMut(&[Option<Value>]) -> bool>,
        key: Option<(u8, Value, u32)>,
        keys: usize,
        mut code: u8,
    ) -> Result<(), Failure> {
        let base = self.stack.len();
        let base_marks = self.marks.len();
        self.push_new(Value::dict(Vec::new()), 1)?;
        if !self.held.reserve(&mut self.marks, 1) {
            return Err(self.over_limit().into());
        }
        self.marks.push(base + 1);
        if let Some((_, k, depth)) = key {
            self.charge(unique_bytes(&k))?;
            self.push(Slot::new(k, depth))?;
        }
        loop {
            // The pairs read before this point are not on the stack, so a MARK right above the
            // record's own would see the dict below it where the last value belongs (its
            // SETITEMS would fill the record): only the generic reader can judge it.
            let mark_on_streamed_pairs =
                code == op::MARK && keys > 0 && self.stack.len() == base + 1;
            if code == op::STOP || mark_on_streamed_pairs {
                return Err(Failure::Unusual);
            }
            self.step()?;
            if self.marks.len() <= base_marks {
                // The record's MARK was taken: only SETITEMS into the dict closes it.
                if code != op::SETITEMS || self.stack.len() != base + 1 {
                    return Err(Failure::Unusual);
                }
                break;
            }
            code = self.next_op()?;
        }
        let dict = self.stack.pop().map(|slot| release(slot, &mut self.memo));
        // The dict goes once its fields are taken, and the fields are the sink's.
        self.held.refund(dict.as_ref().map_or(0, unique_bytes));
        let Some(Value::Dict(pairs)) = dict else { return Err(Failure::Unusual) };
        for (i, (k, v)) in pairs.iter().enumerate() {
            let field = state.field_of(k, keys + i);
            if field != IGNORED {
                state.set(field, v.clone());
            }
        }
        state.deliver()
    }
}

/// The `Value` of a flat value read as `(kind, x)`; `before` is the window up to the value's
/// end. Inlined so the value is built where it goes (a `Value` returned through memory piece
/// by piece and read back whole stalls the store buffer).
#[inline(always)]
fn make<F: FnMut(&[Option<Value>]) -> bool>(
    kind: u8,
    x: u64,
    before: &[u8],
    at: usize,
    memo: &MemoTable,
    strings: &mut StrCache,
    state: &mut State<'_, F>,
) -> Option<(Value, u32)> {
    Some(match kind {
        RAW_INT => (Value::Int(x as i64), 0),
        RAW_STR => {
            let bytes = before.get(before.len().checked_sub(x as usize)?..)?;
            (state.string_at(at, bytes, strings)?, 0)
        }
        RAW_NONE => (Value::None, 0),
        RAW_BOOL => (Value::Bool(x != 0), 0),
        _ => match memo.get(x) {
            Some(MemoRef::Value(v, depth)) => (v.clone(), depth),
            _ => return None,
        },
    })
}

/// What a flat value is before a `Value` is made of it (see `flat_record`).
const RAW_INT: u8 = 0;
/// `x` is the string's length; its bytes end where the value does.
const RAW_STR: u8 = 1;
const RAW_NONE: u8 = 2;
const RAW_BOOL: u8 = 3;
/// `x` is a memo key.
const RAW_GET: u8 = 4;
/// A list of GETs of finished values, built as it was read (the `EMPTY_LIST` arm of
/// `flat_record`).
const RAW_LIST: u8 = 5;

/// One record read in place from `w` (the buffered bytes after its `EMPTY_DICT`) when it is
/// flat: `[MEMOIZE] MARK (GET-key value [MEMOIZE])* SETITEMS`, with values that are ints,
/// short strings, None, bools, GETs of finished values or lists of such GETs (a stack).
/// Fills `state.fields`, appends the memo entries ([`MemoTable::append`]) and returns the
/// bytes used and the memory to charge; `None` when the record is anything else or runs past
/// `w`, having changed nothing but the field array, the string caches and the memo entries
/// appended, which the caller rolls back, so that the opcode reader can start over.
/// `inline(always)`: its one caller's loop is the hot one (not inlined, the Llama snapshot's
/// reading thread took 3 % more instructions).
#[inline(always)]
fn flat_record<F: FnMut(&[Option<Value>]) -> bool>(
    w: &[u8],
    memo: &mut MemoTable,
    strings: &mut StrCache,
    state: &mut State<'_, F>,
    max_depth: u32,
) -> Option<(usize, u64)> {
    // A fixed-size view of the window, and opcodes only read while they start below
    // `FLAT_LIMIT`: an opcode with its argument takes at most 257 bytes, so every index below
    // is in bounds by construction (no check per byte). A record that reaches further, or a
    // window cut short by the end of the stream, goes to the opcode reader.
    let w: &[u8; FLAT_WINDOW_BYTES] = w.get(..FLAT_WINDOW_BYTES)?.try_into().ok()?;
    let mut p = 0;
    let record_start = memo.len() as u64;
    // What the memo keeps of this record (the record itself and its fields are the sink's).
    let mut cost = 0;
    // The next opcode. A `FRAME` (one per 64 KiB) is none of the opcodes a flat record may
    // hold at any position, so it sends the record to the opcode reader, which skips it.
    macro_rules! next_op {
        () => {{
            if p >= FLAT_LIMIT {
                return None;
            }
            p += 1;
            w[p - 1]
        }};
    }
    macro_rules! bytes {
        ($n:expr) => {{
            let n: usize = $n;
            let b = &w[p..p + n];
            p += n;
            b
        }};
    }
    let mut c = next_op!();
    if c == op::MEMOIZE {
        memo.append(Memo::Streamed)?;
        c = next_op!();
    }
    if c != op::MARK {
        return None;
    }
    let mut at = 0;
    c = next_op!();
    while c != op::SETITEMS {
        let key = match c {
            op::BINGET => u64::from(bytes!(1)[0]),
            op::LONG_BINGET => u64::from(u32::from_le_bytes(bytes!(4).try_into().ok()?)),
            // A key string seen for the first time (the first record): the opcode reader.
            _ => return None,
        };
        let slot = at % KEY_CACHE;
        let field = match state.memo_key_cache[slot] {
            (k, field) if k == key => field,
            _ => {
                let field = match memo_value(memo, key)? {
                    (Value::Str(s), _) => state.field_of_str(s, at),
                    _ => IGNORED,
                };
                state.memo_key_cache[slot] = (key, field);
                field
            }
        };
        // The value as plain scalars first: a `Value` is made only where one is kept (a
        // field, a memo entry), and written in place there. A list is made as it is read.
        let mut built: Option<(Value, u32)> = None;
        let (kind, x) = match next_op!() {
            op::BININT1 => (RAW_INT, u64::from(bytes!(1)[0])),
            op::BININT2 => (RAW_INT, u64::from(u16::from_le_bytes(bytes!(2).try_into().ok()?))),
            op::BININT => {
                (RAW_INT, i64::from(i32::from_le_bytes(bytes!(4).try_into().ok()?)) as u64)
            }
            op::LONG1 => {
                let n = usize::from(bytes!(1)[0]);
                if n == 0 || n > 8 {
                    // Zero bytes (the int 0) is rare; more than 8 is not an i64.
                    return None;
                }
                // Little-endian two's complement of n bytes: read a whole word (in bounds, see
                // above) and sign-extend from byte n.
                let word = u64::from_le_bytes(bytes!(8).try_into().ok()?);
                p -= 8 - n;
                let shift = 64 - 8 * n as u32;
                (RAW_INT, (((word << shift) as i64) >> shift) as u64)
            }
            op::SHORT_BINUNICODE => {
                let n = usize::from(bytes!(1)[0]);
                bytes!(n);
                (RAW_STR, n as u64)
            }
            op::NONE => (RAW_NONE, 0),
            op::NEWTRUE => (RAW_BOOL, 1),
            op::NEWFALSE => (RAW_BOOL, 0),
            op::BINGET => (RAW_GET, u64::from(bytes!(1)[0])),
            op::LONG_BINGET => (RAW_GET, u64::from(u32::from_le_bytes(bytes!(4).try_into().ok()?))),
            op::EMPTY_LIST => {
                // A stack's `frames`: a list of GETs of frame dicts read before, written as
                // `EMPTY_LIST [MEMOIZE] (MARK GET* APPENDS | GET APPEND)*`. Built here with the
                // depth and the charges the opcode reader's would have; anything else in it
                // (a frame dict seen for the first time) is for the opcode reader.
                let start = p;
                let memoized = next_op!() == op::MEMOIZE;
                if !memoized {
                    p = start;
                }
                let body = p;
                p = list_end(w, body)?;
                let ops = &w[body..p];
                let cached = memoized.then(|| state.by_bytes.find(ops, memo.epoch())).flatten();
                let (list, depth) = match cached {
                    // The list these ops built before: the same items, held once already.
                    Some((list, depth)) => (Value::List(list.clone()), depth),
                    None => {
                        let (deepest, largest) = list_items(ops, memo, &mut state.items)?;
                        // `EMPTY_LIST` makes a container of depth 1; appending raises it above
                        // its deepest item.
                        let depth = deepest.saturating_add(1);
                        let list = if memoized {
                            // The memo keeps every list to the end: one for each stack.
                            let (list, shared) = state.lists.get(&mut state.items);
                            if !shared {
                                cost += own_bytes(&list);
                            }
                            // Found by its bytes only if it GETs no key of this record, which
                            // a rollback takes back (`MemoTable::rollback`).
                            if let (Value::List(rc), true) = (&list, largest < record_start) {
                                state.by_bytes.insert(ops, memo.epoch(), rc, depth);
                            }
                            list
                        } else {
                            // An exact-size copy; the buffer keeps its room for the next list.
                            #[allow(clippy::drain_collect)]
                            Value::list(state.items.drain(..).collect())
                        };
                        (list, depth)
                    }
                };
                if depth > max_depth {
                    return None;
                }
                if memoized {
                    // Its key was taken at the MEMOIZE; only GETs came since, so it is still
                    // the next one.
                    memo.append(Memo::Value(list.clone(), depth))?;
                }
                built = Some((list, depth));
                (RAW_LIST, 0)
            }
            _ => return None,
        };
        if kind == RAW_GET && field == IGNORED {
            // A GET of nothing (or of a streamed dict) is for the opcode reader to judge; a
            // field's own lookup below checks it for the others.
            memo_value(memo, x)?;
        }
        // `p` is past the value: a string's bytes end there.
        let end = p;
        c = next_op!();
        if c == op::MEMOIZE {
            let (v, depth) = match &built {
                Some((list, depth)) => (list.clone(), *depth),
                None => make(kind, x, &w[..end], at, memo, strings, state)?,
            };
            cost += own_bytes(&v);
            memo.append(Memo::Value(v, depth))?;
            c = next_op!();
        }
        if field != IGNORED {
            // An int or a string the field already holds (the last record's) is updated in
            // place, with no `Value` moved: one built and copied whole stalls the store
            // buffer. Anything else is written straight into the field; see `make`.
            let f = usize::from(field);
            state.present |= 1 << field;
            match (kind, &mut state.fields[f]) {
                (RAW_INT, Some(Value::Int(old))) => *old = x as i64,
                // The same text as the last record's (`compile_context`'s "N/A", entry after
                // entry): the field keeps its string.
                (RAW_STR, Some(Value::Str(old)))
                    if w[..end].get(end.checked_sub(x as usize)?..) == Some(old.as_bytes()) => {}
                (RAW_GET, slot) => match (memo.get(x), slot) {
                    (Some(MemoRef::Value(Value::Str(new), _)), Some(Value::Str(old)))
                        if Rc::ptr_eq(new, old) => {}
                    (Some(MemoRef::Value(v, _)), slot) => drop(slot.replace(v.clone())),
                    _ => return None,
                },
                (RAW_INT, slot) => drop(slot.replace(Value::Int(x as i64))),
                (RAW_LIST, slot) => drop(slot.replace(built.take()?.0)),
                _ => {
                    let (v, _) = make(kind, x, &w[..end], at, memo, strings, state)?;
                    drop(state.fields[f].replace(v));
                }
            }
        }
        at += 1;
    }
    Some((p, cost))
}
