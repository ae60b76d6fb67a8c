#!/usr/bin/env python3
"""One table of treespec's methods and llama.cpp's own tools on the same prompts.

    scripts/side-by-side.py BENCH_DIR/results.json PEERS.jsonl [--out TABLE.md]

Each speed-up is that family's own ratio on the same prompts and machine: a treespec method's
median tokens/s over a category's prompts divided by treespec plain decoding's, and a llama.cpp
tool's divided by llama.cpp's plain decoding (llama-completion). "all" pools every prompt. The last
rows compare the two plain decoders and the best of each family. Below the table, each prompt's own
speed-up over its family's plain, as the mean and the median over prompts (the pooled "all" reads
the prompts in the middle of the tokens/s range, most of them prose).
"""
import json
import statistics
import sys
from collections import defaultdict


def medians(rows):
    """{(name, category): median tokens/s} plus the pooled 'all' category."""
    by = defaultdict(list)
    for name, category, tps in rows:
        if tps is None:
            continue
        by[(name, category)].append(tps)
        by[(name, "all")].append(tps)
    return {k: statistics.median(v) for k, v in by.items()}


def per_prompt(runs, peers):
    """Each prompt's speed-up over its family's plain decoding: mean and median over prompts."""
    tps = {}
    for r in runs:
        tps.setdefault((str(r["prompt_id"]), r["method"]), []).append(r["tokens_per_s"])
    for p in peers:
        tps.setdefault((str(p["id"]), p["tool"]), []).append(p["tokens_per_s"])
    tps = {k: statistics.median(v) for k, v in tps.items() if all(v)}
    ids = sorted({i for i, _ in tps})
    gains = {}
    for name, plain in [("auto", "plain"), ("llama.cpp ngram-mod", "llama.cpp plain")]:
        g = [tps[(i, name)] / tps[(i, plain)] for i in ids if (i, name) in tps and (i, plain) in tps]
        if g:
            gains[name] = (statistics.mean(g), statistics.median(g), len(g))
    if not gains:
        return ""
    text = "per prompt, speed-up over its own plain (mean / median): " + ", ".join(
        f"{n} {m:.2f}× / {md:.2f}× ({k} prompts)" for n, (m, md, k) in gains.items()
    )
    if len(gains) == 2:
        (am, amd, _), (nm, nmd, _) = gains.values()
        text += f"; `auto`'s gain ÷ ngram-mod's: {am / nm:.2f} / {amd / nmd:.2f}"
    return text + "\n"


def main():
    args = sys.argv[1:]
    out = None
    if "--out" in args:
        i = args.index("--out")
        out = args[i + 1]
        del args[i : i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    results = json.load(open(args[0]))
    ours = [(r["method"], r["category"], r["tokens_per_s"]) for r in results["runs"]]
    peers = [json.loads(line) for line in open(args[1]) if line.strip()]
    theirs = [(p["tool"], p["category"], p["tokens_per_s"]) for p in peers]
    med = medians(ours + theirs)
    categories = ["all"] + sorted({c for _, c, _ in ours} & {c for _, c, _ in theirs})
    methods = list(dict.fromkeys(m for m, _, _ in ours))
    tools = list(dict.fromkeys(t for t, _, _ in theirs))

    def ratio(name, plain, cat):
        a, b = med.get((name, cat)), med.get((plain, cat))
        return a / b if a and b else None

    lines = ["| | " + " | ".join(categories) + " |", "|---|" + "---:|" * len(categories)]
    rows = [(f"treespec `{m}`", m, "plain") for m in methods] + [(t, t, "llama.cpp plain") for t in tools]
    table = {}
    for label, name, plain in rows:
        cells = [ratio(name, plain, c) for c in categories]
        table[label] = cells
        lines.append(f"| {label} | " + " | ".join(f"{x:.2f}×" if x else "–" for x in cells) + " |")
    # Plain against plain: the kernels are the same, so this should be ≈ 1.
    cells = [ratio("plain", "llama.cpp plain", c) for c in categories]
    lines.append("| treespec plain ÷ llama.cpp plain | " + " | ".join(f"{x:.2f}" if x else "–" for x in cells) + " |")
    best_peer = [max((v[i] for k, v in table.items() if k.startswith("llama.cpp") and v[i]), default=None) for i in range(len(categories))]
    if "treespec `auto`" in table:
        cells = [a / b if a and b else None for a, b in zip(table["treespec `auto`"], best_peer)]
        lines.append("| `auto` ÷ best llama.cpp tool | " + " | ".join(f"{x:.2f}" if x else "–" for x in cells) + " |")
    text = "\n".join(lines) + "\n"
    text += "\nmedian tokens/s: " + ", ".join(f"{n} {med[(n, 'all')]:.1f}" for n in methods + tools if (n, "all") in med) + "\n"
    text += per_prompt(results["runs"], peers)
    print(text)
    if out:
        open(out, "w").write(text)


if __name__ == "__main__":
    main()
