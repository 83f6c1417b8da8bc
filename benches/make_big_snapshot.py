"""A tutorial-style PyTorch snapshot of millions of entries with stacks (issue 21's target 3).

    python3 benches/make_big_snapshot.py OUT.pickle.gz [STEPS] [ALLOCSIM]

The allocations are `allocsim workload transformer-train?steps=STEPS` (GPT-2 small training,
about 2,550 entries a step; default 790 steps, about 2 million entries), written by allocsim
as a snapshot. Each entry then gets the Python and C++ frames of a real one: the stacks of the
bundled recording made with PyTorch's tutorial recipe
(`traces/pytorch-2.11-h100-user/d_gpt2_blog.pickle.gz`: 39 frames on average), one per
entry by its size and position. As in a snapshot PyTorch writes, an allocation and a
`free_requested` have a list of their own (holding frame dicts shared between entries), and a
`free_completed` shares its `free_requested`'s, so the pickle refers back to both.
Takes about 2 GB of memory and half a minute here.
"""
import gzip, pickle, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
out = Path(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 790
allocsim = sys.argv[3] if len(sys.argv) > 3 else str(ROOT / "target/release/allocsim")

with tempfile.TemporaryDirectory() as tmp:
    plain = Path(tmp) / "plain.pickle"
    subprocess.run([allocsim, "workload", f"transformer-train?steps={steps}", "--out", str(plain)],
                   check=True, stdout=subprocess.DEVNULL)
    snapshot = pickle.load(open(plain, "rb"))

real = pickle.load(gzip.open(ROOT / "traces/pytorch-2.11-h100-user/d_gpt2_blog.pickle.gz"))
stacks = {}
for entry in real["device_traces"][0]:
    frames = entry.get("frames") or []
    stacks.setdefault(tuple(id(f) for f in frames), frames)
stacks = [s for s in stacks.values() if s]
if not stacks:
    sys.exit("the recording has no stacks")

freed = {}
entries = next(t for t in snapshot["device_traces"] if t)
for i, entry in enumerate(entries):
    pick = list(stacks[(entry["size"] // 512 + i) % len(stacks)])
    if entry["action"] == "free_requested":
        freed[entry["addr"]] = pick
    entry["frames"] = freed.pop(entry["addr"]) if entry["action"] == "free_completed" else pick
for segment in snapshot["segments"]:
    segment.setdefault("frames", [])

with gzip.open(out, "wb", compresslevel=6) as f:
    pickle.dump(snapshot, f, protocol=4)
print(f"wrote {out}: {len(entries):,} entries, {len(stacks)} stacks")
