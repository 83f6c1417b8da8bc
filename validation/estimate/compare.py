"""Estimates each recorded program on the simulated device (no GPU) and compares it with its
recording on the H200: peak reserved and allocated, the allocation sizes in order, and
`allocsim capacity` of both against the threshold bisected on the GPU.

    python3 compare.py [--allocsim target/release/allocsim] [PROGRAM...]   (a markdown table)
"""
import gzip, json, os, pickle, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = ["gpt_amp", "gpt_checkpoint", "convnet", "lora", "kv_infer", "hf_gpt2", "find_batch", "moe_routing",
            "llama_fp16", "bert_mlm", "vit_timm"]


def op_stream(path):
    """The allocations (sizes) and frees (which allocation) in order. Frees with no allocation
    between them are one batch, compared as a set: PyTorch frees some in hash-map order (the
    autocast cache), and the allocator's state after a batch does not depend on its order."""
    with gzip.open(path, "rb") as f:
        snap = pickle.load(f)
    ops, index, batch, n = [], {}, [], 0
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            ops += [("free", i) for i in sorted(batch)]
            batch = []
            index[e["addr"]], n = n, n + 1
            ops.append(("alloc", e["size"]))
        elif e["action"] == "free_requested":
            batch.append(index.pop(e["addr"]))
    return ops + [("free", i) for i in sorted(batch)]


def capacity(cli, path):
    out = subprocess.run([cli, "capacity", path, "--json"], capture_output=True, text=True)
    return json.loads(out.stdout)["capacity_bytes"] if out.returncode == 0 else None


def main(argv):
    cli = "target/release/allocsim"
    if argv[:1] == ["--allocsim"]:
        cli, argv = argv[1], argv[2:]
    cli = os.path.abspath(cli)
    os.makedirs(os.path.join(HERE, "estimated"), exist_ok=True)
    print("| program | peak reserved: real | estimated | error | peak allocated: real | estimated | error "
          "| op stream equal | capacity: of the recording | of the estimate | bisected on the H200 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in argv or PROGRAMS:
        rec = json.load(open(os.path.join(HERE, "recorded", name + ".json")))
        meta, real = rec["meta"], rec["memory_stats"]
        out = os.path.join(HERE, "estimated", name + ".pickle.gz")
        run = subprocess.run(
            [sys.executable, "-m", "allocsim.estimate", "--json", "--total-memory", str(meta["total_memory"]),
             "--free-memory", str(meta["free_at_start"]), "--out", out, "--", name + ".py"],
            cwd=os.path.join(HERE, "programs"), capture_output=True, text=True)
        at = run.stdout.find("{\n")
        if at < 0:
            why = (run.stderr.strip().splitlines() or ["?"])[-1]
            print(f"| {name} | {real['reserved_bytes.all.peak']} | refused: {why[:160]} |||||||||")
            continue
        est = json.loads(run.stdout[at:])
        row = [name]
        for key in ("reserved_bytes.all.peak", "allocated_bytes.all.peak"):
            r, e = real[key], est["memory_stats"][key]
            row += [str(r), str(e), f"{100 * (e - r) / r:+.2f} %"]
        a, b = op_stream(os.path.join(HERE, "recorded", name + ".pickle.gz")), op_stream(out)
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        row.append("yes" if a == b else f"no: op {same} of {len(a)}")
        row.append(str(capacity(cli, os.path.join(HERE, "recorded", name + ".pickle.gz"))))
        row.append(str(capacity(cli, out)))
        bis = os.path.join(HERE, "recorded", name + ".bisect")
        row.append(json.loads(open(bis).read().splitlines()[-1])["threshold"] if os.path.exists(bis) else "")
        print("| " + " | ".join(map(str, row)) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
