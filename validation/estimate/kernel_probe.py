"""On the GPU machine: the allocations CUDA kernels make for themselves (reduction buffers,
embedding backward's sort, cuDNN attention's workspaces, dropout), over a sweep of shapes, as
`[case, [[action, size], ...]]` lines. The estimator's kernel models were checked against it.

    python3 kernel_probe.py OUT.json
"""
import json, sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode


def counters():
    s = torch.cuda.memory_stats_as_nested_dict()["allocation"]["all"]
    return s["allocated"] + s["freed"]


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        e0 = counters()
        out = func(*args, **(kwargs or {}))
        self.ops.append([str(func), e0, counters()])
        return out


def cases():
    for n in (1000, 4096, 8192, 12000, 16384, 32768, 65536, 100000):
        for vocab in (2, 64, 512, 1000, 32000, 50257):
            for dt in (torch.float32, torch.bfloat16):
                w = torch.randn(vocab, 256, device="cuda", dtype=dt, requires_grad=True)
                idx = torch.randint(0, vocab, (n,), device="cuda")
                yield f"emb n={n} vocab={vocab} dim=256 {dt}", lambda w=w, idx=idx: F.embedding(idx, w).sum().backward()
    for shape in ((8192, 1024), (8192, 4096), (8192, 3072), (16384, 1024), (1000, 1000), (4, 1024, 768),
                  (32, 128), (100000, 64), (64, 100000), (512, 50257), (3, 7), (1 << 20, 8)):
        for dt in (torch.float32, torch.bfloat16):
            x = torch.randn(shape, device="cuda", dtype=dt)
            dims = list(range(len(shape) - 1))
            yield f"sum {list(shape)} dims={dims} {dt}", lambda x=x, dims=dims: x.sum(dims)
            yield f"sum {list(shape)} dims=[-1] {dt}", lambda x=x: x.sum(-1)
            yield f"sum {list(shape)} all {dt}", lambda x=x: x.sum()
    for b, h, s, d in ((8, 16, 1024, 64), (8, 12, 1024, 128), (2, 8, 512, 64), (4, 16, 2048, 64), (1, 32, 4096, 128),
                       (8, 16, 333, 64), (2, 4, 100, 32)):
        for causal in (True, False):
            for grad in (True, False):
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=grad) for _ in range(3))
                def run(q=q, k=k, v=v, causal=causal, grad=grad):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    if grad:
                        o.backward(torch.ones_like(o))
                yield f"sdpa b={b} h={h} s={s} d={d} causal={causal} grad={grad}", run
        q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        yield f"sdpa decode b={b} h={h} s={s} d={d}", lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v)
    # With a padding mask (as BERT passes one) SDPA takes the memory-efficient kernel.
    for b, h, s, d in ((16, 12, 512, 64), (8, 16, 1024, 64), (2, 8, 333, 128), (4, 4, 100, 32), (1, 32, 2048, 128)):
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            for p in (0.0, 0.1):
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
                mask = torch.zeros(b, 1, 1, s, device="cuda", dtype=dt)

                def run(q=q, k=k, v=v, mask=mask, p=p):
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
                    o.backward(torch.ones_like(o))
                yield f"masked b={b} h={h} s={s} d={d} {dt} p={p}", run
    for shape in ((8192, 1024), (1000, 7), (4, 1024, 768)):
        for dt in (torch.float32, torch.bfloat16):
            x = torch.randn(shape, device="cuda", dtype=dt)
            yield f"dropout {list(shape)} {dt}", lambda x=x: F.dropout(x, 0.1, training=True)


def main():
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=10_000_000, stacks="python")
    log, mode = [], OpLog()
    for name, fn in cases():
        torch.cuda.synchronize()
        mode.ops = []
        with mode:
            fn()
        torch.cuda.synchronize()
        log.append([name, mode.ops])
    snap = torch.cuda.memory._snapshot()
    events = [[e["action"], e["size"]] for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested")]
    with open(sys.argv[1], "w") as f:
        for name, ops in log:
            f.write(json.dumps([name, [[op, events[a:b]] for op, a, b in ops if b > a]]) + "\n")


if __name__ == "__main__":
    main()
