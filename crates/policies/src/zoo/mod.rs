//! The policy zoo: other allocators behind the same trait, for comparison.

use allocsim_core::{Allocator, ConfigError};

/// Names of the zoo's policies.
pub fn names() -> Vec<&'static str> {
    Vec::new()
}

/// Build a zoo policy; `None` when `name` is not one of the zoo's.
pub fn by_name(name: &str, conf: Option<&str>) -> Option<Result<Box<dyn Allocator>, ConfigError>> {
    let _ = (name, conf);
    None
}
