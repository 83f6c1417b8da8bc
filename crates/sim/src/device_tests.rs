use super::*;
use crate::{Fault, Placement, H100_FREE_AT_START_BYTES, VA_BASE};
use allocsim_core::MIB;

const PAGE: u64 = PAGE_BYTES;

/// A device with `free_pages` of `total_pages` free and free calls, plus `faults`.
fn device(total_pages: u64, free_pages: u64, faults: Vec<Fault>) -> SimDevice {
    SimDevice::new(SimConfig {
        total_bytes: total_pages * PAGE,
        free_bytes: free_pages * PAGE,
        cost: CostModel::zero(),
        faults,
        seed: 42,
        placement: Placement::Lowest,
        recorded_segments: Vec::new(),
    })
}

fn is_oom(r: Result<u64, DeviceError>) -> bool {
    matches!(r, Err(DeviceError::OutOfMemory { .. }))
}

#[test]
fn oom_exactly_when_the_request_exceeds_free_memory() {
    let mut d = device(100, 10, vec![]);
    assert_eq!(d.mem_info(), MemInfo { free_bytes: 10 * PAGE, total_bytes: 100 * PAGE });
    assert_eq!(
        d.malloc(10 * PAGE + 1),
        Err(DeviceError::OutOfMemory { requested: 10 * PAGE + 1, free: 10 * PAGE })
    );
    let a = d.malloc(10 * PAGE).expect("exactly the free memory fits");
    assert_eq!(d.free_bytes(), 0);
    assert!(is_oom(d.malloc(1)));
    d.free(a, 10 * PAGE);
    assert_eq!(d.free_bytes(), 10 * PAGE);
    // A part page costs a whole page.
    d.malloc(1).unwrap();
    assert_eq!(d.free_bytes(), 9 * PAGE);
    assert_eq!(d.calls().get(CallKind::Malloc).calls, 4);
    assert_eq!(d.calls().get(CallKind::Malloc).failed, 2);
}

#[test]
fn h100_defaults_count_free_at_start_minus_reserved() {
    let mut d = SimDevice::new(SimConfig::default());
    let whole_pages = H100_FREE_AT_START_BYTES / PAGE * PAGE;
    d.malloc(20 * MIB).unwrap();
    assert_eq!(d.free_bytes(), H100_FREE_AT_START_BYTES - 20 * MIB);
    assert!(is_oom(d.malloc(whole_pages)));
    d.malloc(whole_pages - 20 * MIB).unwrap();
    assert!(is_oom(d.malloc(PAGE)), "less than a page is left");
    assert!(d.calls().total_time_ns() > 0, "the H100 model charges every call");
}

#[test]
fn addresses_are_aligned_reused_lowest_first_and_never_overlap() {
    let mut d = device(1000, 1000, vec![]);
    let a = d.malloc(20 * MIB).unwrap();
    let b = d.malloc(PAGE).unwrap();
    let c = d.malloc(3 * MIB).unwrap();
    assert_eq!((a, b, c), (VA_BASE, VA_BASE + 20 * MIB, VA_BASE + 22 * MIB));
    d.free(a, 20 * MIB);
    assert_eq!(d.malloc(4 * MIB).unwrap(), VA_BASE, "the freed hole is reused");
    assert_eq!(d.malloc(40 * MIB).unwrap(), VA_BASE + 26 * MIB, "too big for the hole");
    assert_eq!(d.malloc(16 * MIB).unwrap(), VA_BASE + 4 * MIB, "fills the rest of it");
    let mut live: Vec<(u64, u64)> = vec![(b, PAGE), (c, 4 * MIB)];
    live.extend([
        (VA_BASE, 4 * MIB),
        (VA_BASE + 26 * MIB, 40 * MIB),
        (VA_BASE + 4 * MIB, 16 * MIB),
    ]);
    live.sort();
    assert!(live.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0));
    assert!(live.iter().all(|&(addr, _)| addr % PAGE == 0));
}

#[test]
fn same_calls_same_addresses() {
    let run = || {
        let mut d = SimDevice::new(SimConfig::default());
        let mut addrs = Vec::new();
        for i in 1..40u64 {
            let a = d.malloc(i * 3 * MIB).unwrap();
            addrs.push(a);
            if i % 3 == 0 {
                d.free(addrs[(i / 2) as usize], ((i / 2) + 1) * 3 * MIB);
            }
        }
        (addrs, d.calls().clone())
    };
    assert_eq!(run(), run());
}

