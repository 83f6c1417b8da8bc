//! The zoo's policies and the kit, each through the public `Allocator` API on the test device,
//! checked after every call by the [`rig`]. One test binary for all of them: each file here is
//! a module, not a binary to link.

mod rig;

mod allocsim;
mod async_pool;
mod bfc;
mod buddy;
mod kit;
mod rmm_arena;
mod rmm_binning;
mod rmm_pool;
mod tlsf;
