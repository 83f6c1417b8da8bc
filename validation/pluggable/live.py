"""One real PyTorch run under PyTorch's own allocator or an allocsim policy (run on the GPU).

    python3 live.py WORKLOAD native|POLICY CONF OUT.json [--history DIR]

WORKLOAD is llama_ft, gpt2_train (validation/fit.py's seeded programs), kv_infer (Llama
generation with a growing KV cache, requests of random batch and length), gpt2_steady and
llama_steady (training at one batch shape for 30 steps, bound by the host: Python and kernel
launches), or gpt2_big and llama_big (the same, bound by the GPU: GPT-2 small at 32 x 1024
tokens; a 540 M-parameter Llama at 8 x 2048), the step-time benchmarks. `native` runs
PyTorch's caching allocator with PYTORCH_CUDA_ALLOC_CONF=CONF; a policy name runs allocsim's
through `crates/torch` (`allocsim_torch.use(POLICY, CONF)`). CONF `-` means none.
Writes OUT.json: peaks, OOM, the wall time of each step (CUDA synchronised at its end), and
for allocsim the calls and time spent in its malloc and free. With --history, also
DIR/NAME.pickle.gz, the snapshot with the whole history (PyTorch's `_record_memory_history`,
or allocsim's recording), and for allocsim DIR/NAME.allocsim, the op stream.
"""
import json, os, random, sys, time
from pathlib import Path

workload, mode, conf, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
conf = "" if conf == "-" else conf
history = Path(sys.argv[sys.argv.index("--history") + 1]) if "--history" in sys.argv else None
if mode == "native" and conf:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf

import torch  # noqa: E402

if mode != "native":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "crates/torch/python"))
    import allocsim_torch
    allocsim_torch.use(mode, conf, record=history is not None)
elif history:
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=5_000_000)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
torch.cuda.init()


def kv_infer(step_done):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    rng = random.Random(1)
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=6, num_attention_heads=16,
                      num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).to("cuda", dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        for _ in range(10):
            b, plen, new = rng.choice([1, 2, 4, 8]), rng.randint(16, 768), rng.randint(8, 40)
            ids = torch.randint(0, 32000, (b, plen), device="cuda")
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
            step_done()


def steady(step_done, model, vocab, batch, seq, steps=30):
    model = model.cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, vocab, (batch, seq), device="cuda")
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = None
        step_done()


def gpt2_steady(step_done):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(41)
    steady(step_done, GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)), 50257, 8, 512)


def gpt2_big(step_done):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(41)
    steady(step_done, GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)), 50257, 32, 1024)


def llama_big(step_done):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(30)
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=16,
                      num_key_value_heads=16, vocab_size=32000, max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg)
    model.config.use_cache = False
    steady(step_done, model, 32000, 8, 2048)


def llama_steady(step_done):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(30)
    cfg = LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=16,
                      num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    steady(step_done, model, 32000, 4, 1024)


if workload in ("kv_infer", "gpt2_steady", "llama_steady", "gpt2_big", "llama_big"):
    run = globals()[workload]
else:
    import fit  # validation/fit.py: the seeded training programs
    run = fit.WORKLOADS[workload]

steps = []
last = [time.perf_counter()]


def step_done():
    torch.cuda.synchronize()
    now = time.perf_counter()
    steps.append(now - last[0])
    last[0] = now


failure = None
t0 = time.perf_counter()
try:
    run(step_done)
except Exception as e:  # an OOM, or what a null block led to
    failure = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
torch.cuda.synchronize()
result = {"workload": workload, "mode": mode, "conf": conf, "failure": failure,
          "seconds": time.perf_counter() - t0, "step_seconds": steps}
if mode == "native":
    s = torch.cuda.memory_stats()
else:
    s = allocsim_torch.memory_stats()
    result["last_oom"] = allocsim_torch.last_oom()
for k in ["reserved_bytes.all.peak", "allocated_bytes.all.peak", "num_ooms", "num_alloc_retries",
          "num_device_alloc", "num_device_free", "allocsim.malloc_calls", "allocsim.malloc_ns",
          "allocsim.free_calls", "allocsim.free_ns"]:
    if k in s:
        result[k] = s[k]
result["memory_stats"] = {k: v for k, v in s.items() if not k.startswith("allocsim.")}
if history:
    history.mkdir(parents=True, exist_ok=True)
    name = f"{workload}.{mode}.{conf.replace(':', '-').replace(',', '_') or 'default'}"
    if mode == "native":
        import gzip, pickle
        with gzip.open(history / f"{name}.pickle.gz", "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)
    else:
        allocsim_torch.save_snapshot(history / f"{name}.pickle.gz")
        allocsim_torch.save_recording(history / f"{name}.allocsim")
Path(out).write_text(json.dumps(result))
print(json.dumps({k: v for k, v in result.items() if k not in ("memory_stats", "step_seconds")}))
