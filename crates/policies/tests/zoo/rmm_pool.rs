//! `rmm_pool`: per-stream coalescing lists, stealing and merging, growth.

use crate::rig::Rig;
use allocsim_core::{GIB, MIB};

#[test]
fn reuse_and_coalescing_on_one_stream() {
    let mut rig = Rig::new("rmm_pool", None, GIB);
    let a = rig.malloc(1, 1000, 0).unwrap();
    assert_eq!(a.size, 1024);
    assert_eq!(rig.reserved(), 1024, "first growth is exactly the request");
    let b = rig.malloc(2, 3000, 0).unwrap();
    assert_eq!(rig.reserved(), 1024 + 3072, "max(size, pool_size) = 3072");
    rig.free(1);
    rig.free(2);
    let c = rig.malloc(3, 3000, 0).unwrap();
    assert_eq!(c.addr, b.addr, "best fit: the 3 KiB segment, not the 1 KiB one");
    rig.free(3);
    assert_eq!(rig.policy.stats().inactive_split.all.current, 0);
}

#[test]
fn doubles_then_halves_on_refusal() {
    let mut rig = Rig::new("rmm_pool", None, 100 * MIB);
    rig.malloc(1, 40 * MIB, 0).unwrap();
    // Wants max(50, 40) = 50 MiB: fits. Next wants max(8, 90) = 90 MiB: refused, halves to
    // 45 MiB: refused (only 10 MiB left), then 22.5, 11.25, and finally 8 MiB.
    rig.malloc(2, 50 * MIB, 0).unwrap();
    rig.malloc(3, 8 * MIB, 0).unwrap();
    assert_eq!(rig.reserved(), 98 * MIB);
    assert!(rig.malloc(4, 8 * MIB, 0).is_err());
}

#[test]
fn other_streams_steal_then_merge() {
    let mut rig = Rig::new("rmm_pool", Some("initial_pool_size:16MiB"), GIB);
    // Stream 7 has no list: it steals from stream 0's, whose list keeps the remainder.
    let a = rig.malloc(1, 4 * MIB, 7).unwrap();
    rig.free(1);
    // Stream 7's list: 4 MiB at the base; stream 0's: the 12 MiB after it. Not merged.
    assert_eq!(rig.policy.snapshot()[0].blocks.len(), 2);
    // 14 MiB fits neither list: stream 0 merges 7's list into its own, and they coalesce.
    let b = rig.malloc(2, 14 * MIB, 0).unwrap();
    assert_eq!(b.addr, a.addr);
    assert_eq!(rig.reserved(), 16 * MIB, "no growth");
    assert_eq!(rig.policy.stats().num_sync_all_streams, 1);
}

#[test]
fn maximum_pool_size_limits_growth() {
    let mut rig = Rig::new("rmm_pool", Some("maximum_pool_size:64MiB"), GIB);
    rig.malloc(1, MIB, 0).unwrap();
    assert_eq!(rig.reserved(), 32 * MIB, "max(size, remaining / 2)");
    rig.malloc(2, 40 * MIB, 0).unwrap_err();
    // 31 MiB + 1 does not fit the 31 MiB left; 32 MiB remain: grow by the request itself.
    rig.malloc(3, 31 * MIB + 1, 0).unwrap();
    assert_eq!(rig.reserved(), 63 * MIB + 256);
}
