"""The hooks allocsim_torch installs, checked on the GPU (run from the repository root):

    python3 validation/pluggable/probe.py

An impossible request raises torch.OutOfMemoryError and the GPU keeps working;
torch.cuda.empty_cache() and set_per_process_memory_fraction() reach the policy; a block
used on a second stream (Tensor.record_stream) is not freed before that stream's work is done;
on a machine with several GPUs, each has its own policy (skipped on one GPU); a CUDA graph
and a torch.cuda.MemPool keep their blocks to themselves, and a policy without private pools
refuses a capture. (PyTorch 2.11 refuses torch.cuda.MemPool over any pluggable allocator.)
Prints what it saw; exits 1 if any check fails.
"""
import subprocess, sys, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "crates/torch/python"))
import allocsim_torch  # noqa: E402

failed = []


def check(ok, what):
    print("ok  " if ok else "FAIL", what)
    if not ok:
        failed.append(what)


allocsim_torch.use("pytorch")
a = torch.ones(1000, device="cuda")
try:
    torch.empty(2**40, dtype=torch.uint8, device="cuda")
    check(False, "a 1 TiB request raises OutOfMemoryError")
except torch.OutOfMemoryError as e:
    check("allocsim" in str(e), f"a 1 TiB request raises OutOfMemoryError: {str(e)[:100]}...")
check(torch.ones(1000, device="cuda").sum().item() == 1000, "after the OOM, the GPU works")

x = torch.empty(50 << 20, dtype=torch.uint8, device="cuda")
del x
before = allocsim_torch.memory_stats()["reserved_bytes.all.current"]
torch.cuda.empty_cache()
after = allocsim_torch.memory_stats()["reserved_bytes.all.current"]
check(after < before, f"torch.cuda.empty_cache() gives memory back: reserved {before} -> {after}")

# A busy second stream: 100 M GPU cycles of sleep (about 50 ms), then a kernel on the block.
s2 = torch.cuda.Stream()
y = torch.ones(30 << 20, dtype=torch.uint8, device="cuda")
y.add_(1)  # the first launch of this kernel loads it (CUDA loads modules lazily), which may wait
torch.cuda.synchronize()
with torch.cuda.stream(s2):
    torch.cuda._sleep(100_000_000)
    y.add_(1)
y.record_stream(s2)
busy = not s2.query()
t = time.perf_counter()
del y
took = time.perf_counter() - t
idle = s2.query()
waits = allocsim_torch.memory_stats()["allocsim.stream_waits"]
check(busy and idle and waits == 1,
      f"the free of a block recorded on a busy stream waited for it: {took * 1e3:.1f} ms "
      f"(stream busy before: {busy}, idle after: {idle}, waits: {waits})")

# Several GPUs: one policy per device; a block of GPU 1 freed on another thread goes back to
# GPU 1's policy.
if torch.cuda.device_count() < 2:
    print("skipped: several GPUs (this machine has one)")
else:
    import threading
    r0 = allocsim_torch.memory_stats(0)["reserved_bytes.all.current"]
    z = torch.full((100 << 20,), 3, dtype=torch.uint8, device="cuda:1")
    z1 = allocsim_torch.memory_stats(1)
    check(z.device.index == 1 and z1["allocated_bytes.all.current"] >= 100 << 20
          and allocsim_torch.memory_stats(0)["reserved_bytes.all.current"] == r0,
          f"a block on GPU 1 comes from GPU 1's policy: allocated there {z1['allocated_bytes.all.current']}")
    check(int(z.to("cuda:0", torch.int64).sum().item()) == 3 * (100 << 20), "GPU 1's block holds its data")
    holder = [z]
    del z
    freer = threading.Thread(target=holder.clear)
    freer.start()
    freer.join()
    after1 = allocsim_torch.memory_stats(1)["allocated_bytes.all.current"]
    check(after1 < 100 << 20, f"freed on another thread, it goes back to GPU 1: allocated {after1}")

# A CUDA graph: an intermediate freed during the capture stays the graph's (its replays write
# there), so an eager tensor made after the capture does not get its block.
x = torch.ones(1 << 20, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):  # warm up off the capture, as PyTorch's docs ask
    (x * 3 + 1).sum()
torch.cuda.current_stream().wait_stream(side)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    tmp = x * 3
    y = tmp + 1
    tmp_ptr = tmp.data_ptr()
    del tmp
eager = torch.zeros(1 << 20, device="cuda")
x.fill_(2)
g.replay()
torch.cuda.synchronize()
check(eager.data_ptr() != tmp_ptr and int(eager.count_nonzero()) == 0 and bool((y == 7).all()),
      f"a CUDA graph keeps its pool: replayed, y == 7, the eager tensor untouched "
      f"(its block {eager.data_ptr():#x}, the graph's intermediate {tmp_ptr:#x})")
reserved = allocsim_torch.memory_stats()["reserved_bytes.all.current"]
del g, y
torch.cuda.empty_cache()
after = allocsim_torch.memory_stats()["reserved_bytes.all.current"]
check(after < reserved, f"the graph's pool goes back when the graph goes: reserved {reserved} -> {after}")

try:  # PyTorch 2.11 itself refuses a MemPool over a pluggable allocator
    torch.cuda.MemPool()
    print("note: torch.cuda.MemPool was made over the pluggable allocator")
except RuntimeError as e:
    print(f"note: PyTorch refuses torch.cuda.MemPool here: {str(e).splitlines()[0][:100]}")

# A policy without private pools refuses a capture instead of sharing the graph's blocks.
child = subprocess.run([sys.executable, "-c", f"""
import sys, torch
sys.path.insert(0, {str(Path(__file__).resolve().parents[2] / "crates/torch/python")!r})
import allocsim_torch
allocsim_torch.use("bfc")
x = torch.ones(1000, device="cuda")
try:
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        x * 2
    print("captured")
except RuntimeError as e:
    print("refused:", str(e).splitlines()[0][:160])
print("works after:", (x + 1).sum().item() == 2000)
"""], capture_output=True, text=True)
said = child.stdout.strip().replace("\n", " | ")
check(child.returncode == 0 and "refused:" in said and "private pools" in said
      and "works after: True" in said, f"the bfc policy refuses a CUDA graph capture: {said[:300]}")

torch.cuda.set_per_process_memory_fraction(0.001)
try:
    torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    check(False, "set_per_process_memory_fraction(0.001) refuses 1 GiB")
except torch.OutOfMemoryError as e:
    check("fraction" in str(e), "set_per_process_memory_fraction(0.001) refuses 1 GiB")
sys.exit(1 if failed else 0)
