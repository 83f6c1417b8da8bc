"""Would it fit? A real PyTorch program on allocsim's simulated GPU, with no GPU at all.

    import allocsim
    result = allocsim.estimate(train, total_memory="H100-80GB")
    result.peak_reserved_bytes, result.memory_stats["num_ooms"]

or around a whole script:

    python -m allocsim.estimate --total-memory H100-80GB --out run.pickle.gz -- train.py ARGS

How: the program runs in a Python process whose CUDA runtime is allocsim's simulated device
(`allocsim_cuda::simulated_runtime`, preloaded from the native module): PyTorch's C++ sees one
GPU of the card's compute capability and memory, so the autograd engine, autocast, the
attention backend and cuDNN's choices are those of the real card. Every CUDA tensor is a
FakeTensor (shapes, strides and dtypes, no data); each storage a CUDA op creates goes, as it is
created, to allocsim's policy on the simulated device, and its free when the storage dies
(CPython frees deterministically). A request the policy cannot serve raises
`torch.OutOfMemoryError` in the program at that point, and `torch.cuda.memory_stats()`,
`mem_get_info()`, `empty_cache()`, `set_per_process_memory_fraction()` and the rest answer as
the simulated card. CPU tensors stay real.

A program that needs the values of a CUDA tensor (`.item()`, `nonzero`, printing one) stops with
`DataDependentError`, naming the op and the line of the program: the simulated device computes
nothing, and a guess would be a silently wrong trace. `torch.compile` is refused the same way.

`allocsim.estimate(fn, ...)` runs `fn` in a fresh process started on the simulated runtime
(`multiprocessing`'s spawn: `fn` and its arguments must pickle, as for any spawned worker),
unless this process already runs on it.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import sys
import tempfile
import weakref
from typing import Any, Callable, Optional, Union

from . import kernels
from ..capture import alloc_conf_from_env

# What cudaMemGetInfo reports as total memory on each card (bytes), and the CUDA context that
# PyTorch 2.11 creates before the first allocation (so free memory at the start is the total
# less it). Measured with torch.cuda.mem_get_info() on the cards themselves.
CARDS = {
    "H100-80GB": 85017493504,
    "H200": 150109880320,
}
CONTEXT_BYTES = 552402944
# What a training run takes outside the caching allocator as it goes (kernels loaded lazily,
# library handles and their workspaces), by card: measured by `allocsim.capture` on the H200
# (the training programs of validation/estimate/ that use cuDNN) and by validation/fit.py on
# the H100. A run that never calls cuDNN takes 16 MiB less (bert_mlm and moe_routing on the
# H200); one whose backward never reaches the GPU 68 MiB less (kv_infer: the autograd engine's
# device thread opens no cuBLAS and cuDNN handles of its own and loads no backward kernels).
OUTSIDE_ALLOCATOR_BYTES = {"H100-80GB": 257949696, "H200": 251658240}
NO_CUDNN_OUTSIDE_BYTES = 16777216
NO_BACKWARD_OUTSIDE_BYTES = 71303168
_ALIASES = {"H100": "H100-80GB", "H200-141GB": "H200"}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}

Size = Union[int, float, str]


class DataDependentError(RuntimeError):
    """The program needs the values of a CUDA tensor, which the simulated device does not
    compute. The message names the op and the line of the program."""


def card(name: str) -> Optional[str]:
    """The card table's name for `name` (case and spelling forgiven), or None."""
    key = name.strip().upper().replace(" ", "-")
    key = _ALIASES.get(key, key)
    return key if key in CARDS else None


def parse_size(value: Size, what: str = "size") -> int:
    """Bytes from an int, `80GiB`, `4e10`, or a card name of `CARDS` (its total memory)."""
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected bytes, a size like '80GiB' or a card name, got a bool")
    if isinstance(value, (int, float)):
        if value != value or value < 0 or value >= 2**64:
            raise ValueError(f"{what}: {value!r} is not a size in bytes")
        return int(value)
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected bytes, a size like '80GiB' or a card name, got {type(value).__name__}")
    if card(value):
        return CARDS[card(value)]
    m = re.fullmatch(r"\s*([0-9.]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", value)
    if not m or m.group(2).upper() not in _UNITS:
        names = ", ".join(CARDS)
        raise ValueError(f"{what}: {value[:60]!r} is neither a size (bytes, '80GiB', '40GB') nor a card ({names})")
    return parse_size(float(m.group(1)) * _UNITS[m.group(2).upper()], what)


