//! Any allocsim policy as PyTorch's CUDA allocator.
//!
//! Built as a shared library (`liballocsim_torch.so`). `crates/torch/python/allocsim_torch.py`
//! installs it and wraps the rest of this ABI. The policy is chosen by [`allocsim_configure`]
//! before the first allocation, or else by the environment: `ALLOCSIM_POLICY` (default
//! `pytorch`), `ALLOCSIM_CONF` (default for the `pytorch` policy: `PYTORCH_CUDA_ALLOC_CONF`,
//! else `PYTORCH_ALLOC_CONF`), `ALLOCSIM_RECORD=1` to keep the op stream, and
//! `ALLOCSIM_TORCH_DEVICE=sim` for the simulated H100 instead of the GPU.
//!
//! PyTorch 2.11's Python API (`torch.cuda.memory.CUDAPluggableAllocator(path, "allocsim_malloc",
//! "allocsim_free")`) passes a pluggable allocator `alloc` and `free` only, and takes a null
//! block for a valid one. `python/allocsim_torch_hooks.cpp` installs the library from C++
//! instead: it throws `c10::OutOfMemoryError` when [`allocsim_malloc`] returns null for a
//! non-empty request, and sets PyTorch's hooks for `empty_cache` ([`allocsim_empty_cache`]),
//! memory fractions ([`allocsim_set_memory_fraction`]) and `record_stream`
//! ([`allocsim_record_stream`]), and private pools (CUDA graph capture, `torch.cuda.MemPool`):
//! [`allocsim_begin_pool`], [`allocsim_malloc_in_pool`] (the shim evaluates PyTorch's filters,
//! which are C++ closures, and names the pool each request goes to), [`allocsim_end_pool`] and
//! [`allocsim_release_pool`].
//! `torch.cuda.memory_stats()` refuses a pluggable allocator: [`allocsim_memory_stats_json`]
//! stands in.
//!
//! Calls come from any thread (the autograd engine frees on its own): one mutex guards the
//! [`hub::Hub`], and the CUDA device makes its context current for each driver call. A panic
//! never crosses the ABI: each entry point catches it and answers as for an error.

use allocsim_core::MemPoolId;
use hub::{AllocError, Hub, Opened, Opener, Settings};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

pub mod hub;

/// The hub, and the last error for [`allocsim_last_error`].
struct Global {
    hub: Option<Hub>,
    error: Option<String>,
}

// SAFETY: `Global` is reached only through `GLOBAL`'s mutex, so no two threads use it at once;
// what makes it `!Send` is not tied to a thread: the policies and engines are plain data behind
// trait objects (no `Rc` shared outside them, no thread-locals), the simulated device likewise,
// and the CUDA device's `Rc` clones all live inside the hub (in the device and its stream
// waiter; its pattern checker, which would share them further, is never enabled here), while
// the driver's handles are usable from any thread (the device and the waiter make the context
// current on the calling thread for each call).
unsafe impl Send for Global {}

static GLOBAL: Mutex<Global> = Mutex::new(Global { hub: None, error: None });

/// Calls of [`allocsim_malloc`] and [`allocsim_free`] and their wall time in nanoseconds, lock
/// included: what each costs the program.
static CALLS: [(AtomicU64, AtomicU64); 2] =
    [(AtomicU64::new(0), AtomicU64::new(0)), (AtomicU64::new(0), AtomicU64::new(0))];
const MALLOC: usize = 0;
const FREE: usize = 1;

fn timed<T>(which: usize, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    CALLS[which].0.fetch_add(1, Relaxed);
    CALLS[which].1.fetch_add(start.elapsed().as_nanos() as u64, Relaxed);
    out
}

/// Run `f` on the hub (made from the environment if not configured yet), catching panics;
/// an error or a panic is kept for [`allocsim_last_error`] and answered with `fallback`.
fn with_hub<T>(fallback: T, f: impl FnOnce(&mut Hub) -> Result<T, String>) -> T {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
        if g.hub.is_none() {
            match Hub::new(settings_from_env(), opener_from_env()) {
                Ok(h) => g.hub = Some(h),
                Err(e) => {
                    g.error = Some(e);
                    return None;
                }
            }
        }
        let out = f(g.hub.as_mut().expect("made above"));
        match out {
            Ok(v) => Some(v),
            Err(e) => {
                g.error = Some(e);
                None
            }
        }
    }));
    match result {
        Ok(Some(v)) => v,
        Ok(None) => fallback,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            GLOBAL.lock().unwrap_or_else(|p| p.into_inner()).error =
                Some(format!("allocsim panicked: {message}"));
            fallback
        }
    }
}

