"""Bisect on two GPUs the smallest free memory (the same on each) on which a two-rank job of
`train.py` completes: every rank must fit.

    python3 validation/ranks/job_fit.py MODE OUTDIR LO HI [STEP_MIB]

Each try is a fresh `torchrun --nproc-per-node 2 validation/ranks/train.py MODE` with
FIT_FREE=target; it fits when both ranks exit 0 (torchrun stops the other rank when one dies
of an OOM). Prints one JSON line per try and a summary {"real_oom_free", "real_fits_free"}
(free memory each rank reported after its ballast: the larger of the two for an OOM, the
smaller for a fit). With FIT_DEADLINE (unix time) set, stops before a try could run past it.
"""
import json, os, re, subprocess, sys, time

MIB = 1 << 20


def attempt(mode, target):
    env = dict(os.environ, FIT_FREE=str(target), PYTHONUNBUFFERED="1")
    t0 = time.time()
    cmd = ["torchrun", "--nproc-per-node", "2", "--master-port", "29533",
           os.path.join(os.path.dirname(__file__), "train.py"), mode]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        out, fits = p.stdout + p.stderr, p.returncode == 0
    except subprocess.TimeoutExpired as e:
        out, fits = str(e.stdout or "") + str(e.stderr or ""), False
    free = [int(f) for f in re.findall(r"rank \d+: free (\d+)", out)]
    oom = "OutOfMemoryError" in out or "out of memory" in out
    r = {"mode": mode, "target_free": target, "fits": fits, "oom": oom, "free": free,
         "seconds": round(time.time() - t0, 1)}
    if not fits and not oom:
        r["error"] = out[-600:]
    print(json.dumps(r), flush=True)
    return r


def main():
    mode, outdir, lo, hi = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    step = (int(sys.argv[5]) if len(sys.argv) > 5 else 8) * MIB
    deadline = float(os.environ.get("FIT_DEADLINE", "inf"))
    fit = oom = None
    for target in (hi, lo):
        r = attempt(mode, target)
        if r["fits"]:
            fit = r
        else:
            oom = r
    seconds = 60
    while fit and oom and min(fit["free"] or [fit["target_free"]]) - max(oom["free"] or [oom["target_free"]]) > step:
        if time.time() + seconds > deadline:
            break
        target = (min(fit["free"] or [fit["target_free"]]) + max(oom["free"] or [oom["target_free"]])) // 2
        r = attempt(mode, target)
        seconds = max(seconds, r["seconds"] + 5)
        if r["fits"]:
            fit = r
        else:
            oom = r
    summary = {"summary": mode, "real_oom_free": oom and max(oom["free"] or [oom["target_free"]]),
               "real_fits_free": fit and min(fit["free"] or [fit["target_free"]])}
    print(json.dumps(summary), flush=True)
    with open(os.path.join(outdir, f"job_fit_{mode}.jsonl"), "a") as f:
        f.write(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
