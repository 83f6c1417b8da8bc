"""Record a PyTorch memory snapshot and the sidecar allocsim reads beside it.

As a context manager around your own code:

    import allocsim
    with allocsim.capture("run.pickle.gz", max_entries=100_000):
        train()

or around a whole script:

    python -m allocsim.capture run.pickle.gz -- train.py --epochs 1

writes `run.pickle.gz` (`torch.cuda.memory._snapshot()`, gzip-compressed) and `run.json`
(`memory_stats()` at the end, the settings in force, `mem_get_info()` at the start and the
memory the run took outside the allocator, the GPU and the versions). Then
`allocsim replay run.pickle.gz`, `allocsim capacity run.pickle.gz`, `allocsim advise ...`.
"""

import argparse
import contextlib
import gc
import gzip
import json
import os
import pickle
import runpy
import sys


# The variables PyTorch takes its allocator settings from, in its order: the first one set
# wins, even when empty, and the others are not read (c10/cuda/CUDAAllocatorConfig.h and
# c10/core/AllocatorConfig.cpp; PYTORCH_ALLOC_CONF, the device-generic name of 2.12 and later,
# counts only when PYTORCH_CUDA_ALLOC_CONF is unset; ROCm builds read PYTORCH_HIP_ALLOC_CONF
# between the two). docs/pytorch-versions.md has the sources.
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def alloc_conf_from_env(environ=None):
    """The allocator settings PyTorch reads from `environ` (default: this process's) and the
    variable they come from: `(settings, name)`, or `("", None)` when none is set."""
    environ = os.environ if environ is None else environ
    for name in ALLOC_CONF_VARS:
        if name in environ:
            return environ[name], name
    return "", None


def rank_from_env(environ=None):
    """`(rank, local_rank, world_size)` as `torchrun` (or any launcher) sets them in `RANK`,
    `LOCAL_RANK` and `WORLD_SIZE`; `None` for each one not set."""
    environ = os.environ if environ is None else environ

    def number(name):
        value = environ.get(name)
        return int(value) if value is not None and value.strip().isdigit() else None

    return number("RANK"), number("LOCAL_RANK"), number("WORLD_SIZE")


def rank_path(path, rank):
    """Where rank `rank` writes: `path` with `{rank}` filled in when it has one, else
    `run.pickle.gz` -> `run_rank{R}.pickle.gz`; `path` itself when there is no rank."""
    path = str(path)
    if rank is None:
        return path
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    for suffix in (".pickle.gz", ".pickle"):
        if path.endswith(suffix):
            return f"{path[:-len(suffix)]}_rank{rank}{suffix}"
    return f"{path}_rank{rank}"


class _Calls:
    """The calls a snapshot cannot show, recorded in order with their place in the run: each
    `empty_cache()` (one that frees nothing leaves no trace entry, yet PyTorch counts it in
    `num_sync_all_streams`) and each `set_per_process_memory_fraction()` (the cap decides which
    failed allocations were refused by the cap and retried). The place is the allocator's
    count of allocations and of frees so far (`allocation.all.allocated`, `.freed`), which are
    the trace's `alloc` and `free_requested` entries: the call came after that many of each.

    Patches `torch.cuda.empty_cache` and `torch.cuda.set_per_process_memory_fraction` (both
    names, under `torch.cuda` and `torch.cuda.memory`) while the capture runs; code that bound
    the functions to a name of its own before the capture started is not seen."""

    NAMES = ("empty_cache", "set_per_process_memory_fraction")

    def __init__(self, torch, device):
        self.torch, self.device, self.calls, self.saved = torch, device, [], []

    def place(self):
        stats = self.torch.cuda.memory_stats(self.device)
        return {"allocations": stats.get("allocation.all.allocated", 0),
                "frees": stats.get("allocation.all.freed", 0)}

    def __enter__(self):
        modules = (self.torch.cuda, self.torch.cuda.memory)
        real = {name: getattr(self.torch.cuda.memory, name) for name in self.NAMES}
        index = self.torch.cuda._utils._get_device_index

        def empty_cache():
            self.calls.append({"call": "empty_cache", **self.place()})
            return real["empty_cache"]()

        def set_per_process_memory_fraction(fraction, device=None):
            on = index(device, optional=True)
            if on == index(self.device, optional=True):
                self.calls.append({"call": "set_per_process_memory_fraction",
                                   "fraction": float(fraction), **self.place()})
            return real["set_per_process_memory_fraction"](fraction, device)

        wrappers = {"empty_cache": empty_cache,
                    "set_per_process_memory_fraction": set_per_process_memory_fraction}
        for module in modules:
            for name in self.NAMES:
                self.saved.append((module, name, getattr(module, name)))
                setattr(module, name, wrappers[name])
        # NCCL frees its buffers when the process group goes: the memory a job took outside
        # the allocator is measured before that too (`outside_before_destroy`).
        self.before_destroy = None
        dist = getattr(self.torch, "distributed", None)
        destroy = getattr(dist, "destroy_process_group", None)
        if destroy is not None:
            def destroy_process_group(*args, **kwargs):
                free, _ = self.torch.cuda.mem_get_info(self.device)
                self.before_destroy = (free, self.torch.cuda.memory_reserved(self.device))
                return destroy(*args, **kwargs)

            self.saved.append((dist, "destroy_process_group", destroy))
            dist.destroy_process_group = destroy_process_group
        return self

    def __exit__(self, *exc):
        for module, name, function in reversed(self.saved):
            setattr(module, name, function)


