//! What a machine's core gives right now, to tell a slow machine from slow code
//! (`benches/README.md`, "Machines and how to measure on them"):
//!
//! `cargo run --release -p allocsim-benches --bin machine-probe [ROUNDS]`
//!
//! Each round prints one line of `name=nanoseconds` pairs, one per kind of work, each chosen
//! to depend on one resource of the core:
//! - `clock`: a step of a dependent multiply chain (latency-bound, so it follows the clock);
//! - `alu`: a step of eight independent chains of cheap operations (bound by how many
//!   operations the core issues per cycle, which a busy SMT sibling takes a share of);
//! - `branch`: a step with one unpredictable branch (the misprediction penalty);
//! - `chase_16k` to `chase_64m`: a dependent load in a random cycle through that many bytes,
//!   one load per 64-byte line (L1, L2, L3 and memory latency, depending on the machine).
//!
//! `benches/ab.py` runs it between replays (`PROBE_BIN`) to see which of these the machine's
//! slow phases take away. One round takes about 0.3 s; three rounds by default.

use std::hint::black_box;
use std::time::Instant;

/// Nanoseconds per step of `steps` steps of `work`, which returns something to keep.
fn per_step(steps: u64, work: impl FnOnce() -> u64) -> f64 {
    let start = Instant::now();
    black_box(work());
    start.elapsed().as_secs_f64() * 1e9 / steps as f64
}

fn clock(steps: u64) -> f64 {
    per_step(steps, || {
        let mut x = black_box(3u64);
        for _ in 0..steps {
            // The rotation amount comes through `black_box`, so the chain has no closed form.
            x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1).rotate_left(black_box(17));
        }
        x
    })
}

fn alu(steps: u64) -> f64 {
    per_step(steps, || {
        let mut s = [1u64, 2, 3, 4, 5, 6, 7, 8];
        for i in 0..steps {
            let j = black_box(i);
            for (k, v) in s.iter_mut().enumerate() {
                *v = (*v ^ (*v << 7)).wrapping_add(j ^ k as u64);
                *v = (*v ^ (*v >> 5)).wrapping_add(j);
            }
        }
        s.iter().fold(0, |a, b| a ^ b)
    })
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn branch(steps: u64) -> f64 {
    per_step(steps, || {
        let (mut x, mut acc) = (black_box(0x2545_f491_4f6c_dd1du64), 0u64);
        for _ in 0..steps {
            let r = xorshift(&mut x);
            if r & 1 == 0 {
                acc = acc.wrapping_add(r >> 3);
            } else {
                acc ^= r.rotate_left(9);
            }
            black_box(acc);
        }
        acc
    })
}

/// A random cycle through `bytes` bytes: each line's first word holds the next line's index.
fn cycle(bytes: usize) -> Vec<usize> {
    const WORDS_PER_LINE: usize = 8;
    let lines = bytes / 64;
    let mut order: Vec<usize> = (0..lines).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..lines).rev() {
        order.swap(i, (xorshift(&mut x) % (i as u64 + 1)) as usize);
    }
    let mut next = vec![0usize; lines * WORDS_PER_LINE];
    for k in 0..lines {
        next[order[k] * WORDS_PER_LINE] = order[(k + 1) % lines] * WORDS_PER_LINE;
    }
    next
}

fn chase(next: &[usize], steps: u64) -> f64 {
    let mut p = 0;
    for _ in 0..next.len() / 8 {
        p = next[p]; // one lap to warm the caches
    }
    per_step(steps, || {
        for _ in 0..steps {
            p = next[p];
        }
        p as u64
    })
}

fn main() {
    let rounds = match std::env::args().nth(1).map(|a| a.parse::<u32>()) {
        None => 3,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("machine-probe: ROUNDS must be a whole number: {e}");
            std::process::exit(2);
        }
    };
    let sizes = [("16k", 16 << 10), ("1m", 1 << 20), ("8m", 8 << 20), ("64m", 64 << 20)];
    let cycles: Vec<_> = sizes.iter().map(|&(name, bytes)| (name, cycle(bytes))).collect();
    for _ in 0..rounds {
        let mut line = format!(
            "clock={:.3} alu={:.3} branch={:.3}",
            clock(10_000_000),
            alu(5_000_000),
            branch(10_000_000)
        );
        for (name, next) in &cycles {
            let steps = if next.len() * 8 > 4 << 20 { 500_000 } else { 3_000_000 };
            line += &format!(" chase_{name}={:.3}", chase(next, steps));
        }
        println!("{line}");
    }
}