def _settings(total_memory: Size, free_memory: Optional[Size], alloc_conf: Optional[str], policy: str) -> dict:
    total = parse_size(total_memory, "total_memory")
    free = total - CONTEXT_BYTES if free_memory is None else parse_size(free_memory, "free_memory")
    if free > total:
        raise ValueError(f"free_memory ({free} bytes) is more than total_memory ({total})")
    # A card by name, or by its exact total memory.
    name = card(total_memory) if isinstance(total_memory, str) else None
    name = name or next((n for n, b in CARDS.items() if b == total), None)
    conf = alloc_conf_from_env()[0] if alloc_conf is None else alloc_conf
    return {"total": total, "free": free, "card": name, "alloc_conf": conf, "policy": policy}


# ---------------------------------------------------------------------------------------------
# Starting a process on the simulated runtime


def _native_module() -> str:
    from .. import _allocsim
    return _allocsim.__file__


def _runtime_env(settings: dict) -> dict:
    """The environment of a Python that starts on the simulated runtime: the native module
    preloaded (its CUDA runtime functions take the place of libcudart's) and, under the
    driver's name, first on the library path (PyTorch's NVRTC stub loads `libcuda.so.1`)."""
    lib = _native_module()
    libdir = os.path.join(tempfile.gettempdir(), f"allocsim-runtime-{os.getuid()}")
    os.makedirs(libdir, exist_ok=True)
    link = os.path.join(libdir, "libcuda.so.1")
    if os.path.realpath(link) != os.path.realpath(lib):
        tmp = f"{link}.{os.getpid()}"
        os.symlink(lib, tmp)
        os.replace(tmp, link)
    env = dict(os.environ)
    env["LD_PRELOAD"] = lib
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, env.get("LD_LIBRARY_PATH")]))
    env["ALLOCSIM_SIM_RUNTIME"] = "1"
    env["ALLOCSIM_SIM_TOTAL_BYTES"] = str(settings["total"])
    env["ALLOCSIM_SIM_NAME"] = f"allocsim simulated {settings['card'] or 'GPU'}"
    return env


def _runtime_active() -> bool:
    return os.environ.get("ALLOCSIM_SIM_RUNTIME") == "1"


def _leave_runtime_env() -> None:
    """This process is on the runtime; the programs it starts (a compiler, git) are not."""
    for key in ("LD_PRELOAD", "ALLOCSIM_SIM_RUNTIME"):
        os.environ.pop(key, None)


# ---------------------------------------------------------------------------------------------
# The simulation


def _user_frame() -> str:
    """The innermost frame of the program (not torch's, not allocsim's), as `file:line in f`."""
    import torch

    skip = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    f = sys._getframe(1)
    while f is not None:
        if not f.f_code.co_filename.startswith(skip) and not f.f_code.co_filename.startswith("<frozen"):
            return f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return "an unknown place"


# Frames of the simulation's own machinery, left out of the stacks a snapshot shows.
_MACHINERY = (os.sep + "allocsim" + os.sep, "_python_dispatch.py", os.sep + "_dynamo" + os.sep, "_compile.py",
              os.sep + "weakref.py")


