//! Allocation policies behind [`allocsim_core::Allocator`]: the faithful PyTorch caching
//! allocator clone (`pytorch`), the uncached baseline, the policy zoo, and the policies
//! written on the [`kit`]. Every policy is registered once, in [`POLICIES`]: the CLI, the
//! checker suites, the property tests and the fuzzers take it from there.

pub mod best_fit;
pub mod kit;
pub mod pytorch;
pub mod uncached;
pub mod zoo;

use allocsim_core::{Allocator, ConfigError};

/// A registered policy.
#[derive(Debug)]
pub struct Policy {
    /// The name `--policy` takes.
    pub name: &'static str,
    /// Builds it from a settings string in its own syntax (`""`: its defaults).
    pub build: fn(&str) -> Result<Box<dyn Allocator>, ConfigError>,
    /// Settings the random-program tests run it under besides its defaults.
    pub test_settings: &'static [&'static str],
}

fn boxed<A: Allocator + 'static>(
    built: Result<A, ConfigError>,
) -> Result<Box<dyn Allocator>, ConfigError> {
    built.map(|a| Box::new(a) as Box<dyn Allocator>)
}

/// Every policy, in the order reports list them.
pub const POLICIES: &[Policy] = &[
    Policy {
        name: "pytorch",
        build: |c| boxed(pytorch::PyTorchAllocator::from_conf(c)),
        test_settings: &[],
    },
    Policy {
        name: "uncached",
        build: |c| boxed(uncached::Uncached::from_conf(c)),
        test_settings: &[],
    },
    Policy {
        name: "bfc",
        build: |c| boxed(zoo::bfc::Bfc::from_conf(c)),
        test_settings: &[
            "allow_growth:false",
            "garbage_collection:false,fragmentation_fraction:0.01",
        ],
    },
    Policy {
        name: "rmm_pool",
        build: |c| boxed(zoo::rmm_pool::RmmPool::from_conf(c)),
        test_settings: &["initial_pool_size:1GiB,maximum_pool_size:6GiB"],
    },
    Policy {
        name: "rmm_arena",
        build: |c| boxed(zoo::rmm_arena::RmmArena::from_conf(c)),
        test_settings: &["arena_size:7GiB"],
    },
    Policy {
        name: "rmm_binning",
        build: |c| boxed(zoo::rmm_binning::RmmBinning::from_conf(c)),
        test_settings: &["blocks_to_preallocate:4,min_exp:10,max_exp:16"],
    },
    Policy {
        name: "async_pool",
        build: |c| boxed(zoo::async_pool::AsyncPool::from_conf(c)),
        test_settings: &["release_threshold:1GiB,internal_dependencies:false"],
    },
    Policy {
        name: "buddy",
        build: |c| boxed(zoo::buddy::Buddy::from_conf(c)),
        test_settings: &["segment_size:2MiB,min_block:4KiB"],
    },
    Policy {
        name: "tlsf",
        build: |c| boxed(zoo::tlsf::Tlsf::from_conf(c)),
        test_settings: &["segment_size:256MiB,sl_bits:3"],
    },
    Policy {
        name: "allocsim",
        build: |c| boxed(zoo::allocsim::Allocsim::from_conf(c)),
        test_settings: &[
            "headroom:0,reclaim_min:0,candidates:1,grow_step:2MiB",
            "headroom:max,small_max:0,reserve_size:3GiB",
        ],
    },
    Policy {
        name: "best_fit",
        build: |c| boxed(kit::Kit::<best_fit::BestFit>::from_conf(c)),
        test_settings: &["min_segment:2MiB"],
    },
];

/// Every policy name `by_name` accepts, in the order reports list them.
pub fn names() -> Vec<&'static str> {
    POLICIES.iter().map(|p| p.name).collect()
}

/// Build a policy by name. `conf` is a settings string in the policy's own syntax
/// (for `pytorch`, a `PYTORCH_CUDA_ALLOC_CONF` string); `None` means its defaults.
pub fn by_name(name: &str, conf: Option<&str>) -> Result<Box<dyn Allocator>, ConfigError> {
    let Some(policy) = POLICIES.iter().find(|p| p.name == name) else {
        return Err(ConfigError(format!(
            "unknown policy {name:?}; known policies: {}",
            names().join(", ")
        )));
    };
    (policy.build)(conf.unwrap_or(""))
}
