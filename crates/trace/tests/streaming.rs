//! The record streamer (`pickle::read_records`, the fast path of reading a snapshot) against
//! the generic reader: the same trace or the same error on every real trace, on a small
//! snapshot as CPython pickles it, on unusual shapes that must send it back to the generic
//! reader, and on thousands of corrupted files.

mod common;

use allocsim_trace::pickle::{self, RecordSpec, Value};
use allocsim_trace::{pytorch, read_trace_with, ReadOptions};
use std::path::{Path, PathBuf};

fn generic() -> ReadOptions {
    ReadOptions { streaming: false, ..ReadOptions::without_sidecar() }
}

fn streaming() -> ReadOptions {
    ReadOptions::without_sidecar()
}

/// The fixture's trace of device 0 (device 1 has one too).
fn device_0(opts: ReadOptions) -> ReadOptions {
    ReadOptions { cuda_device: Some(0), ..opts }
}

/// Both readers agree on `path`: the same trace, or errors with the same message.
fn agree(path: &Path) -> Result<(), String> {
    let fast = read_trace_with(path, &device_0(streaming()));
    let slow = read_trace_with(path, &device_0(generic()));
    match (fast, slow) {
        (Ok(a), Ok(b)) => {
            common::assert_same(&a, &b);
            Ok(())
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.to_string(), b.to_string(), "{}", path.display());
            Err(a.to_string())
        }
        (a, b) => panic!("{}: streaming {:?} vs generic {:?}", path.display(), a.err(), b.err()),
    }
}

/// A xorshift generator from `seed` (not 0).
fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// `rounds` copies of `good` with one to three bytes changed, at `place(random, len)`, written
/// to `path`: how many both readers read alike, and how many both refused alike.
fn corrupted_agree(
    good: &[u8],
    path: &Path,
    rounds: usize,
    seed: u64,
    place: impl Fn(u64, usize) -> usize,
) -> (usize, usize) {
    let mut next = xorshift(seed | 1);
    let (mut ok, mut err) = (0, 0);
    for round in 0..rounds {
        let mut bytes = good.to_vec();
        for _ in 0..1 + round % 3 {
            let r = next();
            let i = place(r, bytes.len());
            bytes[i] = (r >> 40) as u8;
        }
        std::fs::write(path, &bytes).unwrap();
        match agree(path) {
            Ok(()) => ok += 1,
            Err(_) => err += 1,
        }
    }
    (ok, err)
}

#[test]
fn every_real_trace_streams_and_gives_the_generic_trace() {
    for path in common::real_traces() {
        let fast = pytorch::read_snapshot_streaming(&path, &streaming()).unwrap();
        let fast = fast.unwrap_or_else(|| panic!("{}: fell back", path.display()));
        let slow = read_trace_with(&path, &generic()).unwrap();
        common::assert_same(&fast, &slow);
    }
}

fn fixture() -> PathBuf {
    common::data_dir().join("snapshot_cpython.pickle")
}

#[test]
fn cpython_snapshot_with_frames_and_two_devices_streams() {
    let path = fixture();
    let opts = device_0(streaming());
    let fast = pytorch::read_snapshot_streaming(&path, &opts).unwrap().expect("streams");
    let slow = read_trace_with(&path, &device_0(generic())).unwrap();
    common::assert_same(&fast, &slow);
    assert!(fast.stacks.len() > 100, "fresh and shared frames: {}", fast.stacks.len());
    // Two devices have traces: without a choice both readers refuse, naming them.
    let fast = read_trace_with(&path, &streaming()).unwrap_err().to_string();
    let slow = read_trace_with(&path, &generic()).unwrap_err().to_string();
    assert_eq!(fast, slow);
    assert!(fast.contains("devices [0, 1]") && fast.contains("--cuda-device"), "{fast}");
}

