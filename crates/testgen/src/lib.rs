//! Generated allocation programs and the oracles that judge them, shared by the property
//! tests, the fuzz targets in `fuzz/`, `allocsim fuzz` and the benches.
//!
//! The shape follows regalloc2's fuzzing: generators and oracles live here, in the library,
//! and every front end is a few lines of glue over them, so the fuzz targets' oracles also
//! run as plain `#[test]`s.
//!
//! - [`program`]: a workload as steps that name allocations by position, so every generated
//!   or shrunk program is valid, and how it becomes ops and a trace.
//! - [`swarm`] and [`entropy`]: the swarm generator, driven by a seed or by fuzzer bytes.
//! - [`strategy`]: the same programs as proptest strategies, which shrink.
//! - [`conf`]: PyTorch allocator settings strings.
//! - [`oracles`]: what must hold, shared by every front end.
//! - [`reference`](mod@reference): a deliberately simple model of PyTorch's rules, for
//!   differential tests.
//! - [`suite`], [`shrink`], [`targets`]: the property-suite runner, a shrinker for seeded
//!   finds, and the fuzz targets' bodies.
//!
//! The suites are `tests/properties.rs` (every policy in `allocsim_policies::names()` under
//! every oracle; the PyTorch policy against the reference model; format round trips),
//! `tests/fuzz_smoke.rs` (each fuzz target's body on its corpus and on mutations) and
//! `tests/known_bugs.rs` (what they found in other crates). A failure prints the shrunk
//! program and writes it as a `.allocsim.json` trace with the command that reproduces it;
//! `allocsim fuzz --trace FILE --policy P` runs every oracle on such a file.

pub mod conf;
pub mod entropy;
pub mod oracles;
pub mod program;
pub mod reference;
pub mod shrink;
pub mod strategy;
pub mod suite;
pub mod swarm;
pub mod targets;

pub use entropy::{ByteEntropy, Entropy, SeededEntropy};
pub use oracles::{check_trace, check_trace_catching, Failure, Oracle};
pub use program::{DeviceSpec, Program, Step};
pub use swarm::{from_bytes, from_seed, Limits, Shape};
