cd python/allocsim
python3 - <<'PY'
import os, torch
from capture import capture
out = os.environ["OUT"]
def set_md(s):
    f = getattr(torch.cuda.memory, "_set_memory_metadata", None) or torch._C._cuda_setMemoryMetadata
    f(s)
m = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda()
step = torch.compile(lambda x: m(x).relu().square().mean())
with capture(f"{out}/c_annotated.pickle.gz", compile_context=True):
    for i in range(3):
        set_md(f"step {i}")
        loss = step(torch.randn(256, 1024, device="cuda"))
        loss.backward()
    set_md("")
PY
cd ../..
python3 -c "
import pickle,gzip,collections
t=pickle.load(gzip.open('$OUT/c_annotated.pickle.gz'))['device_traces'][0]
print(len(t), collections.Counter(e.get('compile_context') for e in t).most_common(4), collections.Counter(e.get('user_metadata') for e in t))"
carry/allocsim fidelity $OUT/c_annotated.pickle.gz | tail -2
carry/allocsim replay $OUT/c_annotated.pickle.gz --export-snapshot $OUT/exp.pickle.gz > /dev/null
python3 -c "
import pickle,gzip
a=pickle.load(gzip.open('$OUT/c_annotated.pickle.gz'))['device_traces'][0]
b=pickle.load(gzip.open('$OUT/exp.pickle.gz'))['device_traces'][0]
k=lambda e:(e['compile_context'],e['user_metadata'])
print('annotations equal', sum(k(x)==k(y) for x,y in zip(a,b)), 'of', len(a), len(b))"
