//! Policy x trace grids, run in parallel, and the minimum feasible capacity of a run.

use crate::{run_trace, DeviceChoice, RunOptions, RunReport};
use allocsim_core::{ConfigError, Trace};
use rayon::prelude::*;

/// One cell of a comparison grid.
#[derive(Debug, Clone)]
pub struct GridCell {
    pub trace: String,
    pub policy: String,
    pub report: RunReport,
    /// The smallest device (bytes available to the process) on which the trace runs without
    /// OOM, to `CAPACITY_RESOLUTION_BYTES`; `None` when not even the trace's own device is
    /// enough, or when it was not asked for.
    pub min_feasible_capacity_bytes: Option<u64>,
}

/// Whether `trace` runs without OOM on a device of `capacity` bytes (total = free).
fn fits(trace: &Trace, opts: &RunOptions, capacity: u64) -> Result<bool, ConfigError> {
    let size = Some(capacity);
    let run = RunOptions { device_total_bytes: size, device_free_bytes: size, ..opts.clone() };
    crate::capacity::completes(crate::capacity::Runs::Whole(trace), run)
}

/// The smallest capacity on which `trace` runs without OOM under `opts`, found by bisection
/// between `lower` (known or assumed too small) and `upper`. Feasibility is not strictly
/// monotonic in capacity for every policy (a bigger card can change an early decision), so
/// this is the boundary bisection finds, checked to fit.
pub fn min_feasible_capacity(
    trace: &Trace,
    opts: &RunOptions,
    lower: u64,
    upper: u64,
) -> Result<Option<u64>, ConfigError> {
    if !fits(trace, opts, upper)? {
        return Ok(None);
    }
    crate::capacity::bisect(lower.min(upper), upper, |x| fits(trace, opts, x)).map(Some)
}

/// The options of a column, `NAME` or `NAME[SETTINGS]`, on top of `base`: its settings, if it
/// has any, replace `base`'s.
pub fn column_options(column: &str, base: &RunOptions) -> RunOptions {
    let (policy, conf) = allocsim_policies::parse_spec(column);
    RunOptions {
        policy: policy.to_string(),
        alloc_conf: conf.map(str::to_string).or(base.alloc_conf.clone()),
        ..base.clone()
    }
}

/// Run every policy on every trace in parallel; a policy is `NAME` or `NAME[SETTINGS]`. Each
/// cell runs on the device `auto` picks (the PyTorch policy under a recording's own settings
/// follows the recording; anything else runs on the model), and its capacity bisection on
/// the model. `progress` is called once per finished cell.
pub fn compare<T: std::borrow::Borrow<Trace> + Sync>(
    traces: &[(String, T)],
    policies: &[String],
    base: &RunOptions,
    with_capacity: bool,
    progress: impl Fn() + Sync,
) -> Result<Vec<GridCell>, ConfigError> {
    let cells: Vec<(usize, &String)> =
        (0..traces.len()).flat_map(|t| policies.iter().map(move |p| (t, p))).collect();
    // Longest first (a trace's ops as the estimate), one cell per task: the cells started
    // last are short ones, so no core idles long at the end while another finishes a big one.
    let mut order: Vec<usize> = (0..cells.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(traces[cells[i].0].1.borrow().ops.len()));
    let mut done: Vec<(usize, GridCell)> = order
        .par_iter()
        .with_max_len(1)
        .map(|&i| {
            let (t, policy) = cells[i];
            let (name, trace) = &traces[t];
            let trace = trace.borrow();
            let opts = RunOptions { device: DeviceChoice::Auto, ..column_options(policy, base) };
            let report = run_trace(trace, &opts, &mut [], |_| {})?;
            let opts = RunOptions { device: DeviceChoice::Sim, ..opts };
            let min_feasible_capacity_bytes = if with_capacity {
                let upper = report.device_free_bytes;
                let lower = report.metrics.peak_requested_bytes.saturating_sub(1);
                min_feasible_capacity(trace, &opts, lower, upper)?
            } else {
                None
            };
            progress();
            let cell = GridCell {
                trace: name.clone(),
                policy: policy.clone(),
                report,
                min_feasible_capacity_bytes,
            };
            Ok((i, cell))
        })
        .collect::<Result<_, ConfigError>>()?;
    done.sort_by_key(|&(i, _)| i);
    Ok(done.into_iter().map(|(_, cell)| cell).collect())
}
