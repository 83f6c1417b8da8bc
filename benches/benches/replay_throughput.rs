//! Replay throughput of the PyTorch policy with the metrics observer, as `allocsim replay`
//! runs it: the Llama generate recording from memory on the modelled device and following
//! the recording, and 1.1M ops streamed from a native file (issue 3's benchmark of the
//! policy's replay speed).
//!
//! `cargo bench -p allocsim-benches --features bench --bench replay_throughput`

use allocsim_benches::{bundled, write_repeated, LLAMA};
use allocsim_run::{run_trace, run_trace_streamed, DeviceChoice, RunOptions};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::io::BufWriter;

fn throughput(c: &mut Criterion) {
    let trace = allocsim_trace::read_trace(bundled(LLAMA)).unwrap();
    let mut g = c.benchmark_group("replay_throughput");
    g.sample_size(20).throughput(Throughput::Elements(trace.ops.len() as u64));
    for (label, device) in
        [("llama_sim", DeviceChoice::Sim), ("llama_recorded", DeviceChoice::Auto)]
    {
        let opts = RunOptions { policy: "pytorch".into(), device, ..RunOptions::default() };
        g.bench_function(label, |b| b.iter(|| run_trace(&trace, &opts, &mut [], |_| {}).unwrap()));
    }
    let dir = std::env::temp_dir().join(format!("allocsim-bench-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("llama7.allocsim");
    let file = BufWriter::new(std::fs::File::create(&path).unwrap());
    let ops = write_repeated(&trace, 7, file, &path).unwrap();
    g.throughput(Throughput::Elements(ops));
    let opts = RunOptions { policy: "pytorch".into(), ..RunOptions::default() };
    g.bench_function("native_streamed_1m_ops", |b| {
        b.iter(|| {
            let stream = allocsim_trace::native::read_native_ops(&path).unwrap();
            let ops = stream.ops.map(Result::unwrap);
            run_trace_streamed(&stream.head, stream.recorded_len, ops, &opts, &mut [], |_| {})
                .unwrap()
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, throughput);
criterion_main!(benches);
