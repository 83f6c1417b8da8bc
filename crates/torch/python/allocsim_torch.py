"""Run PyTorch on an allocsim policy: `use("allocsim")` before the first CUDA allocation.

    import allocsim_torch, torch
    allocsim_torch.use("pytorch", "expandable_segments:True", record=True)
    ...  # train, infer
    print(allocsim_torch.memory_stats()["reserved_bytes.all.peak"])
    allocsim_torch.save_recording("run.allocsim")   # allocsim replay run.allocsim --policy bfc

The library is `liballocsim_torch.so` (`cargo build --release -p allocsim-torch`), found by
`ALLOCSIM_TORCH_LIB`, beside this file, or in the repository's `target/release`.

`use` installs it from C++ (`allocsim_torch_hooks.cpp`, built once with
`torch.utils.cpp_extension` against the PyTorch in use, which needs a C++ compiler and ninja):
then a request the policy cannot serve raises `torch.OutOfMemoryError` with allocsim's
explanation, `torch.cuda.empty_cache()`, `torch.cuda.set_per_process_memory_fraction()` and
`Tensor.record_stream()` reach the policy, and a CUDA graph capture gets a private pool (the
`pytorch` policy's; other policies refuse the capture). `use(..., hooks=False)` installs it
through PyTorch's Python API alone, which passes `alloc` and `free` only: a failed request then
returns a null block that faults the GPU at its first use, `empty_cache()` and
`set_per_process_memory_fraction()` must be this module's, and a CUDA graph shares the
policy's blocks with everything else (do not capture graphs so). Either way
`torch.cuda.memory_stats()` refuses a pluggable allocator: use this module's `memory_stats()`.
"""
import ctypes
import json
import os
from pathlib import Path

_LIB = None
_PATH = None


def library_path():
    """Where the shared library is: ALLOCSIM_TORCH_LIB, beside this file, or target/release."""
    candidates = [os.environ.get("ALLOCSIM_TORCH_LIB")]
    here = Path(__file__).resolve().parent
    candidates += [here / "liballocsim_torch.so", here.parents[2] / "target/release/liballocsim_torch.so"]
    for c in candidates:
        if c and Path(c).is_file():
            return str(c)
    raise FileNotFoundError("liballocsim_torch.so not found: build it with "
                            "`cargo build --release -p allocsim-torch` or set ALLOCSIM_TORCH_LIB")