def _stack(limit: int = 64) -> list:
    f, frames = sys._getframe(2), []
    while f is not None and len(frames) < limit:
        name = f.f_code.co_filename
        if not any(m in name for m in _MACHINERY):
            frames.append((name, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return frames


class _Simulation:
    """The program's CUDA memory on allocsim's policy: a dispatch mode that runs CUDA ops on
    FakeTensors and hands each new storage to the session, and `torch.cuda`'s memory
    functions answered from the session."""

    def __init__(self, settings: dict, stacks: bool):
        import torch
        import torch._subclasses.fake_tensor as fake_tensor
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        from .._allocsim import Session

        self.torch, self.settings, self.stacks = torch, settings, stacks
        self.session = Session(settings["total"], settings["free"], settings["policy"], settings["alloc_conf"])
        self.storages: dict[int, int] = {}
        self.kernels = kernels.Context()
        # The autograd node (its sequence number) that made each storage made in backward.
        self.made_by: dict[int, int] = {}
        # What the estimate assumed where the program asked for values: assumption -> times.
        self.assumed: dict[str, int] = {}
        # A FakeTensor of a CUDA device made on first use runs a real CUDA allocation
        # (init_gpu_context), and the converter would put constants on the real device:
        # nothing may reach PyTorch's own allocator.
        fake_tensor.init_gpu_context = lambda device: None
        fake_tensor.FakeTensorMode.avoid_device_init = property(lambda self: True)
        self.fake = fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
        self.FakeTensor = FakeTensor = fake_tensor.FakeTensor
        self.tree_flatten = tree_flatten
        refused = (fake_tensor.DataDependentOutputException, fake_tensor.DynamicOutputShapeException,
                   fake_tensor.UnsupportedOperatorException)
        sim = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                flat = tree_flatten((args, kwargs))[0]
                device = kwargs.get("device")
                on_gpu = any(isinstance(a, FakeTensor) for a in flat) or (
                    device is not None and torch.device(device).type == "cuda")
                if not on_gpu:
                    return func(*args, **kwargs)
                if func is torch.ops.aten.add.Tensor and sim.engine_accumulates(args, kwargs):
                    func = torch.ops.aten.add_.Tensor
                try:
                    with sim.fake:
                        out = func(*args, **kwargs)
                except refused as e:
                    raise DataDependentError(
                        f"{func} needs the values of a CUDA tensor, which allocsim's simulated "
                        f"device does not compute (at {_user_frame()}): {type(e).__name__}") from None
                sim.run_kernel(func, args, kwargs, out)
                return out

        self.mode = Mode()

    def engine_accumulates(self, args, kwargs) -> bool:
        """Whether this `add` is the autograd engine summing two gradients of one input.
        The engine adds in place into the gradient it holds when nothing else shares it, but
        never for tensor subclasses, and under a dispatch mode every tensor counts as one
        (`isTensorSubclassLike`); so the sum is done in place here, as on the GPU. Recognised
        by its operands: two gradients of one shape whose storages different nodes made (a
        node that returns a view of its input's gradient, as ViewBackward does, makes none).
        Both shared gradients (one node's output passed on twice) and views stay out of
        place, as on the GPU, where the engine adds in place only into a gradient nothing
        else holds."""
        if self.torch._C._current_autograd_node() is None or kwargs or len(args) != 2:
            return False
        held, new = args
        if not (isinstance(held, self.FakeTensor) and isinstance(new, self.FakeTensor)):
            return False
        if held.shape != new.shape or held.dtype != new.dtype or held._base is not None:
            return False
        if not held.is_contiguous():
            return False
        made_held = self.made_by.get(id(held.untyped_storage()))
        made_new = self.made_by.get(id(new.untyped_storage()))
        return None not in (made_held, made_new) and made_held != made_new

    def run_kernel(self, func, args, kwargs, out) -> None:
        """Allocates what the op's CUDA kernel allocates, in its order (`kernels.plan`): its
        results' new storages, its scratch blocks (freed when it ends) and library
        workspaces."""
        results = list(out) if isinstance(out, (tuple, list)) else [out]
        ctx = self.kernels
        ctx.stream = self.torch.cuda.current_stream().cuda_stream
        # The autograd engine runs CUDA nodes on its device thread, which has its own library
        # handles; here backward runs on the calling thread, so the graph task says where.
        ctx.thread = "autograd" if self.torch._C._current_graph_task_id() != -1 else "main"
        ctx.backward_ran |= ctx.thread == "autograd"
        held: list = []
        try:
            for step in kernels.plan(func, args, kwargs, results, ctx):
                if step[0] == "out":
                    self.allocate_all(results[step[1]])
                elif step[0] == "none":
                    self.allocate_all(results[step[1]], on_device=False)
                elif step[0] == "free":
                    self.session.free(held.pop(step[1] if len(step) > 1 else -1), self.stack())
                else:
                    ptr = self.malloc(step[1])
                    if step[0] == "tmp":
                        held.append(ptr)
        finally:
            while held:
                self.session.free(held.pop(), self.stack())
        self.allocate_all(results)

    def allocate_all(self, tree, on_device: bool = True) -> None:
        for t in self.tree_flatten(tree)[0]:
            if isinstance(t, self.FakeTensor) and t.fake_device.type == "cuda":
                self.allocate(t, on_device)

    def malloc(self, size: int) -> int:
        try:
            return self.session.malloc(size, self.kernels.stream, (0, 0), self.stack())
        except MemoryError as e:
            raise self.torch.OutOfMemoryError(str(e)) from None

    def allocate(self, t, on_device: bool = True) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key in self.storages:
            return
        self.storages[key] = self.malloc(storage.nbytes()) if on_device else 0
        node = self.torch._C._current_autograd_node()
        if node is not None:
            self.made_by[key] = node._sequence_nr()
        weakref.finalize(storage, self.free, key)

    def free(self, key: int) -> None:
        self.made_by.pop(key, None)
        self.session.free(self.storages.pop(key), self.stack())

    def stack(self) -> Optional[list]:
        """The program's frames here, for the snapshot; none on the autograd engine's thread,
        which runs no Python (as a recording shows it)."""
        if not self.stacks or self.torch._C._current_graph_task_id() != -1:
            return None
        return _stack()

    def nested_stats(self) -> dict:
        nested: dict = {}
        for key, value in self.session.memory_stats():
            *parents, leaf = key.split(".")
            d = nested
            for p in parents:
                d = d.setdefault(p, {})
            d[leaf] = value
        return nested

    def __enter__(self) -> "_Simulation":
        torch, s = self.torch, self.session
        torch.cuda.init()
        # One thread runs the backward pass, as the session is one thread's.
        torch.autograd.set_multithreading_enabled(False)
        C = torch._C
        self.saved = {name: getattr(C, name) for name in (
            "_cuda_memoryStats", "_cuda_resetPeakMemoryStats", "_cuda_emptyCache",
            "_cuda_setMemoryFraction", "_cuda_resetAccumulatedMemoryStats")}
        C._cuda_memoryStats = lambda device=None: self.nested_stats()
        C._cuda_resetPeakMemoryStats = lambda device=None: s.reset_peak_stats()
        C._cuda_resetAccumulatedMemoryStats = lambda device=None: None
        C._cuda_emptyCache = s.empty_cache

        def set_fraction(fraction, device=None):
            try:
                s.set_memory_fraction(float(fraction))
            except ValueError as e:
                raise ValueError(str(e)) from None

        C._cuda_setMemoryFraction = set_fraction
        self.saved_swap = swap = torch.utils.swap_tensors

        def swap_tensors(t1, t2):
            # Module._apply swaps FakeTensor parameters, which the fake mode's own weak
            # references forbid; the parameter keeps its identity and takes the new storage.
            try:
                return swap(t1, t2)
            except RuntimeError as e:
                if "weakref" not in str(e):
                    raise
                t1.data = t2.data

        torch.utils.swap_tensors = swap_tensors
        self.saved_info = torch.cuda.memory.mem_get_info
        torch.cuda.mem_get_info = torch.cuda.memory.mem_get_info = lambda device=None: s.mem_get_info()
        # A parameter moved to the GPU is a FakeTensor here, a Parameter there: optimizers and
        # clip_grad_norm_ take their foreach (multi-tensor) kernels for it, as on the GPU.
        from torch.optim import optimizer
        from torch.utils import _foreach_utils

        self.saved_module_apply = torch.nn.Module._apply
        torch.nn.Module._apply = _apply_keeping_ties(torch.nn.Module._apply)
        # GradScaler reads whether the scaled gradients overflowed (`.item()`) before each
        # optimizer step; the simulated device computes no values, so the estimate assumes
        # they did not (every step is taken, as in a run past its first few steps) and says so.
        from torch.amp import grad_scaler

        self.saved_opt_step = grad_scaler.GradScaler._maybe_opt_step

        def opt_step(scaler, optimizer, optimizer_state, *args, **kwargs):
            key = "GradScaler: gradients finite at every step"
            self.assumed[key] = self.assumed.get(key, 0) + 1
            return optimizer.step(*args, **kwargs)

        grad_scaler.GradScaler._maybe_opt_step = opt_step
        self.foreach_types = (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types)
        for types in self.foreach_types:
            types.append(self.FakeTensor)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)
        for name, f in self.saved.items():
            setattr(self.torch._C, name, f)
        self.torch.cuda.mem_get_info = self.torch.cuda.memory.mem_get_info = self.saved_info
        self.torch.utils.swap_tensors = self.saved_swap
        for types in self.foreach_types:
            types.remove(self.FakeTensor)
        self.torch.nn.Module._apply = self.saved_module_apply
        from torch.amp import grad_scaler

        grad_scaler.GradScaler._maybe_opt_step = self.saved_opt_step

    def summary(self, error: Optional[BaseException]) -> dict:
        stats = dict(self.session.memory_stats())
        return {
            "peak_reserved_bytes": stats["reserved_bytes.all.peak"],
            "peak_allocated_bytes": stats["allocated_bytes.all.peak"],
            "num_ooms": stats["num_ooms"],
            "ops": self.session.ops(),
            "memory_stats": stats,
            "last_oom": self.session.last_oom(),
            "error": None if error is None else f"{type(error).__name__}: {error}",
            "assumed": [f"{what} ({n} times)" for what, n in self.assumed.items()],
        }

    def write(self, out: str) -> None:
        import torch

        self.session.save_snapshot(out)
        meta = {
            "estimated": True,
            "assumed": [f"{what} ({n} times)" for what, n in self.assumed.items()],
            "card": self.settings["card"],
            "gpu": f"allocsim simulated {self.settings['card'] or 'GPU'}",
            "total_memory": self.settings["total"],
            "free_at_start": self.settings["free"],
            "alloc_conf": self.settings["alloc_conf"],
            "policy": self.settings["policy"],
            "torch": torch.__version__,
            "backward_on_gpu": self.kernels.backward_ran,
        }
        outside = OUTSIDE_ALLOCATOR_BYTES.get(self.settings["card"] or "")
        if outside is not None:
            ctx = self.kernels
            outside -= (0 if ctx.backward_ran else NO_BACKWARD_OUTSIDE_BYTES) + (0 if ctx.cudnn_used else NO_CUDNN_OUTSIDE_BYTES)
            meta["outside_allocator_bytes"] = outside
        stem = str(out).removesuffix(".gz").removesuffix(".pickle")
        with open(stem + ".json", "w") as f:
            json.dump({"meta": meta, "memory_stats": dict(self.session.memory_stats())}, f, indent=1)


def _apply_keeping_ties(apply: Callable) -> Callable:
    """`Module._apply` (under `.cuda()`, `.to()`, `.half()`) that keeps tied parameters tied.
    On the GPU a CPU parameter takes its new data in place (`param.data = ...`), so a parameter
    shared by two modules is converted once and stays one parameter; a FakeTensor cannot be
    set as a CPU parameter's data, so PyTorch makes a new parameter per module instead, which
    would copy a tied weight twice and give it two gradients. Here each tensor is converted
    once, and the modules that shared a parameter share its new one."""

    def apply_once(module, fn, recurse=True):
        if getattr(apply_once, "active", False):
            return apply(module, fn, recurse)
        converted: dict = {}

        def fn_once(t):
            hit = converted.get(id(t))
            if hit is None or hit[0] is not t:
                hit = converted[id(t)] = (t, fn(t))
            return hit[1]

        before = {(id(m), k): p for m in module.modules() for k, p in m._parameters.items() if p is not None}
        apply_once.active = True
        try:
            out = apply(module, fn_once, recurse)
        finally:
            apply_once.active = False
        first: dict = {}
        for m in module.modules():
            for k, p in list(m._parameters.items()):
                source = before.get((id(m), k))
                if source is not None:
                    m._parameters[k] = first.setdefault(id(source), p)
        return out

    return apply_once


def _refuse_compile(torch) -> None:
    def compile(*args, **kwargs):
        raise DataDependentError(
            f"torch.compile is not estimated: its kernels and their buffers come from Inductor, "
            f"which the simulated device does not run (at {_user_frame()}); estimate the eager program")
    torch.compile = compile


def _run_here(fn: Callable, args: tuple, kwargs: dict, settings: dict, out: Optional[str]) -> dict:
    """Runs `fn` in this process, which runs on the simulated runtime; the summary, with the
    program's exception (an OOM it did not catch) as `error`."""
    import torch

    _refuse_compile(torch)
    error = None
    with _Simulation(settings, stacks=out is not None) as sim:
        try:
            fn(*args, **kwargs)
        except (torch.OutOfMemoryError, DataDependentError) as e:
            error = e
        summary = sim.summary(error)
        if out is not None:
            sim.write(out)
        recording = tempfile.mktemp(suffix=".allocsim", prefix="allocsim-estimate-")
        sim.session.save_recording(recording)
    if isinstance(error, DataDependentError):
        raise error
    summary["recording"] = recording
    return summary


def _child(conn, fn, args, kwargs, settings, out) -> None:
    _leave_runtime_env()
    try:
        conn.send(("ok", _run_here(fn, args, kwargs, settings, out)))
    except BaseException as e:  # sent to the parent, which raises it
        conn.send(("error", e))


def _run_in_child(fn, args, kwargs, settings, out) -> dict:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    saved = dict(os.environ)
    os.environ.update(_runtime_env(settings))
    try:
        proc = ctx.Process(target=_child, args=(child, fn, args, kwargs, settings, out))
        proc.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    child.close()
    try:
        kind, value = parent.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"the estimate's process ended with exit code {proc.exitcode} before it answered") from None
    proc.join()
    if kind == "error":
        raise value
    return value


