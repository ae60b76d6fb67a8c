#!/usr/bin/env python3
"""The summary of a cold run (scripts/cold-bench.sh, scripts/avx2-tier.sh): OUT/cold.md from
OUT/cold.jsonl (one line per run; several runs of a (prompt, tool) count as their median) and
OUT/load.txt.

    scripts/lib/cold_summary.py OUT

Beside llama.cpp's tools, a prompt counts only when treespec plain and llama.cpp plain read it as
the same number of tokens and gave the same greedy answer up to a near tie
(scripts/lib/same_prompt.py); the others are listed apart, below the table, and left out of
every ratio.
"""
import json, os, statistics, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import same_prompt
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/cold.jsonl") if l.strip()]
# Beside llama.cpp's tools, only the prompts both plain decoders read as the same tokens and
# answered the same (up to a near tie) count, in every ratio; the others are listed apart.
firsts = {}
for r in rows:
    firsts.setdefault((r["id"], r["tool"]), r)
pairs = {i: (firsts[(i, "treespec plain")], firsts.get((i, "llama.cpp plain"), {}))
         for i, t in firsts if t == "treespec plain"}
peers = any(r["tool"] == "llama.cpp plain" for r in rows)
apart = []
if peers:
    _, left_out, near = same_prompt.split(pairs)
    apart = same_prompt.report(left_out, near, len(pairs))
    rows = [r for r in rows if r["id"] not in left_out]
# Several runs of a (prompt, tool) — REPEAT, or the lines of several runs of this script
# concatenated — count as their median.
def runs_of(field):
    """{(prompt, tool): [the field's value in each run that has it]}."""
    runs = {}
    for r in rows:
        if r.get(field):
            runs.setdefault((r["id"], r["tool"]), []).append(r[field])
    return runs
runs = runs_of("tokens_per_s")
by = {k: statistics.median(v) for k, v in runs.items()}
ids = sorted({r["id"] for r in rows})
cats = {r["id"]: r["category"] for r in rows}
def ratios(tool, plain, ids):
    return [by[(i, tool)] / by[(i, plain)] for i in ids if (i, tool) in by and (i, plain) in by]
med = lambda xs: statistics.median(xs) if xs else float("nan")
tools = [("treespec auto", "treespec plain"), ("treespec auto (before)", "treespec plain"),
         ("llama.cpp ngram-mod", "llama.cpp plain"), ("llama.cpp lookup", "llama.cpp plain")]
tools = [t for t in tools if any(k[1] == t[0] for k in by)]
groups = [("all", ids)] + [(c, [i for i in ids if cats[i] == c]) for c in sorted(set(cats.values()))]
lines = ["| tool ÷ its plain | " + " | ".join(g for g, _ in groups) + " |",
         "|---|" + "---:|" * len(groups)]
for tool, plain in tools:
    lines.append(f"| {tool} | " + " | ".join(f"{med(ratios(tool, plain, g)):.2f}×" for _, g in groups) + " |")
a = med(ratios("treespec auto", "treespec plain", ids))
n = med(ratios("llama.cpp ngram-mod", "llama.cpp plain", ids))
gain = lambda g: med(ratios("treespec auto", "treespec plain", g)) / med(ratios("llama.cpp ngram-mod", "llama.cpp plain", g))
peers = any(k[1] == "llama.cpp ngram-mod" for k in by)
if peers:
    lines.append("| `auto`'s ÷ ngram-mod's | " + " | ".join(f"{gain(g):.2f}×" for _, g in groups) + " |")
lines += ["", f"Median over {len(ids)} prompts of each prompt's speed-up (a tool's tokens/s on a prompt: the median of its {max(len(v) for v in runs.values())} runs)."]
if peers:
    lines += [f"`auto` ÷ ngram-mod's gain: {a / n:.3f}×.",
              "treespec plain ÷ llama.cpp plain: " + f"{med([by[(i, 'treespec plain')] / by[(i, 'llama.cpp plain')] for i in ids if (i, 'treespec plain') in by and (i, 'llama.cpp plain') in by]):.2f}×."]
# The whole request (prompt read, every draft model's prefill included) as a user waits for it:
# treespec's runs only (llama.cpp's tools report decoding alone).
wall = {k: statistics.median(v) for k, v in runs_of("wall_s").items()}
for tool in ("treespec auto", "treespec auto (before)"):
    w = [wall[(i, "treespec plain")] / wall[(i, tool)] for i in ids if (i, tool) in wall and (i, "treespec plain") in wall]
    if w:
        lines.append(f"Whole request (prefill included), {tool} ÷ treespec plain: median {med(w):.2f}×, lowest {min(w):.2f}×.")
if apart:
    lines += [""] + apart
lines += ["", open(f"{out}/load.txt").read().strip()]
open(f"{out}/cold.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
