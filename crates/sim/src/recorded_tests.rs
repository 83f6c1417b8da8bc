use super::*;
use crate::{CostModel, Placement, SimConfig, PAGE_BYTES, VA_BASE};
use allocsim_core::{StreamId, MIB};

const PAGE: u64 = PAGE_BYTES;

fn ev(op: u64, kind: RecordedKind, addr: u64, size: u64) -> RecordedEvent {
    RecordedEvent { op, kind, addr, size, stream: StreamId(0) }
}

/// A model of 100 free pages of 200, with free calls.
fn model() -> SimDevice {
    SimDevice::new(SimConfig {
        total_bytes: 200 * PAGE,
        free_bytes: 100 * PAGE,
        cost: CostModel::zero(),
        placement: Placement::Lowest,
        ..SimConfig::default()
    })
}

fn recorded(events: &[RecordedEvent]) -> RecordedDevice {
    RecordedDevice::new(events, model())
}

use RecordedKind::*;

#[test]
fn grants_at_recorded_addresses_and_keeps_the_books() {
    let a = 0x7f5f_6080_0000;
    let b = 0x7f5e_f800_0000;
    let mut d = recorded(&[
        ev(0, SegmentAlloc, a, 20 * MIB),
        ev(0, Alloc, a, 1000),
        ev(2, SegmentAlloc, b, 20 * MIB),
    ]);
    d.begin_op(0);
    assert_eq!(d.malloc(20 * MIB), Ok(a));
    d.begin_op(1);
    d.begin_op(2);
    assert_eq!(d.malloc(20 * MIB), Ok(b));
    assert_eq!(d.mem_info().free_bytes, 80 * PAGE);
    assert_eq!(d.divergence(), None);
    assert_eq!(d.notes(), vec!["followed the recording for all 2 device calls".to_string()]);
}

#[test]
fn refuses_when_the_recording_frees_first_then_grants() {
    let (a, b, big) = (0x7f00_1000_0000, 0x7f00_2000_0000, 0x7f00_4000_0000);
    let mut d = recorded(&[
        ev(0, SegmentAlloc, a, 20 * MIB),
        ev(0, SegmentAlloc, b, 20 * MIB),
        ev(1, SegmentFree, a, 20 * MIB),
        ev(1, SegmentAlloc, big, 160 * MIB),
    ]);
    d.begin_op(0);
    d.malloc(20 * MIB).unwrap();
    d.malloc(20 * MIB).unwrap();
    d.begin_op(1);
    // The model has room for 160 MiB, but the recording shows the driver said no.
    assert!(matches!(d.malloc(160 * MIB), Err(DeviceError::OutOfMemory { .. })));
    d.free(a, 20 * MIB);
    assert_eq!(d.malloc(160 * MIB), Ok(big));
    d.begin_op(2);
    assert_eq!(d.divergence(), None);
    assert_eq!(d.calls().get(CallKind::Malloc).calls, 4);
    assert_eq!(d.calls().get(CallKind::Malloc).failed, 1);
    assert_eq!(d.followed_calls(), 5);
}

#[test]
fn an_oom_entry_is_a_refusal_and_is_skipped_when_unused() {
    let mut d = recorded(&[ev(0, Oom, 0, 20 * MIB), ev(1, Oom, 0, 20 * MIB)]);
    d.begin_op(0);
    assert!(d.malloc(20 * MIB).is_err(), "no-fraction OOM: the refusal produces it");
    d.begin_op(1); // fraction OOM: the policy never asked the device
    d.begin_op(2);
    assert_eq!(d.divergence(), None);
}

#[test]
fn a_different_size_leaves_the_recording_for_the_model() {
    let a = 0x7f00_1000_0000;
    let mut d = recorded(&[
        ev(0, SegmentAlloc, a, 20 * MIB),
        ev(3, SegmentAlloc, a + 20 * MIB, 20 * MIB),
        ev(3, SegmentAlloc, a + 40 * MIB, 20 * MIB),
    ]);
    d.begin_op(0);
    d.malloc(20 * MIB).unwrap();
    d.begin_op(3);
    assert_eq!(d.malloc(40 * MIB), Ok(VA_BASE), "the model places it");
    let div = d.divergence().unwrap();
    assert_eq!((div.op_index, div.followed_calls), (3, 1));
    assert_eq!(
        div.to_string(),
        "left the recording at op 3: expected segment_alloc 20971520, policy asked malloc \
         41943040; modelled from there"
    );
    // From here on the model answers, from the right free memory: 100 - 10 - 20 pages.
    assert_eq!(d.malloc(20 * MIB), Ok(VA_BASE + 40 * MIB));
    assert_eq!(d.mem_info().free_bytes, 60 * PAGE);
    assert!(matches!(d.malloc(61 * PAGE), Err(DeviceError::OutOfMemory { .. })));
    assert_eq!(d.notes(), vec![div.to_string()]);
}

