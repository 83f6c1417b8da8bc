"""Record frees that wait on another stream's work: `synthetic_pending_frees`, and
`synthetic_pending_frees_capped` (the same program under a memory fraction of 0.03).

Run on the GPU machine, one process per trace:
    python3 capture_pending_frees.py OUTDIR synthetic_pending_frees
    python3 capture_pending_frees.py OUTDIR synthetic_pending_frees_capped
Writes OUTDIR/NAME.pickle.gz and NAME.json in the layout of
`../../../shared/tools/capture_traces.py` (snapshot gzipped; `memory_stats()` at the end and
`meta`). None of the shared traces frees a block that is still in use on another stream, so
none exercises `recordStream`, `free_requested` without `free_completed`, or the completion
of those frees in `process_events`.

A seeded program allocates tensors of mixed sizes on the current stream. A third of them are
also used on a side stream that is kept busy with `torch.cuda._sleep` (spin kernels of
random length), through `Tensor.record_stream`. Freeing such a tensor leaves its block
pending until the side stream's work is done; the allocator completes it at a later
`malloc` (`process_events`). Under the cap, allocations also fail to get a new segment, and
the release path first waits for every pending free (`synchronize_and_free_events`), so
frees complete inside a `malloc` too; requests that still do not fit are caught as OOMs.
"""
import gzip, json, os, random, shutil, sys, time

FRACTION = {"synthetic_pending_frees": None, "synthetic_pending_frees_capped": 0.03}


def sizes(rng):
    r = rng.random()
    if r < 0.5:
        return rng.randint(1, 1 << 20)          # small pool
    if r < 0.95:
        return rng.randint(1 << 20, 32 << 20)   # large pool
    return rng.randint(32 << 20, 256 << 20)


def workload(torch):
    rng = random.Random(18)
    side = torch.cuda.Stream()
    live, recorded, ooms = [], 0, 0
    for _ in range(20000):
        if live and (len(live) >= 300 or rng.random() < 0.45):
            live.pop(rng.randrange(len(live)))
            continue
        size, use_side = sizes(rng), rng.random() < 0.33
        try:
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            ooms += 1
            continue
        if use_side:
            with torch.cuda.stream(side):
                torch.cuda._sleep(rng.randint(1_000, 400_000))
            t.record_stream(side)
            recorded += 1
        live.append(t)
    live.clear()
    torch.cuda.synchronize()
    return {"recorded_streams": recorded, "caught_ooms": ooms}


def main():
    import torch

    outdir, name = sys.argv[1], sys.argv[2]
    fraction = FRACTION[name]
    os.makedirs(outdir, exist_ok=True)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction)
    free0, total = torch.cuda.mem_get_info()
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=3_000_000)
    t0 = time.perf_counter()
    extra = workload(torch)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    stats = torch.cuda.memory_stats()
    path = os.path.join(outdir, name + ".pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(path)
    meta = {
        "workload": name, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(),
        "total_memory": total, "free_at_start": free0, "workload_seconds": wall, **extra,
    }
    with open(os.path.join(outdir, name + ".json"), "w") as f:
        json.dump({"meta": meta, "memory_stats": stats}, f, indent=1, sort_keys=True)
    print(f"{name}: {wall:.1f}s {extra} peak_reserved={stats.get('reserved_bytes.all.peak')}",
          flush=True)


if __name__ == "__main__":
    main()
