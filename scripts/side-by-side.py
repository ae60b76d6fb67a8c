#!/usr/bin/env python3
"""One table of treespec's methods and llama.cpp's own tools on the same prompts.

    scripts/side-by-side.py BENCH_DIR/results.json PEERS.jsonl [--out TABLE.md]

Each speed-up is that family's own ratio on the same prompts and machine: a treespec method's
median tokens/s over a category's prompts divided by treespec plain decoding's, and a llama.cpp
tool's divided by llama.cpp's plain decoding (llama-completion). "all" pools every prompt. The last
rows compare the two plain decoders and the best of each family. Below the table, each prompt's own
speed-up over its family's plain, as the mean and the median over prompts (the pooled "all" reads
the prompts in the middle of the tokens/s range, most of them prose).

Only prompts both plain decoders read as the same tokens count (issue #68): treespec plain's
prompt token count and greedy answer (BENCH_DIR/plain-answers.jsonl, written by `treespec bench`)
against llama.cpp plain's (PEERS.jsonl's `prompt_tokens` and `text`; on a structured run
`llama-completion --json-schema` is llama.cpp's plain); a prompt whose counts differ or whose
answers differ beyond a near tie (scripts/lib/same_prompt.py) is listed below the table and left
out of every row. Results without plain-answers.jsonl (before #68) are not checked, and the table
says so.
"""
import json
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import same_prompt  # noqa: E402


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
    for name, plain in [("auto", "plain"), ("llama.cpp ngram-mod", PEER_PLAIN)]:
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


PEER_PLAIN = "llama.cpp plain"
PEER_SCHEMA = "llama.cpp json-schema"


def same_tokens(runs, peers, bench_dir):
    """The runs and peer runs of the prompts both plain decoders read as the same tokens, and the
    lines saying which were left out (scripts/lib/same_prompt.py)."""
    answers_file = os.path.join(bench_dir, "plain-answers.jsonl")
    if not os.path.exists(answers_file):
        return runs, peers, [f"Same tokens: NOT CHECKED (no {answers_file}: results from before issue #68)."]
    ours = {}
    for line in open(answers_file):
        if line.strip():
            a = json.loads(line)
            ours.setdefault(str(a["prompt_id"]), a)
    theirs = {}
    for p in peers:
        if p["tool"] in (PEER_PLAIN, PEER_SCHEMA):
            theirs.setdefault(str(p["id"]), p)
    pairs = {i: (a, theirs.get(i, {})) for i, a in ours.items()}
    _, left_out, near = same_prompt.split(pairs)
    runs = [r for r in runs if str(r["prompt_id"]) not in left_out]
    peers = [p for p in peers if str(p["id"]) not in left_out]
    return runs, peers, same_prompt.report(left_out, near, len(pairs))


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
    peers = [json.loads(line) for line in open(args[1]) if line.strip()]
    runs, peers, apart = same_tokens(results["runs"], peers, os.path.dirname(os.path.abspath(args[0])))
    ours = [(r["method"], r["category"], r["tokens_per_s"]) for r in runs]
    theirs = [(p["tool"], p["category"], p["tokens_per_s"]) for p in peers]
    peer_plain = PEER_PLAIN if any(p["tool"] == PEER_PLAIN for p in peers) else PEER_SCHEMA
    med = medians(ours + theirs)
    categories = ["all"] + sorted({c for _, c, _ in ours} & {c for _, c, _ in theirs})
    methods = list(dict.fromkeys(m for m, _, _ in ours))
    tools = list(dict.fromkeys(t for t, _, _ in theirs))

    def ratio(name, plain, cat):
        a, b = med.get((name, cat)), med.get((plain, cat))
        return a / b if a and b else None

    lines = ["| | " + " | ".join(categories) + " |", "|---|" + "---:|" * len(categories)]
    rows = [(f"treespec `{m}`", m, "plain") for m in methods] + [(t, t, peer_plain) for t in tools]
    table = {}
    for label, name, plain in rows:
        cells = [ratio(name, plain, c) for c in categories]
        table[label] = cells
        lines.append(f"| {label} | " + " | ".join(f"{x:.2f}×" if x else "–" for x in cells) + " |")
    # Plain against plain: the kernels are the same, so this should be ≈ 1.
    cells = [ratio("plain", peer_plain, c) for c in categories]
    lines.append(f"| treespec plain ÷ {peer_plain} | " + " | ".join(f"{x:.2f}" if x else "–" for x in cells) + " |")
    best_peer = [max((v[i] for k, v in table.items() if k.startswith("llama.cpp") and v[i]), default=None) for i in range(len(categories))]
    if "treespec `auto`" in table:
        cells = [a / b if a and b else None for a, b in zip(table["treespec `auto`"], best_peer)]
        lines.append("| `auto` ÷ best llama.cpp tool | " + " | ".join(f"{x:.2f}" if x else "–" for x in cells) + " |")
    text = "\n".join(lines) + "\n"
    text += "\nmedian tokens/s: " + ", ".join(f"{n} {med[(n, 'all')]:.1f}" for n in methods + tools if (n, "all") in med) + "\n"
    text += per_prompt(runs, peers)
    text += "\n" + "\n".join(apart) + "\n"
    print(text)
    if out:
        open(out, "w").write(text)


if __name__ == "__main__":
    main()
