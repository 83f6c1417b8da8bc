//! Allocation policies behind [`allocsim_core::Allocator`]: the faithful PyTorch caching
//! allocator clone (`pytorch`), and the uncached baseline, the policy zoo and the kit's
//! example (`best_fit`), all written on the [`kit`]. Every policy is registered once, in [`POLICIES`]: the CLI, the
//! checker suites, the property tests and the fuzzers take it from there. The one exception,
//! [`offline`], follows a plan made from the whole trace, so it is built from that plan, not
//! from a name and settings (its module doc says why).

pub mod best_fit;
pub mod kit;
pub mod offline;
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
    /// Settings the property suites and `allocsim fuzz` also run it under.
    pub test_settings: &'static [&'static str],
}

impl Policy {
    /// `NAME` for its defaults, then `NAME[SETTINGS]` for each of its test settings: what the
    /// property suites run.
    pub fn test_specs(&self) -> Vec<String> {
        let with = self.test_settings.iter().map(|s| format!("{}[{s}]", self.name));
        std::iter::once(self.name.to_string()).chain(with).collect()
    }
}

/// A policy and its settings in one string, `NAME[SETTINGS]` (or a bare `NAME`): the name, and
/// the settings if the brackets are there.
pub fn parse_spec(spec: &str) -> (&str, Option<&str>) {
    match spec.strip_suffix(']').and_then(|s| s.split_once('[')) {
        Some((name, conf)) => (name, Some(conf)),
        None => (spec, None),
    }
}

fn boxed<A: Allocator + 'static>(
    built: Result<A, ConfigError>,
) -> Result<Box<dyn Allocator>, ConfigError> {
    built.map(|a| Box::new(a) as Box<dyn Allocator>)
}

/// Something done with a policy whose type is known at compile time: the replay loop, built
/// once per policy through [`visit_policy`], so that every policy's calls are direct and its
/// generic entry points ([`Allocator::malloc_to`]) inline the caller's event handling.
pub trait PolicyVisitor {
    type Output;
    fn visit<A: Allocator + 'static>(self, allocator: A) -> Self::Output;
}

/// The one list of policies: the table [`POLICIES`] and [`visit_policy`] are made from it.
macro_rules! policies {
    ($($name:literal => $ty:ty, test_settings: [$($setting:literal),* $(,)?];)*) => {
        /// Every policy, in the order reports list them.
        pub const POLICIES: &[Policy] = &[$(
            Policy {
                name: $name,
                build: |c| boxed(<$ty>::from_conf(c)),
                test_settings: &[$($setting),*],
            },
        )*];

        /// Build the policy `name` from `conf` and hand it to `visitor` as its own type.
        pub fn visit_policy<V: PolicyVisitor>(
            name: &str,
            conf: &str,
            visitor: V,
        ) -> Result<V::Output, ConfigError> {
            match name {
                $($name => Ok(visitor.visit(<$ty>::from_conf(conf)?)),)*
                _ => Err(unknown_policy(name)),
            }
        }
    };
}

policies! {
    "pytorch" => pytorch::PyTorchAllocator, test_settings: [];
    "uncached" => uncached::Uncached, test_settings: [];
    "bfc" => zoo::bfc::Bfc, test_settings: [
        "allow_growth:false",
        "garbage_collection:false,fragmentation_fraction:0.01",
    ];
    "rmm_pool" => zoo::rmm_pool::RmmPool,
        test_settings: ["initial_pool_size:1GiB,maximum_pool_size:6GiB"];
    "rmm_arena" => zoo::rmm_arena::RmmArena, test_settings: ["arena_size:7GiB"];
    "rmm_binning" => zoo::rmm_binning::RmmBinning,
        test_settings: ["blocks_to_preallocate:4,min_exp:10,max_exp:16"];
    "async_pool" => zoo::async_pool::AsyncPool,
        test_settings: ["release_threshold:1GiB,internal_dependencies:false"];
    "buddy" => zoo::buddy::Buddy, test_settings: ["segment_size:2MiB,min_block:4KiB"];
    "tlsf" => zoo::tlsf::Tlsf, test_settings: ["segment_size:256MiB,sl_bits:3"];
    "allocsim" => zoo::allocsim::Allocsim, test_settings: [
        "headroom:0,reclaim_min:0,candidates:1,grow_step:2MiB",
        "headroom:max,small_max:0,reserve_size:3GiB",
    ];
    "best_fit" => kit::Kit<best_fit::BestFit>, test_settings: ["min_segment:2MiB"];
}

fn unknown_policy(name: &str) -> ConfigError {
    ConfigError(format!(
        "unknown policy {}; known policies: {}",
        allocsim_core::text::quoted(name),
        names().join(", ")
    ))
}

/// Every policy name `by_name` accepts, in the order reports list them.
pub fn names() -> Vec<&'static str> {
    POLICIES.iter().map(|p| p.name).collect()
}

/// Build a policy by name. `conf` is a settings string in the policy's own syntax
/// (for `pytorch`, a `PYTORCH_CUDA_ALLOC_CONF` string); `None` means its defaults.
pub fn by_name(name: &str, conf: Option<&str>) -> Result<Box<dyn Allocator>, ConfigError> {
    let Some(policy) = POLICIES.iter().find(|p| p.name == name) else {
        return Err(unknown_policy(name));
    };
    (policy.build)(conf.unwrap_or(""))
}

#[cfg(test)]
mod tests {
    #[test]
    fn specs() {
        assert_eq!(super::parse_spec("bfc"), ("bfc", None));
        assert_eq!(super::parse_spec("bfc[a:1,b:2]"), ("bfc", Some("a:1,b:2")));
        assert_eq!(super::parse_spec("pytorch[]"), ("pytorch", Some("")));
        assert_eq!(super::parse_spec("bfc[a:1"), ("bfc[a:1", None));
    }
}
