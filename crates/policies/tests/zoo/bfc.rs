//! `bfc`: best fit with coalescing, region growth and back-off, garbage collection.

use crate::rig::Rig;
use allocsim_core::{GIB, MIB};

#[test]
fn reuses_freed_chunk_and_coalesces() {
    let mut rig = Rig::new("bfc", None, GIB);
    let a = rig.malloc(1, 1000, 0).unwrap();
    assert_eq!(a.size, 1024, "256 B rounding");
    let b = rig.malloc(2, 1000, 0).unwrap();
    assert_eq!(b.addr, a.addr + 1024, "split from the same 2 MiB region");
    rig.free(1);
    let c = rig.malloc(3, 600, 0).unwrap();
    assert_eq!(c.addr, a.addr, "best fit takes the freed 1 KiB chunk");
    // The 1 KiB chunk is not split for 600 B (1024 < 2 * 768), so it is handed out whole.
    assert_eq!(c.size, 1024);
    rig.free(3);
    rig.free(2);
    let snap = rig.policy.snapshot();
    assert_eq!(snap.len(), 1);
    assert_eq!(snap[0].blocks.len(), 1, "everything coalesced back into one chunk");
}

#[test]
fn regions_double_and_back_off() {
    let mut rig = Rig::new("bfc", None, GIB);
    rig.malloc(1, MIB, 0).unwrap();
    assert_eq!(rig.reserved(), 2 * MIB, "first region 2 MiB");
    rig.malloc(2, 1536 * 1024, 0).unwrap();
    assert_eq!(rig.reserved(), 6 * MIB, "second region doubled to 4 MiB");
    rig.malloc(3, 5 * MIB, 0).unwrap();
    assert_eq!(rig.reserved(), 14 * MIB, "8 MiB region");
    // Only ~1010 MiB left: a 600 MiB request wants a 1 GiB region and backs off by 0.9.
    rig.malloc(4, 600 * MIB, 0).unwrap();
    let r = rig.reserved();
    assert!((14 * MIB + 600 * MIB..=GIB).contains(&r), "backed off to fit: {r}");
}

#[test]
fn garbage_collects_free_regions_before_oom() {
    let mut rig = Rig::new("bfc", Some("memory_limit:64MiB"), GIB);
    for i in 0..4 {
        rig.malloc(i, 10 * MIB, 0).unwrap();
    }
    for i in 0..4 {
        rig.free(i);
    }
    let before = rig.reserved();
    // 60 MiB cannot fit the free regions nor the room left: GC frees them, then Extend.
    rig.malloc(10, 60 * MIB, 0).unwrap();
    let s = rig.policy.stats();
    assert!(s.num_device_free > 0 && s.num_alloc_retries == 1, "before {before}: {s:?}");
}

#[test]
fn oom_when_the_device_refuses() {
    let mut rig = Rig::new("bfc", None, 16 * MIB);
    rig.malloc(1, 8 * MIB, 0).unwrap();
    let err = rig.malloc(2, 12 * MIB, 0).unwrap_err();
    assert_eq!(err.rounded_bytes, 12 * MIB);
    assert_eq!(rig.policy.stats().num_ooms, 1);
}

#[test]
fn fragmentation_metric() {
    use allocsim_core::{AllocId, Allocator, Env, StreamId};
    let mut bfc =
        allocsim_policies::zoo::bfc::Bfc::from_conf("allow_growth:false,memory_limit:16MiB")
            .unwrap();
    let mut device = allocsim_sim::SimDevice::for_tests(GIB);
    let mut events = Vec::new();
    let mut env = Env::new(&mut device, &mut events);
    for i in 0..4 {
        bfc.malloc(&mut env, AllocId(i), 4 * MIB - 1024, StreamId(0)).unwrap();
    }
    assert_eq!(bfc.rules.fragmentation(), 0.0);
    bfc.free(&mut env, AllocId(0));
    bfc.free(&mut env, AllocId(2));
    // Two free chunks of 4 MiB - 1 KiB: half the free memory is outside the largest.
    assert!((bfc.rules.fragmentation() - 0.5).abs() < 1e-9, "{}", bfc.rules.fragmentation());
    let s = bfc.stats();
    assert_eq!(s.reserved_bytes.all.current as u64, 16 * MIB, "one region of the whole limit");
    assert_eq!(s.inactive_split.all.current, 2);
}
