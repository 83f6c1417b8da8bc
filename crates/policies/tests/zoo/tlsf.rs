//! `tlsf`: LIFO classes, coalescing, dedicated segments, the one empty segment kept.

use crate::rig::Rig;
use allocsim_core::{GIB, MIB};

#[test]
fn lifo_reuse_and_coalescing() {
    let mut rig = Rig::new("tlsf", None, GIB);
    let a = rig.malloc(1, 1000, 0).unwrap();
    assert_eq!(rig.reserved(), 32 * MIB, "VMA starts at 1/8 of the preferred size");
    let _b = rig.malloc(2, 1000, 0).unwrap();
    let c = rig.malloc(3, 1000, 0).unwrap();
    let _d = rig.malloc(4, 1000, 0).unwrap();
    rig.free(1);
    rig.free(3);
    let e = rig.malloc(5, 1000, 0).unwrap();
    assert_eq!(e.addr, c.addr, "last freed first");
    for id in [2, 4, 5] {
        rig.free(id);
    }
    assert_eq!(rig.policy.snapshot()[0].blocks.len(), 1, "coalesced");
    let _ = a;
}

#[test]
fn dedicated_segments_for_large_requests() {
    let mut rig = Rig::new("tlsf", Some("segment_size:64MiB"), GIB);
    let a = rig.malloc(1, 40 * MIB, 0).unwrap();
    assert_eq!(a.size, 40 * MIB);
    assert_eq!(rig.reserved(), 40 * MIB);
    rig.free(1);
    assert_eq!(rig.reserved(), 0, "dedicated memory goes back at free");
}

#[test]
fn keeps_one_empty_segment_and_ooms() {
    let mut rig = Rig::new("tlsf", Some("segment_size:16MiB"), 24 * MIB);
    rig.malloc(1, 7 * MIB, 0).unwrap();
    rig.malloc(2, 7 * MIB, 0).unwrap();
    rig.malloc(3, 7 * MIB, 0).unwrap();
    let segs = rig.policy.snapshot().len();
    assert!(segs >= 2, "{segs}");
    rig.free(1);
    rig.free(2);
    rig.free(3);
    assert_eq!(rig.policy.snapshot().len(), 1, "one empty segment kept");
    assert!(rig.malloc(4, 30 * MIB, 0).is_err());
}
