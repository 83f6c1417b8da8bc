"""Finds its batch size by catching OOMs, as accelerate's find_executable_batch_size does:
start at 256 and halve until a training step fits in 10 % of the card."""
import gc
import torch
from common import GPT, train_steps

torch.manual_seed(0)
torch.cuda.set_per_process_memory_fraction(0.1)
model = GPT(dim=1024, layers=8).cuda()
batch = 256
while batch:
    try:
        train_steps(model, batch=batch, seq=1024, steps=1)
        break
    except torch.OutOfMemoryError:
        for p in model.parameters():
            p.grad = None
        gc.collect()
        torch.cuda.empty_cache()
        batch //= 2
print(f"batch size found: {batch}")