class EstimateResult:
    """An estimated run: what `allocsim.replay` returns for its op stream (peaks, statistics,
    OOMs, timeline: `.replay`), and how the program ended (`error`: an OOM it did not catch)."""

    def __init__(self, summary: dict, replay: Any, settings: dict):
        self.summary, self.replay, self.settings = summary, replay, settings

    peak_reserved_bytes = property(lambda self: self.summary["peak_reserved_bytes"])
    peak_allocated_bytes = property(lambda self: self.summary["peak_allocated_bytes"])
    memory_stats = property(lambda self: self.summary["memory_stats"])
    error = property(lambda self: self.summary["error"])
    # What the estimate assumed where the program asked for values the simulated device does
    # not compute (for instance GradScaler's overflow check), each with how often.
    assumed = property(lambda self: self.summary["assumed"])

    @property
    def fits(self) -> bool:
        """Whether the program ran to its end without an OOM it did not catch."""
        return self.summary["error"] is None

    def __repr__(self) -> str:
        gib = lambda b: f"{b / 2**30:.2f} GiB"
        where = self.settings["card"] or f"{gib(self.settings['total'])} card"
        return (f"<EstimateResult on {where}: peak reserved {gib(self.peak_reserved_bytes)}, peak allocated "
                f"{gib(self.peak_allocated_bytes)}, {self.summary['num_ooms']} OOMs, "
                f"{'fits' if self.fits else 'does not fit: ' + str(self.error)[:200]}>")


