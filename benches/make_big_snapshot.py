"""A PyTorch snapshot of millions of entries with C++ and Python stacks (issues 21 and 52).

    python3 benches/make_big_snapshot.py OUT.pickle.gz [ENTRIES] [ALLOCSIM]

ENTRIES defaults to 2,000,000; `10e6` and `50e6` make issue 52's snapshots. The allocations are
those of `allocsim workload transformer-train` (GPT-2 small training, about 2,550 entries a
step): its prologue, then its steady-state step repeated until ENTRIES, then its epilogue, so
the addresses, segments and final state are the workload's own. Each entry gets the frames of
a real one, one by its size and position: the stacks of the bundled recording made with
PyTorch's tutorial recipe and `stacks="all"` (`traces/pytorch-2.11-h100-user/d_gpt2_blog`:
29-39 C++ and Python frames), and a `time_us` advanced by that recording's gaps between
entries, in its order.

The file is written as `pickle.dump(snapshot, f)` (protocol 4) writes PyTorch's snapshot:
frames of 64 KiB, every string, dict and list memoized once and referred back to after,
lists and dicts filled 1,000 items at a time; an allocation and a `free_requested` have a
frames list of their own (of frame dicts shared between entries), a `free_completed` shares
its `free_requested`'s. The writer streams: it holds one step and the stacks, so memory stays
under 200 MB whatever ENTRIES (see benches/README.md for the time; gzip level 1).
"""
import gzip, pickle, random, struct, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRAME_BYTES = 64 * 1024
BATCH = 1000  # items per MARK ... APPENDS/SETITEMS, as pickle writes them


class Writer:
    """Protocol-4 pickle opcodes, memoized and framed as CPython's pickler writes them."""

    def __init__(self, f):
        self.f, self.buf, self.memo, self.count = f, bytearray(), {}, 0
        self.f.write(b"\x80\x04")

    def flush(self, final=False):
        if len(self.buf) >= FRAME_BYTES or (final and self.buf):
            self.f.write(b"\x95" + struct.pack("<Q", len(self.buf)) + self.buf)
            self.buf = bytearray()

    def memoize(self, key=None):
        """The next memo index; kept by `key` when the object is referred back to later."""
        if key is not None:
            self.memo[key] = self.count
        self.count += 1
        self.buf += b"\x94"
        return self.count - 1

    def get(self, key):
        i = self.memo.get(key)
        return None if i is None else ref(i)

    def value(self, v):
        b = self.buf
        if v is None:
            b += b"N"
        elif v is True or v is False:
            b += b"\x88" if v else b"\x89"
        elif isinstance(v, int):
            b += int_op(v)
        elif isinstance(v, float):
            b += b"G" + struct.pack(">d", v)
        elif isinstance(v, str):
            got = self.get(("s", v))
            if got:
                b += got
                return
            data = v.encode("utf-8", "surrogatepass")
            b += (b"\x8c" + bytes([len(data)]) if len(data) < 256 else b"X" + struct.pack("<I", len(data))) + data
            self.memoize(("s", v))
        elif isinstance(v, dict):
            self.shared(v, b"}", lambda: self.items(list(v.items())))
        elif isinstance(v, list):
            self.shared(v, b"]", lambda: self.items(v))
        else:
            raise TypeError(f"cannot write {type(v)}")

    def shared(self, v, empty, fill):
        got = self.get(("o", id(v)))
        if got:
            self.buf += got
            return
        self.buf += empty
        self.memoize(("o", id(v)))
        fill()

    def items(self, items):
        pairs = bool(items) and isinstance(items[0], tuple)
        for at in range(0, len(items), BATCH):
            batch = items[at:at + BATCH]
            if len(batch) > 1:
                self.buf += b"("
            for item in batch:
                for x in item if pairs else (item,):
                    self.value(x)
            self.buf += (b"u" if len(batch) > 1 else b"s") if pairs else (b"e" if len(batch) > 1 else b"a")
            self.flush()


def ref(i):
    """BINGET / LONG_BINGET of memo index `i`."""
    return b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)


def int_op(v):
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if 0 <= v < 65536:
        return b"M" + struct.pack("<H", v)
    if -(1 << 31) <= v < (1 << 31):
        return b"J" + struct.pack("<i", v)
    data = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data


def workload(steps, allocsim):
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain.pickle"
        subprocess.run([allocsim, "workload", f"transformer-train?steps={steps}", "--out", str(plain)],
                       check=True, stdout=subprocess.DEVNULL)
        return pickle.load(open(plain, "rb"))


