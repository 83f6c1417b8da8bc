//! Allocation policies behind [`allocsim_core::Allocator`]: the faithful PyTorch caching
//! allocator clone (`pytorch`), the uncached baseline, and the policy zoo.

pub mod pytorch;
pub mod uncached;
pub mod zoo;

use allocsim_core::{Allocator, ConfigError};

/// Every policy name `by_name` accepts, in the order reports list them.
pub fn names() -> Vec<&'static str> {
    let mut names = vec!["pytorch", "uncached"];
    names.extend(zoo::names());
    names
}

/// Build a policy by name. `conf` is a settings string in the policy's own syntax
/// (for `pytorch`, a `PYTORCH_CUDA_ALLOC_CONF` string); `None` means its defaults.
pub fn by_name(name: &str, conf: Option<&str>) -> Result<Box<dyn Allocator>, ConfigError> {
    match name {
        "pytorch" => Ok(Box::new(pytorch::PyTorchAllocator::from_conf(conf.unwrap_or(""))?)),
        "uncached" => Ok(Box::new(uncached::Uncached::from_conf(conf.unwrap_or(""))?)),
        other => zoo::by_name(other, conf).unwrap_or_else(|| {
            Err(ConfigError(format!(
                "unknown policy {other:?}; known policies: {}",
                names().join(", ")
            )))
        }),
    }
}
