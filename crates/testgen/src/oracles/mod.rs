//! The oracles: what must hold for every policy on every program. Each returns the first
//! failure it finds as a [`Failure`] that names the oracle, the policy and the op.

mod consistency;

pub use consistency::{implied_free_space, stat_consistency};