#[test]
fn records_reach_the_sink_with_the_last_of_repeated_keys() {
    let entries = vec![
        Value::dict(vec![
            (Value::str("a"), Value::Int(1)),
            (Value::str("x"), Value::list(vec![Value::Int(5)])),
            (Value::str("a"), Value::Int(2)),
            (Value::Int(7), Value::str("non-str key")),
        ]),
        Value::str_dict([("b", Value::str("s")), ("a", Value::None)]),
    ];
    let root = Value::str_dict([("top", Value::list(vec![Value::list(entries)]))]);
    let bytes = pickle::to_vec(&root).unwrap();
    let mut got = Vec::new();
    let spec = RecordSpec { top_key: "top", fields: &["a", "b", "x"] };
    let records = pickle::read_records(&bytes[..], &Default::default(), spec, |f| {
        got.push(f.to_vec());
        true
    })
    .expect("within the limits")
    .expect("streams");
    assert!(records.streamed);
    let top = records.root.get("top").unwrap().as_seq().unwrap();
    assert_eq!(top, &[Value::list(vec![])][..], "the streamed list is left empty");
    assert_eq!(
        got,
        vec![
            vec![Some(Value::Int(2)), None, Some(Value::list(vec![Value::Int(5)]))],
            vec![Some(Value::None), Some(Value::str("s")), None],
        ]
    );
    // A refused record sends the caller to the generic reader.
    let refused = pickle::read_records(&bytes[..], &Default::default(), spec, |_| false);
    assert!(matches!(refused, Ok(None)));
}

fn write(name: &str, bytes: &[u8]) -> common::ScratchFile {
    let file = common::scratch("stream").file(name);
    std::fs::write(&file, bytes).unwrap();
    file
}

/// Hand-written pickles: opcodes as bytes, so each shape is exactly the one meant.
mod shapes {
    pub const HEAD: &[u8] = b"\x80\x04}\x94(\x8c\rdevice_traces\x94]\x94]\x94";
    /// `{'action': 'alloc', 'addr': 4096, 'size': 512}`, memoized, as CPython writes it.
    pub fn entry(action: &str) -> Vec<u8> {
        let mut e = b"}\x94(\x8c\x06action\x94".to_vec();
        e.push(0x8c);
        e.push(action.len() as u8);
        e.extend_from_slice(action.as_bytes());
        e.extend_from_slice(b"\x94\x8c\x04addrM\x00\x10\x8c\x04sizeM\x00\x02u");
        e
    }
}

