"""The estimator's speed bound: one training step of a 1-billion-parameter GPT (18 layers of
width 2048, bf16 autocast, AdamW), built on the device it runs on.

    python -m allocsim.estimate --total-memory H200 -- benches/estimate/gpt_1b.py   # estimated
    GPT_DEVICE=meta python benches/estimate/gpt_1b.py                              # the model's Python alone
                                                                                    (meta tensors, no autocast)

Prints the parameter count and the CPU seconds of building the model and of the step.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "validation", "estimate", "programs"))
from common import GPT  # noqa: E402

device = os.environ.get("GPT_DEVICE", "cuda")
t0 = time.process_time()
with torch.device(device):
    model = GPT(vocab=32000, dim=2048, layers=18, heads=16)
t1 = time.process_time()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
idx = torch.randint(0, 32000, (4, 1024), device=device)
# The meta device has no autocast: there the step runs in float32, a few casts fewer.
with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
    logits = model(idx)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), idx.view(-1))
loss.backward()
opt.step()
opt.zero_grad(set_to_none=True)
t2 = time.process_time()
params = sum(p.numel() for p in model.parameters())
print(f"{params / 1e9:.2f} B parameters on {device}: build {t1 - t0:.1f} s, one step {t2 - t1:.1f} s (CPU)", flush=True)
