"""A GPT-2 training job whose ranks differ: each rank draws its own sequence lengths, rank r
from longer ones than rank r-1, so one rank decides how much memory the job needs.

    torchrun --nproc-per-node 2 python/allocsim/capture.py OUT/ddp.pickle.gz -- \
        validation/ranks/train.py ddp          # or fsdp2; writes OUT/ddp_rank{0,1}.pickle.gz
    python3 python/allocsim/capture.py OUT/bs8.pickle.gz -- validation/ranks/train.py single --batch 8

MODE is `ddp` (DistributedDataParallel), `fsdp2` (`fully_shard` on every block and the root)
or `single` (one GPU, no process group). With FIT_FREE=BYTES each rank first takes all free
memory of its GPU but BYTES with a ballast `cudaMalloc` outside PyTorch's allocator (what
`job_fit.py` bisects).
"""
import argparse, os, random

import torch

MIB = 1 << 20


def ballast(device):
    """All free memory but FIT_FREE, taken outside the allocator; the free memory left."""
    torch.cuda.mem_get_info(device)  # the CUDA context exists from here
    target = os.environ.get("FIT_FREE")
    if target is None:
        return None
    import cupy
    with cupy.cuda.Device(device):
        free, _ = torch.cuda.mem_get_info(device)
        globals()["_ballast"] = cupy.cuda.runtime.malloc(max(free - int(target), 0))
    return torch.cuda.mem_get_info(device)[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["ddp", "fsdp2", "single"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", 0))
    device = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(device)
    free = ballast(device)
    if free is not None:
        print(f"rank {rank}: free {free}", flush=True)
    if args.mode != "single":
        torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", device))

    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(51)
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers, n_embd=768, n_head=12)).cuda()
    if args.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device])
    elif args.mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(51 + rank)
    lengths = [256 + 128 * rank, 512 + 256 * rank, 768 + 256 * rank]
    for step in range(args.steps):
        s = rng.choice(lengths)
        ids = torch.randint(0, 50257, (args.batch, s), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ids = loss = None
    torch.cuda.synchronize()
    if args.mode != "single":
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
