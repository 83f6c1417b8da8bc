//! The devices against a real recording: the device calls of `synthetic_default` (PyTorch 2.11,
//! H100, default settings, 16 OOMs and 28 retries), replayed as the caching allocator made them.
//!
//! `data/synthetic_default_device_events.txt` was extracted from the snapshot with:
//! ```python
//! tr = pickle.load(gzip.open("synthetic_default.pickle.gz"))["device_traces"][0]
//! # runs of consecutive segment_alloc / segment_free / oom entries, one line each
//! ```
//! A run that starts with `segment_free` is a retry: PyTorch's first `cudaMalloc` was refused,
//! it freed cached segments, then tried again (and got the segment, or reported the OOM).

use allocsim_core::{Device, DeviceError, RecordedEvent, RecordedKind, StreamId};
use allocsim_sim::{RecordedDevice, SimConfig, SimDevice};
use std::collections::BTreeMap;

const DATA: &str = include_str!("data/synthetic_default_device_events.txt");

#[derive(Debug, Clone, Copy)]
enum Call {
    Alloc { addr: u64, size: u64 },
    Free { addr: u64, size: u64 },
    Oom { size: u64, device_free: u64 },
}

fn number(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

/// One `Vec<Call>` per allocator call that touched the device.
fn runs() -> Vec<Vec<Call>> {
    let parse = |item: &str| {
        let f: Vec<&str> = item.split(':').collect();
        match f[0] {
            "a" => Call::Alloc { addr: number(f[1]), size: number(f[2]) },
            "f" => Call::Free { addr: number(f[1]), size: number(f[2]) },
            _ => Call::Oom { size: number(f[1]), device_free: number(f[2]) },
        }
    };
    let lines = DATA.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty());
    lines.map(|l| l.split_whitespace().map(parse).collect()).collect()
}

/// The size of the reservation a retry run was for, if the run is a retry.
fn retried_size(run: &[Call]) -> Option<u64> {
    match (run.first(), run.last()) {
        (Some(Call::Free { .. }), Some(Call::Alloc { size, .. } | Call::Oom { size, .. })) => {
            Some(*size)
        }
        _ => None,
    }
}

/// Make the recorded calls on `device`, as the caching allocator did: a retry's first attempt
/// must be refused, every recorded `segment_alloc` granted, every `oom` refused with the
/// recorded free memory. `addr_of` maps recorded addresses to the device's.
fn replay(
    device: &mut dyn Device,
    runs: &[Vec<Call>],
    addr_of: &mut dyn FnMut(u64, Option<u64>) -> u64,
) {
    for (op, run) in runs.iter().enumerate() {
        device.begin_op(op as u64);
        if let Some(size) = retried_size(run) {
            assert!(
                device.malloc(size).is_err(),
                "op {op}: the first attempt of a retry must fail"
            );
        }
        for call in run {
            match *call {
                Call::Alloc { addr, size } => {
                    let got = device.malloc(size).unwrap_or_else(|e| panic!("op {op}: {e}"));
                    addr_of(addr, Some(got));
                }
                Call::Free { addr, size } => device.free(addr_of(addr, None), size),
                Call::Oom { size, device_free } => {
                    let err = device.malloc(size).unwrap_err();
                    assert_eq!(
                        err,
                        DeviceError::OutOfMemory { requested: size, free: device_free }
                    );
                    assert_eq!(device.mem_info().free_bytes, device_free, "op {op}");
                }
            }
        }
    }
}

#[test]
fn the_model_refuses_exactly_where_the_driver_did() {
    let runs = runs();
    assert_eq!(runs.len(), 172);
    // PyTorch counts a retry for every OOM and every refused-then-granted reservation.
    let granted_retries = runs
        .iter()
        .filter(|r| retried_size(r).is_some() && matches!(r.last(), Some(Call::Alloc { .. })))
        .count();
    let ooms = runs.iter().flatten().filter(|c| matches!(c, Call::Oom { .. })).count();
    assert_eq!((granted_retries + ooms, ooms), (28, 16));
    let mut model = SimDevice::new(SimConfig::default());
    let mut addrs = BTreeMap::new();
    replay(&mut model, &runs, &mut |recorded, got| match got {
        Some(a) => {
            addrs.insert(recorded, a);
            a
        }
        None => addrs.remove(&recorded).unwrap(),
    });
}

#[test]
fn the_recorded_device_follows_it_at_the_recorded_addresses() {
    let runs = runs();
    let mut recorded = Vec::new();
    for (op, run) in runs.iter().enumerate() {
        for call in run {
            let (kind, addr, size) = match *call {
                Call::Alloc { addr, size } => (RecordedKind::SegmentAlloc, addr, size),
                Call::Free { addr, size } => (RecordedKind::SegmentFree, addr, size),
                Call::Oom { size, device_free } => (RecordedKind::Oom, device_free, size),
            };
            recorded.push(RecordedEvent { op: op as u64, kind, addr, size, stream: StreamId(0) });
        }
    }
    let mut device = RecordedDevice::new(&recorded, SimDevice::new(SimConfig::default()));
    replay(&mut device, &runs, &mut |recorded, got| {
        if let Some(a) = got {
            assert_eq!(a, recorded);
        }
        recorded
    });
    device.begin_op(runs.len() as u64);
    assert_eq!(device.divergence(), None);
    // 156 grants, 64 frees, 16 OOM refusals, 18 first attempts of retries refused.
    let calls = 156 + 64 + 16 + 18;
    assert_eq!(
        device.notes(),
        vec![format!("followed the recording for all {calls} device calls")]
    );
}
