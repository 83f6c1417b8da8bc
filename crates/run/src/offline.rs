//! `--policy offline`: the offline placement of the trace being replayed (`allocsim_bound`),
//! as the plan `allocsim_policies::offline::Offline` follows. Planned here, where the whole
//! trace and the policy meet, so that neither the bound nor the policies know of the other.

use allocsim_core::{Allocator, ConfigError, Trace};
use allocsim_policies::offline::Offline;

/// The name `--policy` takes for it.
pub const OFFLINE: &str = "offline";

/// The offline policy of `trace` (`None`: its ops stream in, and the plan needs all of them
/// first), under `conf`, which must be empty: it has no settings.
pub fn policy(trace: Option<&Trace>, conf: &str) -> Result<Offline, ConfigError> {
    let trace = trace.ok_or_else(|| {
        ConfigError(
            "the offline policy is planned from the whole trace before the run, not from ops \
             that stream in"
                .to_string(),
        )
    })?;
    let allocations = allocsim_bound::allocations(trace);
    let lifetimes = &allocations.lifetimes;
    let placement = allocsim_bound::place(lifetimes).ok_or_else(|| {
        ConfigError(
            "the offline policy has no plan: too many allocations live at once for the \
             offline placement (allocsim bound gives the bound alone)"
                .to_string(),
        )
    })?;
    let plan = allocations
        .requests
        .iter()
        .map(|&(id, lifetime)| (id, lifetime.map(|k| (placement.offsets[k], lifetimes[k].size))));
    let mut offline = Offline::new(placement.peak, plan);
    offline.set_settings(conf)?;
    Ok(offline)
}
