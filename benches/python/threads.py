"""Two replays one after the other against the same two in two Python threads at once: the
Python package releases the GIL during a call, so on two cores the threads should take about
half the wall time. Alternating rounds (the machines are noisy): prints each round's times and
the median ratio.

    python3 benches/python/threads.py [ROUNDS]
"""

import statistics
import sys
import threading
import time
from pathlib import Path

import allocsim

ROOT = Path(__file__).resolve().parents[2]
TRACES = [
    ROOT / "traces/pytorch-2.11-h100-user/d_gpt2_blog.pickle.gz",
    ROOT / "traces/pytorch-2.11-h100-user/h_gpt2_blog.pickle.gz",
]


def main(rounds: int) -> None:
    traces = [allocsim.load(t) for t in TRACES]
    expected = [allocsim.replay(t, check=True).raw for t in traces]

    def sequential() -> float:
        start = time.perf_counter()
        got = [allocsim.replay(t, check=True).raw for t in traces]
        assert got == expected
        return time.perf_counter() - start

    def threaded() -> float:
        got = [None, None]

        def run(i: int) -> None:
            got[i] = allocsim.replay(traces[i], check=True).raw

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        assert got == expected
        return elapsed

    ratios = []
    for r in range(rounds):
        s, t = sequential(), threaded()
        ratios.append(t / s)
        print(f"round {r}: one after the other {s:.3f} s, two threads {t:.3f} s, ratio {t / s:.2f}")
    print(f"median ratio (two threads / one after the other): {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
