"""Regenerate the committed seed corpus: python3 fuzz/make_corpus.py PATH/TO/allocsim

- snapshot_import: fragments of the bundled real PyTorch 2.11 recordings: a window of
  `device_traces[0]` (frames kept on the first few entries), the real allocator_settings,
  `segments` emptied, pickled by Python as PyTorch's _dump_snapshot does.
- rmm_import, native_decode: the same fragments converted by `allocsim convert`.
- snapshot_gzip: the first three snapshot_import fragments gzipped, their header's MTIME
  (which the target reads as how to damage the stream) set to three ways of damage.
- alloc_conf: each policy's test settings, and PyTorch's keys, behind the byte that picks
  the policy, then a program's bytes.
- writers: lines of text (frames, annotations, warnings), 0xff, then a program's bytes.
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
    for w, (name, start, count) in enumerate(WINDOWS):
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
        if w < 3:
            raw = bytearray(gzip.compress(pickle.dumps(fragment), mtime=0))
            raw[4:7] = bytes([len(raw) % 251, 0, len(raw) % 4])
            out("snapshot_gzip", stem + ".pickle.gz", bytes(raw))
    rng = random.Random(5)
    extra = random.Random(50)
    policies = ["pytorch", "uncached", "bfc", "rmm_pool", "rmm_arena", "rmm_binning",
                "async_pool", "buddy", "tlsf", "allocsim", "best_fit"]
    confs = {
        "pytorch": ["max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:8]",
                    "expandable_segments:True,garbage_collection_threshold:0.6",
                    "backend:native,pinned_use_cuda_host_register:True,release_lock_on_cudamalloc:False"],
        "bfc": ["allow_growth:false", "garbage_collection:false,fragmentation_fraction:0.01"],
        "rmm_pool": ["initial_pool_size:1GiB,maximum_pool_size:6GiB"],
        "buddy": ["segment_size:2MiB,min_block:4KiB"],
        "tlsf": ["segment_size:256MiB,sl_bits:3"],
    }
    for name, strings in confs.items():
        for j, conf in enumerate(strings):
            program = bytes(extra.randrange(256) for _ in range(120))
            data = bytes([policies.index(name)]) + conf.encode() + b"\xff" + program
            out("alloc_conf", f"{name}_{j}", data)
    for i, text in enumerate(["train.py\nforward\n<!--<script>", "\x1b]0;t\x07\u2028</script>\"'"]):
        program = bytes(extra.randrange(256) for _ in range(200))
        out("writers", f"strings_{i}", bytes([i]) + text.encode() + b"\xff" + program)
    for i, n in enumerate([16, 40, 80, 160, 320, 640]):
        out("program", f"random_{i}", bytes(rng.randrange(256) for _ in range(n)))


main()
