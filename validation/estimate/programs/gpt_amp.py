"""Eager training with bf16 autocast and AdamW: a GPT of 8 layers, 3 steps."""
import torch
from common import GPT, train_steps

torch.manual_seed(0)
model = GPT(dim=1024, layers=8).cuda()
train_steps(model, batch=8, seq=1024)
