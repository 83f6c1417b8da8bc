#!/bin/bash
# run_gpu.sh OUT history|timing [REPS] [WORKLOAD...]: the live runs of validation/pluggable on the
# GPU machine, from the repository root, with ALLOCSIM_TORCH_LIB pointing at the library.
# history: each workload under PyTorch's allocator and allocsim's pytorch policy (default and
# expandable segments), then allocsim, bfc and rmm_pool, each with its whole history kept.
# timing: REPS alternating pairs (native, then the pytorch policy) per setting, no history;
# its workloads by default: gpt2_steady llama_steady kv_infer.
set -u
out=$1 what=$2 reps=${3:-3}
shift 3 2>/dev/null || shift $#
workloads=${*:-llama_ft gpt2_train kv_infer}
[ "$what" = timing ] && [ $# = 0 ] && workloads="gpt2_steady llama_steady kv_infer"
live=validation/pluggable/live.py
mkdir -p "$out/runs" "$out/history"
n=0
one() {  # one WORKLOAD MODE CONF [--history DIR]
  n=$((n + 1))
  python3 $live "$1" "$2" "$3" "$out/runs/$n.json" "${@:4}" > "$out/runs/$n.log" 2>&1 \
    || echo "run $n ($*) exited $?" >> "$out/errors.txt"
}
for w in $workloads; do
  if [ "$what" = history ]; then
    for c in - expandable_segments:True; do
      one $w native $c --history "$out/history"
      one $w pytorch $c --history "$out/history"
    done
    for p in allocsim bfc rmm_pool; do one $w $p - --history "$out/history"; done
  else
    for r in $(seq "$reps"); do
      for c in - expandable_segments:True; do
        one $w native $c
        one $w pytorch $c
      done
    done
  fi
done