def periodic(entries, length):
    """(prologue, step, epilogue): a window of one step's `length` entries that
    frees all it allocates and nothing else, so that it can be repeated; found by a hash of
    the allocations alive at each boundary."""
    rnd, live, alive, h = random.Random(52), {}, [], 0
    for e in entries:
        alive.append(h)
        if e["action"] == "alloc":
            live[e["addr"]] = rnd.getrandbits(64)
            h ^= live[e["addr"]]
        elif e["action"] == "free_completed":
            h ^= live.pop(e["addr"])
    alive.append(h)
    starts = [p for p in range(len(entries) - length + 1) if alive[p] == alive[p + length]]
    if not starts:
        sys.exit("the workload has no step that frees what it allocates")
    p = starts[len(starts) // 2]
    return entries[:p], entries[p:p + length], entries[p + length:]


def main():
    out = Path(sys.argv[1])
    want = int(float(sys.argv[2])) if len(sys.argv) > 2 else 2_000_000
    allocsim = sys.argv[3] if len(sys.argv) > 3 else str(ROOT / "target/release/allocsim")
    snapshot = workload(6, allocsim)
    entries = next(t for t in snapshot["device_traces"] if t)
    shorter = next(t for t in workload(5, allocsim)["device_traces"] if t)
    prologue, step, epilogue = periodic(entries, len(entries) - len(shorter))
    steps = max(1, (want - len(prologue) - len(epilogue) + len(step) - 1) // len(step))

    real = pickle.load(gzip.open(ROOT / "traces/pytorch-2.11-h100-user/d_gpt2_blog.pickle.gz"))
    recorded = real["device_traces"][0]
    stacks = {}
    for entry in recorded:
        frames = entry.get("frames") or []
        stacks.setdefault(tuple(id(f) for f in frames), frames)
    stacks = [s for s in stacks.values() if s]
    gaps = [max(0, b["time_us"] - a["time_us"]) for a, b in zip(recorded, recorded[1:])]
    if not stacks:
        sys.exit("the recording has no stacks")

    def all_entries():
        yield from prologue
        for _ in range(steps):
            yield from step
        yield from epilogue

    total = len(prologue) + steps * len(step) + len(epilogue)
    # No name, mtime=0: the same arguments give the same bytes.
    with open(out, "wb") as raw, gzip.GzipFile("", "wb", 1, raw, mtime=0) as f:
        w = Writer(f)
        top = {k: v for k, v in snapshot.items() if k != "device_traces"}
        for segment in top.get("segments", []):
            segment.setdefault("frames", [])
        w.buf += b"}"
        w.memoize()
        w.buf += b"("
        w.value("segments")
        w.value(top.pop("segments"))
        w.value("device_traces")
        w.buf += b"]"
        w.memoize()
        w.buf += b"]"
        w.memoize()
        write_entries(w, all_entries(), stacks, gaps, recorded[0]["time_us"])
        w.buf += b"a"  # the one device's list into device_traces
        for k, v in top.items():
            w.value(k)
            w.value(v)
        w.buf += b"u."
        w.flush(final=True)
    print(f"wrote {out}: {total:,} entries, {len(stacks)} stacks")


def write_entries(w, entries, stacks, gaps, time_us):
    """Each entry as pickle writes a dict of the snapshot: its keys in PyTorch's order. The
    bytes of what repeats (an entry's action, address, size and stream; the annotations; a
    stack's frames) are kept once they refer only to memoized values, and written again."""
    freed, cached = {}, {}
    batch = 0

    def once(key, write):
        """`write()`'s bytes, kept under `key` when they memoize nothing new."""
        got = cached.get(key)
        if got is not None:
            w.buf += got
            return
        mark, count = len(w.buf), w.count
        write()
        if w.count == count:
            cached[key] = bytes(w.buf[mark:])

    def head(entry):
        for k in ("action", "addr", "size", "stream"):
            w.value(k)
            w.value(entry[k])
        w.value("time_us")

    def annotations():
        for v in ("compile_context", "N/A", "user_metadata", "", "frames"):
            w.value(v)

    for i, entry in enumerate(entries):
        if batch == 0:
            w.buf += b"("
        s = (entry["size"] // 512 + i) % len(stacks)
        time_us += gaps[i % len(gaps)]
        w.buf += b"}"
        w.memoize()
        w.buf += b"("
        once(("head", id(entry)), lambda: head(entry))
        w.buf += int_op(time_us)
        once("annotations", annotations)
        action = entry["action"]
        if action == "free_completed" and entry["addr"] in freed:
            w.buf += ref(freed.pop(entry["addr"]))
        else:
            w.buf += b"]"
            at = w.memoize()
            w.buf += b"("
            once(("stack", s), lambda: [w.value(frame) for frame in stacks[s]])
            w.buf += b"e"
            if action == "free_requested":
                freed[entry["addr"]] = at
        w.buf += b"u"
        batch += 1
        if batch == BATCH:
            w.buf += b"e"
            batch = 0
        w.flush()
    if batch:
        w.buf += b"e"


if __name__ == "__main__":
    main()
