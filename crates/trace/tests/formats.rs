//! RMM logs, the native formats, writing snapshots, and choosing formats by name: round trips
//! and bad input.

mod common;

use allocsim_core::{
    AllocId, Op, RecordedEvent, RecordedKind, Stack, StackFrame, StreamId, Trace, TraceMeta,
};
use allocsim_trace::{
    native, pickle, pytorch, read_trace, read_trace_with, rmm, write_trace, Format, ReadOptions,
    TraceError,
};
use std::path::Path;

fn real(name: &str) -> Trace {
    read_trace(common::traces_dir().join(format!("{name}.pickle.gz"))).unwrap()
}

/// A small trace using every op and field, for lossless formats.
fn everything() -> Trace {
    let id = AllocId;
    Trace {
        meta: TraceMeta {
            source_format: "hand-made".into(),
            alloc_conf: Some("expandable_segments:True".into()),
            memory_fraction: Some(0.25),
            device_total_bytes: Some(80 << 30),
            device_free_bytes: Some(79 << 30),
            expected_stats: Some(vec![("a".into(), -1), ("b".into(), 7)]),
            stats_at_start: None,
            outside_allocator_bytes: None,
            outside_profile: Vec::new(),
            recorded_with: None,
            calls_recorded: false,
            rank: None,
            world_size: None,
        },
        ops: vec![
            Op::Alloc { id: id(0), size: 100, stream: StreamId(0) },
            Op::RecordStream { id: id(0), stream: StreamId(u64::MAX) },
            Op::FreeRequested { id: id(0) },
            Op::FreeCompleted { id: id(0) },
            Op::EmptyCache,
            Op::SetMemoryFraction { fraction: 0.5 },
            Op::SetAllocatorSettings { conf: "max_split_size_mb:32".into() },
        ],
        recorded: vec![RecordedEvent {
            op: 0,
            kind: RecordedKind::Alloc,
            addr: 0x7f00_0000_0000,
            size: 100,
            stream: StreamId(0),
        }],
        stacks: vec![Stack {
            frames: vec![StackFrame { name: "f".into(), filename: "é.py".into(), line: 9 }],
        }],
        op_stacks: vec![(0, 0)],
        // Times are a snapshot's alone: the native formats do not carry them.
        op_times: Vec::new(),
        annotations: Vec::new(),
        op_annotations: Vec::new(),
        warnings: vec!["a warning".into()],
        start: None,
    }
}

#[test]
fn format_by_extension_and_content() {
    let f = |name: &str| Format::from_path(Path::new(name));
    assert_eq!(f("a.pickle"), Some(Format::PytorchSnapshot));
    assert_eq!(f("a.pickle.gz"), Some(Format::PytorchSnapshotGz));
    assert_eq!(f("a.csv"), Some(Format::RmmCsv));
    assert_eq!(f("a.rmm.csv"), Some(Format::RmmCsv));
    assert_eq!(f("a.allocsim"), Some(Format::Native));
    assert_eq!(f("a.allocsim.json"), Some(Format::NativeJson));
    assert_eq!(f("a.json"), None);
    assert_eq!(Format::sniff(b"ALLOCSIM\x01\0\0\0"), Some(Format::Native));
    assert_eq!(Format::sniff(b"Thread,Time,Action"), Some(Format::RmmCsv));
    let dir = common::scratch("unknown");
    let path = dir.join("mystery.txt");
    std::fs::write(&path, b"just text").unwrap();
    assert!(matches!(read_trace(&path), Err(TraceError::UnknownFormat { .. })));
    assert!(matches!(write_trace(&everything(), &path), Err(TraceError::UnknownFormat { .. })));
}

#[test]
fn snapshot_to_native_binary_and_back() {
    let dir = common::scratch("native");
    for t in
        [real("gpt2_train"), real("synthetic_multistream"), everything()].map(common::native_keeps)
    {
        let path = dir.join("t.allocsim");
        write_trace(&t, &path).unwrap();
        assert!(std::fs::read(&path).unwrap().starts_with(b"ALLOCSIM\x02\0\0\0"));
        common::assert_same(&read_trace(&path).unwrap(), &t);
    }
}

#[test]
fn snapshot_to_native_json_and_back() {
    let dir = common::scratch("native-json");
    for t in [real("resnet50_train"), everything()].map(common::native_keeps) {
        let path = dir.join("t.allocsim.json");
        write_trace(&t, &path).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(json["format"], "allocsim");
        assert_eq!(json["version"], 1);
        common::assert_same(&read_trace(&path).unwrap(), &t);
    }
}

