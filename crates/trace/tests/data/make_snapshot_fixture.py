"""Regenerate snapshot_cpython.pickle: python3 make_snapshot_fixture.py (from this folder).

A small snapshot as CPython pickles one (protocol 4: FRAME, MEMOIZE on every dict and
string, APPENDS batches of 1000 and a lone APPEND), for comparing the record streamer with
the generic reader: entries with shared and fresh `frames` lists, keys the reader ignores,
an oom with device_free, snapshot entries, and a second device.
"""
import pickle

MB = 1 << 20
shared = [{"name": "forward", "filename": "model.py", "line": 10},
          {"name": "<module>", "filename": "train.py", "line": 3}]


def entry(action, addr, size, stream=0, frames=None, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": stream,
         "time_us": 1_700_000_000_000_000 + addr % 977, "compile_context": "N/A",
         "user_metadata": ""}
    if frames is not None:
        e["frames"] = frames
    e.update(extra)
    return e


base = 0x7F00_0000_0000
entries = [entry("segment_alloc", base, 20 * MB)]
live = []
for i in range(1998):
    addr = base + (i % 40) * 512 * 1024
    if addr in live:
        entries.append(entry("free_requested", addr, 4096))
        entries.append(entry("free_completed", addr, 4096))
        live.remove(addr)
    else:
        if i % 7 == 0:
            frames = [{"name": f"f{i}", "filename": "x.py", "line": i}]
        elif i % 3 == 0:
            frames = shared
        else:
            frames = None
        entries.append(entry("alloc", addr, 4096, frames=frames))
        live.append(addr)
entries.append({"action": "oom", "device_free": 123 * MB, "size": 40 * MB, "stream": 0,
                "time_us": 1, "compile_context": "N/A", "user_metadata": ""})
# Snapshot entries (which the reader skips) until the last batch is a single APPEND.
while len(entries) % 1000 != 1:
    entries.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0})
snapshot = {
    "segments": [],
    "device_traces": [entries, [entry("alloc", base, 512, stream=7)]],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"},
    "external_annotations": [],
}
with open("snapshot_cpython.pickle", "wb") as f:
    pickle.dump(snapshot, f, protocol=4)
print(len(entries), "entries")
