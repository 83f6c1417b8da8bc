//! The safe pickle reader and the writer: Python's own output for protocols 2 to 5, hostile
//! and broken input (each must give an error naming the place, never a panic), and round trips.

mod common;

use allocsim_trace::pickle::{self, Limits, PickleErrorKind, Value};
use std::rc::Rc;

fn kind(bytes: &[u8]) -> (u64, PickleErrorKind) {
    let e = pickle::from_slice(bytes).expect_err("must fail");
    (e.offset, e.kind)
}

/// The value `make_fixtures.py` pickles, checked field by field.
fn check_fixture(v: &Value, with_bytes: bool) {
    let int = |k: &str| v.get(k).and_then(Value::as_int).unwrap_or_else(|| panic!("{k}"));
    assert_eq!(v.get("none"), Some(&Value::None));
    assert_eq!(v.get("t"), Some(&Value::Bool(true)));
    assert_eq!(v.get("f"), Some(&Value::Bool(false)));
    assert_eq!(int("small"), 7);
    assert_eq!(int("u16"), 40000);
    assert_eq!(int("neg"), -5);
    assert_eq!(int("i32"), -2_000_000_000);
    assert_eq!(int("big"), 140045260423168);
    assert_eq!(int("min"), i64::MIN);
    assert_eq!(int("max"), i64::MAX);
    assert_eq!(v.get("float"), Some(&Value::Float(0.5)));
    assert_eq!(v.get("text").and_then(Value::as_str), Some("héllo ✓"));
    assert_eq!(v.get("long_text").and_then(Value::as_str), Some("x".repeat(300).as_str()));
    assert_eq!(v.get("tuple"), Some(&Value::tuple(vec![Value::Int(1), Value::Int(2)])));
    assert_eq!(v.get("tuple5").and_then(Value::as_seq).map(<[Value]>::len), Some(5));
    assert_eq!(v.get("empty"), Some(&Value::list(Vec::new())));
    let nested = v.get("nested").and_then(Value::as_seq).unwrap();
    assert_eq!(nested[1].get("k"), Some(&Value::tuple(vec![Value::Int(4)])));
    let many = v.get("many").and_then(Value::as_seq).unwrap();
    assert_eq!(many.len(), 2500);
    assert!(many.iter().enumerate().all(|(i, x)| x.as_int() == Some(i as i64)));
    // The frames list is one object shared by two dicts; the memo keeps it one `Rc`.
    let (Some(Value::List(a)), Some(Value::List(b))) =
        (v.get("a").and_then(|d| d.get("frames")), v.get("b").and_then(|d| d.get("frames")))
    else {
        panic!("frames lists");
    };
    assert!(Rc::ptr_eq(a, b));
    assert_eq!(a[0].get("line"), Some(&Value::Int(3)));
    if with_bytes {
        assert_eq!(v.get("bytes"), Some(&Value::bytes(b"\x00\x01\xff")));
    }
}

#[test]
fn reads_python_protocols_2_to_5() {
    for proto in 2..=5 {
        let path = common::data_dir().join(format!("proto{proto}.pickle"));
        let bytes = std::fs::read(&path).unwrap();
        let v = pickle::from_slice(&bytes).unwrap_or_else(|e| panic!("protocol {proto}: {e}"));
        check_fixture(&v, proto >= 3);
    }
}

#[test]
fn refuses_os_system_via_stack_global_and_reduce() {
    // pickle.dumps(Evil(), protocol=4) where Evil.__reduce__ returns (os.system, ("echo hi",)).
    let evil = b"\x80\x04\x95\x22\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\
                 \x93\x94\x8c\x07echo hi\x94\x85\x94R\x94.";
    let e = pickle::from_slice(evil).unwrap_err();
    assert_eq!(e.offset, 28);
    assert!(matches!(e.kind, PickleErrorKind::Refused { name: "STACK_GLOBAL", .. }));
    let msg = e.to_string();
    assert!(msg.contains("STACK_GLOBAL") && msg.contains("byte 28"), "{msg}");
}

#[test]
fn refuses_os_system_via_global_and_reduce() {
    // The same object pickled with protocol 2.
    let evil = b"\x80\x02cposix\nsystem\nq\x00X\x07\x00\x00\x00echo hiq\x01\x85q\x02Rq\x03.";
    let (offset, k) = kind(evil);
    assert_eq!(offset, 2);
    assert!(matches!(k, PickleErrorKind::Refused { name: "GLOBAL", .. }));
}

