"""Paired A/B timing of allocsim binaries replaying one trace (benches/README.md, target 2).

    python3 benches/ab.py ROUNDS TRACE BIN [BIN ...]

The lent machines change speed by up to 2x from one second to the next (a fixed CPython loop
takes 210 or 460 ms depending on when it runs), so the medians of separate batches cannot
tell a 5% change from noise. Here each round runs every binary once, in alternating order,
and each binary's CPU time is divided by the first binary's in the same round: the machine's
state cancels, and the median of those ratios resolves a few percent. Prints, per binary, the
events per second (median and best over the rounds) and the median ratio to the first.

CPU time is user + system of the child, from getrusage; events are what `allocsim replay`
reports (all must agree).
"""
import os, resource, statistics, subprocess, sys

if len(sys.argv) < 4:
    sys.exit(__doc__)
rounds, trace, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
times = {b: [] for b in bins}
events = None
for r in range(rounds):
    for b in (bins if r % 2 == 0 else bins[::-1]):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([b, "replay", trace], capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        got = p.stdout.split("events: ")[1].split()[0] if "events: " in p.stdout else None
        if p.returncode != 0 or got is None or (events is not None and int(got) != events):
            sys.exit(f"{b} failed or disagreed: {p.stdout[-300:]} {p.stderr[-300:]}")
        events = int(got)
        times[b].append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
first = times[bins[0]]
print(f"{trace}: {events} events, {rounds} rounds")
for b, xs in times.items():
    ev = [events / x / 1e6 for x in xs]
    ratio = statistics.median(x / y for x, y in zip(xs, first))
    print(f"{b}: M events/s median {statistics.median(ev):.1f} best {max(ev):.1f}; "
          f"time / first's, median of rounds: {ratio:.3f}")