#[test]
fn unusual_shapes_give_what_the_generic_reader_gives() {
    use shapes::{entry, HEAD};
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    // One entry, with a lone APPEND; then the devices list takes it with APPEND.
    let one = [HEAD, &entry("alloc"), b"aau."].concat();
    cases.push(("one", one));
    // Two entries in a MARK ... APPENDS batch.
    let two = [HEAD, b"(", &entry("alloc"), &entry("free_requested"), b"eau."].concat();
    cases.push(("two", two));
    // A GET of a streamed entry dict later in the file (memo 4 is the first entry).
    let get =
        [HEAD, b"(", &entry("alloc"), &entry("free_requested"), b"ea\x8c\x01kh\x04u."].concat();
    cases.push(("get-entry", get));
    // A GET of the streamed list itself (memo 3).
    let get_list = [HEAD, b"(", &entry("alloc"), b"ea\x8c\x01kh\x03u."].concat();
    cases.push(("get-list", get_list));
    // Something appended to the list after streaming ended.
    let appended = [HEAD, &entry("alloc"), b"a", b"K\x05a", b"au."].concat();
    cases.push(("appended", appended));
    // A list item that is not a dict.
    let not_dict = [HEAD, b"(", &entry("alloc"), b"K\x05e", b"au."].concat();
    cases.push(("not-dict", not_dict));
    // An entry with a code-running opcode inside.
    let evil =
        [HEAD, b"(}\x94(\x8c\x06action\x94\x8c\x05posix\x8c\x06system\x93", b"ueau."].concat();
    cases.push(("evil", evil));
    // Unknown action, wrong types, truncation.
    cases.push(("bogus", [HEAD, &entry("bogus"), b"aau."].concat()));
    let bad_size =
        [HEAD, b"(", &entry("alloc")[..entry("alloc").len() - 4], b"N", b"ueau."].concat();
    cases.push(("bad-size", bad_size));
    cases.push(("truncated", [HEAD, b"(", &entry("alloc")].concat()));
    // `device_traces` twice in the root dict: the last one counts.
    let twice =
        [HEAD, &entry("alloc"), b"aa", b"\x8c\rdevice_traces]]", &entry("free_requested"), b"aau."]
            .concat();
    cases.push(("twice", twice));
    // `device_traces` not in the root dict but in a nested one: not streamed, and missing.
    let nested =
        [b"\x80\x04}\x94(\x8c\x01x", &HEAD[2..], &entry("alloc"), b"aau", b"\x8c\x01yNu."].concat();
    cases.push(("nested", nested));
    let mut streamed = Vec::new();
    for (name, bytes) in &cases {
        let path = write(&format!("{name}.pickle"), bytes);
        let outcome = agree(&path);
        let fast = pytorch::read_snapshot_streaming(&path, &streaming()).unwrap();
        if fast.is_some() {
            streamed.push(*name);
        }
        match *name {
            "one" | "two" | "twice" | "get-entry" | "get-list" => {
                outcome.unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            "evil" => assert!(outcome.unwrap_err().contains("STACK_GLOBAL"), "{name}"),
            "bogus" => assert!(outcome.unwrap_err().contains("device_traces[0][0].action")),
            "bad-size" => assert!(outcome.unwrap_err().contains("device_traces[0][0].size")),
            "truncated" => assert!(outcome.unwrap_err().contains("truncated")),
            "nested" => assert!(outcome.unwrap_err().contains("device_traces: missing")),
            "appended" | "not-dict" => {
                assert!(outcome.unwrap_err().contains("device_traces[0][1]: expected a dict"))
            }
            _ => {}
        }
    }
    assert_eq!(streamed, ["one", "two"], "only the plain shapes stream");
}

/// Stacks (`frames`: lists of GETs of frame dicts met before) in every shape CPython writes a
/// list in, and in shapes it does not, read in place or sent back: the generic reader's trace.
#[test]
fn stacks_give_what_the_generic_reader_gives() {
    use shapes::HEAD;
    // Entry 1 defines the key strings (memo 5 `action`, 6 `alloc`, 7 `addr`, 8 `size`,
    // 9 `frames`) and a frame dict (memo 11), through the opcode reader. Memo 4 is its dict,
    // 10 its frames list.
    let first = [
        b"}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94M\x00\x10".as_slice(),
        b"\x8c\x04size\x94M\x00\x02\x8c\x06frames\x94]\x94(",
        b"}\x94(\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x01\x8c\x04name\x94\x8c\x01f\x94u",
        b"eu",
    ]
    .concat();
    // An entry at `addr` (high byte) whose keys are all GETs, with `frames` as given.
    let entry = |addr: u8, frames: &[u8]| {
        [b"}\x94(h\x05h\x06h\x07M\x00".as_slice(), &[addr], b"h\x08M\x00\x02h\x09", frames, b"u"]
            .concat()
    };
    // Memo keys from 17 on: each entry takes one for its dict and one per memoized list.
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("batch", vec![entry(0x20, b"]\x94(h\x0bh\x0be")]),
        ("single", vec![entry(0x20, b"]\x94h\x0ba")]),
        ("two-batches", vec![entry(0x20, b"]\x94(h\x0be(h\x0be")]),
        ("unmemoized", vec![entry(0x20, b"](h\x0be")]),
        ("empty", vec![entry(0x20, b"]\x94")]),
        // The list then another key: `h\x07` is not a list item.
        (
            "key-after",
            vec![b"}\x94(h\x05h\x06h\x09]\x94h\x0bah\x07M\x00\x30h\x08M\x00\x02u".to_vec()],
        ),
        (
            "empty-key-after",
            vec![b"}\x94(h\x05h\x06h\x09]\x94h\x07M\x00\x30h\x08M\x00\x02u".to_vec()],
        ),
        // A later entry sharing an earlier entry's list (memo 18).
        ("shared", vec![entry(0x20, b"]\x94(h\x0bh\x0be"), entry(0x30, b"h\x12")]),
        // Memoized again after its items.
        ("memoized-after", vec![entry(0x20, b"](h\x0be\x94")]),
        // The list holding itself (memo 18), the entry's own dict (17), a GET of nothing.
        ("itself", vec![entry(0x20, b"]\x94(h\x12e")]),
        ("own-dict", vec![entry(0x20, b"]\x94(h\x11e")]),
        ("missing", vec![entry(0x20, b"]\x94(h\x7fe")]),
        // A list of a scalar (memo 16 is the string `f`), and a frame dict made in place.
        ("scalar", vec![entry(0x20, b"]\x94(h\x10e")]),
        ("new-frame", vec![entry(0x20, b"]\x94(}\x94(h\x0ch\x0duh\x0be")]),
        // Cut off inside the list.
        ("unclosed", vec![entry(0x20, b"]\x94(h\x0bu")]),
        // A field that GETs nothing, or the entry's own dict (memo 17).
        ("field-missing", vec![b"}\x94(h\x05h\x7fh\x07M\x00\x20h\x08M\x00\x02u".to_vec()]),
        ("field-own-dict", vec![b"}\x94(h\x05h\x11h\x07M\x00\x20h\x08M\x00\x02u".to_vec()]),
        // The same bytes again: the list they built before (`pickle::lists::ListsByBytes`).
        ("again", vec![entry(0x20, b"]\x94(h\x0be"), entry(0x30, b"]\x94(h\x0be")]),
        // The same after an entry the opcode reader took over (a frame seen for the first
        // time, memo 21), which took back what the flat reader had added to the memo: the
        // shape and the list found by bytes still hold, and a list GETs the new frame.
        (
            "again-after-new-frame",
            vec![
                entry(0x20, b"]\x94(h\x0be"),
                entry(0x30, b"]\x94(}\x94(h\x0ch\x0duh\x0be"),
                entry(0x40, b"]\x94(h\x0be"),
                entry(0x50, b"]\x94(h\x15h\x0be"),
                entry(0x60, b"]\x94(h\x15h\x0be"),
            ],
        ),
        // A list (under an ignored key, `a.py`) that GETs a string its own entry memoized
        // (memo 18), in an entry the flat reader gives up on after the list (a dict under
        // `line`); the next entry's list has the same bytes.
        (
            "own-string-taken-back",
            vec![
                [
                    b"}\x94(h\x05h\x06h\x0c\x8c\x01z\x94h\x0d]\x94(h\x12e".as_slice(),
                    b"h\x0e}(h\x0ch\x0duh\x07M\x00\x20h\x08M\x00\x02u",
                ]
                .concat(),
                b"}\x94(h\x05h\x06h\x0d]\x94(h\x12eh\x07M\x00\x30h\x08M\x00\x02u".to_vec(),
            ],
        ),
        // The same bytes after the frame they name (memo 11) was replaced by another dict
        // (`filename` b.py, as an ignored key's value): the new frame.
        (
            "frame-replaced",
            vec![
                entry(0x20, b"]\x94(h\x0be"),
                [
                    b"}\x94(h\x05h\x06h\x07M\x00\x30h\x08M\x00\x02".as_slice(),
                    b"h\x0c}(h\x0c\x8c\x04b.pyh\x0eK\x02h\x0fh\x10uq\x0bu",
                ]
                .concat(),
                entry(0x40, b"]\x94(h\x0be"),
            ],
        ),
    ];
    for (name, entries) in cases {
        // A long string after the entries, so that each lies in a window the flat reader
        // takes (it leaves the last kilobyte of a file to the opcode reader).
        let pad = [b"\x8c\x03padX".as_slice(), &2048u32.to_le_bytes(), &[b'.'; 2048]].concat();
        let bytes = [HEAD, b"(", &first, &entries.concat(), b"ea", &pad, b"u."].concat();
        let path = write(&format!("stacks-{name}.pickle"), &bytes);
        let outcome = agree(&path);
        match name {
            // Recursive, a GET of nothing, a frame that is no dict, a cut-off list, fields
            // that GET nothing or a streamed dict.
            "itself" | "own-dict" | "missing" | "scalar" | "unclosed" | "field-missing"
            | "field-own-dict" => {
                assert!(outcome.is_err(), "{name}")
            }
            _ => outcome.unwrap_or_else(|e| panic!("{name}: {e}")),
        }
    }
}

