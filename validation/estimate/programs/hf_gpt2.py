"""A Hugging Face model built from its config (no download): GPT-2 medium-sized, bf16 autocast,
AdamW, 3 steps."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
config = GPT2Config(n_layer=12, n_embd=1024, n_head=16, n_positions=1024)
model = GPT2LMHeadModel(config).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(3):
    idx = torch.randint(0, config.vocab_size, (8, 1024), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx, labels=idx).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
