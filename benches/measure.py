"""The measurements of benches/README.md (issue 7), on one machine, alternating commands.

    python3 benches/measure.py [import] [gunzip] [native] [compare]

Run from the repository root after `cargo build --release -p allocsim-cli -p allocsim-benches`
(or point ALLOCSIM_BIN / MAKE_NATIVE_BIN at carried binaries). ROUNDS (default 15),
NATIVE_ROUNDS (default 7) and COMPARE_ROUNDS (default 2) set the repetitions; NATIVE_CPU
(default 2) is the core the native replays are pinned to. `import` reads IMPORT_TRACE
(default: the Llama snapshot) and, with BASE_BIN set, runs that binary too in every round
(alternating which goes first) and prints the median of the rounds' wall-time ratios.
`gunzip` times `allocsim replay` of each of GUNZIP_TRACES (default: the two GPT-2 snapshots
with stacks) against `gzip -dc FILE > /dev/null` in the same rounds (issue 21's floor), then
the peak RSS of one replay of each. Wall
times from perf_counter, CPU times (user + system, all threads) from getrusage of the child.
"""
import gzip, os, pickle, resource, statistics, subprocess, sys, time

ROOT = os.getcwd()
BIN = os.path.join(ROOT, os.environ.get("ALLOCSIM_BIN", "target/release/allocsim"))
GEN = os.path.join(ROOT, os.environ.get("MAKE_NATIVE_BIN", "target/release/make-native-trace"))
BASE = os.environ.get("BASE_BIN")
LLAMA = "traces/pytorch-2.11-h100-extra/llama_generate_varlen.pickle.gz"
what = sys.argv[1:] or ["import", "native", "compare"]


