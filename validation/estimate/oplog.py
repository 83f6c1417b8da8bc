"""On the GPU machine: runs a program with every ATen op logged beside the allocator's counters,
so each allocation of the recording can be attributed to the op (and thread) that made it.
This is how the kernel-internal allocations the estimator models were found.

    python3 oplog.py OUT.json.gz -- program.py ARGS
"""
import gzip, json, runpy, sys, threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def counters():
    s = torch.cuda.memory_stats_as_nested_dict()["allocation"]["all"]
    return s["allocated"], s["freed"]


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        a0, f0 = counters()
        out = func(*args, **(kwargs or {}))
        a1, f1 = counters()
        if a1 != a0 or f1 != f0:
            self.ops.append([str(func), threading.get_ident(), a0, a1, f0, f1])
        return out


def main():
    path, program, args = sys.argv[1], sys.argv[3], sys.argv[4:]
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=10_000_000, stacks="python")
    sys.argv = [program] + args
    mode = OpLog()
    with mode:
        try:
            runpy.run_path(program, run_name="__main__")
        except SystemExit:
            pass
    snap = torch.cuda.memory._snapshot()
    events = [[e["action"], e["size"]] for e in snap["device_traces"][0]
              if e["action"] in ("alloc", "free_requested")]
    with gzip.open(path, "wt") as f:
        json.dump({"main_thread": threading.get_ident(), "ops": mode.ops, "events": events}, f)


if __name__ == "__main__":
    main()
