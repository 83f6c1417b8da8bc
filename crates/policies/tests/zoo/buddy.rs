//! `buddy`: orders, buddies merging, growth and release.

use crate::rig::Rig;
use allocsim_core::{GIB, MIB};

#[test]
fn splits_to_the_order_and_merges_buddies() {
    let mut rig = Rig::new("buddy", Some("segment_size:1MiB"), GIB);
    let a = rig.malloc(1, 100 << 10, 0).unwrap();
    assert_eq!(a.size, 128 << 10, "power of two");
    let b = rig.malloc(2, 100 << 10, 0).unwrap();
    assert_eq!(b.addr, a.addr + (128 << 10), "a's buddy");
    let c = rig.malloc(3, 1, 0).unwrap();
    assert_eq!(c.size, 512);
    assert_eq!(c.addr, a.addr + (256 << 10));
    rig.free(1);
    let d = rig.malloc(4, 128 << 10, 0).unwrap();
    assert_eq!(d.addr, a.addr, "lowest address of the order");
    for id in [2, 3, 4] {
        rig.free(id);
    }
    let snap = rig.policy.snapshot();
    assert_eq!(snap[0].blocks.len(), 1, "all merged back");
}

#[test]
fn grows_and_returns_free_segments() {
    let mut rig = Rig::new("buddy", Some("segment_size:4MiB"), GIB);
    rig.malloc(1, 3 * MIB, 0).unwrap();
    rig.malloc(2, 3 * MIB, 0).unwrap();
    assert_eq!(rig.reserved(), 8 * MIB);
    rig.malloc(3, 5 * MIB, 0).unwrap();
    assert_eq!(rig.reserved(), 16 * MIB, "8 MiB block gets an 8 MiB segment");
    rig.free(3);
    rig.empty_cache();
    assert_eq!(rig.reserved(), 8 * MIB);
}

#[test]
fn oom_and_gc_when_the_device_refuses() {
    let mut rig = Rig::new("buddy", Some("segment_size:4MiB"), 10 * MIB);
    rig.malloc(1, 1, 0).unwrap();
    rig.free(1);
    // A free 4 MiB segment and 6 MiB of device left: an 8 MiB block needs the segment back.
    rig.malloc(2, 5 * MIB, 0).unwrap();
    let s = rig.policy.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_device_free, s.reserved_bytes.all.current),
        (1, 1, 8 << 20)
    );
    assert!(rig.malloc(3, 5 * MIB, 0).is_err());
}