#[test]
fn corrupted_snapshots_give_what_the_generic_reader_gives() {
    let good = std::fs::read(fixture()).unwrap();
    let dir = common::scratch("stream-mut");
    let path = dir.join("m.pickle");
    // Mostly in the entries (where the streamer works), sometimes anywhere.
    let place = |r: u64, len: usize| {
        if r.is_multiple_of(4) {
            r as usize % len
        } else {
            2000 + r as usize % 3000
        }
    };
    let (ok, err) = corrupted_agree(&good, &path, 600, 0x2545_f491_4f6c_dd1d, place);
    assert!(ok > 50 && err > 50, "both outcomes exercised: {ok} ok, {err} errors");
}

/// A history that starts mid-run converts as its entries come; one without completions needs
/// the whole list first and is streamed again into a list: neither falls back to the generic
/// reader.
#[test]
fn histories_mid_run_or_without_completions_still_stream() {
    use common::{entry, snapshot, write_pickle};
    let dir = common::scratch("stream-list");
    let mid_run = snapshot(
        vec![
            entry("free_requested", 0x1000, 512, 0),
            entry("free_completed", 0x1000, 512, 0),
            entry("alloc", 0x2000, 512, 0),
            entry("snapshot", 0, 0, 0),
            entry("segment_free", 0x10_0000, 2 << 20, 0),
        ],
        vec![],
        "",
    );
    let no_completions = snapshot(
        vec![entry("alloc", 0x100, 512, 0), entry("free_requested", 0x100, 512, 0)],
        vec![],
        "",
    );
    for (name, root) in [("mid.pickle", mid_run), ("skip.pickle", no_completions)] {
        let path = write_pickle(&dir, name, &root);
        let fast = pytorch::read_snapshot_streaming(&path, &streaming()).unwrap();
        let fast = fast.unwrap_or_else(|| panic!("{name}: fell back to the generic reader"));
        let slow = read_trace_with(&path, &generic()).unwrap();
        common::assert_same(&fast, &slow);
        assert!(!fast.warnings.is_empty(), "{name}: {:?}", fast.warnings);
    }
}

