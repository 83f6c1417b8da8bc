//! What the capacity search takes for known without running it holds: a run from an empty
//! device with as much free memory as the unconstrained run reserved at its peak is that run
//! again, so it fits.

use allocsim_core::Trace;
use allocsim_run::{run_trace, DeviceChoice, RunOptions};
use std::path::{Path, PathBuf};

fn snapshots(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            snapshots(&p, out);
        } else if p.to_string_lossy().ends_with(".pickle.gz") {
            out.push(p);
        }
    }
}

fn run(trace: &Trace, conf: &str, free: Option<u64>) -> allocsim_run::RunReport {
    let opts = RunOptions {
        policy: "pytorch".to_string(),
        alloc_conf: Some(conf.to_string()),
        device: DeviceChoice::Sim,
        device_free_bytes: free,
        ..RunOptions::default()
    };
    run_trace(trace, &opts, &mut [], |_| {}).unwrap()
}

#[test]
fn the_unconstrained_runs_reserved_peak_is_enough() {
    let mut paths = vec![];
    snapshots(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces"), &mut paths);
    paths.sort();
    assert!(paths.len() > 30, "the bundled snapshots");
    let confs = [
        "",
        "expandable_segments:True",
        "max_split_size_mb:64",
        "garbage_collection_threshold:0.6,max_split_size_mb:128",
        "roundup_power2_divisions:4",
    ];
    let mut checked = 0;
    for path in &paths {
        let trace = allocsim_trace::read_trace(path).unwrap();
        if trace.start.is_some() {
            continue;
        }
        for conf in confs {
            let base = run(&trace, conf, None);
            if !base.metrics.ooms.is_empty() {
                continue;
            }
            let peak = base.stats.reserved_bytes.all.peak.max(0) as u64;
            let again = run(&trace, conf, Some(peak));
            assert!(again.metrics.ooms.is_empty(), "{}, {conf:?}", path.display());
            assert_eq!(again.metrics, base.metrics, "{}, {conf:?}", path.display());
            checked += 1;
        }
    }
    assert!(checked > 60, "{checked} runs");
}

/// The driver's floor is free memory the allocator never gets: the answer is the answer
/// without it, moved up by it (the band's lower margin, a share of the point, with it).
#[test]
fn the_drivers_floor_moves_the_answer_up_by_itself() {
    use allocsim_run::{capacity, CapacityOptions, H200_DRIVER_FLOOR_BYTES};
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../traces/pytorch-2.11-h100/gpt2_train.pickle.gz");
    let trace = allocsim_trace::read_trace(&path).unwrap();
    let run = RunOptions { policy: "pytorch".to_string(), ..RunOptions::default() };
    let opts = |floor_bytes| CapacityOptions {
        run: run.clone(),
        outside_bytes: 200 << 20,
        floor_bytes,
        jitters: 4,
    };
    let (without, with) = (
        capacity(&trace, &opts(0)).unwrap(),
        capacity(&trace, &opts(H200_DRIVER_FLOOR_BYTES)).unwrap(),
    );
    let up = |b: Option<u64>| b.map(|b| b + H200_DRIVER_FLOOR_BYTES);
    assert_eq!(with.capacity_bytes, up(without.capacity_bytes));
    assert_eq!(with.high_bytes, up(without.high_bytes));
    // The margin below is a share of the point (`ORDER_MARGIN_PER_10K` of each whole 10,000
    // bytes), which moved too.
    let low_moved = with.low_bytes.unwrap() - without.low_bytes.unwrap();
    let margin_moved = H200_DRIVER_FLOOR_BYTES - low_moved;
    assert!(margin_moved <= (H200_DRIVER_FLOOR_BYTES / 10_000 + 1) * 35, "{margin_moved}");
    assert_eq!(allocsim_run::driver_floor_bytes(Some(allocsim_run::H200_TOTAL_BYTES)), 3_276_800);
    assert_eq!(allocsim_run::driver_floor_bytes(Some(85_017_493_504)), 0, "not measured");
}
