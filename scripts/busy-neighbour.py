#!/usr/bin/env python3
"""Keep this machine's cores busy the way other programs do, to measure what treespec does on a
machine it shares (scripts/curve-under-load.sh).

    busy-neighbour.py bursts SECONDS     # every core: busy 0.5–3 s, idle 0.5–3 s, at random
    busy-neighbour.py sustained SECONDS  # every core busy the whole time (a build)

One process per core; each stops after SECONDS. Deterministic per core (fixed seeds)."""
import multiprocessing
import os
import random
import sys
import time


def spin(until):
    x = 0
    while time.monotonic() < until:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def worker(mode, seconds, seed):
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if mode == "sustained":
            spin(end)
            break
        spin(min(end, time.monotonic() + rng.uniform(0.5, 3.0)))
        time.sleep(max(0.0, min(end - time.monotonic(), rng.uniform(0.5, 3.0))))


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("bursts", "sustained"):
        sys.exit(__doc__)
    mode, seconds = sys.argv[1], float(sys.argv[2])
    procs = [
        multiprocessing.Process(target=worker, args=(mode, seconds, 7919 * (i + 1)))
        for i in range(os.cpu_count() or 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()
