"""The real threshold of a program on this GPU: the smallest free memory (what mem_get_info()
reports once the CUDA context exists) on which it runs without an OOM, bisected to 2 MiB.
Each try is a fresh process that takes all free memory but the target with a ballast
cudaMalloc outside PyTorch's allocator (CuPy), then runs the program.

    python3 bisect.py PROGRAM.py LOW_BYTES HIGH_BYTES      (prints one JSON line per try, then the result)
    python3 bisect.py --one PROGRAM.py TARGET_BYTES
"""
import json, os, runpy, subprocess, sys


def one(program, target):
    import torch, cupy
    torch.cuda.mem_get_info()
    free, _ = torch.cuda.mem_get_info()
    ballast = cupy.cuda.runtime.malloc(free - target) if free > target else None
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    sys.argv = [program]
    try:
        runpy.run_path(program, run_name="__main__")
        fits = True
    except torch.OutOfMemoryError:
        fits = False
    st = torch.cuda.memory_stats()
    print(json.dumps({"target": target, "fits": fits, "peak_reserved": st["reserved_bytes.all.peak"]}))
    if ballast is not None:
        cupy.cuda.runtime.free(ballast)


def fits(program, target):
    out = subprocess.run([sys.executable, __file__, "--one", program, str(target)],
                         capture_output=True, text=True)
    line = [l for l in out.stdout.splitlines() if l.startswith("{")]
    print(line[-1] if line else out.stderr[-500:], flush=True)
    return bool(line) and json.loads(line[-1])["fits"]


def main():
    if sys.argv[1] == "--one":
        return one(sys.argv[2], int(sys.argv[3]))
    program, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    while not fits(program, hi):
        lo, hi = hi, hi * 2
    while hi - lo > 2 << 20:
        mid = (lo + hi) // 2
        if fits(program, mid):
            hi = mid
        else:
            lo = mid
    print(json.dumps({"program": os.path.basename(program), "threshold": hi, "fails_at": lo}))


if __name__ == "__main__":
    main()
