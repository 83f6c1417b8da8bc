//! `async_pool`: stream-ordered reuse, synchronization, the release threshold, trimming.

use crate::rig::Rig;
use allocsim_core::{GIB, MIB};

#[test]
fn same_stream_reuses_at_once_other_stream_after_sync() {
    let mut rig = Rig::new("async_pool", Some("internal_dependencies:false"), GIB);
    let a = rig.malloc(1, 3 * MIB, 0).unwrap();
    assert_eq!(a.size, 3 * MIB, "512 B rounding only");
    assert_eq!(rig.reserved(), 4 * MIB, "one 2 MiB-granular segment");
    rig.free(1);
    let b = rig.malloc(2, MIB, 7).unwrap();
    assert_ne!(b.addr, a.addr, "stream 7 cannot use stream 0's uncompleted free");
    let c = rig.malloc(3, MIB, 0).unwrap();
    assert_eq!(c.addr, a.addr, "stream 0 can");
    rig.free(2);
    rig.free(3);
    rig.empty_cache();
    assert_eq!(rig.reserved(), 0, "empty_cache trims to 0 like PyTorch's emptyCache");
}

#[test]
fn internal_dependencies_let_other_streams_reuse_before_growing() {
    let mut rig = Rig::new("async_pool", None, GIB);
    let a = rig.malloc(1, 3 * MIB, 0).unwrap();
    rig.free(1);
    let b = rig.malloc(2, 3 * MIB, 7).unwrap();
    assert_eq!(b.addr, a.addr);
    assert_eq!(rig.reserved(), 4 * MIB);
}

#[test]
fn coalesces_and_keeps_memory_by_default() {
    let mut rig = Rig::new("async_pool", Some("trim_on_empty_cache:false"), GIB);
    for i in 0..4 {
        rig.malloc(i, 512 << 10, 0).unwrap();
    }
    for i in 0..4 {
        rig.free(i);
    }
    assert_eq!(rig.policy.snapshot()[0].blocks.len(), 1, "coalesced");
    rig.empty_cache();
    assert_eq!(rig.reserved(), 2 * MIB, "threshold u64::MAX keeps memory");
}

#[test]
fn release_threshold_applies_at_sync() {
    let mut rig =
        Rig::new("async_pool", Some("release_threshold:4MiB,trim_on_empty_cache:false"), GIB);
    for i in 0..4 {
        rig.malloc(i, 2 * MIB, 0).unwrap();
    }
    for i in 0..4 {
        rig.free(i);
    }
    rig.empty_cache();
    assert_eq!(rig.reserved(), 4 * MIB);
}

#[test]
fn trims_before_oom() {
    let mut rig = Rig::new("async_pool", Some("internal_dependencies:false"), 8 * MIB);
    rig.malloc(1, 4 * MIB, 0).unwrap();
    rig.free(1);
    // Stream 7 cannot reuse it and the device is too full to grow: synchronize (4 MiB is
    // not enough), trim the free segment, grow.
    rig.malloc(2, 6 * MIB, 7).unwrap();
    let s = rig.policy.stats();
    assert_eq!((s.num_sync_all_streams, s.num_alloc_retries, s.num_device_free), (1, 1, 1));
    assert!(rig.malloc(3, 4 * MIB, 7).is_err());
    assert_eq!(rig.policy.stats().num_ooms, 1);
}
