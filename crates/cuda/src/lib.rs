//! allocsim's [`Device`](allocsim_core::Device) on a real GPU, through the CUDA driver API.
//!
//! [`CudaDevice`] makes the driver calls a GPU allocator makes: `cuMemAlloc`/`cuMemFree` for
//! whole segments, and for expandable segments `cuMemAddressReserve`, then `cuMemCreate` +
//! `cuMemMap` + `cuMemSetAccess` to back pages and `cuMemUnmap` + `cuMemRelease` to give them
//! back. Every resource is owned by an RAII type (module `driver`) whose `Drop` returns it, so an
//! error half-way through a call, or dropping the device, leaks nothing. Each call's wall time
//! is measured and recorded in [`DeviceCalls`](allocsim_core::DeviceCalls).
//!
//! [`Patterns`] runs the kernels in `kernels/patterns.cu` (compiled at run time with NVRTC):
//! each live block holds a pattern derived from its allocation id, checked when it is freed and
//! at the end, so overlapping blocks or stray writes show up as corrupted words on real memory.
//!
//! The driver and NVRTC are loaded at run time (cudarc's `dynamic-loading`), so the one binary
//! runs everywhere: [`CudaDevice::open`] on a machine without a driver returns
//! [`CudaError::NoDriver`], never a panic. cudarc panics when a library or symbol is missing;
//! `open` first checks that the libraries load (`is_culib_present`), and runs the rest under
//! `catch_unwind` as a backstop, turning any panic into [`CudaError::Panicked`].
//!
//! **Architecture Invariant:** this is the only crate of the workspace with `unsafe` code. Every
//! `unsafe` block says why it is sound in a `// SAFETY:` comment; all of them are FFI calls into
//! the driver or NVRTC with pointers to live locals or to handles this crate owns.

// The workspace denies unsafe code; FFI into the CUDA driver cannot be written without it.
// Allowed here only, and each block carries its SAFETY reason.
#![allow(unsafe_code)]

mod device;
mod driver;
mod error;
mod patterns;
#[cfg(feature = "simulated-runtime")]
pub mod simulated_runtime;

pub use device::CudaDevice;
pub use driver::{driver_present, nvrtc_present};
pub use error::CudaError;
pub use patterns::{Mismatch, PatternReport, Patterns};

/// The CUDA C source of the pattern kernels, compiled with NVRTC when patterns are enabled.
pub const KERNEL_SOURCE: &str = include_str!("../../../kernels/patterns.cu");
