"""Paired A/B timing of allocsim binaries replaying one trace (benches/README.md).

    python3 benches/ab.py ROUNDS TRACE BIN [BIN ...]
    PROBE_BIN=target/release/machine-probe python3 benches/ab.py ROUNDS TRACE BIN [BIN ...]

The lent machines change speed by up to 2x from one second to the next (a fixed CPython loop
takes 210 or 460 ms depending on when it runs; the probes below say why), so the medians of
separate batches cannot tell a 5% change from noise. Here each round runs every binary once,
in alternating order, and each binary's CPU time is divided by the first binary's in the same
round: the machine's state cancels, and the median of those ratios resolves a few percent.
Prints, per binary, the events per second (median and best over the rounds) and the median
ratio to the first.

With PROBE_BIN set, `machine-probe 1` also runs before the first replay of a round and after
every replay, and each replay gets the mean of the two probes beside it. Then, per binary,
the probes beside its fastest third of replays are set against those beside its slowest
third: the probe that moves with the replay names what the slow phases take away (a clock
that moves is frequency; `alu` and `chase_1m` without the clock, a busy SMT sibling).

With AB_RAW=PATH it also writes every replay's CPU time, and the probes beside it, to PATH as
JSON, for questions the summary does not answer.

CPU time is user + system of the child, from getrusage; events are what `allocsim replay`
reports (all must agree). Run it pinned (`taskset -c N`) so the probes see the replays' core.
"""
import json, os, resource, statistics, subprocess, sys

if len(sys.argv) < 4:
    sys.exit(__doc__)
rounds, trace, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
probe_bin = os.environ.get("PROBE_BIN")


def run(cmd):
    """(CPU seconds of the child, its stdout); exits on failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {p.stdout[-300:]} {p.stderr[-300:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), p.stdout


def probe():
    out = run([probe_bin, "1"])[1]
    return {k: float(v) for k, v in (kv.split("=") for kv in out.split())}


times = {b: [] for b in bins}
beside = {b: [] for b in bins}  # the probes (before, after) each replay
events = None
for r in range(rounds):
    last = probe() if probe_bin else None
    for b in (bins if r % 2 == 0 else bins[::-1]):
        cpu, out = run([b, "replay", trace])
        got = out.split("events: ")[1].split()[0] if "events: " in out else None
        if got is None or (events is not None and int(got) != events):
            sys.exit(f"{b} disagreed: {out[-300:]}")
        events = int(got)
        times[b].append(cpu)
        if probe_bin:
            nxt = probe()
            beside[b].append((last, nxt))
            last = nxt
if os.environ.get("AB_RAW"):
    with open(os.environ["AB_RAW"], "w") as f:
        json.dump({"trace": trace, "events": events, "times": times, "probes": beside}, f)
first = times[bins[0]]
print(f"{trace}: {events} events, {rounds} rounds")
for b, xs in times.items():
    ev = [events / x / 1e6 for x in xs]
    ratio = statistics.median(x / y for x, y in zip(xs, first))
    print(f"{b}: M events/s median {statistics.median(ev):.1f} best {max(ev):.1f}; "
          f"time / first's, median of rounds: {ratio:.3f}")
    if probe_bin and len(xs) >= 3:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        third = len(xs) // 3
        fast, slow = order[:third], order[-third:]
        print(f"  fastest third {statistics.median(ev[i] for i in fast):.1f} M events/s, "
              f"slowest third {statistics.median(ev[i] for i in slow):.1f}; probes beside them, ns:")
        mean = [{k: (a[k] + z[k]) / 2 for k in a} for a, z in beside[b]]
        for k in mean[0]:
            f = statistics.median(mean[i][k] for i in fast)
            s = statistics.median(mean[i][k] for i in slow)
            print(f"    {k:10s} {f:9.3f} {s:9.3f}  x{s / f:.2f}")