#[test]
fn calls_are_costed_from_the_table() {
    let mut d = SimDevice::new(SimConfig::default());
    let a = d.malloc(20 * MIB).unwrap();
    d.free(a, 20 * MIB);
    assert_eq!(d.calls().get(CallKind::Malloc).time_ns, 44_868);
    assert_eq!(d.calls().get(CallKind::Free).time_ns, 52_340);
    let r = d.reserve_address(1 << 30, 0).unwrap();
    d.map(r, 20 * MIB).unwrap();
    d.unmap(r, 20 * MIB);
    d.release_address(r, 1 << 30);
    assert_eq!(d.calls().get(CallKind::Map).time_ns, 44_868);
    assert_eq!(d.calls().get(CallKind::Unmap).time_ns, 52_340);
    assert_eq!(d.calls().get(CallKind::ReleaseAddress).time_ns, crate::ADDRESS_CALL_NS);
    assert_eq!(d.calls().total_calls(), 6);
}

#[test]
fn map_and_unmap_count_against_free_memory() {
    let mut d = device(100, 10, vec![]);
    let r = d.reserve_address(1 << 30, 1 << 30).unwrap();
    assert_eq!(r % (1 << 30), 0);
    assert_eq!(d.free_bytes(), 10 * PAGE, "address space costs no memory");
    d.map(r, 4 * PAGE).unwrap();
    d.map(r + 4 * PAGE, 2 * PAGE).unwrap();
    assert_eq!(d.free_bytes(), 4 * PAGE);
    assert!(matches!(d.map(r + 6 * PAGE, 5 * PAGE), Err(DeviceError::OutOfMemory { .. })));
    d.unmap(r + 2 * PAGE, 3 * PAGE); // across the two mappings
    assert_eq!(d.free_bytes(), 7 * PAGE);
    assert!(is_oom(d.malloc(8 * PAGE)));
    assert!(d.errors().is_empty(), "{:?}", d.errors());
}

#[test]
fn contract_breaches_are_errors_not_panics() {
    let mut d = device(100, 100, vec![]);
    let r = d.reserve_address(10 * PAGE, 0).unwrap();
    let driver = |res: Result<(), DeviceError>| matches!(res, Err(DeviceError::Driver(_)));
    assert!(driver(d.map(r + 10 * PAGE, PAGE)), "outside the reservation");
    assert!(driver(d.map(r, PAGE + 1)), "not whole pages");
    d.map(r, 2 * PAGE).unwrap();
    assert!(driver(d.map(r + PAGE, 2 * PAGE)), "double map");
    assert!(matches!(d.malloc(0), Err(DeviceError::Driver(_))));
    assert!(matches!(d.reserve_address(PAGE, u64::MAX), Err(DeviceError::Driver(_))));
    d.free(0x1234, PAGE);
    d.unmap(r + 4 * PAGE, PAGE);
    d.release_address(r, 10 * PAGE); // still mapped: refused
    assert_eq!(d.errors_total(), 3);
    assert_eq!(d.free_bytes(), 98 * PAGE);
    d.unmap(r, 2 * PAGE);
    d.release_address(r, 10 * PAGE);
    assert_eq!((d.errors_total(), d.live_ranges()), (3, 0));
    assert!(d.notes().iter().any(|n| n.contains("3 invalid calls")));
}

#[test]
fn fail_nth_malloc_counts_mallocs_and_maps() {
    let mut d = device(100, 100, vec![Fault::FailNthMalloc(3)]);
    let r = d.reserve_address(10 * PAGE, 0).unwrap();
    d.malloc(PAGE).unwrap();
    d.map(r, PAGE).unwrap();
    assert!(matches!(d.map(r + PAGE, PAGE), Err(DeviceError::OutOfMemory { .. })));
    d.map(r + PAGE, PAGE).unwrap();
    d.malloc(PAGE).unwrap();
    let notes = d.notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("FailNthMalloc(3)") && notes[0].contains("map"), "{notes:?}");
}

