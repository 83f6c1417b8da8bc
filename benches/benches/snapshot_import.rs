//! Reading a PyTorch snapshot into a trace: gunzip alone, the whole `read_trace` (record
//! streamer), and the generic reader that builds every value first, on the 242,706-entry
//! Llama generate recording and on GPT-2 training (entries with stacks).
//!
//! `cargo bench -p allocsim-benches --features bench --bench snapshot_import`

use allocsim_benches::{bundled, LLAMA};
use allocsim_trace::{read_trace_with, ReadOptions};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::io::Read;

fn import(c: &mut Criterion) {
    for (label, name, entries) in [
        ("llama_generate", LLAMA, 242_706u64),
        ("gpt2_train", "pytorch-2.11-h100/gpt2_train.pickle.gz", 18_668),
    ] {
        let path = bundled(name);
        let mut g = c.benchmark_group(format!("snapshot_import/{label}"));
        g.sample_size(20).throughput(Throughput::Elements(entries));
        g.bench_function("gunzip", |b| {
            b.iter(|| {
                let file = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
                let mut out = Vec::new();
                flate2::bufread::MultiGzDecoder::new(file).read_to_end(&mut out).unwrap();
                out.len()
            })
        });
        let streaming = ReadOptions::without_sidecar();
        g.bench_function("read_trace", |b| {
            b.iter(|| read_trace_with(&path, &streaming).unwrap().ops.len())
        });
        let generic = ReadOptions { streaming: false, ..ReadOptions::without_sidecar() };
        g.bench_function("read_trace_generic_vm", |b| {
            b.iter(|| read_trace_with(&path, &generic).unwrap().ops.len())
        });
        g.finish();
    }
}

criterion_group!(benches, import);
criterion_main!(benches);
