//! The CUDA runtime a PyTorch process sees when it runs on the simulated device: one GPU that
//! answers every question PyTorch's C++ asks of it (how many devices, which one is current,
//! its properties, streams, events, the primary context) and runs no kernel.
//!
//! Why a runtime and not a patched PyTorch: the estimator (`allocsim.estimate`) runs a real,
//! unmodified program whose CUDA tensors hold no data (FakeTensor). PyTorch's C++ still asks
//! the runtime about the device at many places the program cannot see: the autograd engine
//! stashes each device's current stream and asks for its primary context, the attention
//! dispatcher reads the compute capability to pick flash attention, convolutions pick cuDNN
//! from the device's properties, autocast checks that a tensor is on CUDA. With no driver, each
//! of these fails (`cudaErrorInsufficientDriver`), and every way around them in Python (another
//! device type, a copy of the engine) changes the op stream the program makes. So the process
//! gets a device instead: these functions are exported under the runtime's and driver's names
//! (feature `simulated-runtime`, enabled by the Python module only), and the estimator starts
//! its Python with the module preloaded (`LD_PRELOAD`) and named `libcuda.so.1` on the library
//! path, so they take the place of `libcudart`'s and the driver's. Memory never comes from
//! here: every allocation goes through allocsim's policy on the simulated device, in Python.
//!
//! The device is described by the environment, read once: `ALLOCSIM_SIM_TOTAL_BYTES`,
//! `ALLOCSIM_SIM_NAME`, `ALLOCSIM_SIM_CC` (`9.0`) and `ALLOCSIM_SIM_SMS`.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

type CudaError = c_int;
const SUCCESS: CudaError = 0;
const INVALID_VALUE: CudaError = 1;
const MEMORY_ALLOCATION: CudaError = 2;
const INVALID_DEVICE: CudaError = 101;
const NOT_SUPPORTED: CudaError = 801;

/// What the simulated GPU says of itself.
#[derive(Debug, Clone)]
struct Gpu {
    name: String,
    total_bytes: u64,
    major: c_int,
    minor: c_int,
    sms: c_int,
}

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        let var = |k: &str| std::env::var(k).ok();
        let (major, minor) = var("ALLOCSIM_SIM_CC")
            .and_then(|cc| {
                let (a, b) = cc.split_once('.')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .unwrap_or((9, 0));
        Gpu {
            name: var("ALLOCSIM_SIM_NAME").unwrap_or_else(|| "allocsim simulated GPU".into()),
            total_bytes: var("ALLOCSIM_SIM_TOTAL_BYTES")
                .and_then(|v| v.parse().ok())
                .unwrap_or(80 << 30),
            major,
            minor,
            sms: var("ALLOCSIM_SIM_SMS").and_then(|v| v.parse().ok()).unwrap_or(132),
        }
    })
}

/// `cudaDeviceProp` of CUDA 13 (1008 bytes), as offsets into its bytes: the fields PyTorch
/// and its libraries read, at the offsets `driver_types.h` gives them (`offsetof`).
fn device_prop_bytes() -> [u8; 1008] {
    let g = gpu();
    let mut p = [0u8; 1008];
    let mut put = |at: usize, bytes: &[u8]| p[at..at + bytes.len()].copy_from_slice(bytes);
    let name = g.name.as_bytes();
    put(0, &name[..name.len().min(255)]);
    put(288, &g.total_bytes.to_le_bytes()); // totalGlobalMem
    put(296, &(48u64 << 10).to_le_bytes()); // sharedMemPerBlock
    put(304, &65536i32.to_le_bytes()); // regsPerBlock
    put(308, &32i32.to_le_bytes()); // warpSize
    put(320, &1024i32.to_le_bytes()); // maxThreadsPerBlock
    for (i, v) in [1024i32, 1024, 64].iter().enumerate() {
        put(324 + 4 * i, &v.to_le_bytes()); // maxThreadsDim
    }
    for (i, v) in [i32::MAX, 65535, 65535].iter().enumerate() {
        put(336 + 4 * i, &v.to_le_bytes()); // maxGridSize
    }
    put(352, &65536u64.to_le_bytes()); // totalConstMem
    put(360, &g.major.to_le_bytes());
    put(364, &g.minor.to_le_bytes());
    put(384, &g.sms.to_le_bytes()); // multiProcessorCount
    put(392, &1i32.to_le_bytes()); // canMapHostMemory
    put(560, &1i32.to_le_bytes()); // concurrentKernels
    put(564, &1i32.to_le_bytes()); // ECCEnabled
    put(584, &2i32.to_le_bytes()); // asyncEngineCount
    put(588, &1i32.to_le_bytes()); // unifiedAddressing
    put(592, &5120i32.to_le_bytes()); // memoryBusWidth
    put(596, &(50i32 << 20).to_le_bytes()); // l2CacheSize
    put(604, &2048i32.to_le_bytes()); // maxThreadsPerMultiProcessor
    put(624, &(228u64 << 10).to_le_bytes()); // sharedMemPerMultiprocessor
    put(632, &65536i32.to_le_bytes()); // regsPerMultiprocessor
    put(636, &1i32.to_le_bytes()); // managedMemory
    put(672, &(227u64 << 10).to_le_bytes()); // sharedMemPerBlockOptin
    p
}

