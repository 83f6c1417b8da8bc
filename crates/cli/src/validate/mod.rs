//! The real-GPU mode: `allocsim validate`.
//!
//! `validate` replays one op stream twice with the same policy: on the GPU (a `CudaDevice`,
//! with pattern kernels filling and verifying every block) and on the simulated device sized
//! with the GPU's real free and total memory. The GPU run's events become a recording, and the
//! simulated run is compared with it event for event by the same `Fidelity` observer that
//! compares a simulation with a PyTorch recording: action, size, offset within the segment
//! (addresses differ), OOMs; then the final `memory_stats`. The GPU's device calls are logged
//! too (each call, its answer, and the free memory after it), and the comparison is repeated on
//! a device that answers every call exactly as the GPU did (`ReplayCallsDevice`: its addresses,
//! its refusals, its `mem_info`): that tells a difference caused by the driver's answers
//! (address tie-breaks, a refusal the model did not predict) from one in a decision.

mod report;
mod runs;

use crate::gpu::per_op_us;
use crate::input::load_trace;
use crate::output::bytes;
use allocsim_core::{CallKind, Event, RecordedEvent, Trace};
use allocsim_cuda::{CudaDevice, PatternReport, Patterns};
use allocsim_replay::{Divergence, Observer, Recorder};
use allocsim_run::{run_trace, run_trace_on, DeviceChoice, RunOptions, RunReport};
use allocsim_sim::{CallLog, CallLogger, ReplayCallsDevice, SimConfig, SimDevice};
use anyhow::Context;
use std::cell::RefCell;
use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HardwareArg {
    /// A real GPU through the CUDA driver (loaded at run time).
    Cuda,
    /// A second simulated device in the GPU's place: checks the comparison itself, anywhere.
    Sim,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The op stream: a trace file (.pickle[.gz], .csv, .allocsim, .allocsim.json) or a live
    /// workload, `workload:NAME?key=value&...`, e.g.
    /// `workload:transformer-train?layers=12&hidden=768&batch=8&seq=512` (`allocsim workload`
    /// lists names and parameters).
    pub input: PathBuf,
    /// The allocation policy, run identically on both devices.
    #[arg(long, default_value = "pytorch")]
    pub policy: String,
    /// The hardware side of the comparison.
    #[arg(long, value_enum, default_value_t = HardwareArg::Cuda)]
    pub device: HardwareArg,
    /// Which GPU (CUDA device ordinal).
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Allocator settings in the policy's syntax. Default: the trace's own (pytorch only).
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// Cap reserved memory at this fraction of the device total. Default: the trace's.
    #[arg(long)]
    pub memory_fraction: Option<f64>,
    /// Skip the pattern kernels (fill on alloc, verify on free and at the end).
    #[arg(long)]
    pub no_patterns: bool,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// Drives the pattern kernels from the events: fill on alloc, verify on free.
use report::*;
use runs::*;

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let trace = load_trace(&args.input)?;
    let hw = run_hardware(&args, &trace)?;
    let model = Comparison::of(&hw.report, &run_simulated(&args, &trace, &hw)?);
    // Run always: it also compares the model's free memory with the driver's after each call.
    let following = run_following(&args, &trace, &hw)?;
    let corrupted = hw
        .patterns
        .as_ref()
        .is_some_and(|p| p.mismatched_words > 0 || p.overlapping_allocs > 0 || p.unknown_frees > 0);
    let violations = hw.report.check.as_ref().map_or(0, |c| c.total_violations());
    let clean = !corrupted && violations == 0;
    let verdict = verdict(clean, &model, &following);
    if args.json {
        let value = json(&args, &trace, &hw, &model, &following, violations, verdict);
        crate::output::emit(&(serde_json::to_string_pretty(&value)? + "\n"))?;
    } else {
        crate::output::emit(&print(&args, &trace, &hw, &model, &following, violations, verdict))?;
    }
    Ok(if verdict == "DIFFER" { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// AGREE: the modelled device alone reproduces the hardware run; AGREE given the GPU's
/// answers: answering every device call as the GPU did, it does; DIFFER otherwise, or on any
/// corrupted word, overlap or checker violation.
fn verdict(clean: bool, model: &Comparison, following: &Following) -> &'static str {
    match (clean, model.exact(), following.comparison.exact()) {
        (false, _, _) => "DIFFER",
        (true, true, _) => "AGREE",
        (true, false, true) => "AGREE given the GPU's answers",
        (true, false, false) => "DIFFER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn args(input: &str, policy: &str) -> Args {
        Args {
            input: PathBuf::from(input),
            policy: policy.into(),
            device: HardwareArg::Sim,
            gpu: 0,
            alloc_conf: None,
            memory_fraction: None,
            no_patterns: true,
            json: false,
        }
    }

    /// With a simulated device in the GPU's place, the comparison machinery must find the two
    /// runs identical for every policy: anything else is a bug in the comparison, not a
    /// finding about hardware.
    #[test]
    fn sim_against_sim_agrees_for_every_policy_on_a_workload() {
        let input =
            "workload:transformer-train?layers=2&hidden=256&batch=2&seq=128&vocab=4096&steps=2";
        let trace = load_trace(Path::new(input)).unwrap();
        for policy in allocsim_policies::names() {
            let a = args(input, policy);
            let hw = run_hardware(&a, &trace).unwrap();
            assert!(!hw.recorded.is_empty());
            let model = Comparison::of(&hw.report, &run_simulated(&a, &trace, &hw).unwrap());
            assert!(model.exact(), "{policy}: {}", model.summary());
            let f = run_following(&a, &trace, &hw).unwrap();
            assert!(f.comparison.exact(), "{policy}: {}", f.comparison.summary());
            assert!(f.followed_all(), "{policy}: {}", f.calls_summary());
            assert!(f.free_memory.starts_with("free memory equal after"), "{}", f.free_memory);
            assert!(!f.free_memory.contains("differs"), "{policy}: {}", f.free_memory);
        }
    }

    /// A simulated device whose addresses are mirrored, so segments the model places side by
    /// side come out in the opposite order, as a real driver's often do.
    struct Mirrored(SimDevice);

    const MIRROR: u64 = 1 << 48;

    impl allocsim_core::Device for Mirrored {
        fn malloc(&mut self, size: u64) -> Result<u64, allocsim_core::DeviceError> {
            self.0.malloc(size).map(|a| MIRROR - a - size)
        }
        fn free(&mut self, addr: u64, size: u64) {
            self.0.free(MIRROR - addr - size, size)
        }
        fn reserve_address(
            &mut self,
            size: u64,
            alignment: u64,
        ) -> Result<u64, allocsim_core::DeviceError> {
            self.0.reserve_address(size, alignment).map(|a| MIRROR - a - size)
        }
        fn release_address(&mut self, addr: u64, size: u64) {
            self.0.release_address(MIRROR - addr - size, size)
        }
        fn map(&mut self, addr: u64, size: u64) -> Result<(), allocsim_core::DeviceError> {
            self.0.map(MIRROR - addr - size, size)
        }
        fn unmap(&mut self, addr: u64, size: u64) {
            self.0.unmap(MIRROR - addr - size, size)
        }
        fn mem_info(&self) -> allocsim_core::MemInfo {
            self.0.mem_info()
        }
        fn calls(&self) -> &allocsim_core::DeviceCalls {
            self.0.calls()
        }
    }

    /// Other addresses (adjacent segments in the other order) change no decision of a policy
    /// that never looks at addresses: the comparison must say so, offsets and all.
    #[test]
    fn other_addresses_alone_are_no_difference() {
        let input = "workload:cnn-train?batch=2&image=64&steps=2";
        let trace = load_trace(Path::new(input)).unwrap();
        let a = args(input, "uncached");
        let (total, free) = sim_capacity(&trace);
        let sim = SimDevice::new(SimConfig {
            total_bytes: total,
            free_bytes: free,
            ..SimConfig::default()
        });
        let hw = run_stand_in(&a, &trace, &mut Mirrored(sim)).unwrap();
        let model = Comparison::of(&hw.report, &run_simulated(&a, &trace, &hw).unwrap());
        assert!(model.exact(), "{}", model.summary());
    }

    fn stand_in_sim(trace: &Trace, faults: Vec<allocsim_sim::Fault>) -> SimDevice {
        let (total, free) = sim_capacity(trace);
        SimDevice::new(SimConfig {
            total_bytes: total,
            free_bytes: free,
            faults,
            ..SimConfig::default()
        })
    }

    /// A driver that packs mallocs smaller than a page side by side inside one 2 MiB page,
    /// 512-byte aligned, as the H100's does; addresses mirrored as in [`Mirrored`].
    struct Packing {
        sim: Mirrored,
        /// The page being filled: (address, next free offset).
        open: Option<(u64, u64)>,
        /// Page -> live segments packed into it.
        users: std::collections::BTreeMap<u64, u32>,
        packed: u64,
    }

    const PAGE: u64 = allocsim_sim::PAGE_BYTES;

    impl allocsim_core::Device for Packing {
        fn malloc(&mut self, size: u64) -> Result<u64, allocsim_core::DeviceError> {
            if size >= PAGE {
                return self.sim.malloc(size);
            }
            let (page, used) = match self.open {
                Some((page, used)) if used + size <= PAGE => (page, used),
                _ => (self.sim.malloc(PAGE)?, 0),
            };
            self.packed += u64::from(used > 0);
            *self.users.entry(page).or_default() += 1;
            self.open = Some((page, (used + size).div_ceil(512) * 512));
            Ok(page + used)
        }
        fn free(&mut self, addr: u64, size: u64) {
            if size >= PAGE {
                return self.sim.free(addr, size);
            }
            let page = *self.users.range(..=addr).next_back().unwrap().0;
            let users = self.users.get_mut(&page).unwrap();
            *users -= 1;
            if *users == 0 {
                self.users.remove(&page);
                if self.open.is_some_and(|(p, _)| p == page) {
                    self.open = None;
                }
                self.sim.free(page, PAGE);
            }
        }
        fn reserve_address(
            &mut self,
            size: u64,
            alignment: u64,
        ) -> Result<u64, allocsim_core::DeviceError> {
            self.sim.reserve_address(size, alignment)
        }
        fn release_address(&mut self, addr: u64, size: u64) {
            self.sim.release_address(addr, size)
        }
        fn map(&mut self, addr: u64, size: u64) -> Result<(), allocsim_core::DeviceError> {
            self.sim.map(addr, size)
        }
        fn unmap(&mut self, addr: u64, size: u64) {
            self.sim.unmap(addr, size)
        }
        fn mem_info(&self) -> allocsim_core::MemInfo {
            self.sim.mem_info()
        }
        fn calls(&self) -> &allocsim_core::DeviceCalls {
            self.sim.calls()
        }
    }

    /// The rmm_pool runs on the H100 that the event-following device could not follow: the
    /// driver packed small segments into one page. Answering the calls as the device did, with
    /// exact byte ranges in the model's books, follows them to the end, exactly.
    #[test]
    fn a_driver_packing_small_segments_is_followed() {
        let input = "workload:cnn-train?batch=2&image=64&steps=2";
        let trace = load_trace(Path::new(input)).unwrap();
        for policy in ["rmm_pool", "bfc", "rmm_binning", "async_pool"] {
            let a = args(input, policy);
            let mut device = Packing {
                sim: Mirrored(stand_in_sim(&trace, vec![])),
                open: None,
                users: Default::default(),
                packed: 0,
            };
            let hw = run_stand_in(&a, &trace, &mut device).unwrap();
            if policy == "rmm_pool" {
                assert!(device.packed > 0, "the test must pack something");
            }
            let f = run_following(&a, &trace, &hw).unwrap();
            assert!(f.followed_all(), "{policy}: {}", f.calls_summary());
            assert!(f.comparison.exact(), "{policy}: {}", f.comparison.summary());
        }
    }

    /// The async_pool runs the event-following device could not follow: the driver refused a
    /// malloc the model would have granted, and the policy went on without an event showing
    /// it. Answering the calls as the device did reproduces the refusal.
    #[test]
    fn a_refusal_the_model_would_not_make_is_followed() {
        let input =
            "workload:transformer-train?layers=2&hidden=256&batch=2&seq=128&vocab=4096&steps=2";
        let trace = load_trace(Path::new(input)).unwrap();
        for policy in allocsim_policies::names() {
            let a = args(input, policy);
            let mut device = stand_in_sim(&trace, vec![allocsim_sim::Fault::FailNthMalloc(3)]);
            let hw = run_stand_in(&a, &trace, &mut device).unwrap();
            let calls = &hw.report.device_calls;
            let (malloc, map) = (calls.get(CallKind::Malloc), calls.get(CallKind::Map));
            let refused = malloc.failed + map.failed;
            assert_eq!(refused, u64::from(malloc.calls + map.calls >= 3), "{policy}");
            let f = run_following(&a, &trace, &hw).unwrap();
            assert!(f.followed_all(), "{policy}: {}", f.calls_summary());
            assert!(f.comparison.exact(), "{policy}: {}", f.comparison.summary());
            if policy == "async_pool" {
                let model = Comparison::of(&hw.report, &run_simulated(&a, &trace, &hw).unwrap());
                assert!(!model.exact(), "the model alone grants the refused call");
            }
        }
    }

    #[test]
    fn a_wrong_workload_is_an_error_naming_the_choices() {
        let err = load_trace(Path::new("workload:nope")).unwrap_err();
        assert!(format!("{err:#}").contains("transformer-train"), "{err:#}");
    }
}
