"""What PyTorch's CUDA kernels allocate through the caching allocator beyond their outputs, and in
which order: the part of a real run's allocation stream that meta kernels never produce.

Each model follows the cause in PyTorch 2.11's (and its bundled cuDNN's and CUB's) source and
was checked against recordings of the same op on an H200 over a sweep of shapes
(`validation/estimate/kernel_probe.py`); where a size comes from a library's internals rather
than from PyTorch's code, the comment says it was read off that probe.

`plan(func, args, kwargs, outs, ctx)` returns the op's allocation steps, in order:
`("out", i)` allocates the storages of the op's `i`-th result; `("tmp", size)` allocates a
scratch block and `("free",)` frees the newest one still held (`("free", -2)` the one before
it; scratch blocks left at the end are freed then, newest first, as C++ destructors run); `("keep", size)` allocates a block kept
for the process's life (a library's workspace); `("none", i)` marks the `i`-th result as
taking no device memory (the GPU kernel leaves it empty). Ops without a model allocate their
results in order.
"""

from __future__ import annotations

import math
from typing import Optional


def _outs(n: int) -> list:
    return [("out", i) for i in range(n)]


def _align(n: int, to: int = 256) -> int:
    return (n + to - 1) // to * to


# --- cuBLAS ------------------------------------------------------------------------------------
# Workspaces live in maps keyed by (handle, stream) and are kept for the process's life
# (CublasHandlePool.cpp). Handles come from a per-thread pool, so the autograd engine's device
# thread gets its own. Every BLAS call takes the cuBLAS workspace (CUBLAS_WORKSPACE_CONFIG's
# default on sm90: 32 MiB); calls that go through cuBLASLt (addmm with a bias vector) also take
# cuBLASLt's (1 MiB). Both are allocated after the op's output.
CUBLAS_WORKSPACE = 32 << 20
CUBLASLT_WORKSPACE = 1 << 20
_BLAS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "_addmm_activation", "_int_mm"}
_BLAS_LT = {"_addmm_activation", "_scaled_mm"}


def _blas(name: str, args, kwargs, outs, ctx) -> Optional[list]:
    if name not in _BLAS and name not in _BLAS_LT:
        return None
    steps = _outs(len(outs))
    if ctx.keep(("cublas", ctx.thread, ctx.stream)):
        steps.append(("keep", CUBLAS_WORKSPACE))
    bias = args[0] if args else None
    lt = name in _BLAS_LT or (name == "addmm" and getattr(bias, "dim", lambda: 0)() == 1)
    if lt and ctx.keep(("cublaslt", ctx.thread, ctx.stream)):
        steps.append(("keep", CUBLASLT_WORKSPACE))
    return steps


# --- Reductions (ATen/native/cuda/Reduce.cuh) ---------------------------------------------------
# A reduction whose inputs per output are many and outputs few splits each output over several
# blocks (ctas_per_output > 1): the partial results go to a scratch buffer, with a semaphore per
# output block, both from the caching allocator after the output (setReduceConfig,
# gpu_reduce_kernel).
_H200 = {"sms": 132, "threads_per_sm": 2048, "warp": 32}


def _last_pow2(n: int, cap: int) -> int:
    while cap > 1 and n < cap:
        cap //= 2
    return cap


def _iter_dims(shape, strides, reduced):
    """TensorIterator's view of a reduction: reduced dims first, fastest first within each
    group, size-1 dims dropped, neighbours coalesced where the input's strides allow (the
    output's strides are 0 over reduced dims and contiguous over the others)."""
    dims = [(size, stride, d in reduced) for d, (size, stride) in enumerate(zip(shape, strides)) if size != 1]
    dims.sort(key=lambda x: (not x[2], x[1], x[0]))
    out = []
    for size, stride, red in dims:
        if out and out[-1][2] == red and out[-1][1] * out[-1][0] == stride:
            prev = out.pop()
            out.append((prev[0] * size, prev[1], red))
        else:
            out.append((size, stride, red))
    return out


