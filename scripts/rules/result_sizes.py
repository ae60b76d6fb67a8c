#!/usr/bin/env python3
"""Results that stay small (issue #67): no file under `bench/results/` is larger than LIMIT
(512 KiB) unless it is compressed (`.gz`, `.zst`) or listed, with the reason it is kept whole, in
`scripts/rules/large_results.txt`. Every checkout clones every result, and a review reads them:
raw logs, traces and per-request records go in compressed (`gzip -9`), or stay out with a line
in the folder's README saying how to make them again.

The allowlist holds one file a line, its path under `bench/results/` and then its reason; `#`
starts a comment. An entry without a reason, one naming no file, and one whose file is under the
limit after all are named too, so the list never outlives what it excuses.

Usage: result_sizes.py [ROOT]. Prints each file over the limit and each bad entry; exits 1 if
there is one.
"""

import sys
from pathlib import Path

from rule import run

LIMIT = 512 * 1024
COMPRESSED = (".gz", ".zst")
ALLOWLIST = "scripts/rules/large_results.txt"


def allowlist(root):
    """The allowlist's entries (path under `bench/results/` → reason) and its entries without a
    reason."""
    entries, problems = {}, []
    path = root / ALLOWLIST
    if not path.exists():
        return entries, problems
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            problems.append(f"{ALLOWLIST} lists bench/results/{name} without a reason")
        entries[name] = reason.strip()
    return entries, problems


def report(root):
    root = Path(root)
    results = root / "bench/results"
    allowed, problems = allowlist(root)
    files = sorted(p for p in results.rglob("*") if p.is_file()) if results.is_dir() else []
    for p in files:
        rel = p.relative_to(results).as_posix()
        size = p.stat().st_size
        if size > LIMIT and not p.name.endswith(COMPRESSED) and rel not in allowed:
            problems.append(
                f"bench/results/{rel} is {size // 1024} KiB, over the {LIMIT // 1024} KiB limit: "
                f"compress it (gzip -9), leave it out, or list it in {ALLOWLIST} with its reason"
            )
    for rel in allowed:
        p = results / rel
        if not p.is_file():
            problems.append(f"{ALLOWLIST} lists bench/results/{rel}, which does not exist")
        elif p.stat().st_size <= LIMIT or p.name.endswith(COMPRESSED):
            problems.append(f"{ALLOWLIST} lists bench/results/{rel}, which needs no entry (small or compressed)")
    return problems


if __name__ == "__main__":
    sys.exit(run(report, "results over the size limit"))
