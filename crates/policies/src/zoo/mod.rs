//! The policy zoo: other allocators behind the same trait, for comparison.
//!
//! Each module clones one allocator's policy from its source (see its module doc) and reports
//! through the shared [`common::Books`] (statistics and events under PyTorch's names) and
//! [`tiling::Tiling`] (segments tiled by chunks: snapshot, `inactive_split`). Settings are
//! `key:value,key:value` strings, given to `by_name` or at run time to `set_settings`.

mod common;
mod tiling;

pub mod allocsim;
pub mod async_pool;
pub mod bfc;
pub mod buddy;
pub mod rmm_arena;
pub mod rmm_binning;
pub mod rmm_pool;
pub mod tlsf;

#[cfg(test)]
mod measure;
#[cfg(test)]
mod testing;

use allocsim_core::{Allocator, ConfigError};

/// Names of the zoo's policies.
pub fn names() -> Vec<&'static str> {
    vec!["bfc", "rmm_pool", "rmm_arena", "rmm_binning", "async_pool", "buddy", "tlsf", "allocsim"]
}

/// Build a zoo policy; `None` when `name` is not one of the zoo's.
pub fn by_name(name: &str, conf: Option<&str>) -> Option<Result<Box<dyn Allocator>, ConfigError>> {
    let conf = conf.unwrap_or("");
    fn boxed<A: Allocator + 'static>(
        r: Result<A, ConfigError>,
    ) -> Result<Box<dyn Allocator>, ConfigError> {
        r.map(|a| Box::new(a) as Box<dyn Allocator>)
    }
    Some(match name {
        "bfc" => boxed(bfc::Bfc::from_conf(conf)),
        "rmm_pool" => boxed(rmm_pool::RmmPool::from_conf(conf)),
        "rmm_arena" => boxed(rmm_arena::RmmArena::from_conf(conf)),
        "rmm_binning" => boxed(rmm_binning::RmmBinning::from_conf(conf)),
        "async_pool" => boxed(async_pool::AsyncPool::from_conf(conf)),
        "buddy" => boxed(buddy::Buddy::from_conf(conf)),
        "tlsf" => boxed(tlsf::Tlsf::from_conf(conf)),
        "allocsim" => boxed(allocsim::Allocsim::from_conf(conf)),
        _ => return None,
    })
}