#[test]
fn native_bad_input() {
    let dir = common::scratch("native-bad");
    let path = dir.join("t.allocsim");
    let err = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        read_trace(&path).unwrap_err().to_string()
    };
    assert!(err(b"").contains("empty"));
    assert!(err(b"NOTALLOCSIM").contains("no ALLOCSIM magic"));
    assert!(err(b"ALLOCSIM\x03\0\0\0").contains("unsupported allocsim format version 3"));
    write_trace(&everything(), &path).unwrap();
    let good = std::fs::read(&path).unwrap();
    for cut in [12, good.len() / 2, good.len() - 1] {
        let msg = err(&good[..cut]);
        assert!(msg.contains("t.allocsim") && msg.contains("corrupt or truncated"), "{msg}");
    }
    // A string length claiming far more than the file holds.
    let mut huge = b"ALLOCSIM\x01\0\0\0".to_vec();
    huge.extend([0xfc, 0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert!(err(&huge).contains("corrupt or truncated"));

    let path = dir.join("t.allocsim.json");
    let err = |text: &str| {
        std::fs::write(&path, text).unwrap();
        read_trace(&path).unwrap_err().to_string()
    };
    assert!(err("{}").contains("not an allocsim JSON trace"));
    assert!(err(r#"{"format": "allocsim", "version": 9}"#).contains("version 9"));
    assert!(err(r#"{"format": "allocsim", "version": 1, "ops": []}"#).contains("JSON"));
    let mut bad = native::NativeFile::from_trace(&everything());
    bad.op_stacks.push((99, 0));
    let msg = err(&serde_json::to_string(&bad).unwrap());
    assert!(msg.contains("op_stacks[1]"), "{msg}");
}

#[test]
fn snapshot_written_and_read_back_is_the_same_trace() {
    let dir = common::scratch("snapshot-rt");
    for name in ["gpt2_train", "synthetic_oom", "varlen_train_expandable"] {
        let t = read_trace_with(
            common::traces_dir().join(format!("{name}.pickle.gz")),
            &ReadOptions::without_sidecar(),
        )
        .unwrap();
        for file in ["t.pickle.gz", "t.pickle"] {
            let path = dir.join(file);
            write_trace(&t, &path).unwrap();
            common::assert_same(
                &read_trace_with(&path, &ReadOptions::without_sidecar()).unwrap(),
                &t,
            );
        }
    }
}

#[test]
fn snapshot_from_ops_only_gives_each_block_an_address_and_reads_back() {
    let mut t = everything();
    t.recorded.clear();
    let v = pytorch::trace_to_snapshot(&t).unwrap();
    let entries = v.get("device_traces").and_then(|d| d.as_seq()).unwrap()[0].as_seq().unwrap();
    let actions: Vec<&str> =
        entries.iter().map(|e| e.get("action").unwrap().as_str().unwrap()).collect();
    // RecordStream defers the completion to the FreeCompleted op.
    assert_eq!(actions, ["alloc", "free_requested", "free_completed"]);
    let base = pickle::Value::Int(pytorch::SYNTHETIC_BASE as i64);
    assert!(entries.iter().all(|e| e.get("addr") == Some(&base)));
    assert_eq!(
        v.get("allocator_settings").and_then(|s| s.get("PYTORCH_CUDA_ALLOC_CONF")),
        Some(&pickle::Value::str("expandable_segments:True"))
    );
    assert_eq!(v.get("segments"), Some(&pickle::Value::list(vec![])));
    assert_eq!(v.get("external_annotations"), Some(&pickle::Value::list(vec![])));

    // Blocks live at once get addresses apart, so the file reads back as the same ops.
    let id = AllocId;
    let ops = vec![
        Op::Alloc { id: id(0), size: 100, stream: StreamId(0) },
        Op::Alloc { id: id(1), size: 512, stream: StreamId(0) },
        Op::FreeRequested { id: id(0) },
        Op::Alloc { id: id(2), size: 1 << 20, stream: StreamId(0) },
        Op::FreeRequested { id: id(1) },
        Op::FreeRequested { id: id(2) },
    ];
    let t = Trace { ops, ..Trace::default() };
    let dir = common::scratch("ops-only");
    let path = dir.join("t.pickle.gz");
    write_trace(&t, &path).unwrap();
    let back = read_trace_with(&path, &ReadOptions::without_sidecar()).unwrap();
    assert_eq!(back.ops, t.ops);
}

/// A 0-byte tensor never reaches PyTorch's allocator: no entry for it or its free (found by
/// `allocsim fuzz --seed 7 --iters 20000`: the run recorded nothing, its export an `alloc`).
#[test]
fn snapshot_from_ops_skips_zero_byte_allocations() {
    let ops = vec![
        Op::Alloc { id: AllocId(0), size: 0, stream: StreamId(0) },
        Op::Alloc { id: AllocId(1), size: 512, stream: StreamId(0) },
        Op::FreeRequested { id: AllocId(0) },
        Op::FreeRequested { id: AllocId(1) },
    ];
    let t = Trace { ops, ..Trace::default() };
    let v = pytorch::trace_to_snapshot(&t).unwrap();
    let entries = v.get("device_traces").and_then(|d| d.as_seq()).unwrap()[0].as_seq().unwrap();
    let sizes: Vec<(&str, i64)> = entries
        .iter()
        .map(|e| {
            (e.get("action").unwrap().as_str().unwrap(), e.get("size").unwrap().as_int().unwrap())
        })
        .collect();
    assert_eq!(sizes, [("alloc", 512), ("free_requested", 512), ("free_completed", 512)]);
}

#[test]
fn failed_write_keeps_the_existing_file() {
    let dir = common::scratch("atomic");
    let path = dir.join("keep.pickle");
    std::fs::write(&path, b"precious").unwrap();
    let mut t = everything();
    t.recorded[0].size = u64::MAX; // does not fit in int64
    let e = write_trace(&t, &path).unwrap_err();
    assert!(matches!(e, TraceError::Unwritable { .. }), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temporary file left behind");
    assert!(write_trace(&t, dir.join("no/such/dir/x.allocsim")).is_err());
}

const RMM_LOG: &str = "\
Thread,Time,Action,Pointer,Size,Stream
140245734123264,14:03:27.123456,allocate,0x7f8a2c000000,1048576,0
140245734123264,14:03:27.123460,allocate,0x7f8a2c100000,256,7f3a00000010
140245734123264,14:03:27.123470,allocate failure,(nil),99999999999,0
140245734123264,14:03:27.123480,free,0x7f8a2c000000,1048576,0
140245734123264,14:03:27.123490,free,0x7f8a2c100000,256,7f3a00000010
";

#[test]
fn rmm_log_reads() {
    let dir = common::scratch("rmm");
    let path = dir.join("log.csv");
    std::fs::write(&path, RMM_LOG).unwrap();
    let t = read_trace(&path).unwrap();
    let s = StreamId(0x7f3a_0000_0010);
    assert_eq!(
        t.ops,
        vec![
            Op::Alloc { id: AllocId(0), size: 1048576, stream: StreamId(0) },
            Op::Alloc { id: AllocId(1), size: 256, stream: s },
            Op::Alloc { id: AllocId(2), size: 99999999999, stream: StreamId(0) },
            Op::FreeRequested { id: AllocId(0) },
            Op::FreeRequested { id: AllocId(1) },
        ]
    );
    let kinds: Vec<(u64, RecordedKind, u64)> =
        t.recorded.iter().map(|r| (r.op, r.kind, r.addr)).collect();
    assert_eq!(
        kinds,
        vec![
            (0, RecordedKind::Alloc, 0x7f8a2c000000),
            (1, RecordedKind::Alloc, 0x7f8a2c100000),
            (2, RecordedKind::Oom, 0),
            (3, RecordedKind::FreeRequested, 0x7f8a2c000000),
            (3, RecordedKind::FreeCompleted, 0x7f8a2c000000),
            (4, RecordedKind::FreeRequested, 0x7f8a2c100000),
            (4, RecordedKind::FreeCompleted, 0x7f8a2c100000),
        ]
    );
    assert_eq!(t.meta.source_format, rmm::SOURCE_FORMAT);
    assert!(t.warnings.is_empty());
}

#[test]
fn rmm_log_started_late_gets_synthetic_allocs() {
    let log = "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000000,free,0x100,64,0\n";
    let t = rmm::read_rmm_from(log.as_bytes(), Path::new("late.csv")).unwrap();
    assert_eq!(
        t.ops,
        vec![
            Op::Alloc { id: AllocId(0), size: 64, stream: StreamId(0) },
            Op::FreeRequested { id: AllocId(0) }
        ]
    );
    assert!(t.warnings[0].contains("1 frees"));
}

#[test]
fn rmm_write_then_read_gives_the_same_ops() {
    let dir = common::scratch("rmm-rt");
    let path = dir.join("out.rmm.csv");
    let original = rmm::read_rmm_from(RMM_LOG.as_bytes(), Path::new("x.csv")).unwrap();
    write_trace(&original, &path).unwrap();
    let back = read_trace(&path).unwrap();
    assert_eq!(back.ops, original.ops);
    assert_eq!(back.recorded, original.recorded, "recorded pointers are reused");
    // A trace with no recorded events gets made-up distinct pointers.
    let ops_only = Trace {
        ops: (0..50)
            .map(|i| Op::Alloc { id: AllocId(i), size: i + 1, stream: StreamId(i % 3) })
            .chain((0..50).rev().map(|i| Op::FreeRequested { id: AllocId(i) }))
            .collect(),
        ..Trace::default()
    };
    write_trace(&ops_only, &path).unwrap();
    assert_eq!(read_trace(&path).unwrap().ops, ops_only.ops);
    // Real snapshot ops (with OOMs) survive too.
    let t = real("synthetic_oom");
    write_trace(&t, &path).unwrap();
    assert_eq!(read_trace(&path).unwrap().ops, t.ops);
}

#[test]
fn rmm_bad_input_names_line_and_column() {
    let err = |text: &str| {
        rmm::read_rmm_from(text.as_bytes(), Path::new("bad.csv")).unwrap_err().to_string()
    };
    let h = "Thread,Time,Action,Pointer,Size,Stream\n";
    let msg = err(&format!("{h}1,t,allocate,0xZZ,10,0\n"));
    assert!(msg.contains("bad.csv: line 2, column Pointer"), "{msg}");
    let msg = err(&format!("{h}1,t,allocate,0x10,10,0\n1,t,resize,0x10,10,0\n"));
    assert!(msg.contains("line 3, column Action") && msg.contains("resize"), "{msg}");
    let msg = err(&format!("{h}1,t,allocate,0x10,-4,0\n"));
    assert!(msg.contains("column Size"), "{msg}");
    let msg = err(&format!("{h}1,t,allocate,0x10,{},0\n", (1u64 << 62) + 1));
    assert!(msg.contains("column Size"), "{msg}");
    let msg = err(&format!("{h}1,t,allocate,0x10,10,xyz\n"));
    assert!(msg.contains("column Stream"), "{msg}");
    let msg = err(&format!("{h}1,t,allocate,0x10\n"));
    assert!(msg.contains("line 2") && msg.contains("malformed CSV"), "{msg}");
    let msg = err("Thread,Time,Pointer,Size,Stream\n");
    assert!(msg.contains("no Action column"), "{msg}");
    assert!(matches!(
        rmm::read_rmm_from(&b""[..], Path::new("e.csv")),
        Err(TraceError::Empty { .. })
    ));
}

/// A memory fraction that is not a number is refused by name (libFuzzer's `native_decode`
/// found one that read back unequal to itself, NaN != NaN).
#[test]
fn a_fraction_that_is_not_a_number_is_refused() {
    for fraction in [f64::NAN, f64::INFINITY] {
        let op = Trace { ops: vec![Op::SetMemoryFraction { fraction }], ..Trace::default() };
        let meta = TraceMeta { memory_fraction: Some(fraction), ..TraceMeta::default() };
        for t in [op, Trace { meta, ..Trace::default() }] {
            let mut bytes = Vec::new();
            native::write_native(&t, &mut bytes, Path::new("nan.allocsim")).unwrap();
            let e = native::read_native_from(&bytes[..], Path::new("nan.allocsim")).unwrap_err();
            assert!(e.to_string().contains("nan.allocsim"), "{e}");
        }
    }
}

/// A list longer than the header announced is refused at its first chunk past the count,
/// not after the reader has held all of it.
#[test]
fn native_lists_are_held_to_the_header_as_they_arrive() {
    let mut t = everything();
    let event = t.recorded[0];
    t.recorded = vec![event; 5];
    let dir = common::scratch("native-claims");
    let path = dir.join("t.allocsim");
    write_trace(&t, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let old_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let mut header = native::NativeHeader::of(&t, t.ops.len() as u64);
    header.recorded = 2;
    let encoded = bincode::serde::encode_to_vec(&header, bincode::config::standard()).unwrap();
    let mut claimed = bytes[..12].to_vec();
    claimed.extend((encoded.len() as u32).to_le_bytes());
    claimed.extend(&encoded);
    claimed.extend(&bytes[16 + old_len..]);
    std::fs::write(&path, &claimed).unwrap();
    let e = read_trace(&path).unwrap_err().to_string();
    assert!(e.contains("t.allocsim") && e.contains("more recorded events than the header"), "{e}");
}
