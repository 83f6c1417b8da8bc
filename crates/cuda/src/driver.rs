//! The driver resources this crate holds, each owned by a type whose `Drop` gives it back.
//!
//! Order matters when dropping: mappings before the address ranges they live in, everything
//! before the context. Types that own device resources therefore declare their `Rc<Gpu>` last
//! (fields drop in declaration order), and [`Mapping`] unmaps before its physical memory goes.
//! `Drop` cannot report errors; a failed release there means the context is already broken,
//! and the next call that can report will.

use crate::error::{check, CudaError};
use cudarc::driver::sys;
use std::ffi::{c_void, CStr};
use std::ptr;

/// True when `libcuda` can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries `dlopen` on the candidate names and drops what it opened.
    unsafe { sys::is_culib_present() }
}

/// True when `libnvrtc` can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: as for `driver_present`.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The device's primary context, retained for as long as this lives.
struct PrimaryContext {
    device: sys::CUdevice,
    ctx: sys::CUcontext,
}

impl PrimaryContext {
    fn retain(device: sys::CUdevice) -> Result<Self, CudaError> {
        let mut ctx = ptr::null_mut();
        // SAFETY: `ctx` is a live local the driver writes the context handle into.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, device)
        })?;
        let me = PrimaryContext { device, ctx };
        // SAFETY: `ctx` was just retained and stays valid until `Drop` releases it.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(me.ctx) })?;
        Ok(me)
    }
}

/// The primary context made current on this thread for as long as this lives, if it was not
/// already: a device may be called from threads the caller's framework made (PyTorch frees on
/// autograd threads), whose current context is theirs to keep. The thread's stream-capture
/// mode is relaxed meanwhile, as PyTorch's allocator relaxes it around its `cudaMalloc`: while
/// a CUDA graph is captured in the default (global) mode, the driver refuses allocation calls
/// made in any other mode, and a graph's private pool takes its segments then.
#[derive(Debug)]
pub struct ContextScope {
    pushed: bool,
    /// The thread's mode before, once exchanged.
    capture_mode: Option<sys::CUstreamCaptureMode>,
}

impl Drop for ContextScope {
    fn drop(&mut self) {
        if let Some(mut mode) = self.capture_mode {
            // SAFETY: `mode` is a live local; this restores what `Gpu::scope` exchanged.
            unsafe {
                sys::cuThreadExchangeStreamCaptureMode(&mut mode);
            }
        }
        if self.pushed {
            let mut popped = ptr::null_mut();
            // SAFETY: balances the push in `Gpu::scope`; `popped` is a live local.
            unsafe {
                sys::cuCtxPopCurrent_v2(&mut popped);
            }
        }
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `PrimaryContext::retain`; nothing of ours uses the
        // context after this (every owner of a resource holds the `Gpu` that owns this).
        unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.device);
        }
    }
}

/// A non-blocking stream every kernel of ours runs on, in order.
struct Stream(sys::CUstream);

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream was created by `Gpu::open` and is destroyed once, here, after its
        // work has finished.
        unsafe {
            sys::cuStreamSynchronize(self.0);
            sys::cuStreamDestroy_v2(self.0);
        }
    }
}

