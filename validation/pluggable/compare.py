"""Tables from the live runs of run_gpu.sh (run here, after the GPU runs came back).

    python3 validation/pluggable/compare.py OUT... [--allocsim target/release/allocsim]

For each workload and setting: whether allocsim's `pytorch` policy made the same segment
calls (action and size, in order) as PyTorch's own allocator, and the peaks of both; the
peak reserved under every policy; and whether each recorded op stream, replayed offline by
`allocsim replay` under the policy and settings it ran with, comes to the same
`memory_stats()`, key for key, following the device's recorded answers (`--device recorded`)
and on the modelled device (`--device sim`); and from the timing runs (no history kept), each run's median
step time from the fourth step on (the first ones load kernels and fill the cache), then the
median over the runs under PyTorch's allocator and under the `pytorch` policy, their ratio, and
the range of the ratios of each alternating pair.
"""
import statistics
import glob, gzip, json, pickle, subprocess, sys
from pathlib import Path

args = sys.argv[1:]
binary = "target/release/allocsim"
if "--allocsim" in args:
    i = args.index("--allocsim")
    binary = args[i + 1]
    del args[i:i + 2]
runs, histories = [], {}  # a run's history is in the same OUT (a timing run keeps none)
for out in map(Path, args):
    in_order = sorted((out / "runs").glob("*.json"), key=lambda f: (len(f.stem), f.stem))  # 2 before 10
    for f in in_order + sorted(out.glob("*.json")):
        runs.append(dict(json.loads(f.read_text()), out=out))
    for f in (out / "history").glob("*"):
        histories[(out, f.name)] = f


ORDER = {"native": 0, "pytorch": 1, "allocsim": 2}
runs.sort(key=lambda r: (r["workload"], ORDER.get(r["mode"], 3), r["mode"], r["conf"]))


def after_first(r):
    """The run's time after its first step (which loads kernels and libraries), in s."""
    return f"{sum(r['step_seconds'][1:]):.2f}" if len(r["step_seconds"]) > 1 else "—"


def name(r, ext):
    conf = r["conf"].replace(":", "-").replace(",", "_") or "default"
    return histories.get((r["out"], f"{r['workload']}.{r['mode']}.{conf}.{ext}"))


def segment_calls(path):
    snap = pickle.load(gzip.open(path))
    trace = next(t for t in snap["device_traces"] if t)
    return [(e["action"], e["size"]) for e in trace if e["action"].startswith("segment_")]


def gib(b):
    return f"{b / 2**30:,.3f}"


print("| workload | settings | segment calls: PyTorch / allocsim `pytorch` | same sequence | "
      "peak reserved (GiB) | peak allocated (GiB) |")
print("| --- | --- | --- | --- | --- | --- |")
for r in runs:
    if r["mode"] != "native" or not name(r, "pickle.gz"):
        continue
    mine = next((m for m in runs if m["mode"] == "pytorch" and m["workload"] == r["workload"]
                 and m["conf"] == r["conf"] and name(m, "pickle.gz")), None)
    if not mine:
        continue
    a, b = segment_calls(name(r, "pickle.gz")), segment_calls(name(mine, "pickle.gz"))
    peaks = []
    for k in ["reserved_bytes.all.peak", "allocated_bytes.all.peak"]:
        same = "=" if r[k] == mine[k] else "≠"
        peaks.append(f"{gib(r[k])} {same} {gib(mine[k])}")
    print(f"| {r['workload']} | `{r['conf'] or 'default'}` | {len(a)} / {len(b)} | "
          f"{'yes' if a == b else 'no'} | {peaks[0]} | {peaks[1]} |")

print()
print("| workload | policy | settings | peak reserved (GiB) | peak allocated (GiB) | device allocs / frees "
      "| OOM | time after step 1 (s) | µs per malloc / free | offline replay, keys that differ: on the recorded device "
      "| on the model |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in runs:
    rec = name(r, "allocsim") if r["mode"] != "native" else None
    if r["mode"] != "native" and not rec:
        continue
    if r["mode"] == "native" and not name(r, "pickle.gz"):
        continue
    replay = ["—", "—"]
    for i, device in enumerate(["recorded", "sim"] if rec else []):
        cmd = [binary, "replay", str(rec), "--policy", r["mode"], "--device", device, "--json"]
        if r["conf"]:
            cmd += ["--alloc-conf", r["conf"]]
        stats = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["memory_stats"]
        differ = [k for k, v in r["memory_stats"].items() if stats.get(k) != v]
        replay[i] = f"{len(differ)} of {len(r['memory_stats'])}" + (f" ({', '.join(differ[:3])})" if differ else "")
    calls = "—"
    if r.get("allocsim.malloc_calls"):
        calls = (f"{r['allocsim.malloc_ns'] / r['allocsim.malloc_calls'] / 1e3:.2f} / "
                 f"{r['allocsim.free_ns'] / r['allocsim.free_calls'] / 1e3:.2f}")
    policy = "PyTorch's own" if r["mode"] == "native" else f"`{r['mode']}`"
    print(f"| {r['workload']} | {policy} | `{r['conf'] or 'default'}` | {gib(r['reserved_bytes.all.peak'])} | "
          f"{gib(r['allocated_bytes.all.peak'])} | {r['num_device_alloc']} / {r['num_device_free']} | "
          f"{'yes' if r['failure'] else 'no'} | {after_first(r)} | {calls} | {replay[0]} | {replay[1]} |")

print()
print("| workload | settings | runs | median step, PyTorch's own (ms) | median step, `pytorch` policy (ms) "
      "| ratio | ratio per pair (min-max) | µs per malloc / free |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
timing = {}
for r in runs:
    if r["mode"] in ("native", "pytorch") and not name(r, "pickle.gz") and len(r["step_seconds"]) > 4:
        timing.setdefault((r["workload"], r["conf"]), {}).setdefault(r["mode"], []).append(r)
for (w, conf), t in sorted(timing.items()):
    if len(t) != 2:
        continue
    step = {m: [statistics.median(r["step_seconds"][3:]) for r in rs] for m, rs in t.items()}
    a, b = statistics.median(step["native"]), statistics.median(step["pytorch"])
    pairs = [y / x for x, y in zip(step["native"], step["pytorch"])]
    mine = t["pytorch"]
    calls = (f"{sum(r['allocsim.malloc_ns'] for r in mine) / sum(r['allocsim.malloc_calls'] for r in mine) / 1e3:.2f} / "
             f"{sum(r['allocsim.free_ns'] for r in mine) / sum(r['allocsim.free_calls'] for r in mine) / 1e3:.2f}")
    print(f"| {w} | `{conf or 'default'}` | {len(step['native'])} / {len(step['pytorch'])} | "
          f"{a * 1e3:.1f} | {b * 1e3:.1f} | {b / a:.3f} | {min(pairs):.3f}-{max(pairs):.3f} | {calls} |")
