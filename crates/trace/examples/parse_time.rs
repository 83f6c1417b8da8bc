//! Time reading a trace: `cargo run --release -p allocsim-trace --example parse_time -- FILE`.
//!
//! Prints the best of ten runs, in wall time and in this thread's CPU time (which a busy
//! machine disturbs less), for gunzip alone, gunzip + unpickle, and the whole `read_trace`.
//! Compare with `python3 -c "import pickle,gzip; pickle.load(gzip.open(FILE))"`.

use allocsim_trace::{pickle, read_trace_with, ReadOptions};
use std::io::Read;
use std::time::{Duration, Instant};

/// CPU time of this thread so far (Linux `schedstat`; zero elsewhere).
fn cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map(Duration::from_nanos)
        .unwrap_or_default()
}

fn best(label: &str, f: &dyn Fn()) {
    let (mut wall, mut cpu_best) = (Duration::MAX, Duration::MAX);
    for _ in 0..10 {
        let (t, c) = (Instant::now(), cpu());
        f();
        wall = wall.min(t.elapsed());
        cpu_best = cpu_best.min(cpu() - c);
    }
    println!("{label:>18}: wall {wall:>10.2?}  cpu {cpu_best:>10.2?}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: parse_time FILE [unpickle|read N]").clone();
    let open = || std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    // `parse_time FILE unpickle N`: just N unpickles, for `perf stat` instruction counts.
    if let (Some(stage), Some(n)) = (args.get(2), args.get(3).and_then(|n| n.parse().ok())) {
        for _ in 0..n {
            match stage.as_str() {
                "unpickle" => {
                    pickle::from_reader(flate2::bufread::MultiGzDecoder::new(open())).unwrap();
                }
                _ => {
                    read_trace_with(&path, &ReadOptions::without_sidecar()).unwrap();
                }
            }
        }
        return;
    }
    best("gunzip", &|| {
        let mut out = Vec::new();
        flate2::bufread::MultiGzDecoder::new(open()).read_to_end(&mut out).unwrap();
    });
    best("gunzip + unpickle", &|| {
        pickle::from_reader(flate2::bufread::MultiGzDecoder::new(open())).unwrap();
    });
    let opts = ReadOptions::without_sidecar();
    best("read_trace", &|| {
        read_trace_with(&path, &opts).unwrap();
    });
}