/// A snapshot written opcode by opcode as CPython writes one (keys memoized once, a fresh
/// `"N/A"` memoized in every entry), with entries whose shape changes now and then in each way
/// that must stop the streamer reading an entry by the last one's shape (`pickle::template`).
mod changing_shapes {
    use std::collections::HashMap;

    #[derive(Default)]
    struct Pickler {
        out: Vec<u8>,
        memo: u32,
        keys: HashMap<&'static str, u32>,
    }

    impl Pickler {
        fn memoize(&mut self) -> u32 {
            self.out.push(0x94);
            self.memo += 1;
            self.memo - 1
        }
        fn get(&mut self, i: u32) {
            match u8::try_from(i) {
                Ok(i) => self.out.extend([b'h', i]),
                Err(_) => {
                    self.out.push(b'j');
                    self.out.extend(i.to_le_bytes());
                }
            }
        }
        fn text(&mut self, s: &str) {
            self.out.extend([0x8c, s.len() as u8]);
            self.out.extend(s.as_bytes());
        }
        /// A string memoized the first time, a GET after.
        fn key(&mut self, s: &'static str) {
            match self.keys.get(s) {
                Some(&i) => self.get(i),
                None => {
                    self.text(s);
                    let i = self.memoize();
                    self.keys.insert(s, i);
                }
            }
        }
        fn int(&mut self, v: i64, long: bool) {
            if long {
                self.out.extend([0x8a, 8]);
                self.out.extend(v.to_le_bytes());
            } else if let Ok(b) = u8::try_from(v) {
                self.out.extend([b'K', b]);
            } else if let Ok(h) = u16::try_from(v) {
                self.out.push(b'M');
                self.out.extend(h.to_le_bytes());
            } else if let Ok(w) = i32::try_from(v) {
                self.out.push(b'J');
                self.out.extend(w.to_le_bytes());
            } else {
                self.out.extend([0x8a, 8]);
                self.out.extend(v.to_le_bytes());
            }
        }
    }