/// One GPU: its context and stream, and facts read once.
pub struct Gpu {
    stream: Stream,
    _ctx: PrimaryContext,
    pub ordinal: usize,
    pub device: sys::CUdevice,
    pub name: String,
    pub compute_capability: (i32, i32),
    /// `cuMemGetAllocationGranularity` (minimum) for pinned device memory: the unit of
    /// `cuMemCreate` and `cuMemMap`.
    pub granularity: u64,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("compute_capability", &self.compute_capability)
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// Initialise the driver and make device `ordinal`'s primary context current on this
    /// thread. The caller has checked that the driver loads.
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        // SAFETY: plain FFI call with no pointers.
        check("cuInit", unsafe { sys::cuInit(0) })?;
        let mut count = 0;
        // SAFETY: `count` is a live local.
        check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut count) })?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let mut device = 0;
        // SAFETY: `device` is a live local; the ordinal was checked against the count.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut device, ordinal as i32) })?;
        let ctx = PrimaryContext::retain(device)?;
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a live local; the context is current. Flag 1 = CU_STREAM_NON_BLOCKING.
        check("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut raw, 1) })?;
        let stream = Stream(raw);
        let compute_capability = (
            attribute(
                device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            )?,
            attribute(
                device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            )?,
        );
        let mut gpu = Gpu {
            stream,
            _ctx: ctx,
            ordinal,
            device,
            name: device_name(device)?,
            compute_capability,
            granularity: 0,
        };
        let mut granularity = 0usize;
        let prop = gpu.allocation_prop();
        // SAFETY: `granularity` and `prop` are live locals; `prop` is fully initialised.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        gpu.granularity = granularity as u64;
        Ok(gpu)
    }

    /// Make this GPU's primary context current on the calling thread until the scope ends
    /// (nothing to do on the thread that opened it, or where the caller already made it so).
    pub fn scope(&self) -> Result<ContextScope, CudaError> {
        let mut current = ptr::null_mut();
        // SAFETY: `current` is a live local.
        check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut current) })?;
        let pushed = current != self._ctx.ctx;
        if pushed {
            // SAFETY: the context is retained for as long as `self` lives, which outlives the
            // scope.
            check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(self._ctx.ctx) })?;
        }
        // Made before the exchange, so that an error drops it and pops the context.
        let mut scope = ContextScope { pushed, capture_mode: None };
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a live local; the scope's drop exchanges it back.
        check("cuThreadExchangeStreamCaptureMode", unsafe {
            sys::cuThreadExchangeStreamCaptureMode(&mut mode)
        })?;
        scope.capture_mode = Some(mode);
        Ok(scope)
    }

    pub fn stream(&self) -> sys::CUstream {
        self.stream.0
    }

    /// Wait for every kernel launched on our stream.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: the stream is ours and alive.
        check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.stream.0) })
    }

    /// `cuMemGetInfo`: (free, total) bytes.
    pub fn mem_info(&self) -> Result<(u64, u64), CudaError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are live locals.
        check("cuMemGetInfo", unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }

    /// The properties of the physical memory `cuMemCreate` makes: pinned, on this device.
    pub fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: CUmemAllocationProp is a plain C struct for which all-zero bytes is the
        // documented "no special flags" value of every field.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.device;
        prop
    }
}

fn attribute(device: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32, CudaError> {
    let mut value = 0;
    // SAFETY: `value` is a live local.
    check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut value, attr, device) })?;
    Ok(value)
}

fn device_name(device: sys::CUdevice) -> Result<String, CudaError> {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into `buf`.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, device)
    })?;
    // SAFETY: the driver NUL-terminated what it wrote, within `buf`.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// Memory from `cuMemAlloc`, freed by `Drop`.
#[derive(Debug)]
pub struct DeviceAllocation {
    pub ptr: u64,
    pub size: u64,
}

impl DeviceAllocation {
    pub fn new(size: u64) -> Result<Self, CudaError> {
        let mut ptr = 0;
        // SAFETY: `ptr` is a live local; a context is current on this thread.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, size as usize) })?;
        Ok(DeviceAllocation { ptr, size })
    }

    /// Free now, reporting the driver's answer (dropping frees too, silently).
    pub fn free(self) -> Result<(), CudaError> {
        let ptr = self.ptr;
        std::mem::forget(self);
        // SAFETY: `ptr` came from cuMemAlloc and, `self` being forgotten, is freed once.
        check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) })
    }
}

impl Drop for DeviceAllocation {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuMemAlloc and is freed once, here.
        unsafe {
            sys::cuMemFree_v2(self.ptr);
        }
    }
}

/// Virtual address space from `cuMemAddressReserve`, released by `Drop`. Whatever is mapped in
/// it must be unmapped first (owners drop their mappings before their ranges).
#[derive(Debug)]
pub struct AddressRange {
    pub ptr: u64,
    pub size: u64,
}

impl AddressRange {
    pub fn reserve(size: u64, alignment: u64) -> Result<Self, CudaError> {
        let mut ptr = 0;
        // SAFETY: `ptr` is a live local; size and alignment are multiples of the granularity
        // (the caller rounds them), as the driver requires.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut ptr, size as usize, alignment as usize, 0, 0)
        })?;
        Ok(AddressRange { ptr, size })
    }
}

impl Drop for AddressRange {
    fn drop(&mut self) {
        // SAFETY: the range came from cuMemAddressReserve and is freed once, here.
        unsafe {
            sys::cuMemAddressFree(self.ptr, self.size as usize);
        }
    }
}

/// Physical memory from `cuMemCreate`, released by `Drop`.
#[derive(Debug)]
struct PhysicalMemory(sys::CUmemGenericAllocationHandle);

impl Drop for PhysicalMemory {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuMemCreate and is released once, here; a mapping of it
        // that still exists keeps the memory alive until unmapped, so this is never unsound.
        unsafe {
            sys::cuMemRelease(self.0);
        }
    }
}

