#!/bin/bash
# Run validation/fit.py for several (workload, alloc conf) pairs, one queue per GPU, all queues at
# once. Usage: validation/run_gpu.sh OUTDIR "GPU:WORKLOAD:CONF[@LO,HI]" ...   (CONF may contain
# ':'; @LO,HI goes on bisecting from that bracket of free bytes instead of recording first;
# ~SEED at the very end runs every try with FIT_PERTURB=SEED)
# Each pair's files are tarred into OUTDIR/NAME.tar; the log of every try is OUTDIR/log.txt.
set -u
out=$1; shift
mkdir -p "$out"
declare -A queue
for spec in "$@"; do
  gpu=${spec%%:*}; rest=${spec#*:}
  queue[$gpu]+="${rest}"$'\n'
done
for gpu in "${!queue[@]}"; do
  (
    while IFS= read -r item; do
      [ -z "$item" ] && continue
      # FIT_DEADLINE (unix time) also keeps this queue from starting a pair too late to finish
      [ "$(date +%s)" -gt "$(( ${FIT_DEADLINE:-9999999999} - 40 ))" ] && break
      seed=; case $item in *~*) seed=${item##*~}; item=${item%~*};; esac
      bracket=(); case $item in *@*) IFS=, read -r -a bracket <<< "${item#*@}"; item=${item%@*};; esac
      workload=${item%%:*}; conf=${item#*:}
      dir=$(mktemp -d)
      CUDA_VISIBLE_DEVICES=$gpu FIT_PERTURB=$seed PYTHONUNBUFFERED=1 python3 validation/fit.py "$workload" "$conf" "$dir" "${bracket[@]}" 2>&1 \
        | grep -v Warning
      tar -C "$dir" -cf "$out/$(echo "$workload-$conf${bracket[0]:-}${seed:+~$seed}" | tr -c 'A-Za-z0-9_.\n-' _).tar" .
    done <<< "${queue[$gpu]}"
  ) >> "$out/log.txt" 2>&1 &
done
wait
cat "$out/log.txt"
