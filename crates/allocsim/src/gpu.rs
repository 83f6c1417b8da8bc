//! A replay on the real GPU (`replay --device cuda`): the run and the lines it adds to the
//! summary, and the per-op timing both it and `validate` report.

use allocsim_core::Trace;
use allocsim_cuda::CudaDevice;
use allocsim_replay::Observer;
use allocsim_run::{run_trace_on, RunOptions, RunReport};
use anyhow::Context;
use std::time::{Duration, Instant};

/// `allocsim replay --device cuda`: the run on GPU `0` without pattern checks, and its wall
/// time (the policy's own work plus the driver calls).
pub fn replay_on_cuda(
    trace: &Trace,
    opts: &RunOptions,
    extra: &mut [&mut dyn Observer],
    progress: impl FnMut(u64),
) -> anyhow::Result<(RunReport, Duration, String)> {
    let mut gpu = CudaDevice::open(0).context("opening the GPU")?;
    let start = Instant::now();
    let report =
        run_trace_on(trace, opts, &mut gpu, "cuda", extra, progress).with_context(|| {
            format!("setting up the {} policy", allocsim_core::text::excerpt(&opts.policy))
        })?;
    let wall = start.elapsed();
    Ok((report, wall, gpu.description()))
}

/// The lines `replay --device cuda` adds to its summary.
pub fn cuda_timing_lines(report: &RunReport, wall: Duration, description: &str) -> Vec<String> {
    vec![
        format!("  GPU: {description}"),
        format!(
            "  wall time on the GPU: {:.3} s for {} ops ({:.2} us/op); device calls {:.3} ms measured",
            wall.as_secs_f64(),
            report.ops_run,
            per_op_us(wall, report.ops_run),
            report.device_calls.total_time_ns() as f64 / 1e6
        ),
    ]
}

/// Wall time per op, in microseconds.
pub fn per_op_us(wall: Duration, ops: u64) -> f64 {
    wall.as_secs_f64() * 1e6 / ops.max(1) as f64
}
