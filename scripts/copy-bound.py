#!/usr/bin/env python3
"""How fast could ANY free draft copied from the text itself have made these answers? An oracle.

Reads a bench run's plain-tokens.jsonl (plain decoding's prompt and output tokens, written by
`treespec bench`) and the target's measured cost curve (a cost-cache JSON file, as `treespec
profile` / `bench` write under ~/.cache/treespec/costs/). At every position of every answer it finds
the longest stretch of what comes next that also follows an earlier occurrence of the text's last
M tokens (in the prompt or in the answer so far) — what a suffix or prompt-lookup drafter could
propose at best — and then, by dynamic programming over the whole answer, verifies exactly the
right prefix of it at each step: never a wrong token, never a needless row. The resulting speed-up
over plain decoding, priced on the same cost curve (context surcharge included), bounds every
drafter that copies from the text: suffix, lookup, llama.cpp's ngram tools. A category whose
oracle is below a target cannot reach it with free drafts on this machine.

Usage: scripts/copy-bound.py PLAIN_TOKENS_JSONL --curve COST_JSON [--match 1 3]
"""

import argparse
import json
import statistics
import sys
from collections import defaultdict


def load_curve(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"copy-bound: cannot read the cost curve {path}: {e}")
    curve = doc.get("curve", doc)
    if "ms" not in curve or not curve["ms"]:
        sys.exit(f"copy-bound: {path} has no curve.ms (expected a treespec cost-cache file)")
    ms = curve["ms"]
    slope = curve.get("row_ms_per_context_token", 0.0) or 0.0
    profiled = curve.get("profiled_context", 0) or 0

    # Past the measured sizes, the curve goes on at the slope of its last quarter, never
    # downwards (as treespec's CostCurve::ms extrapolates it): the last step alone can be a dip
    # (T(64) is below T(63) on the repacked kernels) and would make longer forwards cheaper.
    last = len(ms)
    first = min(max(last - last // 4, 1), last)
    per_row = max(0.0, (ms[-1] - ms[first - 1]) / (last - first)) if last > first else ms[-1]

    def cost(rows, context):
        base = ms[min(rows, len(ms)) - 1] + max(0, rows - len(ms)) * per_row
        return base + rows * slope * max(0, context - profiled)

    return cost


def copy_lengths(text, start, m, max_len):
    """For each position h >= start: the longest d such that text[h:h+d] follows an earlier
    occurrence of text[h-m:h] that lies wholly in text[:h]."""
    n = len(text)
    where = defaultdict(list)  # m-gram -> end positions (exclusive) of its occurrences
    for j in range(m, start):
        where[tuple(text[j - m:j])].append(j)
    out = [0] * n
    for h in range(start, n):
        best = 0
        for e in where.get(tuple(text[h - m:h]), ()):
            d = 0
            while d < max_len and h + d < n and e + d < h and text[e + d] == text[h + d]:
                d += 1
            best = max(best, d)
        out[h] = best
        where[tuple(text[h - m + 1:h + 1])].append(h + 1)
    return out


def oracle_speedup(prompt, output, cost, m, max_rows):
    text = prompt + output
    start = len(prompt) + 1  # the first output token comes from the prompt's forward
    n = len(text)
    if n <= start:
        return 1.0
    d = copy_lengths(text, start, m, max_rows - 1)
    best = [0.0] * (n + 1)
    for h in range(n - 1, start - 1, -1):
        # A step at h verifies k drafted tokens and emits k + 1 (the last one the target's own).
        best[h] = min(cost(k + 1, h) + best[min(n, h + k + 1)] for k in range(0, min(d[h], n - h - 1) + 1))
    plain = sum(cost(1, h) for h in range(start, n))
    return plain / best[start]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tokens", help="plain-tokens.jsonl from a treespec bench run")
    ap.add_argument("--curve", required=True, help="the target's cost-cache JSON (~/.cache/treespec/costs/…)")
    ap.add_argument("--match", type=int, nargs="+", default=[1, 3],
                    help="tokens of the text's end an occurrence must match (default: 1 3)")
    ap.add_argument("--max-rows", type=int, default=64, help="largest verify batch (default 64)")
    args = ap.parse_args()
    cost = load_curve(args.curve)
    try:
        rows = [json.loads(line) for line in open(args.tokens) if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"copy-bound: cannot read {args.tokens}: {e}")
    if not rows:
        sys.exit(f"copy-bound: {args.tokens} holds no generations")
    print(f"Copy oracle on {len(rows)} answers ({args.tokens}); speed-up over plain decoding on the curve "
          f"{args.curve}, median per category [min–max]\n")
    header = "| category | prompts | " + " | ".join(f"oracle, match ≥ {m}" for m in args.match) + " |"
    print(header)
    print("|---|---:|" + "---:|" * len(args.match))
    by_cat = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for m in args.match:
            s = oracle_speedup(r["prompt"], r["output"], cost, m, args.max_rows)
            by_cat[r["category"]][m].append(s)
            by_cat["all"][m].append(s)
    for cat in sorted(by_cat, key=lambda c: (c != "all", c)):
        cells = []
        for m in args.match:
            v = by_cat[cat][m]
            cells.append(f"{statistics.median(v):.2f}× [{min(v):.2f}–{max(v):.2f}]")
        print(f"| {cat} | {len(by_cat[cat][args.match[0]])} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
