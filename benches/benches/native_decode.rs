//! Decoding the native format: streaming the ops of a version 2 file (`read_native_ops`),
//! reading a whole version 2 file, and reading the same trace as version 1 (one bincode
//! piece, as before chunks), on 16 copies of the Llama generate recording (2.6M ops).
//!
//! `cargo bench -p allocsim-benches --features bench --bench native_decode`

use allocsim_benches::{bundled, write_repeated, LLAMA};
use allocsim_trace::native::{self, NativeFile};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::io::BufWriter;

fn decode(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("allocsim-bench-native-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = allocsim_trace::read_trace(bundled(LLAMA)).unwrap();
    let v2 = dir.join("llama16.allocsim");
    let file = BufWriter::new(std::fs::File::create(&v2).unwrap());
    let ops = write_repeated(&source, 16, file, &v2).unwrap();
    let whole = native::read_native(&v2).unwrap();
    let v1 = dir.join("llama16-v1.allocsim");
    let mut bytes = b"ALLOCSIM\x01\0\0\0".to_vec();
    let config = bincode::config::standard();
    bincode::serde::encode_into_std_write(NativeFile::from_trace(&whole), &mut bytes, config)
        .unwrap();
    std::fs::write(&v1, bytes).unwrap();
    drop(whole);

    let mut g = c.benchmark_group("native_decode");
    g.sample_size(10).throughput(Throughput::Elements(ops));
    g.bench_function("v2_stream_ops", |b| {
        b.iter(|| {
            let stream = native::read_native_ops(&v2).unwrap();
            stream.ops.fold(0u64, |n, op| n + u64::from(op.is_ok()))
        })
    });
    g.bench_function("v2_read_whole", |b| b.iter(|| native::read_native(&v2).unwrap().ops.len()));
    g.bench_function("v1_read_whole", |b| b.iter(|| native::read_native(&v1).unwrap().ops.len()));
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, decode);
criterion_main!(benches);