/// Writes `value` through `out` when it is not null.
///
/// # Safety
/// `out` is null or points to writable memory for a `T`, as each CUDA function's contract
/// says of its output arguments.
unsafe fn put<T>(out: *mut T, value: T) -> CudaError {
    if out.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: not null, and the caller's contract (the runtime's documented signature).
    unsafe { out.write(value) };
    SUCCESS
}

/// Handles for streams and events: distinct, never null, never dereferenced by anyone.
fn handle() -> *mut c_void {
    static NEXT: AtomicUsize = AtomicUsize::new(0x1000);
    NEXT.fetch_add(0x10, Ordering::Relaxed) as *mut c_void
}

/// # Safety
/// `count` is null or writable (`cudaGetDeviceCount`).
#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceCount(count: *mut c_int) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(count, 1) }
}

/// # Safety
/// `device` is null or writable (`cudaGetDevice`).
#[no_mangle]
pub unsafe extern "C" fn cudaGetDevice(device: *mut c_int) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(device, 0) }
}

#[no_mangle]
pub extern "C" fn cudaSetDevice(device: c_int) -> CudaError {
    if device == 0 {
        SUCCESS
    } else {
        INVALID_DEVICE
    }
}

/// # Safety
/// `prop` is null or points to a writable `cudaDeviceProp` of CUDA 13.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceProperties(
    prop: *mut [u8; 1008],
    device: c_int,
) -> CudaError {
    if device != 0 {
        return INVALID_DEVICE;
    }
    // SAFETY: forwarded contract.
    unsafe { put(prop, device_prop_bytes()) }
}

/// # Safety
/// `value` is null or writable (`cudaDeviceGetAttribute`).
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetAttribute(
    value: *mut c_int,
    attr: c_int,
    _device: c_int,
) -> CudaError {
    let g = gpu();
    // The attributes PyTorch and cuBLAS ask for, by their `cudaDeviceAttr` numbers.
    let v = match attr {
        1 => 1024,      // MaxThreadsPerBlock
        10 => 32,       // WarpSize
        16 => g.sms,    // MultiProcessorCount
        38 => 50 << 20, // L2CacheSize
        39 => 2048,     // MaxThreadsPerMultiProcessor
        75 => g.major,  // ComputeCapabilityMajor
        76 => g.minor,  // ComputeCapabilityMinor
        81 => 228 << 10,
        82 => 65536,
        97 => 227 << 10, // MaxSharedMemoryPerBlockOptin
        _ => 0,
    };
    // SAFETY: forwarded contract.
    unsafe { put(value, v) }
}

/// # Safety
/// `free` and `total` are null or writable (`cudaMemGetInfo`).
#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> CudaError {
    let total_bytes = gpu().total_bytes as usize;
    // SAFETY: forwarded contract.
    unsafe {
        put(free, total_bytes);
        put(total, total_bytes)
    }
}

/// # Safety
/// `version` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cudaDriverGetVersion(version: *mut c_int) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(version, 13000) }
}

/// # Safety
/// `version` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cudaRuntimeGetVersion(version: *mut c_int) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(version, 13000) }
}

/// # Safety
/// `least` and `greatest` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CudaError {
    // SAFETY: forwarded contract; a null pointer is allowed for either.
    unsafe {
        put(least, 0);
        put(greatest, -5);
    }
    SUCCESS
}

/// # Safety
/// `stream` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithPriority(
    stream: *mut *mut c_void,
    _flags: c_uint,
    _priority: c_int,
) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(stream, handle()) }
}

/// # Safety
/// `stream` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreate(stream: *mut *mut c_void) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(stream, handle()) }
}

/// # Safety
/// `event` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cudaEventCreateWithFlags(
    event: *mut *mut c_void,
    _flags: c_uint,
) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(event, handle()) }
}

/// # Safety
/// `event` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cudaEventCreate(event: *mut *mut c_void) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(event, handle()) }
}

/// # Safety
/// `ms` is null or writable. No work runs, so no time passes between two events.
#[no_mangle]
pub unsafe extern "C" fn cudaEventElapsedTime(
    ms: *mut f32,
    _start: *mut c_void,
    _end: *mut c_void,
) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(ms, 0.0) }
}

