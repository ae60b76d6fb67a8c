#!/usr/bin/env python3
"""What the suffix drafter's bets earned, by kind of text and by where in the answer they were made.

    cargo run --release -p treespec-bench --example suffix_replay -- TOKENS.jsonl CURVE.json \
        --refine --cold --trace | python3 scripts/replay-bets.py CURVE.json TOKENS.jsonl [...]

Why: a per-prompt speed-up over a short answer swings on one bet (a 3-node probe that brings one
token costs about a plain step, a tenth of an 11-token answer), so a category's median over one or
two such answers cannot say whether the drafter's bets pay in that kind of text. The replay's
`TRACE` lines (prompt, position in the answer, drafted nodes, deepest node, tokens emitted) can:
each drafted step earned `emitted × T(1) − T(nodes + 1)`, in plain steps, on the curve the replay
scored on. Prints, per category and answer-position bucket, the bets and their summed earnings,
and per category the share of answers that made any bet and the answers' lengths.
"""

import json
import statistics
import sys
from collections import defaultdict

BUCKETS = ((4, "1–3"), (8, "4–7"), (16, "8–15"), (None, "16+"))


def bucket(position):
    return next(name for edge, name in BUCKETS if edge is None or position < edge)


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: … --trace | replay-bets.py CURVE.json TOKENS.jsonl [TOKENS.jsonl …]")
    curve = json.load(open(sys.argv[1]))["curve"]["ms"]
    category, length = {}, {}
    for path in sys.argv[2:]:
        for line in open(path):
            answer = json.loads(line)
            category[str(answer["prompt_id"])] = answer["category"]
            length[str(answer["prompt_id"])] = len(answer["output"])
    bets = defaultdict(lambda: [0, 0.0])
    betting = defaultdict(set)
    for line in sys.stdin:
        if not line.startswith("TRACE\t"):
            continue
        _, prompt, position, nodes, _depth, emitted = line.rstrip("\n").split("\t")
        nodes, emitted = int(nodes), int(emitted)
        if nodes == 0:
            continue
        earned = (emitted * curve[0] - curve[nodes]) / curve[0]
        for key in ((category[prompt], bucket(int(position))), (category[prompt], "all")):
            bets[key][0] += 1
            bets[key][1] += earned
        betting[category[prompt]].add(prompt)
    names = [name for _, name in BUCKETS] + ["all"]
    print("| category | answers | median tokens | answers that bet | "
          + " | ".join(f"bets at {n} (earned)" for n in names) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(names))
    for c in sorted(set(category.values())):
        ids = [p for p, k in category.items() if k == c]
        cells = []
        for n in names:
            count, earned = bets.get((c, n), (0, 0.0))
            cells.append(f"{count} ({earned:+.1f})" if count else "–")
        median = statistics.median(length[p] for p in ids)
        print(f"| {c} | {len(ids)} | {median:.0f} | {len(betting[c])} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