/// The allocator settings PyTorch takes from the environment: the first of
/// `PYTORCH_CUDA_ALLOC_CONF` and `PYTORCH_ALLOC_CONF` (2.12 and later's device-generic name)
/// that is set, even when empty (`CUDAAllocatorConfig::instance`; docs/pytorch-versions.md).
fn pytorch_conf_from_env() -> Option<String> {
    ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"]
        .into_iter()
        .find_map(|n| std::env::var(n).ok())
}

fn settings_from_env() -> Settings {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let policy = var("ALLOCSIM_POLICY").unwrap_or_else(|| "pytorch".into());
    let conf = var("ALLOCSIM_CONF")
        .or_else(|| if policy == "pytorch" { pytorch_conf_from_env() } else { None })
        .unwrap_or_default();
    let record = var("ALLOCSIM_RECORD").is_some_and(|v| v != "0");
    Settings { policy, conf, record }
}

/// The real GPU, or with `ALLOCSIM_TORCH_DEVICE=sim` the simulated H100 (as `allocsim replay`
/// models it), for tests without a GPU.
fn opener_from_env() -> Opener {
    if std::env::var("ALLOCSIM_TORCH_DEVICE").is_ok_and(|v| v == "sim") {
        return Box::new(|_| {
            let sim = allocsim_sim::SimDevice::new(allocsim_sim::SimConfig::default());
            Ok(Opened::without_streams(Box::new(sim)))
        });
    }
    Box::new(|device| {
        let gpu = allocsim_cuda::CudaDevice::open(device as usize)
            .map_err(|e| format!("GPU {device}: {e}"))?;
        let wait = gpu.stream_waiter();
        Ok(Opened {
            device: Box::new(gpu),
            wait: Box::new(move |stream| {
                wait(stream).map_err(|e| format!("GPU {device}, stream {stream:#x}: {e}"))
            }),
        })
    })
}

/// A string for the caller, freed with [`allocsim_string_free`].
fn give(text: String) -> *mut c_char {
    CString::new(text.replace('\0', " ")).map_or(std::ptr::null_mut(), CString::into_raw)
}

/// The string at `p`, or an error naming `what`.
fn take(p: *const c_char, what: &str) -> Result<String, String> {
    if p.is_null() {
        return Err(format!("{what}: a null pointer"));
    }
    // SAFETY: the caller passes a NUL-terminated string that outlives this call (ctypes
    // passes a `bytes` object's buffer).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(str::to_string).map_err(|_| format!("{what}: not UTF-8"))
}

fn device_index(device: c_int) -> Result<u32, String> {
    u32::try_from(device).map_err(|_| format!("device {device}: not a device index"))
}

/// Choose the policy, its settings and whether to record, before the first allocation.
/// Returns 0, or -1 (see [`allocsim_last_error`]) for an unknown policy, settings it refuses,
/// or a hub that has already served a device under other settings.
#[no_mangle]
pub extern "C" fn allocsim_configure(
    policy: *const c_char,
    conf: *const c_char,
    record: c_int,
) -> c_int {
    let run = || -> Result<(), String> {
        let settings = Settings {
            policy: take(policy, "policy")?,
            conf: take(conf, "conf")?,
            record: record != 0,
        };
        let mut g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
        // A hub that has served a device keeps its settings: the same ones again are fine.
        if let Some(h) = g.hub.as_ref().filter(|h| !h.devices().is_empty()) {
            if *h.settings() == settings {
                return Ok(());
            }
            return Err(format!(
                "allocsim already serves PyTorch as {:?} with {:?}; configure before the first \
                 allocation",
                h.settings().policy,
                h.settings().conf
            ));
        }
        g.hub = Some(Hub::new(settings, opener_from_env())?);
        Ok(())
    };
    match std::panic::catch_unwind(run) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            GLOBAL.lock().unwrap_or_else(|p| p.into_inner()).error = Some(e);
            -1
        }
        Err(_) => -1,
    }
}

