# Made the c_* recordings here: python/allocsim/capture.py around a small training script (also
# with an OOM at its end and under expandable segments) and as a context manager with a
# 200-entry ring buffer, on the lent H100. OUT is the output folder; carry/allocsim a build.
set -x
cd python/allocsim
cat > /tmp/tiny.py <<'PY'
import torch, sys
m = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
opt = torch.optim.AdamW(m.parameters())
for step in range(3):
    loss = m(torch.randn(512, 2048, device="cuda")).square().mean()
    loss.backward(); opt.step(); opt.zero_grad()
if len(sys.argv) > 1:
    x = torch.empty(int(float(sys.argv[1])), dtype=torch.uint8, device="cuda")
PY
python3 capture.py $OUT/tiny.pickle.gz -- /tmp/tiny.py 2>&1 | tail -3
python3 capture.py $OUT/tiny_oom.pickle.gz -- /tmp/tiny.py 2e12 2>&1 | tail -3
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 capture.py $OUT/tiny_exp.pickle.gz -- /tmp/tiny.py 2>&1 | tail -3
cd ../..; ls -la $OUT
for t in tiny tiny_oom tiny_exp; do carry/allocsim fidelity $OUT/$t.pickle.gz | tail -3; done
carry/allocsim explain-oom $OUT/tiny_oom.pickle.gz | head -20
python3 -c "import json; print(json.load(open('$OUT/tiny.json'))['meta'])"
cd python/allocsim && python3 -c "
import torch
from capture import capture
with capture('$OUT/ctx.pickle.gz', max_entries=200):
    xs = [torch.empty(1 << 20, device='cuda') for _ in range(300)]
    del xs[::2]
" && cd ../.. && carry/allocsim fidelity $OUT/ctx.pickle.gz | tail -2
