"""LoRA: a frozen bf16 GPT with trainable low-rank adapters on its attention projections."""
import torch
import torch.nn as nn
from common import GPT, train_steps

torch.manual_seed(0)


class LoRA(nn.Module):
    def __init__(self, base, rank=16):
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + (x @ self.a.t().to(x.dtype)) @ self.b.t().to(x.dtype)


model = GPT(dim=1536, layers=8, heads=12)
for p in model.parameters():
    p.requires_grad_(False)
model = model.to(torch.bfloat16)
for blk in model.blocks:
    blk.qkv = LoRA(blk.qkv)
    blk.proj = LoRA(blk.proj)
model = model.cuda()
train_steps(model, batch=8, seq=1024)
