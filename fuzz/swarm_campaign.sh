#!/bin/bash
# Usage: fuzz/swarm_campaign.sh ALLOCSIM SECONDS WORKERS OUT
# WORKERS processes each run `ALLOCSIM fuzz` over every policy in chunks of 1,000 programs from
# their own seed range (worker w from 100,000,000 + 10,000,000 w) until SECONDS have passed.
# OUT/log-W.txt gets one line per chunk; OUT/fail-W/ the minimized trace of any failure; the
# last lines printed are the count of chunks in which every oracle held and the other lines.
set -u
bin=$1 seconds=$2 workers=$3 out=$4
end=$(( $(date +%s) + seconds ))
mkdir -p "$out"
for w in $(seq 0 $(( workers - 1 ))); do
  (
    seed=$(( 100000000 + w * 10000000 ))
    mkdir -p "$out/fail-$w"
    while [ "$(date +%s)" -lt "$end" ]; do
      r=$("$bin" fuzz --seed $seed --iters 1000 --out "$out/fail-$w" 2>&1 | tail -3 | tr '\n' ' ')
      echo "worker $w seed $seed: $r" >> "$out/log-$w.txt"
      seed=$(( seed + 1000 ))
    done
  ) &
done
wait
echo "chunks where every oracle held: $(cat "$out"/log-*.txt | grep -c 'every oracle held')"
grep -h -v 'every oracle held' "$out"/log-*.txt || true
