"""Measure on the GPU the smallest free memory on which a seeded workload runs without an OOM.

Run on a GPU machine with PyTorch, transformers and CuPy:
    python3 validation/fit.py WORKLOAD ALLOC_CONF OUTDIR [LO HI | at FREE,FREE,...]
WORKLOAD is `llama_ft` (the d_llama_ft workload of traces/pytorch-2.11-h100-user/
capture_user_patterns.py, step for step), `gpt2_train` (GPT-2 small, 8 steps of varied shapes),
or one of the programs held out from the model (recorded and bisected on an H200 after it was
built): `vit_train` (timm ViT-S/16), `bert_mlm` (BERT masked LM), `llama_generate` (Llama
greedy decoding with a KV cache), `resnet_train` (timm ResNet-50, channels-last
convolutions), `convnext_train` (timm ConvNeXt-T with AdamW, written after the driver's
floor entered the model), `t5_generate` (T5-small encoder-decoder decoding) and
`gpt2_generate` (GPT-2 small decoding; both written after the band's top was capped at what
the run takes unconstrained) and `bart_generate` (BART-base encoder-decoder decoding, written
after the memory outside the allocator was taken step by step).

1. Records the workload once with all the card's free memory: OUTDIR/NAME.pickle.gz (the
   snapshot, `_record_memory_history(context=None)`) and OUTDIR/NAME.json (the sidecar allocsim
   reads: settings, `free_at_start`, `memory_stats()` at the end, and the memory the run used
   outside the caching allocator, `outside_allocator_bytes`, with its growth over the run).
2. Bisects the threshold between the recording's peak allocated (cannot fit) and its peak
   reserved plus the outside memory (must fit), until the bracket is narrow
   (0.2 % of the peak allocated, at least 8 MiB; FIT_STEP_MIB=N makes it N MiB, at least the
   ballast's 2 MiB pages). With LO and
   HI given, bisects between them instead, without recording (to go on from a bracket an
   earlier run left).
   Each try is a fresh CUDA context in a forked child (the parent imports torch but never
   touches CUDA): it takes all free memory but the target with a ballast cudaMalloc outside
   PyTorch's allocator, then runs the workload. A try fails on an OOM or on any other error
   (cuDNN's attention fails so when its memory outside the allocator runs out). The free memory a try
   really had is `mem_get_info()` after the ballast (the ballast rounds to 2 MiB pages).
3. With `at` and a list of free bytes, runs one try at each, without recording or bisecting:
   fitting need not be monotonic in the free memory (under pressure a run that retries sooner
   gives its cache back sooner), and a bisection sees only the tries it makes. Each try's
   snapshot is kept as OUTDIR/NAME.at-FREE.pickle.gz.
With FIT_DEADLINE (unix time) set, stops bisecting before a try could run past it. With
FIT_PERTURB=SEED, each try first takes six buffers of 2-40 MiB (sizes drawn from SEED) and gives
every other one back, so the driver places the run's segments around other chunks than it
would; `free_at_start` is measured after, so thresholds stay comparable.
Prints one JSON line per try and a summary line {"real_oom_free", "real_fits_free", ...}, both
ends observed on the GPU. The snapshots of the tightest fitting try and the loosest failing
one are kept as OUTDIR/NAME.fit.pickle.gz and OUTDIR/NAME.oom.pickle.gz.
"""
import gzip, json, multiprocessing as mp, os, random, shutil, sys, time

import cupy
import torch
import timm  # noqa: F401  imported before the fork, so each try starts at once
import transformers  # noqa: F401

MIB = 1 << 20


