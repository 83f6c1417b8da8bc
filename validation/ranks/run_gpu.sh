#!/bin/bash
# The evidence for per-rank jobs, on a machine with two GPUs (0 and 1), written to OUT:
# DDP and FSDP2 training of validation/ranks/train.py recorded with allocsim.capture under
# torchrun (OUT/{ddp,fsdp2}_rank{0,1}.pickle.gz and sidecars), the same training on one GPU at
# two batch sizes (OUT/bs8, OUT/bs12), then the FSDP2 job's real threshold bisected on both
# GPUs (OUT/job_fit_fsdp2.jsonl). Usage: validation/ranks/run_gpu.sh OUT
set -u
out=$1
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cap=python/allocsim/capture.py
for mode in ddp fsdp2; do
  CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 --master-port 29511 \
    $cap "$out/$mode.pickle.gz" -- validation/ranks/train.py $mode 2>&1 | grep -v Warning | tail -4
done
for b in 8 12; do
  CUDA_VISIBLE_DEVICES=0 python3 $cap "$out/bs$b.pickle.gz" -- validation/ranks/train.py single --batch $b 2>&1 | tail -2
done
# Bisect between the most any rank allocated (cannot fit) and the most any rank reserved plus
# its memory outside the allocator and 256 MiB (must fit).
read -r lo hi < <(python3 - "$out" <<'PY'
import json, sys
ranks = [json.load(open(f"{sys.argv[1]}/fsdp2_rank{r}.json")) for r in (0, 1)]
lo = max(s["memory_stats"]["allocated_bytes.all.peak"] for s in ranks)
hi = max(s["memory_stats"]["reserved_bytes.all.peak"] + s["meta"]["outside_allocator_bytes"] for s in ranks)
print(lo, hi + (256 << 20))
PY
)
CUDA_VISIBLE_DEVICES=0,1 python3 validation/ranks/job_fit.py fsdp2 "$out" "$lo" "$hi" 4
