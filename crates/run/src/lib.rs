//! One run, set up from a trace and options (policy, settings, memory fraction, device), over
//! the replay engine: the glue every front end shares (the CLI, the integration tests, the
//! benchmarks), so that they all mean the same thing by "replay this trace under this policy";
//! the policy x trace grid; and the capacity bisection ("would it fit?").

mod capacity;
mod grid;
mod offline;
mod run;
mod session;

pub use capacity::{
    capacity, capacity_of, driver_floor_bytes, fits_at, Capacity, CapacityOptions,
    PlacementThreshold, Runs, BAND_MARGIN_BYTES, CAPACITY_RESOLUTION_BYTES,
    H200_DRIVER_FLOOR_BYTES, H200_TOTAL_BYTES, OUTSIDE_ALLOCATOR_BYTES, TRANSIENT_OUTSIDE_BYTES,
};
pub use grid::{column_options, compare, min_feasible_capacity, GridCell};
pub use offline::{policy as offline_policy, OFFLINE};
pub use run::{
    changes_the_run, run_trace, run_trace_fed, run_trace_on, run_trace_streamed, DeviceChoice,
    RunOptions, RunReport, StartedFrom, H100_FREE_BYTES, H100_TOTAL_BYTES,
};
pub use session::{format_size, oom_message, Session};