#[test]
fn refuses_every_code_opcode() {
    for (code, name) in [
        (b'R', "REDUCE"),
        (b'b', "BUILD"),
        (b'i', "INST"),
        (b'o', "OBJ"),
        (0x81, "NEWOBJ"),
        (0x92, "NEWOBJ_EX"),
        (0x82, "EXT1"),
        (0x83, "EXT2"),
        (0x84, "EXT4"),
        (b'P', "PERSID"),
        (b'Q', "BINPERSID"),
    ] {
        let (offset, k) = kind(&[0x80, 4, b'N', b'N', code, b'.']);
        assert_eq!(offset, 4, "{name}");
        assert!(
            matches!(k, PickleErrorKind::Refused { name: n, .. } if n == name),
            "{name}: {k:?}"
        );
    }
}

#[test]
fn empty_input() {
    assert!(matches!(kind(b"").1, PickleErrorKind::Empty));
}

#[test]
fn not_a_pickle() {
    assert!(matches!(kind(b"{\"json\": 1}").1, PickleErrorKind::NotAPickle(b'{')));
    assert!(matches!(kind(b"\x80\x09N.").1, PickleErrorKind::Protocol(9)));
}

#[test]
fn truncated_pickle() {
    let bytes =
        pickle::to_vec(&Value::str_dict([("key", Value::str("a long enough value"))])).unwrap();
    for cut in 1..bytes.len() {
        let e = pickle::from_slice(&bytes[..cut]).unwrap_err();
        assert!(
            matches!(e.kind, PickleErrorKind::Truncated(_) | PickleErrorKind::NoStop),
            "cut at {cut}: {e}"
        );
    }
    // A string whose length field claims far more than the input has: no allocation of
    // 4 GiB, just an error.
    let (offset, k) = kind(b"\x80\x04X\xff\xff\xff\xffabc");
    assert_eq!(offset, 2);
    assert!(matches!(k, PickleErrorKind::Truncated("BINUNICODE")));
    // One claiming more than the memory limit is read as it comes: the input ends first.
    let (_, k) = kind(b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7fabc");
    assert!(matches!(k, PickleErrorKind::Truncated("BINUNICODE8")), "{k:?}");
    // One that is there but does not fit is refused once what arrived reaches the limit.
    let mut bytes = b"\x80\x04\x8e".to_vec();
    bytes.extend((4u64 << 20).to_le_bytes());
    bytes.extend(vec![0; 4 << 20]);
    bytes.push(b'.');
    let limits = Limits { max_held_bytes: 8 << 20, ..Limits::default() };
    let e = pickle::from_reader_with(&bytes[..], &limits).unwrap_err();
    assert!(matches!(e.kind, PickleErrorKind::MemoryLimit(_)), "{e}");
    let limits = Limits { max_held_bytes: 16 << 20, ..Limits::default() };
    let v = pickle::from_reader_with(&bytes[..], &limits).unwrap();
    assert!(matches!(v, Value::Bytes(b) if b.len() == 4 << 20));
}

#[test]
fn ints_wider_than_64_bits_are_refused() {
    let (offset, k) = kind(b"\x80\x04\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.");
    assert_eq!(offset, 2);
    assert!(matches!(k, PickleErrorKind::IntTooWide(9)));
    // 2^64 - 1, C++'s `size_t(-1)` as PyTorch writes a generated frame's line, keeps its 64
    // bits (a torch.compile snapshot has it).
    let v = pickle::from_slice(b"\x80\x04\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.");
    assert!(matches!(v, Ok(Value::Int(-1))), "{v:?}");
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    // 100k nested one-tuples without MARK: depth grows with no stack growth.
    let mut bytes = vec![0x80, 4, b'N'];
    bytes.extend(std::iter::repeat_n(0x85u8, 100_000));
    bytes.push(b'.');
    assert!(matches!(kind(&bytes).1, PickleErrorKind::TooDeep(_)));
    // The same through the memo: each list holds the previous one by reference.
    let mut bytes = vec![0x80, 4, b']', 0x94];
    for i in 0..2000u32 {
        bytes.extend([b']', 0x94, b'j']);
        bytes.extend(i.to_le_bytes());
        bytes.push(b'a');
    }
    bytes.push(b'.');
    assert!(matches!(kind(&bytes).1, PickleErrorKind::TooDeep(_)));
}

#[test]
fn self_reference_is_refused() {
    // l = []; l.append(l)
    let (_, k) = kind(b"\x80\x04]\x94h\x00a.");
    assert!(matches!(k, PickleErrorKind::SharedMutation), "{k:?}");
}

#[test]
fn memory_and_memo_limits_hold() {
    let mut bytes = vec![0x80, 4];
    for _ in 0..100_000 {
        bytes.extend([b'N', 0x94]);
    }
    bytes.push(b'.');
    let limits = Limits { max_memo: 100, ..Limits::default() };
    let e = pickle::from_reader_with(&bytes[..], &limits).unwrap_err();
    assert!(matches!(e.kind, PickleErrorKind::MemoLimit(100)));
    // 100k memo entries and stack slots take about 4.5 MB.
    let limits = Limits { max_held_bytes: 2 << 20, ..Limits::default() };
    let e = pickle::from_reader_with(&bytes[..], &limits).unwrap_err();
    assert!(matches!(e.kind, PickleErrorKind::MemoryLimit(_)));
    let limits = Limits { max_held_bytes: 8 << 20, ..Limits::default() };
    pickle::from_reader_with(&bytes[..], &limits).unwrap();
}

#[test]
fn bad_memo_get_and_stack_misuse() {
    assert!(matches!(kind(b"\x80\x04h\x05.").1, PickleErrorKind::MemoMissing(5)));
    assert!(matches!(kind(b"\x80\x04.").1, PickleErrorKind::StackUnderflow(_)));
    assert!(matches!(kind(b"\x80\x04Ne.").1, PickleErrorKind::NoMark(_)));
    assert!(matches!(kind(b"\x80\x04N(Ne.").1, PickleErrorKind::BadTarget { .. }));
    // STOP cannot reach below a MARK (Python pops from the list the MARK started).
    assert!(matches!(kind(b"\x80\x04N(.").1, PickleErrorKind::StackUnderflow(_)));
    assert!(matches!(kind(b"\x80\x04\x8f.").1, PickleErrorKind::Unsupported(_)));
    assert!(matches!(kind(b"\x80\x04\xff.").1, PickleErrorKind::UnknownOpcode(0xff)));
}

#[test]
fn garbage_never_panics() {
    // A cheap deterministic fuzz: mutate a real pickle byte by byte.
    let good = std::fs::read(common::data_dir().join("proto4.pickle")).unwrap();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..1000 {
        let mut bytes = good.clone();
        for _ in 0..4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let i = (state % bytes.len() as u64) as usize;
            bytes[i] = (state >> 32) as u8;
        }
        let _ = pickle::from_slice(&bytes);
    }
}

