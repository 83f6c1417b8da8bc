//! The property suites' runner: proptest over generated programs for one policy and one
//! oracle, with a fixed seed per (suite, policy) so CI sees the same cases every run. A
//! failure is shrunk by proptest and then by [`crate::shrink`], printed as an op listing, written as a trace file, and
//! reported with the command that reproduces it:
//! `allocsim replay FILE --policy P [--alloc-conf S] --check` for what the checker sees,
//! otherwise `allocsim fuzz --trace FILE --policy 'P[S]'`, which runs every oracle on one
//! trace.

use crate::oracles::Failure;
use crate::program::Program;
use crate::strategy;
use crate::swarm::Limits;
use allocsim_core::Trace;
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use std::path::{Path, PathBuf};

/// One property suite's bounds.
#[derive(Debug, Clone)]
pub struct Suite {
    /// Names the suite in messages and in the failure file's name.
    pub name: &'static str,
    pub cases: u32,
    pub limits: Limits,
    /// Where a failing case's trace file goes.
    pub failure_dir: PathBuf,
}

/// The command that shows `failure` on the trace at `path`.
pub fn reproduce_command(failure: &Failure, path: &Path) -> String {
    let (name, conf) = allocsim_policies::parse_spec(&failure.policy);
    if failure.oracle.replay_shows_it() {
        let conf = conf.map_or(String::new(), |c| format!(" --alloc-conf '{c}'"));
        format!("allocsim replay {} --policy {name}{conf} --check", path.display())
    } else {
        format!("allocsim fuzz --trace {} --policy '{}'", path.display(), failure.policy)
    }
}

/// Write `program` as a native JSON trace in `dir`; the path, or why not.
pub fn save_case(dir: &Path, file_stem: &str, program: &Program) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = dir.join(format!("{file_stem}.allocsim.json"));
    allocsim_trace::write_trace(&program.trace(), &path).map_err(|e| e.to_string())?;
    Ok(path)
}

/// The message for a minimal failing program: what failed, the program, where it was saved,
/// how to reproduce it.
pub fn report(failure: &Failure, program: &Program, dir: &Path, file_stem: &str) -> String {
    let saved = match save_case(dir, file_stem, program) {
        Ok(path) => format!(
            "written to {}\nreproduce: {}",
            path.display(),
            reproduce_command(failure, &path)
        ),
        Err(e) => format!("(could not write the trace: {e})"),
    };
    format!("{failure}\nminimal program ({} ops):\n{program}{saved}", program.ops().len())
}

fn seed_for(name: &str, policy: &str) -> [u8; 32] {
    // FNV-1a over the names: stable across platforms and releases, unlike `DefaultHasher`.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain([0]).chain(policy.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    let mut seed = [0u8; 32];
    for (i, chunk) in seed.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&h.rotate_left(i as u32 * 13).to_le_bytes());
    }
    seed
}

impl Suite {
    /// Run `oracle` on `cases` generated programs for `policy`; panic with [`report`] on the
    /// shrunk failure.
    pub fn run(&self, policy: &str, oracle: impl Fn(&str, &Trace) -> Result<(), Failure>) {
        self.run_on(policy, strategy::program(self.limits), oracle);
    }

    /// [`Suite::run`] on the programs `programs` draws (the suite's limits unread).
    pub fn run_on(
        &self,
        policy: &str,
        programs: impl Strategy<Value = Program>,
        oracle: impl Fn(&str, &Trace) -> Result<(), Failure>,
    ) {
        let config = Config {
            cases: self.cases,
            failure_persistence: None,
            max_shrink_iters: 4096,
            max_shrink_time: 120_000,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_for(self.name, policy));
        let mut runner = TestRunner::new_with_rng(config, rng);
        let result = runner.run(&programs, |program| {
            oracle(policy, &program.trace()).map_err(|f| TestCaseError::fail(f.to_string()))
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(reason, program)) => {
                let failure = oracle(policy, &program.trace()).err().unwrap_or_else(|| {
                    Failure::new(crate::oracles::Oracle::Panic, policy, None, reason.to_string())
                });
                // Proptest shrinks value by value; delta debugging then drops what it kept.
                let fails = |p: &Program| oracle(policy, &p.trace()).err();
                let (program, failure) = crate::shrink::shrink(&program, &failure, fails);
                let plain = |c: char| if c.is_ascii_alphanumeric() { c } else { '_' };
                let stem =
                    format!("{}-{}", self.name, policy.chars().map(plain).collect::<String>());
                panic!(
                    "{} suite: {}",
                    self.name,
                    report(&failure, &program, &self.failure_dir, &stem)
                );
            }
            Err(e) => panic!("{} suite, policy {policy}: {e}", self.name),
        }
    }
}
