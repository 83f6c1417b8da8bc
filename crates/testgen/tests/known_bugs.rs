//! Bugs this crate's generators found in other crates, as the minimal programs that showed
//! them, kept as regression tests now that they are fixed.

use allocsim_testgen::oracles::check_trace;
use allocsim_testgen::{DeviceSpec, Program, Step};

fn one_alloc(size: u64) -> Program {
    Program {
        device: DeviceSpec { total_bytes: 1 << 30, free_bytes: 1 << 30 },
        alloc_conf: String::new(),
        memory_fraction: None,
        steps: vec![Step::Alloc { size, stream: 0 }],
        drain: false,
    }
}

/// `pytorch` (fixed): a request of 2^60 bytes or more got PyTorch's "more than 1EB" refusal as an
/// `Oom` event, but `num_ooms` stays 0, so the checker reports
/// `stat-mismatch: num_ooms: events imply 1, allocator reports 0`.
#[test]
fn pytorch_counts_the_oom_it_reports_for_an_exabyte_request() {
    let r = check_trace("pytorch", &one_alloc(1 << 60).trace());
    assert!(r.is_ok(), "{}", r.unwrap_err());
}

/// `uncached` (fixed): rounding `size.div_ceil(512) * 512` overflowed for sizes within 512 bytes of
/// `u64::MAX` (a panic in debug builds, a wrapped size in release).
#[test]
fn uncached_refuses_a_request_near_u64_max() {
    let r = check_trace("uncached", &one_alloc(u64::MAX).trace());
    assert!(r.is_ok(), "{}", r.unwrap_err());
}
