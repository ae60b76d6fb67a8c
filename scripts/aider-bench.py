#!/usr/bin/env python3
"""aider editing real files against each server, every answer generated live (issue #65 item 4).

    scripts/aider-bench.py --server "treespec=treespec serve ... --port {port}" \
        --server "llama-server=llama-server ... --port {port}" [--server NAME=CMD ...] \
        [--formats whole,diff,udiff] [--rounds 1] [--tasks all|N,N] [--out DIR]

Every server is up for the whole run (an idle server computes nothing). A task is one file of
bench/inputs/sessions/agent-whole.jsonl (real library modules: toolz, attrs, boltons,
more-itertools) and one change request of its session, with a check of the edited file: it must
still parse, and the change must be there (a rename done everywhere, a parameter renamed, an
f-string in place). For each round, edit format and task, aider (its own environment: $AIDER, as
`scripts/clients-check.sh --aider` installs it) runs once against each server in turn, the order
rotated task by task, on a fresh copy of the file:
    aider --edit-format F --no-stream --message REQUEST FILE
and the row records the wall time of that aider run, whether the edit was applied and passes its
check, and the tokens aider reports sent and received. aider's own start-up (the same against
every server) is measured apart, with `--exit`, and taken off the wall time for the tokens/s that
aider saw.

OUT/runs.jsonl has one line per aider run; OUT/summary.md, per format and server: edits applied,
median seconds per edit, seconds per applied edit, aider's received tokens/s; then the first
server named ÷ each other server, the median of the per-task ratios of seconds per edit (over
the tasks each pair applied both, and over all). Python standard library.
"""
import argparse
import ast
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_process import Server  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import aider_run  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SESSIONS = os.path.join(REPO, "bench/inputs/sessions/agent-whole.jsonl")


