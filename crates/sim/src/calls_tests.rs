use super::*;
use crate::{CostModel, Fault, Placement, SimConfig, PAGE_BYTES};
use allocsim_core::MIB;

const PAGE: u64 = PAGE_BYTES;

fn sim(free_pages: u64, faults: Vec<Fault>) -> SimDevice {
    SimDevice::new(SimConfig {
        total_bytes: 200 * PAGE,
        free_bytes: free_pages * PAGE,
        cost: CostModel::zero(),
        faults,
        placement: Placement::Lowest,
        ..SimConfig::default()
    })
}

/// The calls of a small allocator: a segment per op, the second refused once and retried.
fn drive(d: &mut dyn Device) -> Vec<Result<u64, DeviceError>> {
    let mut answers = Vec::new();
    d.begin_op(0);
    answers.push(d.malloc(20 * MIB));
    d.begin_op(1);
    let second = d.malloc(40 * MIB);
    answers.push(second.clone());
    if second.is_err() {
        if let Ok(a) = answers[0] {
            d.free(a, 20 * MIB);
        }
        answers.push(d.malloc(40 * MIB));
    }
    let info = d.mem_info();
    answers.push(Ok(info.free_bytes));
    d.begin_op(2);
    let r = d.reserve_address(64 * MIB, 20 * MIB);
    answers.push(r.clone());
    if let Ok(base) = r {
        answers.push(d.map(base, 4 * PAGE).map(|()| 0));
        d.unmap(base, 2 * PAGE);
    }
    answers
}

#[test]
fn answers_as_the_logged_device_did_refusals_included() {
    // The "hardware": refuses the second malloc although it has room.
    let mut hw = sim(100, vec![Fault::FailNthMalloc(2)]);
    let mut logger = CallLogger::new(&mut hw, true);
    let on_hw = drive(&mut logger);
    let log = logger.finish();
    assert_eq!(log.calls.len(), 7);
    assert!(log.calls[1].answer.is_err());
    // The model alone grants the second malloc; following the log, it is refused.
    assert!(drive(&mut sim(100, vec![]))[1].is_ok());
    let mut replay = ReplayCallsDevice::new(log, sim(100, vec![]));
    let on_replay = drive(&mut replay);
    assert_eq!(on_replay, on_hw);
    replay.begin_op(3);
    assert_eq!(replay.divergence(), None);
    assert_eq!(replay.followed_calls(), 7);
    assert!(replay.unreached().is_none());
    assert_eq!(replay.calls().get(CallKind::Malloc).failed, 1);
    let check = replay.free_check();
    assert_eq!((check.compared, check.equal), (7, 7), "{check}");
    assert_eq!(check.delta_range, Some((0, 0)));
    assert_eq!(replay.notes()[0], "followed the device for all 7 calls");
}

#[test]
fn packed_sub_page_segments_are_followed() {
    let page = 0x7f00_0060_0000;
    let logged = |op, addr, size| LoggedCall {
        op: Some(op),
        call: DeviceCall { kind: CallKind::Malloc, addr: 0, size },
        alignment: 0,
        answer: Ok(addr),
        free_after: None,
    };
    let log = CallLog {
        calls: vec![
            logged(0, page, 1_000),
            logged(0, page + 1024, 512),
            logged(1, page + 1536, 2048),
        ],
        mem_infos: vec![],
    };
    let mut d = ReplayCallsDevice::new(log, sim(100, vec![]));
    d.begin_op(0);
    assert_eq!(d.malloc(1_000), Ok(page));
    assert_eq!(d.malloc(512), Ok(page + 1024));
    d.begin_op(1);
    assert_eq!(d.malloc(2048), Ok(page + 1536));
    assert_eq!(d.divergence(), None);
    assert_eq!(d.model().reserved_bytes(), PAGE);
}

#[test]
fn another_call_or_a_missed_one_is_a_divergence_then_the_model_answers() {
    let mut hw = sim(100, vec![]);
    let mut logger = CallLogger::new(&mut hw, false);
    drive(&mut logger);
    let log = logger.finish();

    let mut d = ReplayCallsDevice::new(log.clone(), sim(100, vec![]));
    d.begin_op(0);
    assert!(d.malloc(30 * MIB).is_ok(), "the model answers");
    let div = d.divergence().unwrap().clone();
    assert_eq!((div.op, div.followed_calls), (Some(0), 0));
    assert_eq!(
        div.to_string(),
        "left the device's calls at op 0 after 0 followed calls: the device was asked malloc \
         20971520 (granted at 0x7f0000000000) in op 0, the policy asked malloc 31457280; \
         modelled from there"
    );

    let mut d = ReplayCallsDevice::new(log, sim(100, vec![]));
    d.begin_op(0);
    d.begin_op(1);
    let div = d.divergence().unwrap();
    assert_eq!(div.got, None);
    assert!(div.to_string().contains("the policy made no such call"), "{div}");
}

#[test]
fn mem_info_answers_the_logged_ones_of_the_op_then_the_model() {
    let big = MemInfo { free_bytes: 7, total_bytes: 200 * PAGE };
    let log = CallLog {
        calls: vec![],
        mem_infos: vec![
            LoggedMemInfo { op: None, info: MemInfo { free_bytes: 1, total_bytes: 1 } },
            LoggedMemInfo { op: Some(1), info: big },
        ],
    };
    let d = &mut ReplayCallsDevice::new(log, sim(100, vec![]));
    let model = MemInfo { free_bytes: 100 * PAGE, total_bytes: 200 * PAGE };
    assert_eq!(d.mem_info(), model, "before the first op: the model");
    d.begin_op(0);
    assert_eq!(d.mem_info(), model);
    d.begin_op(1);
    assert_eq!(d.mem_info(), big);
    assert_eq!(d.mem_info(), model, "the op's logged answers are used up");
}

#[test]
fn free_memory_differences_are_reported_with_their_range() {
    let call = |free_after| LoggedCall {
        op: Some(0),
        call: DeviceCall { kind: CallKind::Malloc, addr: 0, size: 512 },
        alignment: 0,
        answer: Ok(0x7f00_0000_0200),
        free_after: Some(free_after),
    };
    let mut check = FreeMemoryCheck::default();
    check.compare(0, &call(3 * PAGE), PAGE);
    check.compare(1, &call(2 * PAGE), PAGE);
    assert_eq!((check.compared, check.equal), (2, 0));
    assert_eq!(check.delta_range, Some((PAGE as i64, 2 * PAGE as i64)));
    assert!(check.to_string().ends_with("device − model from 2097152 to 4194304 bytes"), "{check}");
}
