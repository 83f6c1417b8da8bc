//! `allocsim`: pages mapped where live blocks are, the cache bounded by the headroom.

use crate::rig::Rig;
use allocsim_core::{GIB, MIB};

#[test]
fn maps_only_touched_pages_and_packs_small_blocks() {
    let mut rig = Rig::new("allocsim", Some("headroom:0"), GIB);
    let a = rig.malloc(1, 1000, 0).unwrap();
    assert_eq!(a.size, 1024);
    assert_eq!(rig.reserved(), 2 * MIB, "one page for the small lane");
    let b = rig.malloc(2, 1000, 0).unwrap();
    assert_eq!(b.addr, a.addr + 1024);
    let c = rig.malloc(3, 3 * MIB, 0).unwrap();
    assert_eq!(c.size, 3 * MIB);
    assert_eq!(rig.reserved(), 6 * MIB, "and two pages for 3 MiB in the large lane");
    let d = rig.malloc(4, 3 * MIB, 0).unwrap();
    assert_eq!(d.addr, c.addr + 3 * MIB, "shares c's last page");
    assert_eq!(rig.reserved(), 8 * MIB);
}

#[test]
fn maps_ahead_at_the_frontier_within_the_headroom() {
    let mut rig = Rig::new("allocsim", None, GIB);
    rig.malloc(1, 3 * MIB, 0).unwrap();
    assert_eq!(rig.reserved(), 48 * MIB, "ahead to the 48 MiB grow step");
    let calls = rig.policy.stats().num_device_alloc;
    for id in 2..=5 {
        rig.malloc(id, 3 * MIB, 0).unwrap();
    }
    assert_eq!(rig.policy.stats().num_device_alloc, calls, "served from the pages ahead");
}

#[test]
fn reuses_cached_pages_without_device_calls() {
    let mut rig = Rig::new("allocsim", None, GIB);
    rig.malloc(1, 100 * MIB, 0).unwrap();
    rig.free(1);
    let calls = rig.policy.stats().num_device_alloc;
    rig.malloc(2, 100 * MIB, 0).unwrap();
    assert_eq!(rig.policy.stats().num_device_alloc, calls, "same hole, pages still mapped");
}

#[test]
fn unmaps_cached_pages_rather_than_pass_the_peak_need() {
    let mut rig = Rig::new("allocsim", Some("headroom:0,reclaim_min:0"), GIB);
    rig.malloc(1, 100 * MIB, 0).unwrap();
    rig.malloc(2, 100 * MIB, 0).unwrap();
    rig.free(1);
    // 150 MiB fits no hole but the tail; mapping it would make 350 MiB for a need of 250.
    rig.malloc(3, 150 * MIB, 0).unwrap();
    let s = rig.policy.stats();
    assert_eq!(s.reserved_bytes.all.peak as u64, 250 * MIB);
    assert!(s.num_sync_all_streams == 1 && s.num_device_free >= 1, "{s:?}");
}

#[test]
fn headroom_bounds_the_cache() {
    let mut rig = Rig::new("allocsim", Some("headroom:16MiB,reclaim_min:0,grow_step:2MiB"), GIB);
    for round in 0..20u64 {
        let id = round * 2;
        rig.malloc(id, 50 * MIB, 0).unwrap();
        rig.malloc(id + 1, 30 * MIB + round * MIB, 0).unwrap();
        rig.free(id);
    }
    // Live: 30..49 MiB blocks; the cache never holds more than 16 MiB past the peak need.
    let live: u64 = (0..20).map(|r| 30 * MIB + r * MIB).sum();
    let peak = rig.policy.stats().reserved_bytes.all.peak as u64;
    assert!(peak <= live + 50 * MIB + 16 * MIB + 20 * 2 * MIB, "{peak}");
}

#[test]
fn oom_after_releasing_everything() {
    let mut rig = Rig::new("allocsim", Some("headroom:max"), 64 * MIB);
    rig.malloc(1, 40 * MIB, 0).unwrap();
    rig.free(1);
    rig.malloc(2, 10 * MIB, 7).unwrap();
    // Stream 0's 40 MiB stay cached (headroom:max) until the device refuses stream 13.
    rig.malloc(3, 50 * MIB, 13).unwrap();
    assert_eq!(rig.policy.stats().num_alloc_retries, 1);
    assert_eq!(rig.reserved(), 60 * MIB);
    assert!(rig.malloc(4, 10 * MIB, 0).is_err());
    rig.empty_cache();
    assert_eq!(rig.reserved(), 60 * MIB, "nothing cached is left to unmap");
}
