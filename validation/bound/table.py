"""The headroom table: for every bundled trace, the bound every allocator must reach, the
offline placement, the best policy of the zoo, PyTorch's default and expandable segments.

    python3 validation/bound/table.py [--allocsim target/release/allocsim] [TRACE...]
"""
import glob, json, os, subprocess, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def run(cli, *args):
    out = subprocess.run([cli, *args, "--json"], capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout) if out.returncode == 0 else None


def gib(b):
    return f"{b / 2**30:.2f}"


def main(argv):
    cli = os.path.join(ROOT, "target", "release", "allocsim")
    if argv[:1] == ["--allocsim"]:
        cli, argv = argv[1], argv[2:]
    traces = argv or sorted(glob.glob(os.path.join(ROOT, "traces", "*", "*.pickle.gz")))
    print("| trace | allocations | bound GiB | offline GiB | best zoo policy GiB | pytorch GiB | headroom | expandable GiB | headroom |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in traces:
        name = os.path.relpath(t, os.path.join(ROOT, "traces"))
        b = run(cli, "bound", t)
        e = run(cli, "bound", t, "--alloc-conf", "expandable_segments:True")
        c = run(cli, "compare", t, "--no-capacity")
        if not (b and e and c):
            print(f"| {name} | not read |||||||")
            continue
        zoo = [r for r in c if r["policy"] not in ("pytorch", "uncached") and r["ooms"] == 0]
        best = min(zoo, key=lambda r: r["peak_reserved_bytes"]) if zoo else None
        head = lambda peak: f"{gib(peak - b['offline_bytes'])} ({100 * (peak - b['offline_bytes']) / peak:.1f} %)"
        print(f"| {name} | {b['allocations']} | {gib(b['bound_bytes'])} | {gib(b['offline_bytes'])} | "
              f"{gib(best['peak_reserved_bytes']) + ' (' + best['policy'] + ')' if best else '-'} | "
              f"{gib(b['policy_peak_reserved_bytes'])} | {head(b['policy_peak_reserved_bytes'])} | "
              f"{gib(e['policy_peak_reserved_bytes'])} | {head(e['policy_peak_reserved_bytes'])} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