def estimate(fn: Callable, *args: Any, total_memory: Size = "H100-80GB", free_memory: Optional[Size] = None,
             alloc_conf: Optional[str] = None, policy: str = "pytorch", out: Optional[str] = None,
             **kwargs: Any) -> EstimateResult:
    """Runs `fn(*args, **kwargs)` on a simulated card of `total_memory` (bytes, `"80GiB"`, or a
    card of `CARDS`) with `free_memory` free at the start (default: the total less the CUDA
    context), under `alloc_conf` (default: the environment's settings as PyTorch reads them,
    `PYTORCH_CUDA_ALLOC_CONF` before `PYTORCH_ALLOC_CONF`) and allocsim's `policy`. With `out`, writes a PyTorch snapshot with Python stacks and its
    sidecar, which `allocsim capacity`, `advise`, `report` and memory_viz read."""
    from .. import replay

    if not callable(fn):
        raise TypeError(f"estimate: fn must be callable, got {type(fn).__name__}")
    settings = _settings(total_memory, free_memory, alloc_conf, policy)
    if out is not None:
        out = os.fspath(out)
    run = _run_here if _runtime_active() else _run_in_child
    summary = run(fn, args, kwargs, settings, out)
    recording = summary.pop("recording")
    try:
        result = replay(recording, policy=policy, alloc_conf=settings["alloc_conf"],
                        device_total=settings["total"], device_free=settings["free"], device="sim")
    finally:
        os.unlink(recording)
    return EstimateResult(summary, result, settings)