#[test]
fn writer_round_trips_and_shares() {
    let frames = Value::list(vec![Value::str_dict([("line", Value::Int(1))])]);
    let v = Value::str_dict([
        ("a", frames.clone()),
        ("b", frames.clone()),
        (
            "ints",
            Value::list(
                [0, 255, 256, 65535, 65536, -1, -129, i64::MIN, i64::MAX, 1 << 40]
                    .map(Value::Int)
                    .to_vec(),
            ),
        ),
        ("t0", Value::tuple(Vec::new())),
        ("t4", Value::tuple(vec![Value::None; 4])),
        ("f", Value::Float(-2.5)),
        ("bytes", Value::bytes(&[1, 2, 3])),
        ("long", Value::str(&"é".repeat(200))),
        ("many", Value::list((0..2500).map(Value::Int).collect())),
    ]);
    let bytes = pickle::to_vec(&v).unwrap();
    let back = pickle::from_slice(&bytes).unwrap();
    assert_eq!(back, v);
    let (Some(Value::List(a)), Some(Value::List(b))) = (back.get("a"), back.get("b")) else {
        panic!()
    };
    assert!(Rc::ptr_eq(a, b), "a shared list is written once and read back shared");
}

/// An empty APPENDS or SETITEMS is a no-op on whatever lies below its mark, as in CPython
/// (`pickle.loads(b'\x80\x04\x8c\x01a(u.') == 'a'`); with items, only a list or dict takes them.
/// The generic reader once refused the empty case the record streamer took (found by the
/// `snapshot_file` fuzz target).
#[test]
fn empty_appends_and_setitems_change_nothing() {
    assert_eq!(pickle::from_slice(b"\x80\x04\x8c\x01a(u.").unwrap(), Value::str("a"));
    assert_eq!(pickle::from_slice(b"\x80\x04K\x05(e.").unwrap(), Value::Int(5));
    assert!(pickle::from_slice(b"\x80\x04\x8c\x01a(K\x01K\x02u.").is_err());
}

/// The error reading input `name` of the `snapshot_file` fuzz target's corpus.
fn snapshot_file_corpus_error(name: &str) -> String {
    let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/snapshot_file/");
    allocsim_trace::read_trace(format!("{corpus}{name}")).unwrap_err().to_string()
}

/// A batch opened inside a snapshot entry where a key belongs: its SETITEMS applies to the
/// value below the MARK, an int here, which CPython refuses. The record streamer once took the
/// batch's pairs as the entry's (found by the `snapshot_file` fuzz target; the input is in its
/// corpus): now both readers refuse it alike.
#[test]
fn a_batch_inside_an_entry_applies_to_the_value_below_it() {
    let err = snapshot_file_corpus_error("crash-cb633dfda8f83c8076a6a04ef92475c43ee47a0e");
    assert!(err.contains("pickle byte 477: SETITEMS on a int"), "{err}");
}

