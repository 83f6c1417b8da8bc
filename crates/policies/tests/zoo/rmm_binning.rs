//! `rmm_binning`: bins, FIFO reuse, growth from the pool.

use crate::rig::Rig;
use allocsim_core::{GIB, MIB};

#[test]
fn bins_preallocate_and_round_to_their_block() {
    let mut rig = Rig::new("rmm_binning", None, 4 * GIB);
    let a = rig.malloc(1, 1000, 0).unwrap();
    assert_eq!(a.size, 256 << 10, "smallest bin");
    // 128 blocks of each of 256 KiB .. 4 MiB, from a pool that grows by max(size, pool).
    let bins: u64 = (18..=22).map(|e| 128u64 << e).sum();
    let s = rig.policy.stats();
    assert!(s.reserved_bytes.all.current as u64 >= bins, "{s:?}");
    let b = rig.malloc(2, 3 * MIB, 0).unwrap();
    assert_eq!(b.size, 4 * MIB);
    let c = rig.malloc(3, 5 * MIB, 0).unwrap();
    assert_eq!(c.size, 5 * MIB, "past the bins: the pool, 256 B aligned");
}

#[test]
fn fifo_reuse_and_growth() {
    let mut rig = Rig::new("rmm_binning", Some("blocks_to_preallocate:2,preallocate:false"), GIB);
    let a = rig.malloc(1, 300 << 10, 0).unwrap();
    assert_eq!(a.size, 512 << 10);
    let b = rig.malloc(2, 300 << 10, 0).unwrap();
    assert_eq!(b.addr, a.addr + (512 << 10));
    let before = rig.reserved();
    let c = rig.malloc(3, 300 << 10, 0).unwrap();
    assert!(rig.reserved() > before, "third block grows the bin");
    rig.free(1);
    rig.free(3);
    let d = rig.malloc(4, 300 << 10, 0).unwrap();
    assert_eq!(d.addr, c.addr + (512 << 10), "FIFO: c's sibling, then a, then c");
}

#[test]
fn oom_when_pool_cannot_grow() {
    let mut rig = Rig::new("rmm_binning", Some("preallocate:false"), 64 * MIB);
    rig.malloc(1, 60 * MIB, 0).unwrap();
    assert!(rig.malloc(2, 8 * MIB, 0).is_err());
    assert_eq!(rig.policy.stats().num_ooms, 1);
}