/// PyTorch's `alloc_fn`: a block of `size` bytes on `device` for use on `stream`, or null when
/// the policy cannot serve it (the explanation is [`allocsim_last_oom`]).
#[no_mangle]
pub extern "C" fn allocsim_malloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    allocsim_malloc_in_pool(size, device, stream, 0, 0)
}

/// [`allocsim_malloc`] from the private pool `(pool_a, pool_b)` (PyTorch's `MempoolId_t`;
/// `(0, 0)`: the policy's own pools).
#[no_mangle]
pub extern "C" fn allocsim_malloc_in_pool(
    size: isize,
    device: c_int,
    stream: *mut c_void,
    pool_a: u64,
    pool_b: u64,
) -> *mut c_void {
    timed(MALLOC, || {
        with_hub(0, |hub| {
            let size = u64::try_from(size).map_err(|_| format!("malloc of {size} bytes"))?;
            let pool = MemPoolId(pool_a, pool_b);
            match hub.malloc_in_pool(size, device_index(device)?, stream as u64, pool) {
                Ok(addr) => Ok(addr),
                Err(AllocError::OutOfMemory(text) | AllocError::Setup(text)) => Err(text),
            }
        })
    }) as *mut c_void
}

/// `beginAllocateToPool` (a CUDA graph capture begins, `torch.cuda.use_mem_pool` is entered):
/// 0, or -1 (see [`allocsim_last_error`]) when the policy has no private pools.
#[no_mangle]
pub extern "C" fn allocsim_begin_pool(device: c_int) -> c_int {
    with_hub(-1, |hub| hub.begin_pool(device_index(device)?).map(|()| 0))
}

/// `endAllocateToPool`: no more requests go to the pool `(pool_a, pool_b)`.
#[no_mangle]
pub extern "C" fn allocsim_end_pool(device: c_int, pool_a: u64, pool_b: u64) {
    with_hub((), |hub| {
        hub.end_pool(device_index(device)?, MemPoolId(pool_a, pool_b));
        Ok(())
    });
}

/// `releasePool`: the pool's owner is gone; its segments go back to the device once free.
#[no_mangle]
pub extern "C" fn allocsim_release_pool(device: c_int, pool_a: u64, pool_b: u64) {
    with_hub((), |hub| {
        hub.release_pool(device_index(device)?, MemPoolId(pool_a, pool_b));
        Ok(())
    });
}

/// PyTorch's `free_fn`. The block goes back to the policy; `size` and `stream` are PyTorch's
/// record of the allocation, which the policy already knows.
#[no_mangle]
pub extern "C" fn allocsim_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void) {
    let _ = (size, stream);
    timed(FREE, || {
        with_hub((), |hub| {
            let device = device_index(device)?;
            if hub.free(ptr as u64, device)? {
                Ok(())
            } else {
                Err(format!("free of {ptr:p} on device {device}: not a block allocsim handed out"))
            }
        })
    });
}

/// `Tensor.record_stream(stream)`: the block at `ptr` is also used on `stream`; its free
/// waits for the work queued there (see [`hub::Hub::free`]).
#[no_mangle]
pub extern "C" fn allocsim_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    with_hub((), |hub| {
        if hub.record_stream(ptr as u64, stream as u64) {
            Ok(())
        } else {
            Err(format!("record_stream of {ptr:p}: not a block allocsim handed out"))
        }
    });
}

/// `torch.cuda.empty_cache()`: every device's policy gives its wholly free memory back.
#[no_mangle]
pub extern "C" fn allocsim_empty_cache() {
    with_hub((), |hub| {
        hub.empty_cache();
        Ok(())
    });
}

/// `torch.cuda.set_per_process_memory_fraction(fraction, device)`. 0, or -1 if refused.
#[no_mangle]
pub extern "C" fn allocsim_set_memory_fraction(fraction: f64, device: c_int) -> c_int {
    with_hub(-1, |hub| hub.set_memory_fraction(fraction, device_index(device)?).map(|()| 0))
}

/// `torch.cuda.reset_peak_memory_stats(device)`.
#[no_mangle]
pub extern "C" fn allocsim_reset_peak_stats(device: c_int) {
    with_hub((), |hub| {
        hub.reset_peak_stats(device_index(device)?);
        Ok(())
    });
}

