"""Training with non-reentrant gradient checkpointing, bf16 autocast, AdamW."""
import torch
from common import GPT, train_steps

torch.manual_seed(0)
model = GPT(dim=1024, layers=12, checkpoint=True).cuda()
train_steps(model, batch=16, seq=1024)