def llama_ft(step_done):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(30)
    rng = random.Random(30)
    cfg = LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=16,
                      num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg).cuda()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(8):
        for micro in range(2):
            b, s = rng.choice([2, 4, 8]), rng.randint(128, 2048)
            ids = torch.randint(0, 32000, (b, s), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss / 2
            loss.backward()
            ids = loss = None
            step_done()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_done()


def gpt2_train(step_done):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(41)
    rng = random.Random(41)
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(8):
        b, s = rng.choice([4, 8]), rng.choice([256, 512, 1024])
        ids = torch.randint(0, 50257, (b, s), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        step_done()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_done()
        ids = loss = None


def vit_train(step_done):
    import timm
    torch.manual_seed(42)
    rng = random.Random(42)
    model = timm.create_model("vit_small_patch16_224", num_classes=1000).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(6):
        b = rng.choice([64, 96, 128])
        x = torch.randn(b, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (b,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        step_done()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_done()
        x = y = loss = None


def bert_mlm(step_done):
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(43)
    rng = random.Random(43)
    model = BertForMaskedLM(BertConfig(num_hidden_layers=8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(8):
        b, s = rng.choice([16, 32]), rng.choice([128, 256, 384, 512])
        ids = torch.randint(0, 30522, (b, s), device="cuda")
        labels = torch.where(torch.rand(b, s, device="cuda") < 0.15, ids, -100)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        step_done()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_done()
        ids = labels = loss = None


def decode(step_done, model, rng, steps, batches, lengths, tokens, new_tokens, masked=False, **generate):
    """Greedy decoding of `steps` random prompts (batch size from `batches`; prompt length, token
    ids and new tokens drawn from the ranges), the calls in the order each decoding workload
    made them when recorded."""
    with torch.inference_mode():
        for step in range(steps):
            b, s = rng.choice(batches), rng.randint(*lengths)
            ids = torch.randint(*tokens, (b, s), device="cuda")
            mask = {"attention_mask": torch.ones_like(ids)} if masked else {}
            model.generate(ids, **mask, max_new_tokens=rng.randint(*new_tokens), do_sample=False,
                           eos_token_id=None, **generate)
            mask = None
            torch.cuda.synchronize()
            step_done()
            ids = None


def llama_generate(step_done):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(44)
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                      num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    decode(step_done, model, random.Random(44), 5, [8, 16, 24], (64, 512), (0, 32000), (32, 96), pad_token_id=0)


def t5_generate(step_done):
    """T5-small greedy encoder-decoder decoding (written after the band's top was capped at
    what the run takes unconstrained, with nothing changed after it)."""
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(52)
    cfg = T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128, decoder_start_token_id=0)
    model = T5ForConditionalGeneration(cfg).to("cuda", torch.bfloat16).eval()
    decode(step_done, model, random.Random(52), 5, [16, 32, 48], (64, 384), (2, 32128), (16, 48),
           pad_token_id=0, decoder_start_token_id=0)


def gpt2_generate(step_done):
    """GPT-2 small greedy decoding with a KV cache (written with `t5_generate`)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(53)
    model = GPT2LMHeadModel(GPT2Config()).to("cuda", torch.bfloat16).eval()
    decode(step_done, model, random.Random(53), 5, [8, 16, 32], (64, 256), (0, 50257), (32, 64), masked=True,
           pad_token_id=0)


def bart_generate(step_done):
    """BART-base greedy encoder-decoder decoding (written after the memory outside the allocator
    was taken step by step, with nothing changed after it)."""
    from transformers import BartConfig, BartForConditionalGeneration
    torch.manual_seed(54)
    cfg = BartConfig(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                     decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072, vocab_size=50265)
    model = BartForConditionalGeneration(cfg).to("cuda", torch.bfloat16).eval()
    decode(step_done, model, random.Random(54), 4, [8, 16, 32], (64, 320), (3, 50265), (16, 40), masked=True,
           num_beams=1, pad_token_id=1, decoder_start_token_id=2, forced_bos_token_id=None,
           forced_eos_token_id=None)


def timm_train(step_done, name, seed, optimizer):
    """Six steps of a timm image model with channels-last convolutions under bf16 autocast."""
    import timm
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = timm.create_model(name, num_classes=1000).cuda().to(memory_format=torch.channels_last)
    opt = optimizer(model.parameters())
    for step in range(6):
        b, px = rng.choice([32, 48, 64]), rng.choice([160, 192, 224])
        x = torch.randn(b, 3, px, px, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (b,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        step_done()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_done()
        x = y = loss = None


def resnet_train(step_done):
    timm_train(step_done, "resnet50", 45, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))


def convnext_train(step_done):
    timm_train(step_done, "convnext_tiny", 51, lambda p: torch.optim.AdamW(p, lr=1e-4))


WORKLOADS = {"llama_ft": llama_ft, "gpt2_train": gpt2_train, "vit_train": vit_train,
             "bert_mlm": bert_mlm, "llama_generate": llama_generate, "resnet_train": resnet_train,
             "convnext_train": convnext_train, "t5_generate": t5_generate, "gpt2_generate": gpt2_generate,
             "bart_generate": bart_generate}


def one_try(workload, target, snapshot_path, out):
    """One run in a fresh CUDA context; `target` None means all free memory (the recording)."""
    torch.cuda.mem_get_info()  # the context, as in a recording, before the ballast
    free0, total = torch.cuda.mem_get_info()
    held = []
    if os.environ.get("FIT_PERTURB"):  # before the ballast, so the try has `target` free
        rng = random.Random(int(os.environ["FIT_PERTURB"]))
        bufs = [cupy.cuda.runtime.malloc(rng.choice([2, 4, 6, 20, 22, 40]) * MIB) for _ in range(6)]
        for b in bufs[::2]:
            cupy.cuda.runtime.free(b)
        held = bufs[1::2]
        free0, _ = torch.cuda.mem_get_info()
    ballast = cupy.cuda.runtime.malloc(free0 - target) if target is not None else None
    free1, _ = torch.cuda.mem_get_info()
    profile = []

    def step_done():
        free, _ = torch.cuda.mem_get_info()
        profile.append([time.time_ns() // 1000, free1 - free - torch.cuda.memory_reserved()])

    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=3_000_000)
    t0 = time.perf_counter()
    failure = None
    try:
        WORKLOADS[workload](step_done)
    except torch.OutOfMemoryError:
        failure = "oom"
    except Exception as e:  # cuDNN, cuBLAS: their memory outside the allocator ran out
        failure = (str(e).splitlines() or [type(e).__name__])[0][:200]
    fits = failure is None
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    stats = torch.cuda.memory_stats()
    free_end, _ = torch.cuda.mem_get_info()
    torch.cuda.memory._dump_snapshot(snapshot_path)
    torch.cuda.memory._record_memory_history(enabled=None)
    for b in held + ([ballast] if ballast is not None else []):
        cupy.cuda.runtime.free(b)
    out.put({
        "target_free": target, "free_at_start": free1, "fits": fits, "failure": failure, "seconds": round(seconds, 2),
        "total_memory": total, "free_at_end": free_end, "reserved_at_end": stats["reserved_bytes.all.current"],
        "outside_allocator_bytes": free1 - free_end - stats["reserved_bytes.all.current"],
        "outside_profile": profile, "memory_stats": dict(stats), "gpu": torch.cuda.get_device_name(),
    })


def run_try(workload, target, snapshot_path):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=one_try, args=(workload, target, snapshot_path, q))
    p.start()
    r = q.get(timeout=150)
    p.join()
    return r


def gz(src, dst):
    with open(src, "rb") as f, gzip.open(dst, "wb", compresslevel=6) as g:
        shutil.copyfileobj(f, g)
    os.remove(src)


def main():
    workload, conf, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf  # read when the child's allocator starts
    os.makedirs(outdir, exist_ok=True)
    name = workload + ("_" + conf.replace(":", "-").replace(",", "_") if conf else "")
    tmp = os.path.join(outdir, name + ".try.pickle")

    def show(r):
        brief = {k: v for k, v in r.items() if k not in ("memory_stats", "outside_profile", "gpu")}
        brief["peak_reserved"] = r["memory_stats"]["reserved_bytes.all.peak"]
        brief["ooms"], brief["retries"] = r["memory_stats"]["num_ooms"], r["memory_stats"]["num_alloc_retries"]
        print(json.dumps({"workload": name, "perturb": os.environ.get("FIT_PERTURB") or None, **brief}), flush=True)

    if len(sys.argv) > 5 and sys.argv[4] == "at":  # one try at each of these free bytes
        for target in map(int, sys.argv[5].split(",")):
            r = run_try(workload, target, tmp)
            show(r)
            gz(tmp, os.path.join(outdir, f"{name}.at-{r['free_at_start']}.pickle.gz"))
        return
    if len(sys.argv) > 5:  # go on from a bracket: LO and HI free bytes
        bisect(workload, name, outdir, tmp, int(sys.argv[4]), int(sys.argv[5]), show, None)
        return
    rec = run_try(workload, None, tmp)
    show(rec)
    gz(tmp, os.path.join(outdir, name + ".pickle.gz"))
    meta = {
        "workload": name, "alloc_conf": conf, "history": "full", "torch": torch.__version__,
        "cuda": torch.version.cuda, "gpu": rec["gpu"], "total_memory": rec["total_memory"],
        "free_at_start": rec["free_at_start"], "free_at_end": rec["free_at_end"],
        "outside_allocator_bytes": rec["outside_allocator_bytes"], "outside_profile": rec["outside_profile"],
        "workload_seconds": rec["seconds"],
    }
    with open(os.path.join(outdir, name + ".json"), "w") as f:
        json.dump({"meta": meta, "memory_stats": rec["memory_stats"]}, f, indent=1, sort_keys=True)

    st = rec["memory_stats"]
    # Some libraries (cuDNN's attention) take memory for a moment outside the allocator, more
    # than what is still held at the end: the upper end leaves 512 MiB for that.
    lo, hi = st["allocated_bytes.all.peak"], st["reserved_bytes.all.peak"] + rec["outside_allocator_bytes"] + 512 * MIB
    bisect(workload, name, outdir, tmp, lo, hi, show, rec["seconds"])


def bisect(workload, name, outdir, tmp, lo, hi, show, seconds):
    """Try both ends, then halve until the bracket is as narrow as the module docstring says."""
    # Never finer than the ballast's 2 MiB pages: a target between two pages gets the lower
    # one's free memory, so the bracket would stop narrowing.
    resolution = max(int(os.environ.get("FIT_STEP_MIB", 0)) * MIB or max(8 * MIB, lo // 512), 2 * MIB)
    best_fit = best_oom = None

    def attempt(target):
        nonlocal best_fit, best_oom
        r = run_try(workload, target, tmp)
        show(r)
        if r["fits"]:
            best_fit = r
        else:
            best_oom = r
        gz(tmp, os.path.join(outdir, name + (".fit" if r["fits"] else ".oom") + ".pickle.gz"))

    for target in [hi, lo]:
        attempt(target)
    deadline = float(os.environ.get("FIT_DEADLINE", "inf"))  # unix time: stop bisecting, keep what is known
    while best_fit and best_oom and best_fit["free_at_start"] - best_oom["free_at_start"] > resolution:
        if time.time() + 2 * (seconds or best_fit["seconds"]) + 10 > deadline:
            break
        before = (best_fit["free_at_start"], best_oom["free_at_start"])
        attempt((best_fit["free_at_start"] + best_oom["free_at_start"]) // 2)
        if (best_fit["free_at_start"], best_oom["free_at_start"]) == before:
            break  # the try landed on an end already known: the bracket cannot narrow
    print(json.dumps({"summary": name, "perturb": os.environ.get("FIT_PERTURB") or None,
                      "alloc_conf": os.environ["PYTORCH_CUDA_ALLOC_CONF"],
                      "real_oom_free": best_oom and best_oom["free_at_start"],
                      "real_fits_free": best_fit and best_fit["free_at_start"],
                      "outside_allocator_bytes_at_fit": best_fit and best_fit["outside_allocator_bytes"],
                      "gpu": (best_fit or best_oom)["gpu"], "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
