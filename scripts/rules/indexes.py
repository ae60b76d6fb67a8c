#!/usr/bin/env python3
"""Every script and every results folder is in its index (issue #67): `scripts/README.md` lists
each file under `scripts/`, `bench/README.md` each entry under `bench/results/`, and neither index
lists what is not there. An index that misses a file leaves the reader guessing what it is for
and whether it is still used; one that lists a file gone sends them after nothing.

An index entry is a backticked name in the first cell of a table row: `setup.sh`,
`lib/server.sh`, or a folder `demo/` that covers every file in it. Results are listed by their
name under `bench/results/` (`main-greedy`, `qwen-pair.accept.json`).

Usage: indexes.py [ROOT]. Prints each file missing from its index and each entry naming nothing;
exits 1 if there is one.
"""

import re
import sys
from pathlib import Path

from rule import run

SKIPPED = ("README.md", "__pycache__")


def index_entries(readme, section=None):
    """The backticked names in the first cell of each table row of `readme` (only under the
    heading `section`, when given)."""
    entries, inside = [], section is None
    for line in readme.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            inside = section is None or line.lstrip("#").strip() == section
        if inside and line.startswith("|") and not set(line) <= set("|-: "):
            first = line.split("|")[1]
            entries += re.findall(r"`([^`]+)`", first)
    return entries


def script_files(scripts):
    """Each file under `scripts/` as a path relative to it, leaving out the index itself and
    Python's caches."""
    return sorted(
        p.relative_to(scripts).as_posix()
        for p in scripts.rglob("*")
        if p.is_file() and not any(part in SKIPPED or part.startswith(".") for part in p.relative_to(scripts).parts)
    )


def index_gaps(root, index, folder, files, entries):
    """What the index at `index` misses of `files` (paths under `folder`; an entry `dir/` covers
    the files in it) and the entries that name nothing there."""
    problems = []
    for f in files:
        folders = [f.rsplit("/", k)[0] + "/" for k in range(1, f.count("/") + 1)]
        if f not in entries and not any(d in entries for d in folders):
            problems.append(f"{index} does not list {folder}/{f}")
    for e in entries:
        if not (root / folder / e).exists():
            problems.append(f"{index} lists {folder}/{e}, which does not exist")
    return problems


def report(root):
    root = Path(root)
    scripts = index_gaps(
        root, "scripts/README.md", "scripts", script_files(root / "scripts"), index_entries(root / "scripts/README.md")
    )
    results = sorted(p.name for p in (root / "bench/results").iterdir() if p.name not in SKIPPED)
    entries = index_entries(root / "bench/README.md", "results/")
    return scripts + index_gaps(root, "bench/README.md", "bench/results", results, entries)


if __name__ == "__main__":
    sys.exit(run(report, "index gaps"))
