//! The policy zoo: other allocators behind the same trait, for comparison.
//!
//! Each module clones one allocator's policy from its source (see its module doc) as
//! [`crate::kit::Rules`]; the kit does the rest through the shared [`common::Books`]
//! (statistics and events under PyTorch's names) and [`tiling::Tiling`] (segments tiled by
//! chunks: snapshot, `inactive_split`). Settings are `key:value,key:value` strings, given to
//! `by_name` or at run time to `set_settings`.

pub(crate) mod common;
pub(crate) mod tiling;

pub mod allocsim;
pub mod async_pool;
pub mod bfc;
pub mod buddy;
pub mod rmm_arena;
pub mod rmm_binning;
pub mod rmm_pool;
pub mod tlsf;
