#!/usr/bin/env bash
# The H100 validation batch behind validation/decisions/README.md.
#
#   validation/decisions/run_validation.sh BIN OUTDIR [timing|traces|workloads|viz|all]
#
# BIN is a release `allocsim` built on a machine with Rust (the GPU machine has none); run from
# the repository root. Every run's JSON goes to OUTDIR/runs/, one line per run to
# OUTDIR/summary.tsv, and everything is packed into OUTDIR/runs.tgz at the end (or on timeout,
# as far as it got, when the caller packs it). `viz` checks that a snapshot allocsim exports
# opens in PyTorch's memory viewer (torch.cuda._memory_viz), writing OUTDIR/viz_*.html.
set -u
B=$1
OUT=$2
PART=${3:-all}
T=traces/pytorch-2.11-h100
POLICIES=${POLICIES:-"pytorch uncached bfc rmm_pool rmm_arena rmm_binning async_pool buddy tlsf"}
TRACES=${TRACES:-"gpt2_train resnet50_train varlen_train varlen_train_expandable synthetic_default synthetic_gc synthetic_maxsplit synthetic_multistream synthetic_oom synthetic_roundup"}
WORKLOADS=(
  "transformer-train?layers=24&hidden=1024&heads=16&batch=8&seq=1024"
  "transformer-train?layers=6&flash=0"
  "llm-inference?layers=32&hidden=4096&heads=32&vocab=32000&max_batch=32&steps=256"
  "cnn-train?batch=64&blocks=3"
)
mkdir -p "$OUT/runs"

# One validate run: NAME INPUT POLICY [extra args]. Prints a summary line.
validate() {
  local name=$1 input=$2 policy=$3
  shift 3
  local start end rc
  start=$(date +%s.%N)
  timeout 240 "$B" validate "$input" --policy "$policy" --json "$@" >"$OUT/runs/$name.json" 2>"$OUT/runs/$name.err"
  rc=$?
  end=$(date +%s.%N)
  python3 - "$OUT/runs/$name.json" "$name" "$rc" "$start" "$end" >>"$OUT/summary.tsv" <<'EOF'
import json, sys
path, name, rc, start, end = sys.argv[1:]
try:
    d = json.load(open(path))
    p = d.get("patterns") or {}
    m = d["model"]
    f = d.get("following_device_calls") or {}
    print("\t".join(str(x) for x in [
        name, rc, d["verdict"], d["ops"], d["events"], "%.3f" % d["wall_s"], "%.2f" % d["us_per_op"],
        d["ooms"], m["ooms"], p.get("mismatched_words"), p.get("blocks_verified"), d["checker_violations"],
        m["summary"], f.get("summary", "-"), f.get("calls_summary", "-"), f.get("free_memory", "-"),
        "%.1f" % (float(end) - float(start)),
    ]))
except Exception as e:  # a crash or timeout: say so, with the tail of stderr
    err = open(path[:-5] + ".err").read()[-300:].replace("\n", " ")
    print("\t".join([name, rc, "ERROR", str(e)[:80], err]))
EOF
  tail -n 1 "$OUT/summary.tsv"
}

timing() {
  # allocsim's pytorch policy on the GPU vs PyTorch's own allocator, same op stream, 3 runs each.
  for t in gpt2_train resnet50_train synthetic_default; do
    "$B" convert "$T/$t.pickle.gz" "/tmp/$t.allocsim.json" 2>/dev/null
    for i in 1 2 3; do
      "$B" replay "$T/$t.pickle.gz" --policy pytorch --device cuda --json >"$OUT/runs/replay_${t}_$i.json" 2>"$OUT/runs/replay_${t}_$i.err"
      echo "allocsim $t run $i: $(grep 'wall time' "$OUT/runs/replay_${t}_$i.err")"
      python3 validation/decisions/torch_replay.py "/tmp/$t.allocsim.json" >"$OUT/runs/torch_${t}_$i.json" 2>"$OUT/runs/torch_${t}_$i.err"
      echo "torch   $t run $i: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('%.3f s, %.2f us/op, %s device allocs' % (d['seconds'], d['us_per_op'], d['num_device_alloc']))" "$OUT/runs/torch_${t}_$i.json" 2>&1)"
    done
  done
}

traces() {
  for t in $TRACES; do
    for p in $POLICIES; do
      validate "${t}__$p" "$T/$t.pickle.gz" "$p"
    done
  done
}

workloads() {
  local i=0
  for w in "${WORKLOADS[@]}"; do
    for p in pytorch uncached bfc rmm_pool; do
      validate "workload${i}__$p" "workload:$w" "$p"
    done
    i=$((i + 1))
  done
}

viz() {
  # An exported snapshot must open in PyTorch's own viewer (both plots).
  "$B" replay "$T/gpt2_train.pickle.gz" --export-snapshot "$OUT/sim.pickle" >"$OUT/viz_export.log" 2>&1
  echo "export: rc $? ($(stat -c %s "$OUT/sim.pickle" 2>/dev/null) bytes)"
  for plot in trace_plot segment_plot; do
    python3 -m torch.cuda._memory_viz "$plot" "$OUT/sim.pickle" -o "$OUT/viz_$plot.html" >"$OUT/viz_$plot.log" 2>&1
    echo "memory_viz $plot: rc $? ($(stat -c %s "$OUT/viz_$plot.html" 2>/dev/null) bytes) $(tail -c 300 "$OUT/viz_$plot.log")"
  done
}

case $PART in
  timing) timing ;;
  traces) traces ;;
  workloads) workloads ;;
  viz) viz ;;
  all) timing; traces; workloads; viz ;;
esac
(cd "$OUT" && touch summary.tsv && tar czf runs.tgz runs summary.tsv)