#[test]
fn take_memory_fires_at_its_op() {
    let mut d = device(100, 10, vec![Fault::TakeMemory { at_op: 3, bytes: 4 * PAGE }]);
    d.begin_op(2);
    assert_eq!(d.free_bytes(), 10 * PAGE);
    d.begin_op(3);
    assert_eq!((d.free_bytes(), d.taken_bytes()), (6 * PAGE, 4 * PAGE));
    assert!(is_oom(d.malloc(7 * PAGE)));
    d.begin_op(4);
    assert_eq!(d.free_bytes(), 6 * PAGE, "fires once");
    assert!(d.notes()[0].contains("took 8388608 of 8388608 bytes"), "{:?}", d.notes());
}

#[test]
fn take_memory_takes_at_most_what_is_free() {
    let mut d = device(100, 10, vec![Fault::TakeMemory { at_op: 0, bytes: 50 * PAGE }]);
    d.begin_op(5); // op 0 was never announced; the fault still fires
    assert_eq!((d.free_bytes(), d.taken_bytes()), (0, 10 * PAGE));
}

#[test]
fn fail_random_is_seeded() {
    let run = |seed: u64, probability: f64| {
        let mut d = SimDevice::new(SimConfig {
            faults: vec![Fault::FailRandom { probability }],
            seed,
            ..SimConfig::default()
        });
        (0..100).map(|_| d.malloc(PAGE).is_ok()).collect::<Vec<_>>()
    };
    assert_eq!(run(1, 0.5), run(1, 0.5));
    assert_ne!(run(1, 0.5), run(2, 0.5));
    assert!(run(1, 0.0).iter().all(|&ok| ok));
    assert!(run(1, 1.0).iter().all(|&ok| !ok));
    let mut d = SimDevice::new(SimConfig {
        faults: vec![Fault::FailRandom { probability: 1.0 }],
        seed: 9,
        ..SimConfig::default()
    });
    let _ = d.malloc(PAGE);
    assert!(d.notes()[0].contains("1 of 1 reservation attempts refused"), "{:?}", d.notes());
}

#[test]
fn free_at_start_above_total_is_clamped_and_said() {
    let d = SimDevice::new(SimConfig { free_bytes: 10, total_bytes: 5, ..SimConfig::default() });
    assert_eq!(d.mem_info().free_bytes, 5);
    assert!(d.notes()[0].contains("clamped"));
}

#[test]
fn reservations_take_any_alignment_and_stay_page_aligned() {
    let mut d = device(100, 100, vec![]);
    d.malloc(PAGE).unwrap();
    let twenty = d.reserve_address(1 << 30, 20 * MIB).unwrap();
    assert_eq!((twenty % (20 * MIB), twenty % PAGE), (0, 0));
    assert!(twenty > VA_BASE);
    let odd = d.reserve_address(PAGE, 3 * 4096).unwrap();
    assert_eq!((odd % (3 * 4096), odd % PAGE), (0, 0));
}

#[test]
fn segments_packed_into_one_page_fit_and_share_it() {
    // A driver packs small mallocs side by side, 512-byte aligned, inside one 2 MiB page.
    let mut d = device(100, 10, vec![]);
    let page = 0x7f00_0020_0000;
    assert!(d.malloc_at(page, 1000));
    assert!(d.malloc_at(page + 1024, 4096));
    assert!(d.malloc_at(page + 1024 + 4096, 3 * PAGE), "spans into three more pages");
    assert!(!d.malloc_at(page + 512, 512), "overlaps the first segment");
    assert_eq!(d.reserved_bytes(), 4 * PAGE, "the shared page counts once");
    d.free(page + 1024, 4096);
    assert_eq!(d.reserved_bytes(), 4 * PAGE, "the page is still under two segments");
    d.free(page + 1024 + 4096, 3 * PAGE);
    assert_eq!(d.reserved_bytes(), PAGE);
    // The model places its own segments on pages no live segment touches.
    let own = d.malloc(PAGE).unwrap();
    assert!(own >= page + PAGE || own + PAGE <= page, "{own:#x}");
    d.free(page, 1000);
    d.free(own, PAGE);
    assert_eq!(d.reserved_bytes(), 0);
    assert_eq!(d.live_ranges(), 0);
    assert!(d.errors().is_empty(), "{:?}", d.errors());
}