/// `torch.cuda.memory_stats(device)` as a JSON object under PyTorch's key names, plus
/// `allocsim.*` keys: policy, settings, live blocks, frees of unknown pointers, waits for
/// other streams before a free (`record_stream`) and their time, and the calls of
/// `allocsim_malloc` and `allocsim_free` on all devices with their total wall time.
#[no_mangle]
pub extern "C" fn allocsim_memory_stats_json(device: c_int) -> *mut c_char {
    with_hub(std::ptr::null_mut(), |hub| {
        let d = device_index(device)?;
        let mut map: serde_json::Map<String, serde_json::Value> =
            hub.stats(d).flat().into_iter().map(|(k, v)| (k, v.into())).collect();
        let s = hub.settings();
        map.insert("allocsim.policy".into(), s.policy.clone().into());
        map.insert("allocsim.conf".into(), s.conf.clone().into());
        map.insert("allocsim.live_blocks".into(), hub.live(d).into());
        map.insert("allocsim.unknown_frees".into(), hub.unknown_frees(d).into());
        let (waits, wait_ns) = hub.stream_waits(d);
        map.insert("allocsim.stream_waits".into(), waits.into());
        map.insert("allocsim.stream_wait_ns".into(), wait_ns.into());
        for (name, (calls, ns)) in ["malloc", "free"].iter().zip(&CALLS) {
            map.insert(format!("allocsim.{name}_calls"), calls.load(Relaxed).into());
            map.insert(format!("allocsim.{name}_ns"), ns.load(Relaxed).into());
        }
        Ok(give(serde_json::Value::Object(map).to_string()))
    })
}

/// `torch.cuda.memory_summary(device)`'s table, from the policy's statistics.
#[no_mangle]
pub extern "C" fn allocsim_memory_summary(device: c_int) -> *mut c_char {
    with_hub(std::ptr::null_mut(), |hub| {
        let d = device_index(device)?;
        Ok(give(allocsim::memory_summary(&hub.stats(d), d)))
    })
}

/// Why the last allocation that failed on `device` failed, or null if none did.
#[no_mangle]
pub extern "C" fn allocsim_last_oom(device: c_int) -> *mut c_char {
    with_hub(std::ptr::null_mut(), |hub| {
        Ok(hub.last_oom(device_index(device)?).map_or(std::ptr::null_mut(), |t| give(t.into())))
    })
}

/// The last error any call met (a refused setting, a free of an unknown pointer, a device
/// that would not open), or null.
#[no_mangle]
pub extern "C" fn allocsim_last_error() -> *mut c_char {
    let g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    g.error.clone().map_or(std::ptr::null_mut(), give)
}

/// Write `device`'s memory as a PyTorch snapshot (`.pickle`, or `.pickle.gz`): the segments
/// now and, when recording, every event so far as its trace. `_memory_viz` and `allocsim`
/// read it. 0, or -1 (see [`allocsim_last_error`]).
#[no_mangle]
pub extern "C" fn allocsim_save_snapshot(device: c_int, path: *const c_char) -> c_int {
    with_hub(-1, |hub| {
        let d = device_index(device)?;
        let path = std::path::PathBuf::from(take(path, "path")?);
        let mut trace = hub.recording(d).unwrap_or_default();
        let recorded = std::mem::take(&mut trace.recorded);
        let s = hub.settings();
        allocsim::write_snapshot(&path, &trace, recorded, &hub.segments(d), &s.policy, &s.conf)
            .map_err(|e| format!("{e:#}"))?;
        Ok(0)
    })
}

/// Write `device`'s op stream so far as a trace (`.allocsim`, `.allocsim.json`, or any format
/// `allocsim convert` writes), which `allocsim replay` runs against every policy. Needs
/// recording. 0, or -1 (see [`allocsim_last_error`]).
#[no_mangle]
pub extern "C" fn allocsim_save_recording(device: c_int, path: *const c_char) -> c_int {
    with_hub(-1, |hub| {
        let d = device_index(device)?;
        let path = take(path, "path")?;
        let trace = hub
            .recording(d)
            .ok_or("nothing recorded: configure with record=1 (or ALLOCSIM_RECORD=1)")?;
        allocsim_trace::write_trace(&trace, &path).map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// Free a string this library returned.
///
/// # Safety
/// `s` is null or a string this library returned, not freed before.
#[no_mangle]
pub unsafe extern "C" fn allocsim_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: `s` came from `CString::into_raw` in `give` and is freed once (the caller's
        // contract above).
        drop(unsafe { CString::from_raw(s) });
    }
}
