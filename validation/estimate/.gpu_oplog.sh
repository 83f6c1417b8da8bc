set -u
cd validation/estimate
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/programs
mkdir -p $OUT/oplog
for p in gpt_amp gpt_checkpoint convnet lora kv_infer find_batch hf_gpt2; do
  (cd programs && timeout 200 python3 ../oplog.py $OUT/oplog/$p.json.gz -- $p.py) > $OUT/oplog/$p.log 2>&1
  echo "$p: exit $?"; tail -2 $OUT/oplog/$p.log
done
ls -la $OUT/oplog