/// Physical memory mapped at `[ptr, ptr + size)`; `Drop` unmaps it and then releases the
/// memory. Access is granted separately ([`grant_access`]), once for a whole run of mappings.
#[derive(Debug)]
pub struct Mapping {
    pub ptr: u64,
    pub size: u64,
    _memory: PhysicalMemory,
}

impl Mapping {
    /// `cuMemCreate` + `cuMemMap` for one chunk. On failure what was already done is undone by
    /// the `Drop`s of the partial state.
    pub fn new(gpu: &Gpu, ptr: u64, size: u64) -> Result<Self, CudaError> {
        let prop = gpu.allocation_prop();
        let mut handle = 0;
        // SAFETY: `handle` and `prop` are live locals; `size` is a multiple of the granularity.
        check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0) })?;
        let memory = PhysicalMemory(handle);
        // SAFETY: `[ptr, ptr+size)` lies in a range we reserved and is not mapped (the caller
        // keeps track); `handle` is the live physical memory above, mapped from offset 0.
        check("cuMemMap", unsafe { sys::cuMemMap(ptr, size as usize, 0, handle, 0) })?;
        Ok(Mapping { ptr, size, _memory: memory })
    }
}

/// `cuMemSetAccess`: read-write access for `gpu` to `[ptr, ptr + size)`, which must be wholly
/// mapped (by any number of [`Mapping`]s: one call covers them all, as PyTorch's expandable
/// segments do).
pub fn grant_access(gpu: &Gpu, ptr: u64, size: u64) -> Result<(), CudaError> {
    let desc = sys::CUmemAccessDesc {
        location: gpu.allocation_prop().location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the caller mapped the whole range; `desc` is a live local, count 1.
    check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(ptr, size as usize, &desc, 1) })
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `[ptr, ptr+size)` is exactly what `Mapping::new` mapped, unmapped once here;
        // `_memory` is released after this body runs.
        unsafe {
            sys::cuMemUnmap(self.ptr, self.size as usize);
        }
    }
}

/// A loaded module (our compiled kernels), unloaded by `Drop`.
#[derive(Debug)]
pub struct Module(sys::CUmodule);

impl Module {
    /// Load a CUBIN or NUL-terminated PTX image.
    pub fn load(image: &[u8]) -> Result<Self, CudaError> {
        let mut module = ptr::null_mut();
        // SAFETY: `image` is a complete CUBIN or NUL-terminated PTX that outlives the call.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut module, image.as_ptr().cast())
        })?;
        Ok(Module(module))
    }

    pub fn function(&self, name: &CStr) -> Result<sys::CUfunction, CudaError> {
        let mut f = ptr::null_mut();
        // SAFETY: the module is loaded; `name` is NUL-terminated; `f` is a live local.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut f, self.0, name.as_ptr())
        })?;
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by `Module::load`, unloaded once, here.
        unsafe {
            sys::cuModuleUnload(self.0);
        }
    }
}

/// Launch `f` on `gpu`'s stream with a 1-D grid. `params` points at each argument, in order.
///
/// # Safety
/// Each pointer in `params` must point to a live value of exactly the type the kernel declares
/// for that parameter, and any device pointers among them must be valid for what the kernel
/// does with them.
pub unsafe fn launch(
    gpu: &Gpu,
    f: sys::CUfunction,
    grid: u32,
    block: u32,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees the parameters; the function and stream are live.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            f,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            gpu.stream(),
            params.as_mut_ptr(),
            ptr::null_mut(),
        )
    })
}

/// Wait for all work of the current context, on every stream.
pub fn synchronize_context() -> Result<(), CudaError> {
    // SAFETY: plain FFI call with no pointers.
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}

/// Wait for all work queued on `stream`, a handle of the caller's (PyTorch's `cudaStream_t`;
/// 0 is the legacy default stream).
pub fn synchronize_stream(stream: u64) -> Result<(), CudaError> {
    // SAFETY: the caller passes a live stream handle of the current context (or 0).
    check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(stream as sys::CUstream) })
}

/// Copy `out.len()` 64-bit words from device memory at `src` (synchronous).
pub fn copy_to_host(src: u64, out: &mut [u64]) -> Result<(), CudaError> {
    // SAFETY: `out` is a live buffer of exactly the bytes copied; the caller passes device
    // memory it owns of at least that size.
    check("cuMemcpyDtoH", unsafe {
        sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), src, size_of_val(out))
    })
}

/// Zero `bytes` of device memory at `dst` (synchronous).
pub fn zero(dst: u64, bytes: u64) -> Result<(), CudaError> {
    // SAFETY: the caller passes device memory it owns of at least `bytes`.
    check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(dst, 0, bytes as usize) })
}
