"""Regenerate the committed seed corpus: python3 fuzz/make_corpus.py PATH/TO/allocsim

- snapshot_import: fragments of the bundled real PyTorch 2.11 recordings: a window of
  `device_traces[0]` (frames kept on the first few entries), the real allocator_settings,
  `segments` emptied, pickled by Python as PyTorch's _dump_snapshot does.
- rmm_import, native_decode: the same fragments converted by `allocsim convert`.
- program: seeded random bytes (libFuzzer finds the rest).
"""
import gzip, os, pickle, random, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "..", "traces", "pytorch-2.11-h100")
WINDOWS = [
    ("synthetic_default", 0, 60),
    ("synthetic_multistream", 0, 80),
    ("synthetic_multistream", 20000, 80),
    ("synthetic_oom", 0, 60),
    ("synthetic_maxsplit", 0, 60),
    ("synthetic_gc", 0, 60),
    ("varlen_train_expandable", 0, 60),
    ("gpt2_train", 5000, 60),
]


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    return os.path.join(d, name)


def main():
    allocsim = sys.argv[1] if len(sys.argv) > 1 else None
    for name, start, count in WINDOWS:
        snap = pickle.load(gzip.open(os.path.join(TRACES, name + ".pickle.gz")))
        entries = snap["device_traces"][0][start:start + count]
        for i, e in enumerate(entries):
            if i >= 3:
                e.pop("frames", None)
        fragment = {
            "segments": [],
            "device_traces": [entries],
            "allocator_settings": snap.get("allocator_settings", {}),
            "external_annotations": [],
        }
        stem = f"{name}_{start}"
        path = out("snapshot_import", stem + ".pickle", pickle.dumps(fragment))
        if allocsim:
            for target, ext in [("rmm_import", ".csv"), ("native_decode", ".allocsim"), ("native_decode", ".allocsim.json")]:
                dest = os.path.join(HERE, "corpus", target, stem + ext)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                subprocess.run([allocsim, "convert", path, dest], check=True, capture_output=True)
    rng = random.Random(5)
    for i, n in enumerate([16, 40, 80, 160, 320, 640]):
        out("program", f"random_{i}", bytes(rng.randrange(256) for _ in range(n)))


main()