def main(argv: list) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m allocsim.estimate",
        description="Run a PyTorch script on allocsim's simulated GPU (no GPU needed): peaks, OOMs, "
                    "and with --out a snapshot that allocsim and memory_viz read.")
    parser.add_argument("--total-memory", default="H100-80GB", help=f"bytes, '80GiB', or a card: {', '.join(CARDS)}")
    parser.add_argument("--free-memory", default=None, help="free at the start (default: the total less the CUDA context)")
    parser.add_argument("--alloc-conf", default=None, help="PYTORCH_CUDA_ALLOC_CONF (default: the environment's, as PyTorch reads it)")
    parser.add_argument("--policy", default="pytorch")
    parser.add_argument("--out", default=None, help="write a snapshot (.pickle.gz) and its sidecar (.json)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    if "--" in argv:
        at = argv.index("--")
        opts = parser.parse_args(argv[:at] + argv[at + 1:])
    else:
        opts = parser.parse_args(argv)
    try:
        settings = _settings(opts.total_memory, opts.free_memory, opts.alloc_conf, opts.policy)
    except (TypeError, ValueError) as e:
        parser.error(str(e))
    if not os.path.isfile(opts.script):
        parser.error(f"no such script: {opts.script}")
    if not _runtime_active():
        env = _runtime_env(settings)
        os.execve(sys.executable, [sys.executable, "-m", "allocsim.estimate", *argv], env)
    _leave_runtime_env()

    def program():
        sys.argv = [opts.script, *opts.args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(opts.script)))
        runpy.run_path(opts.script, run_name="__main__")

    try:
        summary = _run_here(program, (), {}, settings, opts.out)
    except DataDependentError as e:
        print(f"allocsim.estimate: {e}", file=sys.stderr)
        return 2
    os.unlink(summary.pop("recording"))
    if opts.json:
        print(json.dumps(summary, indent=1))
    else:
        gib = lambda b: f"{b / 2**30:.3f} GiB ({b} bytes)"
        print(f"card: {settings['card'] or settings['total']}, free at start {gib(settings['free'])}, "
              f"alloc_conf {settings['alloc_conf']!r}, policy {settings['policy']}")
        print(f"peak reserved:  {gib(summary['peak_reserved_bytes'])}")
        print(f"peak allocated: {gib(summary['peak_allocated_bytes'])}")
        print(f"OOMs: {summary['num_ooms']}; requests: {summary['ops']}")
        for what in summary["assumed"]:
            print(f"assumed: {what}")
        print("fits" if summary["error"] is None else f"does not fit: {summary['error']}")
        if opts.out:
            print(f"wrote {opts.out}")
    return 0 if summary["error"] is None else 1

