//! The offline policy (`--policy offline`) on generated programs, under the independent
//! checker: it follows the offline placement exactly, so its peak reserved is the placement's
//! arena and its blocks are active exactly over their lifetimes (the peak is the bound's peak
//! live bytes), or, where the device or a memory fraction refuses the arena, it reserves
//! nothing and every request fails; either way no event breaks the checker's rules.

use allocsim_run::{run_trace, DeviceChoice, RunOptions, OFFLINE};
use allocsim_testgen::swarm::{from_seed, Limits};

const CASES: u64 = if cfg!(debug_assertions) { 60 } else { 400 };

#[test]
fn the_offline_policy_follows_its_placement_under_the_checker() {
    let limits = Limits { max_steps: 300, absurd_sizes: false, ..Limits::default() };
    let mut placed = 0;
    for seed in 0..CASES {
        let trace = from_seed(seed, &limits).trace();
        let opts = RunOptions {
            policy: OFFLINE.to_string(),
            device: DeviceChoice::Sim,
            check: true,
            ..RunOptions::default()
        };
        let reproduce = format!("the program of swarm::from_seed({seed}, {limits:?})");
        let report = run_trace(&trace, &opts, &mut [], |_| {}).expect(&reproduce);
        let check = report.check.as_ref().expect("checked");
        assert_eq!(check.total_violations(), 0, "{reproduce}: {:?}", check.violations().first());
        let allocations = allocsim_bound::allocations(&trace);
        let requests = allocations.requests.len();
        let arena = allocsim_bound::reserved(
            allocsim_bound::place(&allocations.lifetimes).expect("a small case is placed").peak,
        );
        let m = &report.metrics;
        if m.peak_reserved_bytes > 0 {
            placed += 1;
            assert_eq!(m.peak_reserved_bytes, arena, "{reproduce}");
            assert_eq!(m.ooms.len(), 0, "{reproduce}");
            let peak_live = allocsim_bound::lower_bound(&allocations.lifetimes);
            assert_eq!(m.peak_active_bytes, peak_live, "{reproduce}: active over its lifetime");
        } else {
            assert_eq!(m.ooms.len(), requests, "{reproduce}: refused arena, every request fails");
        }
        assert_eq!(report.stats.num_device_free, 0, "{reproduce}: the arena is kept");
    }
    println!("{placed} of {CASES} generated programs reserved their arena");
    // Small devices and low fractions refuse some arenas; most cases place theirs.
    assert!(placed * 2 > CASES, "{placed} of {CASES} cases reserved their arena");
}
