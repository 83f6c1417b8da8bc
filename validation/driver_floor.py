"""How much free memory the driver never hands out (run on the GPU machine).

Fills the device, then reads `mem_get_info()`: with `cudaMalloc`s (CuPy) of halving sizes down to
2 MiB (`cupy_pages`) or 512 bytes (`cupy_small`), or with PyTorch tensors through its caching allocator
(`torch`; set PYTORCH_CUDA_ALLOC_CONF for expandable segments). What is left free is the floor
`allocsim_run::driver_floor_bytes` takes from every capacity answer on that device.

    python3 validation/driver_floor.py cupy_pages|cupy_small|torch
"""
import json
import os
import sys

import cupy
import torch


def cupy_fill(min_size):
    held, size = [], 1 << 36
    while size >= min_size:
        try:
            held.append(cupy.cuda.runtime.malloc(size))
        except cupy.cuda.runtime.CUDARuntimeError:
            size //= 2
    free, total = cupy.cuda.runtime.memGetInfo()
    for b in held:
        cupy.cuda.runtime.free(b)
    return {"free_left": free, "total": total, "buffers": len(held)}


def torch_fill():
    held, size = [], 1 << 36
    while size >= 512:
        try:
            held.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            size //= 2
    free, total = torch.cuda.mem_get_info()
    return {"free_left": free, "total": total, "reserved": torch.cuda.memory_reserved(), "tensors": len(held)}


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    fills = {"cupy_pages": lambda: cupy_fill(2 << 20), "cupy_small": lambda: cupy_fill(512), "torch": torch_fill}
    if mode not in fills:
        sys.exit(__doc__)
    torch.cuda.mem_get_info()  # the CUDA context, as in a recording
    result = {"mode": mode, "gpu": torch.cuda.get_device_name(), "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    result.update(fills[mode]())
    print(json.dumps(result))
