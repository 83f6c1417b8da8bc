//! Every registered policy at the edges: absurd sizes, a zero memory fraction and bad settings
//! give an OOM or an error, never a panic (`pytorch` has its own suites).

use allocsim_core::{AllocId, Env, StreamId, GIB};
use allocsim_sim::SimDevice;

#[test]
fn extreme_requests_and_bad_settings_never_panic() {
    for name in allocsim_policies::names().into_iter().filter(|&n| n != "pytorch") {
        let mut policy = allocsim_policies::by_name(name, None).unwrap();
        let mut device = SimDevice::for_tests(8 * GIB);
        let mut events = Vec::new();
        let mut env = Env::new(&mut device, &mut events);
        let sizes = [0, 1, u64::MAX, u64::MAX - 511, 1 << 62, (1 << 40) + 1, 9 * GIB, 255, 257];
        for (id, size) in sizes.into_iter().enumerate() {
            let _ = policy.malloc(&mut env, AllocId(id as u64), size, StreamId(0));
        }
        policy.set_memory_fraction(&mut env, 0.0).unwrap();
        let _ = policy.malloc(&mut env, AllocId(100), 1 << 20, StreamId(3));
        policy.set_memory_fraction(&mut env, 1.0).unwrap();
        policy.empty_cache(&mut env);
        for conf in ["nonsense", "a:b:c", "x:1", ":", "min_block:3", "headroom:-1"] {
            assert!(policy.set_settings(conf).is_err(), "{name} accepted {conf:?}");
        }
        assert!(policy.set_memory_fraction(&mut env, f64::NAN).is_err(), "{name}");
        assert!(policy.set_memory_fraction(&mut env, -0.5).is_err(), "{name}");
    }
}