def defines(tree, name):
    """The function `name` defined anywhere in `tree`, or None."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def renamed(old, new):
    """A rename done everywhere: `old` gone from the file (word-bounded), `new` defined or used."""
    def check(text, tree):
        assert not re.search(rf"\b{re.escape(old)}\b", text), f"`{old}` is still in the file"
        assert re.search(rf"\b{re.escape(new)}\b", text), f"`{new}` is not in the file"
    return check


def params(function, expected):
    def check(text, tree):
        f = defines(tree, function)
        assert f is not None, f"`{function}` is gone"
        got = [a.arg for a in f.args.args]
        assert got[: len(expected)] == expected, f"`{function}` takes {got}, not {expected}"
    return check


def f_string_in(function):
    def check(text, tree):
        f = defines(tree, function)
        assert f is not None, f"`{function}` is gone"
        assert any(isinstance(n, ast.JoinedStr) for n in ast.walk(f)), f"no f-string in `{function}`"
    return check


# (session file, turn, check of the edited text): one change per file, each of a kind an agent asks
# for every day; aider's whole format re-emits the file, its diff formats only the change.
TASKS = [
    ("toolz/recipes.py", 2, renamed("partitionby", "partition_by")),
    ("attr/filters.py", 0, renamed("_split_what", "_partition_what")),
    ("attr/setters.py", 0, params("frozen", ["instance", "attrib", "new_value"])),
    ("boltons/deprutils.py", 0, renamed("depros", "deprecated_members")),
    ("toolz/dicttoolz.py", 3, f_string_in("_get_factory")),
    ("more_itertools/recipes.py", 0, params("tabulate", ["func"])),
]

TOKENS_RE = re.compile(r"Tokens:\s*([\d.]+)(k?)\s*sent,\s*([\d.]+)(k?)\s*received", re.I)


def count(number, k):
    return float(number) * (1000 if k else 1)


def startup_s(aider, base, runs=3):
    """Median wall time of aider starting up and exiting (`--exit`), what every run pays before its
    request."""
    times = []
    with tempfile.TemporaryDirectory() as work:
        for _ in range(runs):
            t0 = time.monotonic()
            subprocess.run(aider_run.command(aider, base, "whole", ["--timeout", "900", "--exit"]), cwd=work,
                           capture_output=True, env=aider_run.env(base), timeout=300)
            times.append(time.monotonic() - t0)
    return statistics.median(times)


def run_task(aider, base, edit_format, session, turn, check):
    path, original = session["file"]["path"], session["file"]["text"]
    request = session["turns"][turn]["user"]
    with tempfile.TemporaryDirectory() as work:
        target = os.path.join(work, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as f:
            f.write(original)
        t0 = time.monotonic()
        extra = ["--timeout", "900", "--message", request, path]
        out = subprocess.run(aider_run.command(aider, base, edit_format, extra), cwd=work,
                             capture_output=True, text=True, env=aider_run.env(base), timeout=1800)
        wall = time.monotonic() - t0
        with open(target) as f:
            edited = f.read()
    row = {"wall_s": wall, "exit": out.returncode, "changed": edited != original}
    tokens = TOKENS_RE.findall(out.stdout)
    if tokens:
        row["sent"] = sum(count(s, sk) for s, sk, _, _ in tokens)
        row["received"] = sum(count(r, rk) for _, _, r, rk in tokens)
        row["requests"] = len(tokens)
    try:
        assert out.returncode == 0, f"aider exited {out.returncode}"
        assert row["changed"], "no edit applied"
        tree = ast.parse(edited)
        check(edited, tree)
        row["applied"] = True
    except (AssertionError, SyntaxError) as e:
        row["applied"] = False
        row["why"] = str(e)[:300]
        row["aider_tail"] = out.stdout[-600:]
    return row


def summarize(runs, names, out_dir):
    lines = ["| format | server | applied | s per edit (median) | s per applied edit | aider's tok/s (median) |",
             "|---|---|---:|---:|---:|---:|"]
    formats = sorted({r["format"] for r in runs}, key=["whole", "diff", "udiff"].index)
    for fmt in formats:
        for name in names:
            rows = [r for r in runs if r["format"] == fmt and r["server"] == name]
            if not rows:
                continue
            applied = [r for r in rows if r["applied"]]
            walls = [r["wall_s"] for r in rows]
            per_applied = sum(walls) / len(applied) if applied else float("inf")
            rates = [r["received"] / max(r["wall_s"] - r["startup_s"], 1e-3) for r in rows if r.get("received")]
            lines.append(f"| {fmt} | {name} | {len(applied)}/{len(rows)} | {statistics.median(walls):.1f} | "
                         f"{per_applied:.1f} | {statistics.median(rates) if rates else float('nan'):.2f} |")
    lines += ["", f"Ratio: seconds per edit of each other server ÷ {names[0]}'s (above 1: {names[0]} is faster),",
              "median over the (task, round) pairs; 'both applied' counts only pairs where both edits were applied.", "",
              "| format | against | all pairs | both applied | pairs (both applied) |", "|---|---|---:|---:|---:|"]
    for fmt in formats:
        for other in names[1:]:
            ratios, both = [], []
            for r in runs:
                if r["format"] != fmt or r["server"] != names[0]:
                    continue
                twin = [o for o in runs if o["format"] == fmt and o["server"] == other
                        and o["task"] == r["task"] and o["round"] == r["round"]]
                if not twin:
                    continue
                ratio = twin[0]["wall_s"] / r["wall_s"]
                ratios.append(ratio)
                if r["applied"] and twin[0]["applied"]:
                    both.append(ratio)
            med = lambda xs: f"{statistics.median(xs):.2f}×" if xs else "–"
            lines.append(f"| {fmt} | {other} | {med(ratios)} | {med(both)} | {len(both)} of {len(ratios)} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(text)
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", action="append", required=True, help="NAME=COMMAND with {port}")
    ap.add_argument("--formats", default="whole,diff,udiff")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tasks", default="all", help="all, or task indexes (0-5) joined by commas")
    ap.add_argument("--out", default="bench-out/aider-bench")
    ap.add_argument("--startup-timeout", type=float, default=600)
    args = ap.parse_args()
    aider = os.environ.get("AIDER") or os.path.join(REPO, "bench-out/.venv-aider/bin/aider")
    if not os.access(aider, os.X_OK):
        sys.exit(f"no aider at {aider}: run scripts/clients-check.sh --aider once, or set AIDER")
    formats = args.formats.split(",")
    for fmt in formats:
        if fmt not in ("whole", "diff", "udiff"):
            sys.exit(f"--formats: unknown edit format {fmt!r} (whole, diff, udiff)")
    tasks = range(len(TASKS)) if args.tasks == "all" else [int(t) for t in args.tasks.split(",")]
    sessions = {s["file"]["path"]: s for s in map(json.loads, open(SESSIONS))}
    os.makedirs(args.out, exist_ok=True)
    servers = []
    for spec in args.server:
        name, _, cmd = spec.partition("=")
        if not cmd:
            sys.exit(f"--server wants NAME=COMMAND, got {spec!r}")
        servers.append((name, Server(cmd, os.path.join(args.out, f"{name}.log"), args.startup_timeout)))
    names = [n for n, _ in servers]
    runs = []
    try:
        for name, s in servers:
            s.start()
            print(f"[aider-bench] {name} up at port {s.port}", file=sys.stderr)
        base = lambda s: f"http://{s.host}:{s.port}"
        startup = startup_s(aider, base(servers[0][1]))
        print(f"[aider-bench] aider's start-up: {startup:.1f} s", file=sys.stderr)
        with open(os.path.join(args.out, "runs.jsonl"), "w") as log:
            k = 0
            for rnd in range(args.rounds):
                for fmt in formats:
                    for t in tasks:
                        path, turn, check = TASKS[t]
                        order = servers[k % len(servers):] + servers[: k % len(servers)]
                        k += 1
                        for name, s in order:
                            row = run_task(aider, base(s), fmt, sessions[path], turn, check)
                            row.update(server=name, format=fmt, task=path, round=rnd, startup_s=startup)
                            runs.append(row)
                            log.write(json.dumps(row) + "\n")
                            log.flush()
                            print(f"[aider-bench] r{rnd} {fmt} {path} {name}: {row['wall_s']:.1f} s, "
                                  f"applied={row['applied']} {row.get('why', '')}", file=sys.stderr)
    finally:
        for _, s in servers:
            s.stop()
    summarize(runs, names, args.out)


if __name__ == "__main__":
    main()