@contextlib.contextmanager
def capture(path, max_entries=100_000, stacks="python", device=None, **history):
    """Record the allocator's history on `device` while the block runs; dump it at the end,
    also when the block raises (an OOM is what one most wants to see). Other keyword
    arguments go to `torch.cuda.memory._record_memory_history` (`compile_context=True`, ...).

    Under `torchrun` (or any launcher that sets `RANK`), each rank writes a snapshot of its
    own (`rank_path`) of the GPU `LOCAL_RANK` names, and its sidecar says which rank it is."""
    try:
        import torch
    except ImportError:
        raise ImportError(
            "allocsim.capture records on a GPU through PyTorch, which is not installed here "
            "(pip install torch)"
        ) from None

    rank, local_rank, world_size = rank_from_env()
    path = rank_path(path, rank)
    torch.cuda.init()
    if device is None and local_rank is not None and local_rank < torch.cuda.device_count():
        device = local_rank
    device = torch.cuda._utils._get_device_index(device, optional=True)
    free_at_start, total = torch.cuda.mem_get_info(device)
    stats_at_start = dict(torch.cuda.memory_stats(device))
    fraction_at_start = torch.cuda.get_per_process_memory_fraction(device)
    torch.cuda.memory._record_memory_history(
        max_entries=max_entries, stacks=stacks, device=device, **history
    )
    try:
        with _Calls(torch, device) as calls:
            yield
    finally:
        torch.cuda.synchronize(device)
        # Snapshot and statistics describe one moment: no garbage collection between them
        # (a collection frees tensors, which the statistics would see and the trace would not).
        gc.disable()
        try:
            snapshot = torch.cuda.memory._snapshot(device)
            stats = dict(torch.cuda.memory_stats(device))
            free_at_end, _ = torch.cuda.mem_get_info(device)
            reserved = torch.cuda.memory_reserved(device)
            torch.cuda.memory._record_memory_history(enabled=None, device=device)
        finally:
            gc.enable()
        # Level 6, not gzip's 9: a third of the time on a big history, for a few % more bytes.
        gz = str(path).endswith(".gz")
        with gzip.open(path, "wb", compresslevel=6) if gz else open(path, "wb") as f:
            pickle.dump(snapshot, f)
        alloc_conf, alloc_conf_var = alloc_conf_from_env()
        meta = {
            "alloc_conf": alloc_conf,
            "alloc_conf_var": alloc_conf_var,
            "total_memory": total,
            "free_at_start": free_at_start,
            "free_at_end": free_at_end,
            "outside_allocator_bytes": max(free_at_start - free_at_end - reserved, 0),
            "gpu": torch.cuda.get_device_name(device),
            "device": device,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "max_entries": max_entries,
            "calls": calls.calls,
        }
        # The statistics when the history began describe the trace's first entry unless the
        # ring buffer wrapped (then the trace starts later and what it starts from is unknown).
        entries = sum(len(t) for t in snapshot.get("device_traces", []))
        if stats_at_start and entries < max_entries:
            meta["memory_stats_at_history_start"] = stats_at_start
        if calls.before_destroy is not None:
            free, held = calls.before_destroy
            meta["outside_before_destroy"] = max(free_at_start - free - held, 0)
            meta["outside_allocator_bytes"] = max(meta["outside_allocator_bytes"],
                                                  meta["outside_before_destroy"])
        if fraction_at_start != 1.0:
            meta["memory_fraction"] = fraction_at_start
        if rank is not None:
            meta.update(rank=rank, local_rank=local_rank, world_size=world_size)
        sidecar = {"meta": meta, "memory_stats": stats}
        stem = str(path).removesuffix(".gz").removesuffix(".pickle")
        with open(stem + ".json", "w") as f:
            json.dump(sidecar, f, indent=1)
        print(f"allocsim.capture: wrote {path} and {stem}.json", file=sys.stderr)


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m allocsim.capture",
        description="Run a script while recording the PyTorch allocator's history; write the "
        "snapshot to OUT and the sidecar allocsim reads beside it (OUT without .pickle[.gz], "
        "plus .json).",
        usage="%(prog)s [--max-entries N] OUT.pickle.gz -- SCRIPT.py [ARGS...]",
    )
    parser.add_argument("out", metavar="OUT.pickle.gz")
    parser.add_argument("--max-entries", type=int, default=100_000,
                        help="trace entries kept (a ring buffer; default 100000)")
    if "--" not in argv:
        if any(a in ("-h", "--help") for a in argv):
            parser.print_help()
            return 0
        parser.error("expected OUT.pickle.gz -- SCRIPT.py [ARGS...]")
    at = argv.index("--")
    opts = parser.parse_args(argv[:at])
    script = argv[at + 1:]
    if not script:
        parser.error("no SCRIPT.py after --")
    sys.argv = script
    try:
        with capture(opts.out, max_entries=opts.max_entries):
            runpy.run_path(script[0], run_name="__main__")
    except ImportError as e:
        if "allocsim.capture" not in str(e):
            raise
        print(f"python -m allocsim.capture: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