/// The same, where the entry goes on in the generic reader (a `PROTO` inside it): a batch
/// opened after the entry's last value applies to that value, a str here. The record
/// streamer, which had taken the entry's pairs off the stack, once filled the entry with it
/// (found by the `snapshot_file` fuzz target on the device host; the input is in its corpus).
#[test]
fn a_batch_after_an_entrys_last_value_applies_to_that_value() {
    let err = snapshot_file_corpus_error("crash-beed63e81cb8438baee97fa98349f672bef93e80");
    assert!(err.contains("pickle byte 528: SETITEMS on a str"), "{err}");
}

/// A frame of `train.py`'s `step` at `line`.
fn frame(line: i64) -> Value {
    Value::str_dict([
        ("filename", Value::str("train.py")),
        ("line", Value::Int(line)),
        ("name", Value::str("step")),
    ])
}

/// Entry `i` of a trace: an allocation of 512 bytes with `frames`.
fn alloc_entry(i: i64, frames: Value) -> Value {
    Value::str_dict([
        ("action", Value::str("alloc")),
        ("addr", Value::Int(0x7f00_0000_0000 + i * 512)),
        ("size", Value::Int(512)),
        ("stream", Value::Int(0)),
        ("time_us", Value::Int(i)),
        ("frames", frames),
    ])
}

/// A snapshot of one GPU's `entries`, written to a file of its own (`name`) and read with
/// `opts`.
fn read_snapshot_of(
    entries: Vec<Value>,
    name: &str,
    opts: &allocsim_trace::ReadOptions,
) -> Result<allocsim_core::Trace, allocsim_trace::TraceError> {
    let snapshot = Value::str_dict([
        ("segments", Value::list(Vec::new())),
        ("device_traces", Value::list(vec![Value::list(entries)])),
    ]);
    let dir = std::env::temp_dir().join(format!("allocsim-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("frames.pickle");
    std::fs::write(&path, pickle::to_vec(&snapshot).unwrap()).unwrap();
    let read = allocsim_trace::read_trace_with(&path, opts);
    std::fs::remove_dir_all(&dir).unwrap();
    read
}

/// PyTorch memoizes every entry's `frames` list, so a reader keeps each to the end; equal
/// lists read by the record streamer are held once. 50,000 entries, each with a list of its
/// own of the same 40 shared frames, would hold 32 MB of lists: they read within 16 MiB.
#[test]
fn an_entrys_frames_list_equal_to_an_earlier_one_is_held_once() {
    let frames: Vec<Value> = (0..40).map(frame).collect();
    // A second reference to each list makes the writer memoize it, as CPython's pickler
    // memoizes every list.
    let lists: Vec<Value> = (0..50_000).map(|_| Value::list(frames.clone())).collect();
    let entries = (0..50_000i64).map(|i| alloc_entry(i, lists[i as usize].clone())).collect();
    let small = Limits { max_held_bytes: 16 << 20, ..Limits::default() };
    let opts = allocsim_trace::ReadOptions { sidecar: false, limits: small, ..Default::default() };
    let trace = read_snapshot_of(entries, "frames", &opts).expect("reads within 16 MiB");
    assert_eq!(trace.ops.len(), 50_000);
    assert_eq!(trace.stacks.len(), 1, "one stack");
    assert_eq!(trace.stacks[0].frames.len(), 40);
    assert_eq!(trace.op_stacks.len(), 50_000, "every allocation has it");
}

/// Frames lists that no memo entry holds (a pickler that memoizes nothing writes them so): the
/// streamed reader drops each once its entry is read, and the allocator gives a later list its
/// address. Stacks were told apart by the list's address without holding the list, so the
/// streamed reader gave 11 stacks here where the generic reader gives 2,000.
#[test]
fn stacks_of_unmemoized_frames_lists_are_told_apart() {
    let read = |streaming| {
        // Made afresh for each file: a list referred to twice is memoized by the writer.
        let entries = (0..2000i64).map(|i| alloc_entry(i, Value::list(vec![frame(i)]))).collect();
        let opts = allocsim_trace::ReadOptions { sidecar: false, streaming, ..Default::default() };
        read_snapshot_of(entries, &format!("unmemo-{streaming}"), &opts).unwrap()
    };
    let (streamed, generic) = (read(true), read(false));
    assert_eq!(generic.stacks.len(), 2000);
    assert_eq!(streamed.stacks, generic.stacks);
    assert_eq!(streamed.op_stacks, generic.op_stacks);
}
