#!/usr/bin/env bash
# On the GPU machine: record each program with allocsim.capture, then bisect the real threshold
# of three of them. Everything lands in $OUT/estimate-gpu.tar.gz.
set -u
cd "$(dirname "$0")"
out=${OUT:-/tmp/out}/estimate-gpu; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/programs
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(), torch.cuda.mem_get_info())" | tee "$out/device.txt"
for p in gpt_amp gpt_checkpoint convnet lora kv_infer moe_routing find_batch hf_gpt2 llama_fp16 bert_mlm vit_timm; do
  (cd programs && timeout 300 python3 ../../../python/allocsim/capture.py "$out/$p.pickle.gz" -- "$p.py") > "$out/$p.log" 2>&1
  echo "$p: exit $?"; tail -2 "$out/$p.log"
done
for p in ${BISECT:-gpt_amp convnet lora}; do
  peak=$(python3 -c "import json; print(json.load(open('$out/$p.json'))['memory_stats']['reserved_bytes.all.peak'])")
  timeout 200 python3 bisect.py "programs/$p.py" $((peak - (1 << 30))) $((peak + (1 << 30))) > "$out/$p.bisect" 2>&1
  tail -1 "$out/$p.bisect"
done
tar czf "${OUT:-/tmp/out}/estimate-gpu.tar.gz" -C "$(dirname "$out")" estimate-gpu
ls -la "${OUT:-/tmp/out}"