/// # Safety
/// `priority` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetPriority(
    _stream: *mut c_void,
    priority: *mut c_int,
) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(priority, 0) }
}

/// # Safety
/// `status` is null or writable: no stream is ever capturing (`cudaStreamCaptureStatusNone`).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamIsCapturing(
    _stream: *mut c_void,
    status: *mut c_int,
) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(status, 0) }
}

/// # Safety
/// `mode` is null or points to the mode to set, where the previous one is written back.
#[no_mangle]
pub unsafe extern "C" fn cudaThreadExchangeStreamCaptureMode(_mode: *mut c_int) -> CudaError {
    SUCCESS
}

/// # Safety
/// `can` is null or writable: the one device has no peer.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceCanAccessPeer(
    can: *mut c_int,
    _device: c_int,
    _peer: c_int,
) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(can, 0) }
}

/// Calls that succeed at doing nothing: no work is queued, so every stream and event is done.
macro_rules! no_work {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[no_mangle]
        pub extern "C" fn $name($($arg: $ty),*) -> CudaError {
            $(let _ = $arg;)*
            SUCCESS
        }
    )*};
}

no_work! {
    cudaGetLastError();
    cudaPeekAtLastError();
    cudaDeviceSynchronize();
    cudaStreamSynchronize(stream: *mut c_void);
    cudaStreamQuery(stream: *mut c_void);
    cudaStreamDestroy(stream: *mut c_void);
    cudaStreamWaitEvent(stream: *mut c_void, event: *mut c_void, flags: c_uint);
    cudaEventRecord(event: *mut c_void, stream: *mut c_void);
    cudaEventRecordWithFlags(event: *mut c_void, stream: *mut c_void, flags: c_uint);
    cudaEventQuery(event: *mut c_void);
    cudaEventSynchronize(event: *mut c_void);
    cudaEventDestroy(event: *mut c_void);
    cudaProfilerStart();
    cudaProfilerStop();
    cudaFuncSetAttribute(func: *const c_void, attr: c_int, value: c_int);
}

/// `cudaFree(nullptr)` is how PyTorch makes the context exist; anything else was never
/// allocated here.
#[no_mangle]
pub extern "C" fn cudaFree(ptr: *mut c_void) -> CudaError {
    if ptr.is_null() {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

/// Device memory comes from allocsim's policy, never from here: a caller that reaches this
/// has bypassed the allocator, and is told there is none.
#[no_mangle]
pub extern "C" fn cudaMalloc(_ptr: *mut *mut c_void, _size: usize) -> CudaError {
    MEMORY_ALLOCATION
}

#[no_mangle]
pub extern "C" fn cudaGetErrorString(error: CudaError) -> *const c_char {
    error_text(error)
}

#[no_mangle]
pub extern "C" fn cudaGetErrorName(error: CudaError) -> *const c_char {
    error_text(error)
}

fn error_text(error: CudaError) -> *const c_char {
    let text: &'static [u8] = match error {
        SUCCESS => b"no error (allocsim's simulated device)\0",
        MEMORY_ALLOCATION => {
            b"out of memory: allocsim's simulated device allocates nothing itself\0"
        }
        INVALID_DEVICE => b"invalid device ordinal (allocsim's simulated device has one GPU)\0",
        NOT_SUPPORTED => b"operation not supported on allocsim's simulated device\0",
        _ => b"invalid argument (allocsim's simulated device)\0",
    };
    text.as_ptr().cast()
}

// The driver functions PyTorch calls through its lazily loaded NVRTC stub.

#[no_mangle]
pub extern "C" fn cuInit(_flags: c_uint) -> CudaError {
    SUCCESS
}

/// # Safety
/// `flags` and `active` are null or writable. The primary context is reported inactive, so the
/// autograd engine stashes no stream of it.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    _device: c_int,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe {
        put(flags, 0);
        put(active, 0)
    }
}

/// # Safety
/// `version` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(version, 13000) }
}

/// # Safety
/// `text` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CudaError, text: *mut *const c_char) -> CudaError {
    // SAFETY: forwarded contract.
    unsafe { put(text, error_text(error)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_describes_itself_at_the_runtimes_offsets() {
        let p = device_prop_bytes();
        let int = |at: usize| i32::from_le_bytes(p[at..at + 4].try_into().unwrap());
        assert_eq!((int(360), int(364)), (gpu().major, gpu().minor));
        assert_eq!(u64::from_le_bytes(p[288..296].try_into().unwrap()), gpu().total_bytes);
        assert!(p[..256].starts_with(gpu().name.as_bytes()));
        let mut count = 0;
        // SAFETY: a live local.
        assert_eq!(unsafe { cudaGetDeviceCount(&mut count) }, SUCCESS);
        assert_eq!(count, 1);
        assert_eq!(cudaSetDevice(1), INVALID_DEVICE);
    }
}
