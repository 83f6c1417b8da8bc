"""Held-out recordings of the user patterns: the workloads of capture_user_patterns.py with other
seeds, sizes and lengths, recorded the same way (each in its own process, NAME.pickle.gz plus
NAME.json). Nobody looked at these while writing the converter and the policy.

On the GPU machine:  python3 capture_holdout.py all OUTDIR   (or a comma-separated list of names)
HOLDOUT_SEED=N shifts every seed by N (the h_*_s2 recordings are HOLDOUT_SEED=10).
"""
import os, random, subprocess, sys

import capture_user_patterns as cup

SEED = int(os.environ.get("HOLDOUT_SEED", "0"))


def h_gpt2_blog(torch):
    # The tutorial recipe on a longer run with other shapes: the ring buffer wraps several times.
    model, opt, rng = cup._gpt2(torch, 51 + SEED)
    cup._gpt2_steps(torch, model, opt, rng, 45)


def h_late_history(torch):
    model, opt, rng = cup._gpt2(torch, 52 + SEED)
    cup._gpt2_steps(torch, model, opt, rng, 5)
    before = torch.cuda.memory_stats()
    cup.start_history(torch, "full")
    cup._gpt2_steps(torch, model, opt, rng, 2)
    return {"memory_stats_at_history_start": dict(before)}


def h_release_phases(torch):
    import gc, torchvision
    torch.manual_seed(55 + SEED)
    model = torchvision.models.resnet34(weights=None).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        x = torch.randn(64, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (64,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    model = model.to("cpu")
    opt = x = y = loss = None
    gc.collect()
    torch.cuda.empty_cache()
    model = model.cuda().eval()
    with torch.inference_mode():
        for step in range(4):
            out = model(torch.randn(96, 3, 224, 224, device="cuda"))
            del out
    model = None
    gc.collect()
    torch.cuda.empty_cache()
    big = [torch.empty(5 << 28, dtype=torch.uint8, device="cuda") for _ in range(3)]
    del big
    torch.cuda.synchronize()


def h_mempool(torch):
    torch.manual_seed(54 + SEED)
    rng = random.Random(54 + SEED)
    w = [torch.randn(2048, 2048, device="cuda") for _ in range(3)]
    pool1 = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool1):
        kv1 = [torch.empty(rng.randint(1, 48) << 20, dtype=torch.uint8, device="cuda") for _ in range(18)]
    for step in range(20):
        x = torch.randn(rng.choice([512, 2048]), 2048, device="cuda")
        for m in w:
            x = torch.relu(x @ m)
        del x
    del kv1
    del pool1
    torch.cuda.empty_cache()
    pool2 = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool2):
        kv2 = [torch.empty(rng.randint(1, 40) << 20, dtype=torch.uint8, device="cuda") for _ in range(24)]
        del kv2[1::4]
    for step in range(15):
        x = torch.randn(rng.choice([256, 1024, 4096]), 2048, device="cuda")
        for m in w:
            x = torch.relu(x @ m)
        del x
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    globals()["_keep"] = (pool2, kv2)
    return {"pool_ids": sorted({str(s["segment_pool_id"]) for s in snap["segments"]})}


def h_cudagraphs(torch):
    torch.manual_seed(53 + SEED)
    model = torch.nn.Sequential(
        torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768), torch.nn.LayerNorm(768),
        torch.nn.Linear(768, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cmodel = torch.compile(model, mode="reduce-overhead")
    for step in range(5):
        torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(256, 768, device="cuda")
        y = torch.randint(0, 512, (256,), device="cuda")
        loss = torch.nn.functional.cross_entropy(cmodel(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    with torch.inference_mode():
        for step in range(3):
            torch.compiler.cudagraph_mark_step_begin()
            out = cmodel(torch.randn(256, 768, device="cuda")).clone()
            torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    return {"pool_ids": sorted({str(s["segment_pool_id"]) for s in snap["segments"]})}


h_gpt2_blog_expandable = h_gpt2_blog
h_late_history_expandable = h_late_history

HOLDOUT = {
    "h_gpt2_blog": ("", "blog"),
    "h_gpt2_blog_expandable": ("expandable_segments:True", "blog"),
    "h_late_history_expandable": ("expandable_segments:True", "late"),
    "h_late_history": ("", "late"),
    "h_release_phases": ("", "full"),
    "h_mempool": ("", "full"),
    "h_cudagraphs": ("", "full"),
}

for name, fn in list(globals().items()):
    if name.startswith("h_") and callable(fn):
        setattr(cup, "w_" + name, fn)
cup.WORKLOADS.update(HOLDOUT)

if __name__ == "__main__":
    if sys.argv[1] == "one":
        cup.run_one(sys.argv[2], sys.argv[3])
        sys.exit(0)
    outdir = sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    names = list(HOLDOUT) if sys.argv[1] == "all" else sys.argv[1].split(",")
    for name in names:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=HOLDOUT[name][0])
        try:
            subprocess.run([sys.executable, __file__, "one", name, outdir], env=env, timeout=240, check=True)
        except Exception as e:  # one broken workload must not lose the others
            print(f"{name}: FAILED {e}", flush=True)
