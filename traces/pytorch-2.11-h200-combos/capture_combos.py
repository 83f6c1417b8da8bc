"""Recordings that combine the patterns read well on their own, made with `allocsim.capture`
as a user makes them, each in a fresh process on the GPU machine:

    python3 traces/pytorch-2.11-h200-combos/capture_combos.py all OUTDIR
    python3 traces/pytorch-2.11-h200-combos/capture_combos.py NAME[,NAME...] OUTDIR

The patterns are the workloads of `../pytorch-2.11-h100-user/capture_user_patterns.py`
(CUDA graphs under `torch.compile(mode="reduce-overhead")`, MemPools created and deleted, the
release phases, GPT-2 training steps), under other settings, started late (the capture begins
after training has run) or in a ring buffer that wraps (the trace starts mid-run), and one
after another in one process. `calls` makes the calls a plain snapshot cannot show:
`empty_cache()` that frees nothing, and `set_per_process_memory_fraction()` whose cap refuses
an allocation that is then retried and one that ends in a caught OOM.
"""
import gc, importlib.util, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python", "allocsim"))
spec = importlib.util.spec_from_file_location(
    "patterns", os.path.join(ROOT, "traces", "pytorch-2.11-h100-user", "capture_user_patterns.py"))
patterns = importlib.util.module_from_spec(spec)
spec.loader.exec_module(patterns)

MIB = 1 << 20
EXPANDABLE = "expandable_segments:True"
TUNED = "max_split_size_mb:128,roundup_power2_divisions:4"


def gpt2_steps(torch, seed, steps):
    model, opt, rng = patterns._gpt2(torch, seed)
    patterns._gpt2_steps(torch, model, opt, rng, steps)
    return model, opt, rng


def calls(torch):
    x = [torch.empty(64 * MIB, dtype=torch.uint8, device="cuda") for _ in range(8)]
    torch.cuda.empty_cache()  # every block live: frees nothing
    del x[::2]
    torch.cuda.empty_cache()  # frees the four emptied segments
    torch.cuda.empty_cache()  # frees nothing
    a = [torch.empty(256 * MIB, dtype=torch.uint8, device="cuda") for _ in range(6)]
    del a[1::2]  # 768 MiB cached
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 1000 * MIB) / total)
    b = torch.empty(1200 * MIB, dtype=torch.uint8, device="cuda")  # over the cap: retried
    try:
        c = torch.empty(1000 * MIB, dtype=torch.uint8, device="cuda")  # nothing left to free
    except torch.OutOfMemoryError:
        c = None
    torch.cuda.set_per_process_memory_fraction(1.0)
    d = torch.empty(1000 * MIB, dtype=torch.uint8, device="cuda")
    del a, b, c, d
    model, opt, rng = patterns._gpt2(torch, 61)
    for step in range(3):  # the Lightning habit: empty the cache after each step
        patterns._gpt2_steps(torch, model, opt, rng, 1)
        torch.cuda.empty_cache()


def late_mempool(torch, capture):
    gpt2_steps(torch, 62, 2)
    with capture():
        patterns.w_d_mempool(torch)
        gc.collect()
        torch.cuda.empty_cache()


def ring_release(torch, capture):
    with capture(max_entries=6000):
        model, opt, rng = gpt2_steps(torch, 63, 4)
        model = model.cpu()
        opt = None
        gc.collect()
        torch.cuda.empty_cache()
        patterns.w_d_release_phases(torch)


def graphs_pools_release(torch):
    patterns.w_d_cudagraphs(torch)
    patterns.w_d_mempool(torch)
    patterns.w_d_release_phases(torch)


def late_graphs(torch, capture):
    gpt2_steps(torch, 64, 2)
    with capture():
        patterns.w_d_cudagraphs(torch)


COMBOS = {
    # name: (PYTORCH_CUDA_ALLOC_CONF, what runs; a function of (torch, capture) records itself)
    "cudagraphs_expandable": (EXPANDABLE, patterns.w_d_cudagraphs),
    "mempool_expandable": (EXPANDABLE, patterns.w_d_mempool),
    "release_tuned": (TUNED, patterns.w_d_release_phases),
    "late_mempool_expandable": (EXPANDABLE, late_mempool),
    "ring_release_expandable": (EXPANDABLE, ring_release),
    "graphs_pools_release": ("", graphs_pools_release),
    "late_graphs_tuned": (TUNED, late_graphs),
    "calls": ("", calls),
    "calls_expandable": (EXPANDABLE, calls),
}


def run_one(name, outdir):
    import functools, inspect, torch
    from capture import capture
    conf, work = COMBOS[name]
    path = os.path.join(outdir, name + ".pickle.gz")
    if "capture" in inspect.signature(work).parameters:
        work(torch, functools.partial(capture, path, max_entries=3_000_000))
    else:
        with capture(path, max_entries=3_000_000):
            work(torch)


def main():
    names, outdir = sys.argv[1], sys.argv[2]
    if names == "one":
        run_one(sys.argv[3], outdir)
        return
    os.makedirs(outdir, exist_ok=True)
    for name in COMBOS if names == "all" else names.split(","):
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=COMBOS[name][0])
        try:
            subprocess.run([sys.executable, __file__, "one", outdir, name], env=env, timeout=240, check=True)
        except Exception as e:  # one broken combination must not lose the others
            print(f"{name}: FAILED {e}", flush=True)


if __name__ == "__main__":
    main()