def _lib():
    global _LIB, _PATH
    if _LIB is None:
        _PATH = library_path()
        lib = ctypes.CDLL(_PATH)
        text = ctypes.c_void_p  # a string the library made: read, then allocsim_string_free
        for name, args, res in [
            ("allocsim_configure", [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int], ctypes.c_int),
            ("allocsim_malloc", [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p),
            ("allocsim_free", [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p], None),
            ("allocsim_record_stream", [ctypes.c_void_p, ctypes.c_void_p], None),
            ("allocsim_empty_cache", [], None),
            ("allocsim_set_memory_fraction", [ctypes.c_double, ctypes.c_int], ctypes.c_int),
            ("allocsim_reset_peak_stats", [ctypes.c_int], None),
            ("allocsim_memory_stats_json", [ctypes.c_int], text),
            ("allocsim_memory_summary", [ctypes.c_int], text),
            ("allocsim_last_oom", [ctypes.c_int], text),
            ("allocsim_last_error", [], text),
            ("allocsim_save_snapshot", [ctypes.c_int, ctypes.c_char_p], ctypes.c_int),
            ("allocsim_save_recording", [ctypes.c_int, ctypes.c_char_p], ctypes.c_int),
            ("allocsim_string_free", [ctypes.c_void_p], None),
        ]:
            f = getattr(lib, name)
            f.argtypes, f.restype = args, res
        _LIB = lib
    return _LIB


def _text(ptr):
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        _lib().allocsim_string_free(ptr)


def _check(rc):
    if rc != 0:
        raise RuntimeError(_text(_lib().allocsim_last_error()) or "allocsim: call failed")


def _device(device):
    if device is None:
        import torch
        return torch.cuda.current_device()
    return device.index if hasattr(device, "index") else int(device)


def _pytorch_conf_from_env():
    """The allocator settings PyTorch reads: the first of PYTORCH_CUDA_ALLOC_CONF and
    PYTORCH_ALLOC_CONF (the device-generic name of 2.12 and later) that is set, even empty."""
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if name in os.environ:
            return os.environ[name]
    return ""


def configure(policy="pytorch", conf=None, record=False):
    """Choose the policy (and its settings: for `pytorch`, a PYTORCH_CUDA_ALLOC_CONF string,
    by default the environment's, PYTORCH_CUDA_ALLOC_CONF before PYTORCH_ALLOC_CONF) without
    installing it; `use` does both."""
    if conf is None:
        conf = _pytorch_conf_from_env() if policy == "pytorch" else ""
    _check(_lib().allocsim_configure(policy.encode(), conf.encode(), int(bool(record))))


def use(policy="pytorch", conf=None, record=False, hooks=True):
    """Make allocsim's `policy` PyTorch's CUDA allocator. Call before any CUDA tensor exists."""
    import torch
    configure(policy, conf, record)
    if hooks:
        from torch.utils.cpp_extension import load
        source = Path(__file__).resolve().parent / "allocsim_torch_hooks.cpp"
        load(name="allocsim_torch_hooks", sources=[str(source)], extra_include_paths=_cuda_includes(),
             extra_ldflags=["-ltorch_cuda"], verbose=False).install(_PATH)
        return None
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_PATH, "allocsim_malloc", "allocsim_free")
    torch.cuda.memory.change_current_allocator(allocator)
    return allocator


def _cuda_includes():
    """Where `cuda_runtime_api.h` is, which PyTorch's headers include: CUDA_HOME's, or that of
    the `nvidia-cuda-runtime` wheel PyTorch was installed with."""
    import glob, site
    roots = [os.environ.get("CUDA_HOME", "/usr/local/cuda")] + site.getsitepackages()
    for root in roots:
        for header in sorted(glob.glob(f"{root}/include/cuda_runtime_api.h")
                             + glob.glob(f"{root}/nvidia/**/include/cuda_runtime_api.h", recursive=True)):
            return [str(Path(header).parent)]
    return []


def memory_stats(device=None):
    """`torch.cuda.memory_stats()` of the policy, plus `allocsim.*` keys."""
    return json.loads(_text(_lib().allocsim_memory_stats_json(_device(device))) or "{}")


def memory_summary(device=None):
    return _text(_lib().allocsim_memory_summary(_device(device)))


def max_memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.peak"]


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    _lib().allocsim_reset_peak_stats(_device(device))


def empty_cache():
    """`torch.cuda.empty_cache()` for the policy (what the hooks make of PyTorch's own)."""
    _lib().allocsim_empty_cache()


def set_per_process_memory_fraction(fraction, device=None):
    _check(_lib().allocsim_set_memory_fraction(float(fraction), _device(device)))


def last_oom(device=None):
    """Why the last request the policy could not serve failed, or None."""
    return _text(_lib().allocsim_last_oom(_device(device)))


def save_snapshot(path, device=None):
    """The memory as a PyTorch snapshot (`.pickle` or `.pickle.gz`), with its history when
    recording: `torch.cuda._memory_viz` and `allocsim` read it."""
    _check(_lib().allocsim_save_snapshot(_device(device), str(path).encode()))


def save_recording(path, device=None):
    """The op stream so far as a trace (`.allocsim`, `.allocsim.json`, ...): replay it offline
    against any policy. Needs `record=True`."""
    _check(_lib().allocsim_save_recording(_device(device), str(path).encode()))
