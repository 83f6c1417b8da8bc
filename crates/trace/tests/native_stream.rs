//! The chunked native layout (version 2): streaming its ops gives the trace's ops, the old
//! version 1 still reads and streams, the writer keeps its counts, and a corrupt or truncated
//! file is an error that names it, never a panic or a short trace.

mod common;

use allocsim_core::{AllocId, Op, RecordedKind, StreamId, Trace};
use allocsim_trace::native::{self, NativeFile, NativeWriter};
use allocsim_trace::{read_trace, write_trace};
use std::path::{Path, PathBuf};

fn real(name: &str) -> Trace {
    read_trace(common::traces_dir().join(format!("{name}.pickle.gz"))).unwrap()
}

fn streamed_ops(path: &Path) -> Result<Vec<Op>, String> {
    let stream = native::read_native_ops(path).map_err(|e| e.to_string())?;
    assert_eq!(stream.ops.total() as usize, stream.ops.size_hint().1.unwrap());
    stream.ops.map(|r| r.map_err(|e| e.to_string())).collect()
}

#[test]
fn streamed_ops_are_the_trace_ops_and_the_head_has_the_device_events() {
    let dir = common::scratch("native-stream");
    for name in ["gpt2_train", "synthetic_oom", "varlen_train_expandable"] {
        let t = common::native_keeps(real(name));
        let path = dir.join(format!("{name}.allocsim"));
        write_trace(&t, &path).unwrap();
        let stream = native::read_native_ops(&path).unwrap();
        assert_eq!(stream.recorded_len, t.recorded.len() as u64);
        let device: Vec<_> =
            t.recorded.iter().filter(|r| r.kind.is_segment_event()).copied().collect();
        assert_eq!(stream.head.recorded, device, "{name}: only the device events are kept");
        assert!(stream.head.recorded.iter().any(|r| r.kind != RecordedKind::Alloc));
        assert_eq!(stream.head.meta, t.meta);
        assert_eq!(stream.head.stacks, t.stacks);
        assert_eq!(stream.head.op_stacks, t.op_stacks);
        assert!(stream.head.ops.is_empty());
        assert_eq!(streamed_ops(&path).unwrap(), t.ops, "{name}");
    }
}

/// Many chunks, ids far apart, every kind of op.
#[test]
fn writer_streams_long_traces_in_chunks() {
    let dir = common::scratch("native-long");
    let path = dir.join("long.allocsim");
    let n = 200_000u64;
    let op = |i: u64| match i % 7 {
        0 => Op::Alloc { id: AllocId(i * 3), size: i << 20, stream: StreamId(u64::MAX - i) },
        1 => Op::FreeRequested { id: AllocId(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) },
        2 => Op::FreeCompleted { id: AllocId(0) },
        3 => Op::RecordStream { id: AllocId(u64::MAX), stream: StreamId(i) },
        4 => Op::EmptyCache,
        5 => Op::SetMemoryFraction { fraction: 1.0 / (i + 1) as f64 },
        _ => Op::SetAllocatorSettings { conf: format!("max_split_size_mb:{i}") },
    };
    let file = std::fs::File::create(&path).unwrap();
    let mut w =
        NativeWriter::new(std::io::BufWriter::new(file), &Trace::default(), n, &path).unwrap();
    for i in 0..n {
        w.op(&op(i)).unwrap();
    }
    assert!(w.op(&Op::EmptyCache).is_err(), "one op more than announced");
    drop(w.finish());
    let ops = streamed_ops(&path).unwrap();
    assert_eq!(ops.len() as u64, n);
    assert!(ops.iter().enumerate().all(|(i, o)| *o == op(i as u64)));
    // The writer refuses to finish short.
    let mut short = NativeWriter::new(Vec::new(), &Trace::default(), 2, &path).unwrap();
    short.op(&Op::EmptyCache).unwrap();
    assert!(short.finish().unwrap_err().to_string().contains("fewer"));
}

#[test]
fn version_1_files_still_read_and_stream() {
    let t = common::native_keeps(real("synthetic_multistream"));
    let mut bytes = b"ALLOCSIM\x01\0\0\0".to_vec();
    let config = bincode::config::standard();
    bincode::serde::encode_into_std_write(NativeFile::from_trace(&t), &mut bytes, config).unwrap();
    let dir = common::scratch("native-v1");
    let path = dir.join("old.allocsim");
    std::fs::write(&path, &bytes).unwrap();
    common::assert_same(&read_trace(&path).unwrap(), &t);
    assert_eq!(streamed_ops(&path).unwrap(), t.ops);
}

fn cut_and_flipped(good: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut cases = Vec::new();
    for cut in [13, 16, 40, good.len() / 3, good.len() / 2, good.len() - 9, good.len() - 1] {
        cases.push((format!("cut at {cut}"), good[..cut].to_vec()));
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..300 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut bytes = good.to_vec();
        let i = 12 + state as usize % (good.len() - 12);
        bytes[i] ^= 1 << (state >> 61);
        cases.push((format!("bit flip at {i}"), bytes));
    }
    cases
}

#[test]
fn corrupt_files_are_errors_naming_the_file() {
    let t = real("resnet50_train");
    let dir = common::scratch("native-corrupt");
    let good_path = dir.join("good.allocsim");
    write_trace(&t, &good_path).unwrap();
    let good = std::fs::read(&good_path).unwrap();
    let path = dir.join("bad.allocsim");
    for (what, bytes) in cut_and_flipped(&good) {
        std::fs::write(&path, &bytes).unwrap();
        let whole = read_trace(&path);
        let streamed = streamed_ops(&path);
        if what.starts_with("cut") {
            let msg = whole.as_ref().map(|_| ()).unwrap_err().to_string();
            assert!(msg.contains("bad.allocsim") && msg.contains("corrupt or truncated"), "{msg}");
            assert!(streamed.is_err(), "{what}: a truncated stream ends in an error");
        }
        // Both readers agree on whether the ops are fine (a flip may land in a size).
        if let (Ok(t), Ok(ops)) = (&whole, &streamed) {
            assert_eq!(&t.ops, ops, "{what}");
        }
        if let Err(e) = &streamed {
            assert!(e.contains("bad.allocsim"), "{what}: {e}");
        }
    }
}

#[test]
fn bounded_memory_claims() {
    // A header or chunk claiming a gigabyte is refused before anything is allocated.
    let dir = common::scratch("native-claims");
    let path: PathBuf = dir.join("claims.allocsim");
    let mut bytes = b"ALLOCSIM\x02\0\0\0".to_vec();
    bytes.extend_from_slice(&(1u32 << 30).to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let msg = read_trace(&path).unwrap_err().to_string();
    assert!(msg.contains("claims"), "{msg}");
}