    /// The snapshot's bytes: `entries` entries of a history that frees each block it
    /// allocates, shapes drawn from `seed` (0: the plain shape throughout); with `frames`, each entry has a stack, a list of
    /// its own or (a free completion's) its free request's.
    pub fn snapshot(entries: usize, seed: u64, frames: bool) -> Vec<u8> {
        let mut next = super::xorshift(seed | 1);
        let mut p = Pickler::default();
        p.out.extend(b"\x80\x04}");
        p.memoize();
        p.out.push(b'(');
        p.key("device_traces");
        p.out.push(b']');
        p.memoize();
        p.out.extend(b"]");
        p.memoize();
        p.out.push(b'(');
        let base = 0x7f00_0000_0000_i64;
        // The memo key of an earlier `"N/A"`, to store over.
        let mut old_na = None;
        // The memo keys of the frame dicts, and of the last stack.
        let mut frame_keys: Vec<u32> = Vec::new();
        let mut last_stack = None;
        for i in 0..entries {
            let action = ["alloc", "free_requested", "free_completed"][i % 3];
            let addr = base + (i / 3 % 64) as i64 * 512;
            // Mostly the plain shape; otherwise one change, each about as often.
            let change = match next() % 24 {
                // Seed 0 writes the plain shape only.
                _ if seed == 0 => 99,
                // Seed 4 changes the memo entry of a key under the learned shape, once.
                _ if seed == 4 && i == 2500 => 10,
                _ if seed == 4 && (2490..2510).contains(&i) => 99,
                c @ 0..=9 => c,
                c @ 10..=11 if frames => c + 1,
                _ => 99,
            };
            p.out.push(b'}');
            if change != 0 {
                p.memoize();
            }
            p.out.push(b'(');
            p.key("action");
            if change == 1 {
                // The action as a fresh string, memoized.
                p.text(action);
                p.memoize();
            } else {
                p.key(action);
            }
            p.key("addr");
            p.int(addr, change == 2);
            p.key("size");
            p.int([512, 70_000, 1 << 40][next() as usize % 3], false);
            p.key("stream");
            p.int(0, false);
            if change == 10 {
                // An ignored key whose value is stored over the memo entry of the key
                // `stream`: later entries' `stream` key reads as `size` (the last wins).
                p.key("extra");
                p.text("size");
                p.out.push(b'r');
                p.out.extend(p.keys["stream"].to_le_bytes());
            }
            p.key("time_us");
            p.int(1_795_338_726_900_000 + i as i64, false);
            p.key("compile_context");
            let mut own_na = None;
            match change {
                // The `"N/A"` of an earlier entry, by GET.
                3 => p.key("N/A"),
                // Stored over an earlier entry's memo key: the memo changes.
                4 if old_na.is_some() => {
                    p.text("N/A");
                    p.out.extend([b'r']);
                    p.out.extend(old_na.unwrap_or(0u32).to_le_bytes());
                }
                _ => {
                    p.text("N/A");
                    let at = p.memoize();
                    old_na.get_or_insert(at);
                    own_na = Some(at);
                }
            }
            if frames {
                p.key("frames");
                match (i % 3, last_stack) {
                    // A free completion: its request's list.
                    (2, Some(list)) if change != 11 => p.get(list),
                    _ if frame_keys.is_empty() => {
                        // The first stack: its frames, dicts met for the first time.
                        p.out.push(b']');
                        last_stack = Some(p.memoize());
                        p.out.push(b'(');
                        for (f, name) in ["forward", "backward", "step"].iter().enumerate() {
                            p.out.push(b'}');
                            frame_keys.push(p.memoize());
                            p.out.push(b'(');
                            p.key("name");
                            p.text(name);
                            p.memoize();
                            p.key("filename");
                            p.key("train.py");
                            p.key("line");
                            p.int(10 * f as i64 + 1, false);
                            p.out.push(b'u');
                        }
                        p.out.push(b'e');
                    }
                    _ => {
                        // A list of its own, of one to three frames met before; now and then
                        // a single frame appended alone.
                        p.out.push(b']');
                        last_stack = Some(p.memoize());
                        let n = 1 + next() as usize % 3;
                        if n == 1 && change == 12 {
                            p.get(frame_keys[0]);
                            p.out.push(b'a');
                        } else {
                            p.out.push(b'(');
                            for &f in &frame_keys[..n] {
                                p.get(f);
                            }
                            p.out.push(b'e');
                        }
                    }
                }
            }
            p.key("user_metadata");
            match change {
                // Another text: not PyTorch's default annotation.
                5 => p.text("step 3"),
                // A GET of the `"N/A"` memoized by this very entry (not the default).
                6 if own_na.is_some() => p.get(own_na.unwrap_or(0)),
                _ => p.key(""),
            }
            if change == 7 {
                p.key("extra");
                p.out.push(b'N');
            }
            if change == 8 {
                // A FRAME in the middle of an entry.
                p.out.push(0x95);
                p.out.extend(0u64.to_le_bytes());
            }
            p.out.push(b'u');
            if change == 9 {
                // The batch ends early: a single entry appended on its own.
                p.out.extend(b"e}(");
                p.key("action");
                p.key("snapshot");
                p.out.extend(b"ua(");
            }
        }
        p.out.extend(b"eau.");
        p.out
    }
}