def run(cmd, **kw):
    """Run cmd; return (cpu seconds user+sys, wall seconds, max RSS KiB) of the child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        print("FAILED", cmd, p.stderr.decode()[:400], flush=True)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, after.ru_maxrss


def peak_rss_kib(cmd):
    """Peak RSS of one run of cmd alone, from a fresh parent (RUSAGE_CHILDREN keeps the most of
    all children so far)."""
    return int(subprocess.run([sys.executable, "-c",
        "import resource,subprocess,sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)", *cmd],
        capture_output=True, text=True).stdout.strip())


def steal_jiffies(cpu):
    """Time the hypervisor ran something else on `cpu` (the `steal` column of /proc/stat)."""
    for line in open("/proc/stat"):
        if line.startswith(f"cpu{cpu} "):
            return int(line.split()[8])
    return 0


def load_only(path):
    t, w = time.process_time(), time.perf_counter()
    pickle.load(gzip.open(path))
    return time.process_time() - t, time.perf_counter() - w


def show(label, xs, unit=1000, fmt="{:.1f}"):
    xs = [x * unit for x in xs]
    print(f"{label}: median {fmt.format(statistics.median(xs))} (min {fmt.format(min(xs))}, "
          f"max {fmt.format(max(xs))}) of {len(xs)}: " + " ".join(fmt.format(x) for x in xs),
          flush=True)


print(open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0], flush=True)
print("cpus", os.cpu_count(), "load", os.getloadavg(), flush=True)

if "import" in what:
    trace = os.environ.get("IMPORT_TRACE", LLAMA)
    name = os.path.basename(trace).split(".")[0]
    cmd = [BIN, "replay", trace]
    base = [os.path.join(ROOT, BASE), "replay", trace] if BASE else None
    py = [sys.executable, "-c", f"import pickle,gzip; pickle.load(gzip.open('{trace}'))"]
    rs, ps, ls, rss, rw, pw, lw, bw = [], [], [], [], [], [], [], []
    for r in range(int(os.environ.get('ROUNDS', 15))):
        if base and r % 2:
            bw.append(run(base)[1])
        cpu, wall, _ = run(cmd); rs.append(cpu); rw.append(wall)
        if base and r % 2 == 0:
            bw.append(run(base)[1])
        cpu, wall, _ = run(py); ps.append(cpu); pw.append(wall)
        c, w = load_only(trace); ls.append(c); lw.append(w)
    show(f"import: allocsim replay {name} wall ms", rw)
    show("import: python3 process wall ms", pw)
    show(f"import: allocsim replay {name} CPU ms", rs)
    show("import: python3 process CPU ms", ps)
    show("import: pickle.load(gzip.open) in-process CPU ms", ls)
    show("import: pickle.load(gzip.open) in-process wall ms", lw)
    print("WALL ratio load-only / allocsim: %.2f; median of the rounds' own ratios: %.2f" % (
        statistics.median(lw) / statistics.median(rw),
        statistics.median(l / r for l, r in zip(lw, rw))), flush=True)
    print("ratio load-only / allocsim: %.2f; python process / allocsim: %.2f" % (
        statistics.median(ls) / statistics.median(rs), statistics.median(ps) / statistics.median(rs)), flush=True)
    if base:
        show(f"import: BASE_BIN replay {name} wall ms", bw)
        print("wall time / BASE_BIN's, median of the rounds' own ratios: %.3f" % statistics.median(
            a / b for a, b in zip(rw, bw)), flush=True)

if "gunzip" in what:
    traces = os.environ.get("GUNZIP_TRACES", "traces/pytorch-2.11-h100/gpt2_train.pickle.gz "
                            "../shared/traces/pytorch-2.11-h100-user/d_gpt2_blog.pickle.gz").split()
    for trace in traces:
        name = os.path.basename(trace).split(".")[0]
        gz, al = [], []
        for r in range(int(os.environ.get("ROUNDS", 15))):
            first, second = (gz, al) if r % 2 == 0 else (al, gz)
            for xs in (first, second):
                cmd = ["gzip", "-dc", trace] if xs is gz else [BIN, "replay", trace]
                xs.append(run(cmd)[1])
        show(f"gunzip: gzip -dc {name} wall ms", gz)
        show(f"gunzip: allocsim replay {name} wall ms", al)
        print("gunzip: allocsim / gzip -dc, median of the rounds' own ratios: %.2f" % statistics.median(
            a / g for a, g in zip(al, gz)), flush=True)
        print(f"gunzip: allocsim replay {name} peak RSS MB: {peak_rss_kib([BIN, 'replay', trace]) / 1024:.0f}",
              flush=True)

if "native" in what:
    out = "/tmp/llama10m.allocsim"
    run([GEN, LLAMA, out, "10000000"])
    print("native file bytes", os.path.getsize(out), flush=True)
    # Pinned to one core, whose steal time is read around each run: a slow phase that shows
    # up there is the hypervisor running something else on the core. A busy SMT sibling does
    # not show there: `benches/ab.py` with PROBE_BIN tells those phases apart.
    core = os.environ.get("NATIVE_CPU", "2")
    cpus, walls, steals = [], [], []
    for _ in range(int(os.environ.get("NATIVE_ROUNDS", 7))):
        st = steal_jiffies(core)
        cpu, wall, _ = run(["taskset", "-c", core, "/bin/sh", "-c", f"exec {BIN} replay {out} > /tmp/out.txt"])
        steals.append((steal_jiffies(core) - st) / os.sysconf("SC_CLK_TCK"))
        cpus.append(cpu); walls.append(wall)
    rss = peak_rss_kib([BIN, "replay", out])
    show("native 10M: allocsim replay CPU s", cpus, unit=1, fmt="{:.3f}")
    show("native 10M: wall s", walls, unit=1, fmt="{:.3f}")
    show(f"native 10M: steal time of cpu {core} during each run, s", steals, unit=1, fmt="{:.3f}")
    print("\n".join(open("/tmp/out.txt").read().split("\n")[:5]), flush=True)
    ops, events = 10030236, 15045395
    m = statistics.median(cpus)
    best = min(cpus)
    print(f"native 10M: median {ops / m / 1e6:.1f} M ops/s, {events / m / 1e6:.1f} M events/s; best {ops / best / 1e6:.1f} M ops/s, {events / best / 1e6:.1f} M events/s (CPU time); peak RSS {rss} KiB", flush=True)

if "compare" in what:
    # two distinct physical cores
    cores = {}
    for line in subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("#"):
            continue
        cpu, core, sock = line.split(",")[:3]
        cores.setdefault((sock, core), cpu)
    two = list(cores.values())[:2]
    print("pinned to cpus", two, "(distinct cores)", flush=True)
    traces = sorted(os.path.join("traces/pytorch-2.11-h100", f) for f in os.listdir("traces/pytorch-2.11-h100") if f.endswith(".pickle.gz"))
    one = lambda: run(["taskset", "-c", two[0], BIN, "compare", *traces, "--jobs", "1"])[1]
    both = lambda: run(["taskset", "-c", ",".join(two), BIN, "compare", *traces, "--jobs", "2"])[1]
    w1, w2 = [], []
    for r in range(int(os.environ.get("COMPARE_ROUNDS", 2))):
        # Alternating which goes first, so that a slow phase falls on both alike.
        if r % 2 == 0:
            w1.append(one()); w2.append(both())
        else:
            w2.append(both()); w1.append(one())
    show("compare jobs 1 (1 core) wall s", w1, unit=1, fmt="{:.2f}")
    show("compare jobs 2 (2 cores) wall s", w2, unit=1, fmt="{:.2f}")
    print("speedup %.2f; median of the rounds' own speedups %.2f" % (
        statistics.median(w1) / statistics.median(w2),
        statistics.median(a / b for a, b in zip(w1, w2))), flush=True)