#[test]
fn an_extra_call_or_a_missing_one_is_a_divergence() {
    let a = 0x7f00_1000_0000;
    let mut extra = recorded(&[ev(0, SegmentAlloc, a, 20 * MIB)]);
    extra.begin_op(0);
    extra.malloc(20 * MIB).unwrap();
    extra.malloc(20 * MIB).unwrap();
    let div = extra.divergence().unwrap();
    assert_eq!((div.expected, div.got.map(|c| c.kind)), (None, Some(CallKind::Malloc)));

    let mut missing =
        recorded(&[ev(0, SegmentAlloc, a, 20 * MIB), ev(1, SegmentFree, a, 20 * MIB)]);
    missing.begin_op(0);
    missing.malloc(20 * MIB).unwrap();
    missing.begin_op(1);
    missing.begin_op(2);
    let div = missing.divergence().unwrap();
    assert_eq!((div.op_index, div.got), (1, None));
    assert!(div.to_string().contains("expected segment_free 20971520 at 0x7f0010000000"));
    // The unconsumed free is the model's to do now; the books still hold the segment.
    missing.free(a, 20 * MIB);
    assert_eq!(missing.mem_info().free_bytes, 100 * PAGE);
}

#[test]
fn a_free_of_the_wrong_segment_is_a_divergence() {
    let (a, b) = (0x7f00_1000_0000, 0x7f00_2000_0000);
    let mut d = recorded(&[
        ev(0, SegmentAlloc, a, 20 * MIB),
        ev(0, SegmentAlloc, b, 20 * MIB),
        ev(1, SegmentFree, a, 20 * MIB),
    ]);
    d.begin_op(0);
    d.malloc(20 * MIB).unwrap();
    d.malloc(20 * MIB).unwrap();
    d.begin_op(1);
    d.free(b, 20 * MIB);
    let div = d.divergence().unwrap();
    assert_eq!(div.got, Some(DeviceCall { kind: CallKind::Free, addr: b, size: 20 * MIB }));
    assert_eq!(d.model().live_ranges(), 1);
}

#[test]
fn expandable_recordings_line_up_reservations_with_maps() {
    let (large, small) = (0x3_0200_0000, 0x19_4800_0000);
    let mut d = recorded(&[
        ev(0, SegmentMap, large, 20 * MIB),
        ev(1, SegmentMap, small, 2 * MIB),
        ev(2, SegmentMap, large + 20 * MIB, 40 * MIB),
        ev(3, Oom, 0, 100 * MIB),
        ev(4, SegmentUnmap, large + 20 * MIB, 20 * MIB),
    ]);
    let va = 64 << 30;
    d.begin_op(0);
    assert_eq!(d.reserve_address(va, 0), Ok(large));
    d.map(large, 20 * MIB).unwrap();
    d.begin_op(1);
    assert_eq!(d.reserve_address(va, 0), Ok(small), "the next head outside live ranges");
    d.map(small, 2 * MIB).unwrap();
    d.begin_op(2);
    d.map(large + 20 * MIB, 40 * MIB).unwrap();
    d.begin_op(3);
    assert!(matches!(d.map(large + 60 * MIB, 100 * MIB), Err(DeviceError::OutOfMemory { .. })));
    d.begin_op(4);
    d.unmap(large + 20 * MIB, 20 * MIB);
    assert_eq!(d.divergence(), None, "{:?}", d.notes());
    assert_eq!(d.mem_info().free_bytes, 100 * PAGE - 42 * MIB);
}

#[test]
fn the_notes_say_when_the_run_stopped_short() {
    let mut d =
        recorded(&[ev(0, SegmentAlloc, 0x7f00_1000_0000, PAGE), ev(5, SegmentAlloc, 0, PAGE)]);
    d.begin_op(0);
    d.malloc(PAGE).unwrap();
    let notes = d.notes();
    assert_eq!(notes[0], "followed the recording for all 1 device calls");
    assert!(notes[1].contains("1 recorded device events not reached (the first in op 5)"));
}

#[test]
fn ops_going_backwards_leave_the_recording() {
    let mut d = recorded(&[ev(5, SegmentAlloc, 0x7f00_1000_0000, PAGE)]);
    d.begin_op(3);
    d.begin_op(2);
    assert_eq!(
        d.divergence().map(|div| div.to_string()),
        Some(
            "left the recording at op 3: ops went backwards, from 3 to 2; modelled from there"
                .into()
        )
    );
}