def reduction_scratch(shape, strides, reduced, acc_bytes: int,
                      device=_H200, max_threads: int = 512, input_vec: int = 4) -> Optional[tuple]:
    """(buffer bytes, semaphore bytes) of a reduction that reduces over a global buffer, else
    None. Strides in elements; the output is assumed aligned (the caching allocator's blocks
    are)."""
    dims = _iter_dims(shape, strides, set(reduced))
    numel = math.prod(s for s, _, _ in dims)
    n_red = sum(1 for _, _, r in dims if r)
    num_outputs = math.prod(s for s, _, r in dims if not r)
    if numel == 0 or num_outputs == 0:
        return None
    inputs_per_output = numel // num_outputs
    if dims:
        fastest_reduced = n_red == len(dims) or dims[0][1] < dims[n_red][1]
        fastest_stride = dims[0][1] if fastest_reduced else dims[n_red][1]
        dim0, dim1 = (inputs_per_output, num_outputs) if fastest_reduced else (num_outputs, inputs_per_output)
    else:
        fastest_reduced, fastest_stride, dim0, dim1 = True, 1, 1, 1
    output_vec = 1
    if fastest_stride == 1:
        if fastest_reduced and dim0 >= 128 and n_red == 1:
            dim0 //= input_vec
        elif not fastest_reduced:
            output_vec = 4
            sizes = [dims[n_red][0]] + [st for i, (_, st, _) in enumerate(dims) if i != n_red]
            while output_vec > 1 and any(x % output_vec for x in sizes):
                output_vec //= 2
            dim0 //= output_vec
    threads = max_threads // output_vec
    d0, d1 = _last_pow2(dim0, threads), _last_pow2(dim1, threads)
    width = min(d0, device["warp"])
    height = min(d1, threads // width)
    width = min(d0, threads // height)
    step_input, step_output, block_x_reduce = 1, 1, False
    if not dims or fastest_reduced:
        step_input, block_x_reduce = width, True
    else:
        step_output = width
    values_per_thread = -(-inputs_per_output // step_input)
    if values_per_thread < min(height * 16, 256):
        return None
    step_input *= height
    values_per_thread = -(-inputs_per_output // step_input)
    grid_x = -(-(num_outputs // output_vec) // step_output)
    target = device["sms"] * (device["threads_per_sm"] // (width * height))
    if values_per_thread < 256 or grid_x > target:
        return None
    ctas = max(-(-values_per_thread // 256), min(-(-target // grid_x), -(-values_per_thread // 16)))
    if ctas <= 1:
        return None
    buffer = acc_bytes * num_outputs * ctas * (1 if block_x_reduce else width * output_vec)
    return buffer, 4 * grid_x


_SUM_LIKE = {"sum", "mean", "nansum"}


def _reduction(name: str, args, kwargs, outs, ctx) -> Optional[list]:
    if name not in _SUM_LIKE or not args or not hasattr(args[0], "shape"):
        return None
    x = args[0]
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = range(x.dim())
    elif isinstance(dims, int):
        dims = [dims]
    reduced = [d % max(x.dim(), 1) for d in dims]
    # The accumulator: float for floating types narrower than double, else 8 bytes.
    acc = 4 if x.dtype.is_floating_point and x.element_size() < 8 else 8
    scratch = reduction_scratch(tuple(x.shape), tuple(x.stride()), reduced, acc)
    steps = _outs(len(outs))
    if scratch:
        steps += [("tmp", scratch[0]), ("tmp", scratch[1])]
    return steps


# --- cuDNN scaled dot product attention (attention.cu, MHA.cpp) ----------------------------------
def _sdpa_cudnn(name: str, args, kwargs, outs, ctx) -> Optional[list]:
    if name == "_scaled_dot_product_cudnn_attention":
        # Outputs: out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox seed, philox
        # offset, debug mask. The seed and offset are made first; then the output and the
        # log-sum-exp when a backward needs it (else it is empty on the GPU, whatever size the
        # meta kernel gives it); then cuDNN's workspace, freed at once. Its
        # size (256 bytes) was read off the probe; a one-row query (decoding) runs with none
        # for key lengths up to 1024 (longer ones split the keys and take more: not modelled).
        q = args[0]
        lse = args[4] if len(args) > 4 else kwargs.get("compute_log_sumexp", True)
        order = [6, 7, 0] + ([1] if lse else [])
        steps = [("out", i) for i in order if i < len(outs)]
        steps += [("out", i) if i != 1 else ("none", 1) for i in range(len(outs)) if i not in order]
        if q.shape[-2] > 1:
            steps += [("tmp", 256)]
        return steps
    if name in ("_scaled_dot_product_efficient_attention", "_efficient_attention_forward"):
        # Output, log-sum-exp, then the philox seed and offset, which live on the host
        # outside a CUDA graph capture (see "Seed and Offset Device" in attention.cu).
        return [("out", 0), ("out", 1)] + [("none", i) for i in range(2, len(outs))]
    if name == "_scaled_dot_product_efficient_attention_backward" and args[1].dtype.is_floating_point \
            and args[1].element_size() == 4:
        # The gradients; then delta = (dO * O).sum(-1), transposed and made contiguous (the
        # float32 product and the sum freed when done); then CUTLASS's workspace: float32
        # accumulators over the query rows padded to 64 (one, for dQ; two at head size 32),
        # and an int per 16 padded rows. Read off the probe (float32 only: at half precision
        # the H200 takes cuDNN's kernel).
        *batch, rows, head = args[1].shape
        bh = math.prod(batch)
        padded = -(-rows // 64) * 64
        accumulators = 2 if head <= 32 else 1
        return _outs(len(outs)) + [
            ("tmp", args[1].numel() * 4), ("tmp", bh * rows * 4), ("tmp", bh * rows * 4),
            ("free", -2), ("free", -2),
            ("tmp", bh * (accumulators * padded * head * 4 + padded // 4))]
    if name == "_scaled_dot_product_cudnn_attention_backward":
        # dq, dk, dv, then the workspace: a float32 accumulator for dq, a float32 row sum of
        # dO * O, and 256 bytes more (read off the probe).
        *batch, rows, head = args[1].shape
        bh = math.prod(batch)
        return _outs(len(outs)) + [("tmp", bh * rows * head * 4 + bh * rows * 4 + 256)]
    return None


# --- Foreach norm (ForeachReduceOp.cu): one partial sum per chunk of 65536 elements of each
# tensor, in the op-math type, zeroed before the results and freed when the op ends.
_FOREACH_CHUNK = 65536


def _foreach_norm(name: str, args, kwargs, outs, ctx) -> Optional[list]:
    if name != "_foreach_norm" or not args or not args[0]:
        return None
    tensors = args[0]
    chunks = max(-(-t.numel() // _FOREACH_CHUNK) for t in tensors)
    opmath = 8 if tensors[0].element_size() == 8 and tensors[0].dtype.is_floating_point else 4
    return [("tmp", opmath * len(tensors) * chunks)] + _outs(len(outs))


# --- Layer norm (layer_norm_kernel.cu): a strided input is made contiguous first, the copy freed
# when the op ends.
def _layer_norm(name: str, args, kwargs, outs, ctx) -> Optional[list]:
    if name != "native_layer_norm" or args[0].is_contiguous():
        return None
    x = args[0]
    return [("tmp", x.numel() * x.element_size())] + _outs(len(outs))


# --- Dropout (Dropout.cu): the mask is made before the output. --------------------------------
def _dropout(name: str, args, kwargs, outs, ctx) -> Optional[list]:
    if name != "native_dropout" or len(outs) != 2:
        return None
    return [("out", 1), ("out", 0)]


# --- Embedding (Embedding.cpp): indices of more than one dimension are flattened for
# index_select; indices that cannot be flattened in place (a broadcast, say) are copied first,
# the copy freed when the op ends.
def _flattens_in_place(t) -> bool:
    dims = [(size, stride) for size, stride in zip(t.shape, t.stride()) if size != 1]
    return all(dims[i][1] == dims[i + 1][1] * dims[i + 1][0] for i in range(len(dims) - 1))


def _embedding(name: str, args, kwargs, outs, ctx) -> Optional[list]:
    if name != "embedding" or len(args) < 2:
        return None
    indices = args[1]
    if indices.dim() <= 1 or _flattens_in_place(indices):
        return None
    return [("tmp", indices.numel() * indices.element_size())] + _outs(len(outs))


# --- Embedding backward (EmbeddingBackwardKernel.cu) --------------------------------------------
# More than 3072 indices take the sorting path: indices sorted with their positions (CUB radix
# sort), segments of equal indices found (unique_by_key), partial sums per segment of at most
# NROWS_PER_THREAD rows, each with a float row. CUB's temporary storage is AliasTemporaries'
# layout (each piece aligned to 256 bytes, plus 255); the tile sizes were read off the probe.
_NROWS_PER_THREAD = 10


def _cub_sort_pairs_bytes(n: int) -> int:
    # onesweep, 64-bit keys and values, 8 passes: bins, lookback per 4608-item tile, the
    # alternate key and value buffers, counters
    return 255 + _align(8 * 256 * 8) + _align(-(-n // 4608) * 256 * 4) + 2 * _align(8 * n) + _align(8 * 4)


def _cub_tile_state_bytes(n: int, tile: int) -> int:
    return 255 + _align(16 * (48 + -(-n // tile)))


def _embedding_backward(name: str, args, kwargs, outs, ctx) -> Optional[list]:
    if name != "embedding_dense_backward" or len(outs) != 1:
        return None
    grad, indices, num_weights = args[0], args[1], args[2]
    scale_by_freq = args[4] if len(args) > 4 else kwargs.get("scale_grad_by_freq", False)
    n = indices.numel()
    dim = grad.shape[-1]
    # The indices, then the gradient, made contiguous first (copies held to the end).
    steps = [("tmp", t.numel() * t.element_size()) for t in (indices, grad) if not t.is_contiguous()]
    if n <= 3072 and not scale_by_freq:
        return steps + [("out", 0)]
    idx = 8 * n
    m = min(n, num_weights)
    partial = n // _NROWS_PER_THREAD + m
    acc = 8 if grad.element_size() == 8 else 4
    steps += [("tmp", idx), ("tmp", idx), ("tmp", idx), ("tmp", _cub_sort_pairs_bytes(n)), ("free",), ("free",),
              ("out", 0),
              ("tmp", idx), ("tmp", 8), ("tmp", idx), ("tmp", _cub_tile_state_bytes(n, 4096)), ("free",), ("free",),
              ("tmp", 8 * m), ("tmp", 8 * m), ("tmp", _cub_tile_state_bytes(m, 896)), ("free",),
              ("tmp", 8), ("tmp", 8 * partial)]
    # Then a float row per partial segment, summed into grad_weight after; with few rows in
    # the table and many indices per row (at most 512 rows, 32 or more indices per row, as
    # the probe draws the line) an index per partial segment instead, the sums going to a
    # float copy of grad_weight when it is of half precision.
    if num_weights <= 512 and n >= 32 * num_weights:
        steps.append(("tmp", 8 * partial))
        if grad.element_size() < 4:
            steps += [("tmp", num_weights * dim * 4), ("free",)]
        return steps
    return steps + [("tmp", partial * dim * acc)]


_MODELS: list = [_blas, _reduction, _sdpa_cudnn, _foreach_norm, _layer_norm, _dropout, _embedding, _embedding_backward]


class Context:
    """What a model may ask of the run: the stream and thread an op runs on, and whether a
    per-(handle, stream) workspace is new (`keep` records it). `backward_ran`: whether any op
    ran on the autograd engine's device thread; `cudnn_used`: whether any op called cuDNN."""

    def __init__(self) -> None:
        self.kept: set = set()
        self.thread = "main"
        self.stream = 0
        self.backward_ran = False
        self.cudnn_used = False

    def keep(self, key) -> bool:
        if key in self.kept:
            return False
        self.kept.add(key)
        return True


# Ops that run cuDNN on an sm90 card with PyTorch 2.11.
_CUDNN = {"convolution", "convolution_backward", "_convolution", "cudnn_convolution", "cudnn_batch_norm",
          "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"}


def plan(func, args, kwargs, outs: list, ctx: Context) -> list:
    name = func._opname
    ctx.cudnn_used |= name in _CUDNN
    for model in _MODELS:
        steps = model(name, args, kwargs, outs, ctx)
        if steps is not None:
            return steps
    return _outs(len(outs))

