//! Thousands of streams and OOM storms (issue 50), for every policy under every setting its
//! suites run, under the same oracles as the property suites (`check_trace`: the checker and
//! the statistics identities after every op, a second run with a byte-identical event log,
//! and for `pytorch` the reference model). The programs are generated from a seed: blocks on
//! thousands of streams, then requests no device holds on random streams between frees and
//! new blocks, then everything freed (1,000 streams: the checker after every op is linear in
//! the segments, so thousands take minutes). Speed is not asserted here (see `crates/cli/tests/
//! scale.rs`, which bounds the CPU time of the same shapes at full size); a quadratic path
//! makes this file take minutes instead of seconds.

use allocsim_core::{AllocId, Op, StreamId, Trace, TraceMeta};
use allocsim_testgen::oracles::check_trace;

/// xorshift64: the programs are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn program(seed: u64, streams: u64, storm: u64) -> Trace {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut ops = Vec::new();
    let (mut live, mut next) = (Vec::new(), 0u64);
    // A request of `size` bytes on a random stream; kept to be freed if it can be granted.
    let mut alloc = |rng: &mut Rng, ops: &mut Vec<Op>, live: &mut Vec<AllocId>, size: u64| {
        let id = AllocId(next);
        next += 1;
        let stream = StreamId(1 + rng.below(streams));
        ops.push(Op::Alloc { id, size, stream });
        if size < 1 << 40 {
            live.push(id);
        }
    };
    for _ in 0..streams + streams / 2 {
        let size = [512, 4096, 1 << 20, 3 << 20][rng.below(4) as usize];
        alloc(&mut rng, &mut ops, &mut live, size);
    }
    for _ in 0..storm {
        match rng.below(8) {
            0 if !live.is_empty() => {
                let id = live.swap_remove(rng.below(live.len() as u64) as usize);
                ops.push(Op::FreeRequested { id });
            }
            1 => {
                let size = 512 << rng.below(12);
                alloc(&mut rng, &mut ops, &mut live, size);
            }
            // A terabyte: an OOM under every policy, on a device of any size.
            _ => {
                let size = (1 << 40) + rng.below(1 << 30);
                alloc(&mut rng, &mut ops, &mut live, size);
            }
        }
    }
    for id in live {
        ops.push(Op::FreeRequested { id });
    }
    ops.push(Op::EmptyCache);
    let meta = TraceMeta { source_format: "generated".into(), ..TraceMeta::default() };
    Trace { meta, ops, ..Trace::default() }
}

#[test]
fn thousands_of_streams_and_oom_storms_pass_every_oracle_under_every_policy() {
    let (streams, storm) = if cfg!(debug_assertions) { (200, 400) } else { (1000, 2000) };
    for seed in 0..2 {
        let trace = program(seed, streams, storm);
        for spec in allocsim_policies::POLICIES.iter().flat_map(|p| p.test_specs()) {
            if let Err(failure) = check_trace(&spec, &trace) {
                panic!("seed {seed}, {streams} streams: {failure}");
            }
        }
    }
}