#[test]
fn entries_that_change_shape_give_what_the_generic_reader_gives() {
    let dir = common::scratch("stream-shapes");
    for seed in 1..=6 {
        let bytes = changing_shapes::snapshot(3000, seed, seed > 4);
        let path = dir.join(format!("shapes-{seed}.pickle"));
        std::fs::write(&path, &bytes).unwrap();
        agree(&path).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let fast = pytorch::read_snapshot_streaming(&path, &device_0(streaming())).unwrap();
        assert!(fast.is_some(), "seed {seed}: streamed without falling back");
        // Corrupted: one to three bytes anywhere in the entries.
        let place = |r: u64, len: usize| 40 + r as usize % (len - 40);
        let (ok, err) = corrupted_agree(&bytes, &path, 150, seed.wrapping_mul(0x9e37_79b9), place);
        assert!(ok > 10 && err > 10, "seed {seed}: both outcomes exercised: {ok} ok, {err} errors");
    }
}

/// `bytes_read` ends at the file's size, gzipped or not, on every path that reads a snapshot:
/// the streaming reader, the one that replays as it reads, and the generic reader.
#[test]
fn bytes_read_counts_the_whole_file() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let gz = common::traces_dir().join("gpt2_train.pickle.gz");
    let dir = common::scratch("bytes-read");
    let plain = dir.join("gpt2_train.pickle");
    let mut inflated = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(&gz).unwrap()),
        &mut inflated,
    )
    .unwrap();
    std::fs::write(&plain, &inflated).unwrap();
    for path in [&gz, &plain] {
        let size = std::fs::metadata(path).unwrap().len();
        for streaming in [true, false] {
            let count = Arc::new(AtomicU64::new(0));
            let opts = ReadOptions { bytes_read: Some(count.clone()), streaming, ..generic() };
            read_trace_with(path, &opts).unwrap();
            assert_eq!(
                count.load(Ordering::Relaxed),
                size,
                "{} streaming {streaming}",
                path.display()
            );
        }
        let count = Arc::new(AtomicU64::new(0));
        let opts = ReadOptions { bytes_read: Some(count.clone()), ..streaming() };
        let mut fed = 0;
        pytorch::read_snapshot_replaying(path, &opts, |o| fed = o.ops.count()).unwrap();
        assert!(fed > 0, "{}: the replay was fed no op", path.display());
        assert_eq!(count.load(Ordering::Relaxed), size, "{} replaying", path.display());
    }
    std::fs::remove_dir_all(plain.parent().unwrap()).unwrap();
}

