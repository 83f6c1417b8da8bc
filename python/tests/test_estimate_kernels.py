"""The estimator's kernel models against what the same ops allocated on an H200
(validation/estimate/recorded/kernel_probe.jsonl, written there by kernel_probe.py): every
reduction, embedding backward, cuDNN attention and dropout case of the sweep, allocation for
allocation. Needs PyTorch (meta tensors only); without it the tests are reported as skipped."""
import json
import os
import re

import pytest

torch = pytest.importorskip("torch", reason="the kernel models are checked on PyTorch meta tensors")
from allocsim.estimate import kernels  # noqa: E402

PROBE = os.path.join(os.path.dirname(__file__), "..", "..", "validation", "estimate", "recorded", "kernel_probe.jsonl")
DTYPES = {"torch.float32": torch.float32, "torch.bfloat16": torch.bfloat16}


def probe(kind):
    with open(PROBE) as f:
        for line in f:
            name, ops = json.loads(line)
            if name.startswith(kind + " "):
                yield name, {op.split(".")[1]: [(a, s) for a, s in events] for op, events in ops}


def events(func, args, kwargs, outs):
    """The allocations and frees a plan makes, as the probe lists them: results' storages,
    scratch blocks freed newest first, workspaces kept."""
    out, held = [], []
    ctx = kernels.Context()
    for step in kernels.plan(func, args, kwargs, outs, ctx):
        if step[0] == "out":
            t = outs[step[1]]
            if isinstance(t, torch.Tensor):
                out.append(("alloc", t.untyped_storage().nbytes()))
        elif step[0] == "free":
            out.append(("free_requested", held.pop(step[1] if len(step) > 1 else -1)))
        elif step[0] in ("tmp", "keep"):
            out.append(("alloc", step[1]))
            if step[0] == "tmp":
                held.append(step[1])
    # What is still held is freed when the op ends, in an order that leaves the allocator as
    # any other would: compared as a set.
    return out + sorted(("free_requested", s) for s in held)


def same(a, b):
    """Equal, trailing frees compared as a set."""
    def split(ev):
        i = len(ev)
        while i and ev[i - 1][0] == "free_requested":
            i -= 1
        return ev[:i], sorted(ev[i:])
    return split(a) == split(b)


def test_reductions_take_the_gpus_buffers():
    cases = 0
    for name, ops in probe("sum"):
        shape, dims, dtype = re.match(r"sum \[(.*)\] (dims=\[.*\]|all) (\S+)", name).groups()
        x = torch.empty([int(s) for s in shape.split(",")], dtype=DTYPES[dtype], device="meta")
        if dims == "all":
            func, args, out = torch.ops.aten.sum.default, (x,), x.sum()
        else:
            d = json.loads(dims.removeprefix("dims="))
            func, args, out = torch.ops.aten.sum.dim_IntList, (x, d), x.sum(d)
        real = ops["sum"]
        # The output's storage on the GPU: its elements (a 0-d sum has one).
        assert real[0] == ("alloc", out.numel() * out.element_size()), name
        assert same(events(func, args, {}, [out]), real), name
        cases += 1
    assert cases == 72


def test_embedding_backward_takes_the_gpus_scratch():
    cases = 0
    for name, ops in probe("emb"):
        n, vocab, dim, dtype = re.match(r"emb n=(\d+) vocab=(\d+) dim=(\d+) (\S+)", name).groups()
        n, vocab, dim = int(n), int(vocab), int(dim)
        # The probe's gradient is a broadcast ones (sum().backward()): the kernel copies it.
        grad = torch.empty((), dtype=DTYPES[dtype], device="meta").expand(n, dim)
        indices = torch.empty(n, dtype=torch.long, device="meta")
        out = torch.empty(vocab, dim, dtype=DTYPES[dtype], device="meta")
        func = torch.ops.aten.embedding_dense_backward.default
        assert same(events(func, (grad, indices, vocab, -1, False), {}, [out]), ops["embedding_dense_backward"]), name
        cases += 1
    assert cases == 96


def test_cudnn_attention_and_dropout_allocate_in_the_gpus_order():
    cases = 0
    for name, ops in probe("sdpa"):
        b, h, s, d = map(int, re.search(r"b=(\d+) h=(\d+) s=(\d+) d=(\d+)", name).groups())
        grad = "grad=True" in name
        rows = 1 if "decode" in name else s
        q = torch.empty(b, h, rows, d, dtype=torch.bfloat16, device="meta")
        kv = torch.empty(b, h, s, d, dtype=torch.bfloat16, device="meta")
        seed = torch.empty((), dtype=torch.long, device="meta")
        outs = [q.new_empty(q.shape), torch.empty(b, h, rows, dtype=torch.float32, device="meta"),
                None, None, 0, 0, seed, seed.new_empty(()), None]
        fwd = torch.ops.aten._scaled_dot_product_cudnn_attention.default
        real = ops["_scaled_dot_product_cudnn_attention"]
        if "decode" in name and len(real) > 3:
            continue  # long keys: cuDNN splits them and takes a workspace not modelled
        assert same(events(fwd, (q, kv, kv, None, grad), {}, outs), real), name
        if grad:
            bwd = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default
            grads = [q.new_empty(q.shape), kv.new_empty(kv.shape), kv.new_empty(kv.shape)]
            assert same(events(bwd, (q, q, kv, kv), {}, grads), ops["_scaled_dot_product_cudnn_attention_backward"]), name
        cases += 1
    for name, ops in probe("dropout"):
        shape, dtype = re.match(r"dropout \[(.*)\] (\S+)", name).groups()
        x = torch.empty([int(s) for s in shape.split(",")], dtype=DTYPES[dtype], device="meta")
        outs = [x.new_empty(x.shape), torch.empty(x.shape, dtype=torch.bool, device="meta")]
        assert same(events(torch.ops.aten.native_dropout.default, (x, 0.1, True), {}, outs), ops["native_dropout"]), name
        cases += 1
    assert cases == 39


def test_masked_attention_takes_the_gpus_kernel_and_scratch():
    """A padding mask: cuDNN's kernel at half precision, the memory-efficient one in float32."""
    cases = 0
    for name, ops in probe("masked"):
        b, h, s, d = map(int, re.search(r"b=(\d+) h=(\d+) s=(\d+) d=(\d+)", name).groups())
        dtype = {"torch.float32": torch.float32, "torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16}[
            name.split()[5]]
        q = torch.empty(b, h, s, d, dtype=dtype, device="meta")
        grads = [q.new_empty(q.shape) for _ in range(3)]
        if dtype == torch.float32:
            bwd = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default
            real = ops["_scaled_dot_product_efficient_attention_backward"]
            assert same(events(bwd, (q, q, q, q, None, q), {}, grads), real), name
        else:
            bwd = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default
            real = ops["_scaled_dot_product_cudnn_attention_backward"]
            assert same(events(bwd, (q, q, q, q), {}, grads), real), name
        cases += 1
    assert cases == 30
