//! The C ABI as PyTorch drives it, on the simulated device: calls from many threads, frees on
//! other threads than the allocation, statistics, OOM, snapshot and recording files that
//! allocsim reads back. One test: the library has one process-wide hub, as under PyTorch.

use allocsim_torch::*;
use std::ffi::{c_char, c_void, CStr, CString};

fn text(p: *mut c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the library returned a NUL-terminated string, freed once, right after.
    let s = unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string();
    unsafe { allocsim_string_free(p) };
    Some(s)
}

fn stats(device: i32) -> serde_json::Value {
    serde_json::from_str(&text(allocsim_memory_stats_json(device)).unwrap()).unwrap()
}

fn stream(n: usize) -> *mut c_void {
    n as *mut c_void
}

#[test]
fn pytorch_drives_the_library_from_many_threads() {
    std::env::set_var("ALLOCSIM_TORCH_DEVICE", "sim");
    let policy = CString::new("pytorch").unwrap();
    let bad = CString::new("no_such_setting:1").unwrap();
    assert_eq!(allocsim_configure(policy.as_ptr(), bad.as_ptr(), 1), -1);
    assert!(text(allocsim_last_error()).unwrap().contains("no_such_setting"));
    let conf = CString::new("expandable_segments:True").unwrap();
    assert_eq!(allocsim_configure(policy.as_ptr(), conf.as_ptr(), 1), 0);

    // Eight threads allocate; each frees what its neighbour allocated, as the autograd
    // engine frees tensors the main thread made.
    let made: Vec<Vec<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                s.spawn(move || {
                    (0..500)
                        .map(|i| {
                            let size = 512 + (t * 7919 + i * 104729) % (4 << 20);
                            let p = allocsim_malloc(size as isize, 0, stream(1));
                            assert!(!p.is_null());
                            p as usize
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let s = stats(0);
    assert_eq!(s["allocsim.live_blocks"], 4000);
    assert_eq!(s["allocation.all.current"], 4000);
    std::thread::scope(|s| {
        for t in 0..8 {
            let theirs = made[(t + 1) % 8].clone();
            s.spawn(move || {
                for p in theirs {
                    allocsim_free(p as *mut c_void, 0, 0, stream(1));
                }
            });
        }
    });
    let s = stats(0);
    assert_eq!(s["allocsim.live_blocks"], 0);
    assert_eq!(s["allocsim.unknown_frees"], 0);
    assert_eq!(s["allocated_bytes.all.current"], 0);
    assert!(s["reserved_bytes.all.peak"].as_i64().unwrap() > 0);
    assert_eq!(s["allocsim.policy"], "pytorch");
    assert_eq!(s["allocsim.malloc_calls"], 4000);
    assert_eq!(s["allocsim.free_calls"], 4000);

    // A second free of the same pointer is an error, not a crash.
    allocsim_free(made[0][0] as *mut c_void, 0, 0, stream(1));
    assert!(text(allocsim_last_error()).unwrap().contains("not a block allocsim handed out"));
    assert_eq!(stats(0)["allocsim.unknown_frees"], 1);

    // More than the simulated H100 has: null, explained.
    let p = allocsim_malloc(1 << 40, 0, stream(1));
    assert!(p.is_null());
    let why = text(allocsim_last_oom(0)).unwrap();
    assert!(why.contains("Tried to allocate 1024.00 GiB"), "{why}");
    assert_eq!(stats(0)["num_ooms"], 1);

    // A second device has its own policy; reconfiguring after use is refused.
    let q = allocsim_malloc(3 << 20, 1, stream(7));
    assert!(!q.is_null());
    assert_eq!(stats(1)["allocated_bytes.all.current"], 3 << 20);
    assert_eq!(allocsim_configure(policy.as_ptr(), c"".as_ptr(), 0), -1);

    allocsim_empty_cache();
    assert_eq!(stats(0)["reserved_bytes.all.current"], 0);
    allocsim_reset_peak_stats(0);
    assert_eq!(stats(0)["reserved_bytes.all.peak"], 0);
    assert!(text(allocsim_memory_summary(0)).unwrap().contains("PyTorch CUDA memory summary"));

    // The files: a snapshot and a recording, both read back by allocsim.
    let dir = std::env::temp_dir().join(format!("allocsim-torch-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let snap = dir.join("live.pickle.gz");
    let rec = dir.join("live.allocsim");
    for (f, path) in [
        (allocsim_save_snapshot as extern "C" fn(_, _) -> _, &snap),
        (allocsim_save_recording, &rec),
    ] {
        let c = CString::new(path.to_str().unwrap()).unwrap();
        assert_eq!(f(0, c.as_ptr()), 0, "{}", text(allocsim_last_error()).unwrap_or_default());
    }
    let snapshot = allocsim_trace::read_trace(&snap).unwrap();
    assert_eq!(snapshot.recorded.len(), {
        let recording = allocsim_trace::read_trace(&rec).unwrap();
        assert_eq!(recording.ops.len(), 4000 + 4000 + 1 + 1, "allocs, frees, the OOM, empty_cache");
        recording.recorded.len()
    });
    std::fs::remove_dir_all(&dir).unwrap();
}