/// A snapshot of many entries that share a few stacks reads within a memory bound that grows
/// with what is distinct, not with the entries (issue 52). CPython memoizes every entry's
/// frames list and its fresh `"N/A"`: two or three memo keys an entry, which the memo packs
/// by the few values they name (`pickle::keys`: about a byte a key, where it took five), and
/// a string appended into the slot that holds it is no memory held (it was charged 43 bytes
/// each time). 600,000 entries read under 4 MiB, 7 bytes an entry (the first 524,288 keys kept
/// plain, four bytes each); before, they took more than 32 MiB.
#[test]
fn many_entries_sharing_stacks_read_within_a_memo_bound() {
    let entries = 600_000;
    let bytes = changing_shapes::snapshot(entries, 0, true);
    let dir = common::scratch("memo-bound");
    let path = dir.join("shared.pickle");
    std::fs::write(&path, &bytes).unwrap();
    let limits = pickle::Limits { max_held_bytes: 4 << 20, ..pickle::Limits::default() };
    let opts = ReadOptions { limits, packed_ops: Some(0), ..streaming() };
    let read = pytorch::read_snapshot_packed(&path, &opts).unwrap_or_else(|e| panic!("{e}"));
    // An allocation and its free request an op each; the completion is no op of its own.
    assert_eq!(read.ops_len(), entries / 3 * 2);
    let packed = read.packed.expect("the ops packed");
    assert!(packed.heap_bytes() < 8 * packed.len(), "{} bytes", packed.heap_bytes());
    assert_eq!(read.recorded_len, entries as u64);
}

/// The passes that read a sidecar's calls and free memory into the ops (`empty_cache` calls
/// placed by the allocator's counts, runs of frees read as `empty_cache`) give the same trace
/// on packed ops as on `Op`s, on every bundled and validation snapshot with a sidecar: the
/// ops, the recorded events' ops, the times and the notes.
#[test]
fn the_sidecar_passes_give_the_same_trace_on_packed_ops() {
    fn snapshots(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                snapshots(&p, out);
            } else if p.to_string_lossy().ends_with(".pickle.gz") {
                out.push(p);
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut paths = vec![];
    snapshots(&root.join("traces"), &mut paths);
    snapshots(&root.join("validation"), &mut paths);
    paths.retain(|p| pytorch::sidecar_path(p).is_some_and(|s| s.exists()));
    paths.sort();
    use allocsim_core::Op;
    let (mut with_calls, mut with_free, mut stayed_packed, mut edited_packed) = (0, 0, 0, 0);
    for path in &paths {
        let read = |packed_ops| {
            let opts = ReadOptions { packed_ops, ..ReadOptions::default() };
            pytorch::read_snapshot_packed(path, &opts).unwrap_or_else(|e| panic!("{e}"))
        };
        let (plain, packed) = (read(None), read(Some(0)));
        let name = path.display();
        assert!(plain.packed.is_none(), "{name}");
        // A history that starts mid-run has its ops unpacked for the start's inference.
        let ops = match &packed.packed {
            Some(ops) => ops.to_vec(),
            None => packed.trace.ops.clone(),
        };
        stayed_packed += usize::from(packed.packed.is_some());
        let called = |o: &Op| matches!(o, Op::EmptyCache | Op::SetMemoryFraction { .. });
        edited_packed += usize::from(packed.packed.is_some() && ops.iter().any(called));
        assert_eq!(ops, plain.trace.ops, "{name}");
        assert_eq!(packed.trace.recorded, plain.trace.recorded, "{name}");
        assert_eq!(packed.trace.op_times, plain.trace.op_times, "{name}");
        assert_eq!(packed.trace.warnings, plain.trace.warnings, "{name}");
        assert_eq!(packed.trace.meta, plain.trace.meta, "{name}");
        with_calls += usize::from(plain.trace.meta.calls_recorded);
        with_free += usize::from(plain.trace.meta.device_free_bytes.is_some());
    }
    let counts = format!(
        "{with_calls} with calls, {with_free} with free, {stayed_packed} packed, \
         {edited_packed} of them with calls among their ops"
    );
    eprintln!("{counts}");
    assert!(with_calls >= 10 && with_free >= 30 && stayed_packed >= 30, "{counts}");
    assert!(edited_packed >= 5, "{counts}");
}
