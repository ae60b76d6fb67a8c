"""The command line every rule's check shares: run its `report(root)` on ROOT (the first argument,
default this repository), print each problem and a count, exit 1 if there is a problem."""

import sys
from pathlib import Path


def run(report, what):
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
    problems = report(root)
    for p in problems:
        print(p)
    print(f"[rules] {what}: {len(problems)}")
    return 1 if problems else 0
