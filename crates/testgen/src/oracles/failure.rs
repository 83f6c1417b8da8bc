//! What an oracle reports when a promise is broken: which one, by which policy, and why.

use std::fmt;

/// Which promise a failure broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Oracle {
    /// The policy refused the trace's own settings or memory fraction.
    Setup,
    /// Something panicked.
    Panic,
    /// `allocsim-check` reported violations.
    Checker,
    /// Events did not fit the ops, or snapshot and stats disagreed (`contract`).
    Contract,
    /// The same run twice gave different event logs.
    Determinism,
    /// The policy and the reference model parted.
    Reference,
    /// A format did not give back what was written.
    RoundTrip,
    /// A policy seeded with a run's state did not go on as the run did.
    Seed,
}

impl Oracle {
    pub fn name(self) -> &'static str {
        match self {
            Oracle::Setup => "setup",
            Oracle::Panic => "panic",
            Oracle::Checker => "checker",
            Oracle::Contract => "contract",
            Oracle::Determinism => "determinism",
            Oracle::Reference => "reference",
            Oracle::RoundTrip => "round-trip",
            Oracle::Seed => "seed",
        }
    }

    /// Whether `allocsim replay FILE --policy P --check` shows this failure by itself;
    /// the others need `allocsim fuzz --trace FILE --policy P`, which runs every oracle.
    pub fn replay_shows_it(self) -> bool {
        matches!(self, Oracle::Setup | Oracle::Checker | Oracle::Panic)
    }
}

/// One failed oracle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub oracle: Oracle,
    pub policy: String,
    pub op_index: Option<u64>,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} oracle, policy {}", self.oracle.name(), self.policy)?;
        if let Some(op) = self.op_index {
            write!(f, ", op {op}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for Failure {}

impl Failure {
    pub fn new(
        oracle: Oracle,
        policy: &str,
        op_index: Option<u64>,
        message: impl Into<String>,
    ) -> Self {
        Failure { oracle, policy: policy.to_string(), op_index, message: message.into() }
    }
}
