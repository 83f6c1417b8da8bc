#!/bin/bash
# Issue 52's targets 1 and 2 on a GPU host, in one go (benches/README.md, "Big snapshots"):
# makes the 10 M- and 50 M-entry snapshots, records a real multi-million-entry one on GPU 0
# with allocsim.capture (GPT-2 training, Python stacks), and times `info`, `replay`,
# `capacity` (and `report` but at 50 M) on each beside `gzip -dc`, alternating, with peak RSS.
#   benches/device_host.sh ALLOCSIM OUT [STEPS]
# ALLOCSIM is a release binary; OUT gets times.txt (name, seconds, peak KB per line), the
# generators' and the recording's logs, and the real recording's sidecar. REAL_SNAPSHOT=PATH
# times an earlier recording instead of making one; CMDS="capacity capacity" times only those.
set -u
bin=$1 out=$2 steps=${3:-1800}
w=${BIG_DIR:-/tmp/big}
mkdir -p "$w" "$out"
python3 benches/make_big_snapshot.py "$w/big10m.pickle.gz" 10e6 "$bin" > "$out/gen10m.txt" 2>&1 & p10=$!
python3 benches/make_big_snapshot.py "$w/big50m.pickle.gz" 50e6 "$bin" > "$out/gen50m.txt" 2>&1 & p50=$!
if [ -n "${REAL_SNAPSHOT:-}" ]; then # an earlier recording (and its sidecar) instead
  cp "$REAL_SNAPSHOT" "$w/real.pickle.gz" && cp "${REAL_SNAPSHOT%.pickle.gz}.json" "$w/real.json"
  true & preal=$!
else
  (cd "$w" && CUDA_VISIBLE_DEVICES=0 /usr/bin/time -f "%e s %M KB" python3 "$OLDPWD/python/allocsim/capture.py" \
    --max-entries 4000000 real.pickle.gz -- "$OLDPWD/validation/ranks/train.py" single --layers 4 --batch 2 \
    --steps "$steps") > "$out/real.txt" 2>&1 & preal=$!
fi
t() { # NAME COMMAND...: one line of times.txt
  local name=$1; shift
  /usr/bin/time -o "$out/times.txt" -a -f "$name %e s %M KB" "$@" > /dev/null 2> "$out/last_err.txt" \
    || { echo "$name failed: $(tail -3 "$out/last_err.txt")" >> "$out/times.txt"; }
}
measure() { # SNAPSHOT: gzip -dc before each command, so every ratio is of neighbours
  local s=$w/$1.pickle.gz
  for cmd in ${CMDS:-info replay capacity ${2:-}}; do
    t "$1 gzip-dc" gzip -dc "$s"
    case $cmd in
      report) t "$1 report" "$bin" report "$s" -o "$w/$1.html" && ls -l "$w/$1.html" >> "$out/times.txt" ;;
      *) t "$1 $cmd" "$bin" "$cmd" "$s" ;;
    esac
  done
}
wait $p10 && measure big10m report
wait $preal && cp "$w"/real.json "$out/" && ls -l "$w"/real.pickle.gz >> "$out/times.txt" && measure real report
wait $p50 && measure big50m
"$bin" info "$w/real.pickle.gz" | head -12 > "$out/real_info.txt"
