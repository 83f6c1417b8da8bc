#!/bin/bash
# libfuzzer_one.sh SECONDS JOBS TARGET[:N]...: libFuzzer on each TARGET with JOBS processes (N
# where given), for SECONDS, on the device host. Run from the repository root with carry/fz.tgz holding fz/ (the
# stripped `cargo fuzz build -O` binaries) and corpus/; writes summary.txt and any crashes
# to $OUT.
set -u
secs=$1 jobs=$2; shift 2
export TMPDIR=${TMPDIR:-/dev/shm}  # snapshot_file writes each input as two files
tar xzf carry/fz.tgz -C /tmp
cd /tmp
for tn in "$@"; do
  t=${tn%%:*} n=$jobs
  [ "$t" != "$tn" ] && n=${tn##*:}
  mkdir -p work/$t new/$t art/$t
  (cd work/$t && /tmp/fz/$t /tmp/new/$t /tmp/corpus/$t -jobs=$n -workers=$n \
     -max_total_time=$secs -detect_leaks=0 -print_final_stats=1 -rss_limit_mb=4096 \
     -artifact_prefix=/tmp/art/$t/ > /dev/null 2>&1) &
done
wait
for tn in "$@"; do
  t=${tn%%:*}
  execs=$(cat work/$t/fuzz-*.log | grep -h "stat::number_of_executed_units" | awk '{s+=$2} END {print s}')
  crashes=$(ls art/$t | wc -l)
  cov=$(cat work/$t/fuzz-*.log | grep -h "cov:" | tail -1 | grep -o "cov: [0-9]*")
  echo "$t executions=$execs artifacts=$crashes $cov corpus=$(ls new/$t | wc -l)" | tee -a $OUT/summary.txt
  tail -12 work/$t/fuzz-0.log > $OUT/$t-log0.txt
  [ "$crashes" != 0 ] && tar czf $OUT/art-$t.tgz -C art $t
done
