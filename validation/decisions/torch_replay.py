#!/usr/bin/env python3
"""Replay an allocsim op stream through PyTorch's own CUDA caching allocator and time it.

The op stream comes from `allocsim convert TRACE OUT.allocsim.json` (or
`allocsim workload SPEC --out OUT.allocsim.json`). Each `alloc` becomes
`torch.cuda.caching_allocator_alloc(size, device, stream)` and each `free_requested` a
`torch.cuda.caching_allocator_delete(ptr)`, in the trace's order; `empty_cache` and
`set_memory_fraction` are called as such. The trace's allocator settings are put in
PYTORCH_CUDA_ALLOC_CONF before CUDA starts, and its memory fraction is applied first, as
`allocsim replay` does. Allocations PyTorch refuses (OutOfMemoryError) are counted and their
frees skipped, as allocsim's engine skips them.

Prints one JSON object: ops, wall seconds for the op loop (synchronised at both ends), µs per
op, OOMs, and a few `torch.cuda.memory_stats()` keys to set beside allocsim's run of the same
stream with its `pytorch` policy.

    python3 validation/decisions/torch_replay.py OUT.allocsim.json [--repeat N]
"""

import argparse
import json
import os
import sys
import time


def op_kind(op):
    """('alloc', {...}) for {"alloc": {...}}, ('empty_cache', None) for "empty_cache"."""
    if isinstance(op, str):
        return op, None
    ((kind, body),) = op.items()
    return kind, body


def replay(torch, ops, fraction):
    if fraction is not None and fraction < 1.0:
        torch.cuda.set_per_process_memory_fraction(fraction)
    streams = {0: torch.cuda.default_stream()}
    for op in ops:
        kind, body = op_kind(op)
        if kind == "alloc" and body["stream"] not in streams:
            streams[body["stream"]] = torch.cuda.Stream()
    ptrs = {}
    ooms = 0
    alloc = torch.cuda.caching_allocator_alloc
    delete = torch.cuda.caching_allocator_delete
    torch.cuda.synchronize()
    start = time.perf_counter()
    for op in ops:
        kind, body = op_kind(op)
        if kind == "alloc":
            try:
                ptrs[body["id"]] = alloc(body["size"], 0, streams[body["stream"]])
            except torch.OutOfMemoryError:
                ooms += 1
        elif kind == "free_requested":
            ptr = ptrs.pop(body["id"], None)
            if ptr is not None:
                delete(ptr)
        elif kind == "empty_cache":
            torch.cuda.empty_cache()
        elif kind == "set_memory_fraction":
            torch.cuda.set_per_process_memory_fraction(min(body["fraction"], 1.0))
        # free_completed, record_stream: no stream uses are recorded here, frees complete at once.
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    for ptr in ptrs.values():
        delete(ptr)
    return seconds, ooms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="an .allocsim.json file")
    ap.add_argument("--repeat", type=int, default=1, help="replays in fresh processes are best; "
                    "this reruns in the same process after empty_cache (the first run is reported too)")
    args = ap.parse_args()
    with open(args.trace) as f:
        trace = json.load(f)
    meta = trace.get("meta", {})
    conf = meta.get("alloc_conf") or ""
    if conf and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    import torch  # after PYTORCH_CUDA_ALLOC_CONF is set

    torch.cuda.init()
    torch.empty(1, device="cuda")  # context and allocator up before timing
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    ops = trace["ops"]
    runs = []
    for i in range(max(args.repeat, 1)):
        if i > 0:
            torch.cuda.empty_cache()
        seconds, ooms = replay(torch, ops, meta.get("memory_fraction"))
        runs.append(seconds)
        if i == 0:
            stats = torch.cuda.memory_stats()
    out = {
        "trace": args.trace,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "memory_fraction": meta.get("memory_fraction"),
        "ops": len(ops),
        "seconds": runs[0],
        "us_per_op": runs[0] * 1e6 / max(len(ops), 1),
        "seconds_all_runs": runs,
        "ooms": ooms,
        "num_device_alloc": stats.get("num_device_alloc"),
        "num_device_free": stats.get("num_device_free"),
        "num_ooms": stats.get("num_ooms"),
        "reserved_bytes.all.peak": stats.get("reserved_bytes.all.peak"),
        "allocated_bytes.all.peak": stats.get("allocated_bytes.all.peak"),
    }
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
