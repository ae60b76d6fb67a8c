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


# The suffix drafter's context buckets (crates/treespec-core/src/suffix/pricing.rs): a node's
# context is the match it continues, the root's match length plus the drafted tokens above it.
CONTEXT_EDGES = [2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64]


def context_bucket(context):
    for i, e in enumerate(CONTEXT_EDGES):
        if context <= e:
            return i
    return len(CONTEXT_EDGES)


def longest_match_chains(text, start, max_len=64):
    """For each position h >= start: (m, chain, run) for the most recent earlier occurrence of the
    longest suffix of text[:h] (m tokens, at most max_len): chain = what followed it (known text
    only, at most max_len tokens), run = how many of chain's tokens text[h:] repeats."""
    n = len(text)
    out = {}
    for h in range(start, n):
        best_m, best_e = 0, None
        last = text[h - 1]
        for e in range(h - 1, 0, -1):  # e: where the occurrence's continuation starts
            if text[e - 1] != last:
                continue
            m = 1
            while m < max_len and e - 1 - m >= 0 and text[e - 1 - m] == text[h - 1 - m]:
                m += 1
            if m > best_m:
                best_m, best_e = m, e
        if best_e is None:
            out[h] = (0, [], 0)
            continue
        chain = text[best_e:min(h, best_e + max_len)]
        run = 0
        while run < len(chain) and h + run < n and chain[run] == text[h + run]:
            run += 1
        out[h] = (best_m, chain, run)
    return out


def calibrated_speedups(rows, cost, max_rows):
    """A free drafter that knows exactly how often each category's matches continue.

    It drafts the continuation of the longest earlier match in the request's own text (as a suffix
    drafter's main chain) and prices each drafted token at the acceptance measured *in sample*:
    per category, per context bucket (match length + depth - 1), over every position of every
    answer. Each step verifies the prefix with the best gain at the answer's achieved rate on the
    curve (Dinkelbach's rule, as treespec's budget does). No real drafter is calibrated that well on
    text it has not seen, so this bounds what better prices alone could give: the best a free draft
    with the measured acceptance can reach on the measured curve."""
    chains = [longest_match_chains(r["prompt"] + r["output"], len(r["prompt"]) + 1) for r in rows]
    tally = defaultdict(lambda: [0, 0])  # (category, bucket) -> [trials, accepted]
    for r, found in zip(rows, chains):
        for m, chain, run in found.values():
            for d in range(1, len(chain) + 1):
                if run < d - 1:
                    break
                t = tally[(r["category"], context_bucket(m + d - 1))]
                t[0] += 1
                t[1] += run >= d
    out = []
    for r, found in zip(rows, chains):
        n = len(r["prompt"]) + len(r["output"])
        h = len(r["prompt"]) + 1
        plain = sum(cost(1, k) for k in range(h, n))
        spent, emitted = 0.0, 0
        while h < n:
            m, chain, run = found[h]
            room = min(len(chain), n - h - 1, max_rows - 1)
            # The answer's achieved rate, never below plain decoding's.
            rate = max(emitted / spent if spent > 0 else 0.0, 1.0 / cost(1, h))
            best_k, best_gain, value, tokens = 0, 1.0 - rate * cost(1, h), 1.0, 1.0
            for k in range(1, room + 1):
                trials, accepted = tally[(r["category"], context_bucket(m + k - 1))]
                value *= accepted / trials if trials else 0.0
                tokens += value
                gain = tokens - rate * cost(k + 1, h)
                if gain > best_gain:
                    best_k, best_gain = k, gain
            step = min(best_k, run) + 1
            spent += cost(best_k + 1, h)
            emitted += step
            h += step
        out.append(plain / spent if spent > 0 else 1.0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tokens", help="plain-tokens.jsonl from a treespec bench run")
    ap.add_argument("--curve", required=True, help="the target's cost-cache JSON (~/.cache/treespec/costs/…)")
    ap.add_argument("--match", type=int, nargs="+", default=[1, 3],
                    help="tokens of the text's end an occurrence must match (default: 1 3)")
    ap.add_argument("--max-rows", type=int, default=64, help="largest verify batch (default 64)")
    ap.add_argument("--calibrated", action="store_true",
                    help="add a column: a drafter of the longest match's continuation priced at the "
                         "acceptance measured in sample per category and context (see calibrated_speedups)")
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
    columns = [f"oracle, match ≥ {m}" for m in args.match]
    if args.calibrated:
        columns.append("calibrated drafter")
    print("| category | prompts | " + " | ".join(columns) + " |")
    print("|---|---:|" + "---:|" * len(columns))
    by_cat = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for m in args.match:
            s = oracle_speedup(r["prompt"], r["output"], cost, m, args.max_rows)
            by_cat[r["category"]][m].append(s)
            by_cat["all"][m].append(s)
    keys = list(args.match)
    if args.calibrated:
        keys.append("calibrated")
        for r, s in zip(rows, calibrated_speedups(rows, cost, args.max_rows)):
            by_cat[r["category"]]["calibrated"].append(s)
            by_cat["all"]["calibrated"].append(s)
    for cat in sorted(by_cat, key=lambda c: (c != "all", c)):
        cells = []
        for key in keys:
            v = by_cat[cat][key]
            cells.append(f"{statistics.median(v):.2f}× [{min(v):.2f}–{max(v):.2f}]")
        print(f"| {cat} | {len(by_cat[cat][args.match[0]])} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
