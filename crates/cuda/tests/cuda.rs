//! The real device. Without a driver (CI, a laptop) every GPU test prints
//! "skipped: no CUDA driver found" to stderr and returns; only the no-driver behaviour itself is
//! checked there.

use allocsim_core::{AllocId, CallKind, Device, DeviceError, MIB};
use allocsim_cuda::{driver_present, CudaDevice, CudaError};

/// Say why a test did nothing, on the real stderr: libtest captures `eprintln!` of passing
/// tests, and a skip must be visible in the test log.
fn skipped(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Open device 0, or report the skip and return from the test.
macro_rules! gpu_or_skip {
    () => {
        match CudaDevice::open(0) {
            Ok(d) => d,
            Err(CudaError::NoDriver) => {
                skipped("skipped: no CUDA driver found");
                return;
            }
            Err(e) => panic!("a driver is present but device 0 did not open: {e}"),
        }
    };
}

#[test]
fn open_without_a_driver_is_a_clear_error_not_a_panic() {
    if driver_present() {
        skipped("skipped: a CUDA driver is present, so the no-driver path cannot be shown here");
        return;
    }
    let err = CudaDevice::open(0).unwrap_err();
    assert!(matches!(err, CudaError::NoDriver), "{err:?}");
    assert!(err.to_string().starts_with("no CUDA driver found"), "{err}");
}

#[test]
fn malloc_free_and_mem_info_follow_the_driver() {
    let mut dev = gpu_or_skip!();
    let before = dev.mem_info();
    assert!(before.total_bytes > 0 && before.free_bytes <= before.total_bytes);
    let a = dev.malloc(256 * MIB).unwrap();
    let b = dev.malloc(2 * MIB).unwrap();
    assert_ne!(a, b);
    let during = dev.mem_info();
    assert!(during.free_bytes + 256 * MIB <= before.free_bytes, "{before:?} -> {during:?}");
    dev.free(a, 256 * MIB);
    dev.free(b, 2 * MIB);
    assert_eq!(dev.held(), (0, 0, 0));
    let calls = dev.calls();
    assert_eq!(calls.get(CallKind::Malloc).calls, 2);
    assert_eq!(calls.get(CallKind::Free).calls, 2);
    assert!(calls.get(CallKind::Malloc).time_ns > 0, "wall time is measured");
    assert!(dev.notes().is_empty(), "{:?}", dev.notes());
}

#[test]
fn a_request_beyond_the_card_is_out_of_memory() {
    let mut dev = gpu_or_skip!();
    let total = dev.mem_info().total_bytes;
    match dev.malloc(2 * total) {
        Err(DeviceError::OutOfMemory { requested, free }) => {
            assert_eq!(requested, 2 * total);
            assert!(free <= total);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    assert_eq!(dev.calls().get(CallKind::Malloc).failed, 1);
    // The refusal is not sticky: the next call works.
    let a = dev.malloc(2 * MIB).unwrap();
    dev.free(a, 2 * MIB);
}

#[test]
fn expandable_ranges_map_and_unmap_in_pieces() {
    let mut dev = gpu_or_skip!();
    let g = dev.granularity();
    assert!(g > 0 && g.is_power_of_two());
    let va = dev.reserve_address(64 * g, 0).unwrap();
    dev.map(va, 10 * g).unwrap();
    dev.map(va + 10 * g, 10 * g).unwrap();
    assert!(dev.map(va + 5 * g, g).is_err(), "mapping twice is refused");
    assert!(dev.map(va + 63 * g, 2 * g).is_err(), "mapping past the range is refused");
    // Unmap part of one earlier map call and part of the other.
    dev.unmap(va + 8 * g, 4 * g);
    assert_eq!(dev.held(), (0, 1, 16));
    dev.map(va + 8 * g, 4 * g).unwrap();
    dev.unmap(va, 20 * g);
    dev.release_address(va, 64 * g);
    assert_eq!(dev.held(), (0, 0, 0));
    assert!(dev.notes().is_empty(), "{:?}", dev.notes());
}

#[test]
fn reservations_honour_pytorchs_20_mib_alignment() {
    let mut dev = gpu_or_skip!();
    let page = 20 * MIB;
    let total = dev.mem_info().total_bytes;
    let size = (total + total / 8).div_ceil(page) * page;
    let large = dev.reserve_address(size, page).unwrap();
    assert_eq!(large % page, 0);
    let small = dev.reserve_address(size, 2 * MIB).unwrap();
    dev.map(large, page).unwrap();
    dev.map(large + size - page, page).unwrap();
    dev.unmap(large, page);
    dev.unmap(large + size - page, page);
    dev.release_address(large, size);
    dev.release_address(small, size);
    assert_eq!(dev.held(), (0, 0, 0));
    assert!(dev.notes().is_empty(), "{:?}", dev.notes());
}

#[test]
fn dropping_the_device_gives_everything_back() {
    let baseline = {
        let dev = gpu_or_skip!();
        dev.mem_info().free_bytes
    };
    {
        let mut dev = gpu_or_skip!();
        let g = dev.granularity();
        dev.malloc(512 * MIB).unwrap();
        let va = dev.reserve_address(256 * g, 0).unwrap();
        dev.map(va, 128 * g).unwrap();
        // Dropped here with a segment, a range and mappings held.
    }
    let dev = gpu_or_skip!();
    let after = dev.mem_info().free_bytes;
    assert!(after + 64 * MIB >= baseline, "leaked: {baseline} free before, {after} after");
}

#[test]
fn patterns_verify_clean_blocks_and_catch_overlap() {
    let mut dev = gpu_or_skip!();
    let patterns = dev.enable_patterns().unwrap();
    let seg = dev.malloc(64 * MIB).unwrap();
    {
        let mut p = patterns.borrow_mut();
        // Odd sizes and an unaligned block: the partial-word paths.
        p.on_alloc(AllocId(1), seg, 4 * MIB);
        p.on_alloc(AllocId(2), seg + 4 * MIB, 1000);
        p.on_alloc(AllocId(3), seg + 4 * MIB + 1003, 77);
        p.on_free(AllocId(2));
    }
    let clean = patterns.borrow_mut().finish().unwrap();
    assert_eq!(clean.mismatched_words, 0, "{clean:?}");
    assert_eq!(clean.blocks_filled, 3);
    assert_eq!(clean.blocks_verified, 3);
    assert!(clean.touches >= 3);

    let patterns = dev.enable_patterns().unwrap();
    {
        let mut p = patterns.borrow_mut();
        p.on_alloc(AllocId(10), seg, 8 * MIB);
        p.on_alloc(AllocId(11), seg + 6 * MIB, 4 * MIB); // overlaps 10's last 2 MiB
    }
    let bad = patterns.borrow_mut().finish().unwrap();
    assert_eq!(bad.overlapping_allocs, 1);
    assert!(bad.mismatched_words > 0, "{bad:?}");
    assert_eq!(bad.first_mismatch.unwrap().id, AllocId(10));
    dev.free(seg, 64 * MIB);
}
