//! `rmm_arena`: stream superblocks, the global arena, defragmentation.

use crate::rig::Rig;
use allocsim_core::{GIB, MIB};

#[test]
fn small_blocks_share_a_stream_superblock_first_fit() {
    let mut rig = Rig::new("rmm_arena", None, 2 * GIB);
    let a = rig.malloc(1, 1000, 0).unwrap();
    assert_eq!(rig.reserved(), GIB, "half the free memory, up front");
    let b = rig.malloc(2, 1000, 0).unwrap();
    assert_eq!(b.addr, a.addr + 1024);
    rig.free(1);
    let c = rig.malloc(3, 512, 0).unwrap();
    assert_eq!(c.addr, a.addr, "address-ordered first fit");
    let d = rig.malloc(4, 1000, 7).unwrap();
    assert_eq!(d.addr, a.addr + MIB, "stream 7 gets its own superblock");
}

#[test]
fn large_blocks_go_to_the_global_arena_and_coalesce() {
    let mut rig = Rig::new("rmm_arena", Some("arena_size:64MiB"), GIB);
    let a = rig.malloc(1, 10 * MIB, 0).unwrap();
    let b = rig.malloc(2, 10 * MIB, 0).unwrap();
    assert_eq!(b.addr, a.addr + 10 * MIB);
    rig.free(1);
    rig.free(2);
    // Both superblocks are empty again and merged with the tail: 60 MiB fit.
    rig.malloc(3, 60 * MIB, 0).unwrap();
}

#[test]
fn defragment_on_failure_then_oom() {
    let mut rig = Rig::new("rmm_arena", Some("arena_size:4MiB"), GIB);
    for (id, stream) in [(1, 0), (2, 7), (3, 13)] {
        rig.malloc(id, 1000, stream).unwrap();
    }
    for id in 1..=3 {
        rig.free(id);
    }
    // Three 1 MiB superblocks sit empty in stream arenas: 2 MiB needs them back.
    rig.malloc(4, 2 * MIB, 0).unwrap();
    assert_eq!(rig.policy.stats().num_sync_all_streams, 1);
    assert!(rig.malloc(5, 3 * MIB, 0).is_err());
}

#[test]
fn oom_when_the_device_refuses_the_arena() {
    let mut rig = Rig::new("rmm_arena", Some("arena_size:2GiB"), GIB);
    assert!(rig.malloc(1, 1, 0).is_err());
    assert_eq!(rig.reserved(), 0);
}
