//! One malloc/free pair of every policy, in three situations:
//! - `hit`: the block comes from the cache (a warm allocator, the same size freed before);
//! - `miss_split`: nothing cached fits, so a new segment is reserved and split (the pair is
//!   malloc + free + `empty_cache`, which gives the segment back so the next malloc misses
//!   again; a policy that never caches misses in `hit` too);
//! - `oom`: a request larger than the device, through every retry to the OOM report.
//!
//! `cargo bench -p allocsim-benches --features bench --bench policy_pairs`

use allocsim_core::{AllocId, Allocator, Env, Event, StreamId, MIB};
use allocsim_sim::{SimConfig, SimDevice};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};

const GIB: u64 = 1 << 30;

struct Rig {
    allocator: Box<dyn Allocator>,
    device: SimDevice,
    events: Vec<Event>,
    next_id: u64,
}

impl Rig {
    fn new(policy: &str, device_bytes: u64) -> Rig {
        Rig {
            allocator: allocsim_policies::by_name(policy, None).unwrap(),
            device: SimDevice::new(SimConfig::with_total_bytes(device_bytes)),
            events: Vec::with_capacity(64),
            next_id: 0,
        }
    }

    fn malloc(&mut self, size: u64) -> Option<AllocId> {
        let id = AllocId(self.next_id);
        self.next_id += 1;
        self.events.clear();
        let mut env = Env::new(&mut self.device, &mut self.events);
        self.allocator.malloc(&mut env, id, size, StreamId(0)).ok().map(|_| id)
    }

    fn free(&mut self, id: AllocId) {
        self.events.clear();
        let mut env = Env::new(&mut self.device, &mut self.events);
        self.allocator.free(&mut env, id);
    }

    fn empty_cache(&mut self) {
        self.events.clear();
        let mut env = Env::new(&mut self.device, &mut self.events);
        self.allocator.empty_cache(&mut env);
    }
}

fn pairs(c: &mut Criterion) {
    for policy in allocsim_policies::names() {
        let mut g = c.benchmark_group(format!("policy_pairs/{policy}"));
        g.sample_size(30);
        // A warm allocator with some live neighbours, then the same size over and over.
        let mut rig = Rig::new(policy, 80 * GIB);
        let live: Vec<_> = (0..64).filter_map(|i| rig.malloc((1 + i % 7) * MIB + 4096)).collect();
        g.bench_function("hit", |b| {
            b.iter(|| {
                let id = rig.malloc(3 * MIB).unwrap();
                rig.free(id);
            })
        });
        for id in live {
            rig.free(id);
        }
        let mut rig = Rig::new(policy, 80 * GIB);
        g.bench_function("miss_split", |b| {
            b.iter(|| {
                let id = rig.malloc(3 * MIB + 512).unwrap();
                rig.free(id);
                rig.empty_cache();
            })
        });
        g.bench_function("oom", |b| {
            b.iter_batched_ref(
                || {
                    let mut rig = Rig::new(policy, 8 * GIB);
                    let held: Vec<_> = (0..4).filter_map(|_| rig.malloc(GIB)).collect();
                    (rig, held)
                },
                |(rig, _)| assert!(rig.malloc(6 * GIB).is_none()),
                BatchSize::SmallInput,
            )
        });
        g.finish();
    }
}

criterion_group!(benches, pairs);
criterion_main!(benches);
