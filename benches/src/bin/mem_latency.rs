//! How fast a machine's caches and memory answer, to tell a slow machine from slow code
//! (`benches/README.md`, "Machines and how to measure on them"):
//!
//! `cargo run --release -p allocsim-benches --bin mem-latency`
//!
//! For working sets of 16 KiB to 64 MiB, follows a random cycle through them, one load per
//! 64-byte line, each load's address the previous load's value, and prints nanoseconds per load.
//! Three rounds, to show how steady the machine is.

use std::time::Instant;

/// Nanoseconds per dependent load over a random cycle through `bytes` bytes.
fn chase(bytes: usize, loads: usize) -> f64 {
    const WORDS_PER_LINE: usize = 8;
    let lines = bytes / 64;
    // A random order of the lines (xorshift, fixed seed), then each line points to the next.
    let mut order: Vec<usize> = (0..lines).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut next = vec![0usize; lines * WORDS_PER_LINE];
    for k in 0..lines {
        next[order[k] * WORDS_PER_LINE] = order[(k + 1) % lines] * WORDS_PER_LINE;
    }
    let mut p = 0;
    for _ in 0..lines {
        p = next[p];
    }
    let start = Instant::now();
    for _ in 0..loads {
        p = next[p];
    }
    let elapsed = start.elapsed().as_secs_f64();
    std::hint::black_box(p);
    elapsed / loads as f64 * 1e9
}

fn main() {
    for round in 0..3 {
        let mut line = format!("round {round}:");
        for kib in [16, 256, 1024, 4096, 16384, 65536] {
            line += &format!(" {kib} KiB {:.1} ns", chase(kib * 1024, 20_000_000));
        }
        println!("{line}");
    }
}
