#!/usr/bin/env bash
# `auto`'s decision traces on a prompt set, cold, and what its bets saved or lost, read off them.
#
#   scripts/trace-set.sh OUT [PROMPTS.jsonl] [BIN]
#
# One `treespec generate --method auto --decision-trace` per prompt, as scripts/cold-bench.sh runs
# it (a fresh cache holding only this machine's cost curves; Qwen pair by default; greedy, N new
# tokens, 2 threads). Prompts: cold-bench.sh's held-out set (bench/results/cold-qwen-zen3-eos/
# held-out.jsonl by default). OUT/<id>.trace holds each trace, OUT/runs.jsonl each run's tokens/s,
# OUT/regret.md per prompt and category: the steps that drafted, by policy, and the time they
# saved (+) or lost (−) against the run's own median plain step (a drafted step emitting e tokens
# in t ms saved e·plain − t), as a share of the run's decode time; "lost" sums the steps that lost.
# Then every drafted step by its predicted edge over plain decoding (the bandit's corrected rates,
# as the decision read them): plain steps saved and tokens brought ÷ predicted, per band — whether
# the close bets pay on this text.
# Two builds compared: run it once per build (BIN) into two OUT folders.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:?usage: scripts/trace-set.sh OUT [PROMPTS.jsonl] [BIN]}"
prompts="${2:-bench/results/cold-qwen-zen3-eos/held-out.jsonl}"
bin="${3:-target/release/treespec}"
TARGET="${TARGET:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
DRAFT="${DRAFT-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}"
N="${N:-128}"
[[ -x "$bin" ]] || { echo "no $bin: cargo build --release -p treespec-cli" >&2; exit 1; }
mkdir -p "$out"
source scripts/lib/cold-cache.sh
cache="$out/cache"
curves_only_cache "$cache"
draft=()
[[ -n "$DRAFT" ]] && draft=(--draft "$DRAFT")
: >"$out/runs.jsonl"
while IFS= read -r line; do
    id="$(jq -r '.question_id // .id' <<<"$line")"
    category="$(jq -r '.category' <<<"$line")"
    text="$(jq -r '.turns[0]' <<<"$line")"
    name="${id//\//_}"
    cold_generate "$cache" "$bin" -m "$TARGET" -t 2 --method auto --chat -n "$N" --json \
        "${draft[@]}" --decision-trace "$out/$name.trace" -p "$text" |
        jq -c --arg id "$id" --arg c "$category" --arg f "$name" \
            '{id: $id, category: $c, trace: $f, tokens_per_s: .stats.tokens_per_s}' >>"$out/runs.jsonl"
    echo "[trace-set] $category $id" >&2
done <"$prompts"
rm -rf "$cache"

python3 - "$out" <<'EOF'
import collections, json, statistics, sys
out = sys.argv[1]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl") if l.strip()]
lines = ["| category | prompt | tok/s | steps | drafted steps | saved | lost |", "|---|---|---:|---:|---|---:|---:|"]
by_cat = collections.defaultdict(list)

# Whether the bets the decision found close to plain decoding paid: each drafted step by its
# predicted edge, the rate its policy was read to bring (the bandit's corrected rate) ÷ plain
# decoding's at that step, against the plain steps it saved (+) or lost (−) and the tokens it
# brought ÷ those predicted. A margin on close bets would be right where the lowest rows lose.
def corrected_rate(offer):
    c = offer["correction"]
    tokens = min(c["tokens"] * (1 + c["bonus"]), 1.0) if c["tokens"] < 1.0 else c["tokens"]
    return offer["predicted"]["tokens"] * tokens / max(offer["predicted"]["ms"] * c["ms"], 1e-12)

edges = [1.05, 1.10, 1.25, 1.5, 2.0]
rows = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
for r in runs:
    steps = [json.loads(l) for l in open(f"{out}/{r['trace']}.trace") if l.strip()]
    if not steps:
        continue
    plain = [s["step_ms"] for s in steps if s["chosen"] == "plain"]
    per_token = statistics.median(plain) if plain else statistics.median(s["curve_ms"] for s in steps)
    total = sum(s["step_ms"] for s in steps)
    bets = [s for s in steps if s["chosen"] != "plain"]
    delta = [s["emitted"] * per_token - s["step_ms"] for s in bets]
    saved = 100 * sum(delta) / total
    lost = 100 * sum(d for d in delta if d < 0) / total
    policies = ", ".join(f"{p} {n}" for p, n in sorted(collections.Counter(s["chosen"] for s in bets).items()))
    by_cat[r["category"]].append((r["tokens_per_s"], saved, lost))
    lines.append(f"| {r['category']} | {r['id']} | {r['tokens_per_s']:.1f} | {len(steps)} | {policies or '—'} | {saved:+.1f}% | {lost:+.1f}% |")
    # The edge table counts runs with a plain step to measure the bets against.
    for s in bets if plain else []:
        offers = {o["policy"]: o for o in s["offers"]}
        if s["chosen"] not in offers:
            continue
        chosen = offers[s["chosen"]]
        edge = corrected_rate(chosen) / corrected_rate(offers["plain"])
        row = rows[sum(edge >= e for e in edges)]
        row[0] += 1
        row[1] += s["emitted"] - s["step_ms"] / per_token
        row[2] += chosen["predicted"]["tokens"]
        row[3] += s["emitted"]
lines += ["", "| category | prompts | mean tok/s | mean saved | mean lost |", "|---|---:|---:|---:|---:|"]
for c, v in sorted(by_cat.items()):
    lines.append(f"| {c} | {len(v)} | {statistics.mean(x[0] for x in v):.1f} | "
                 f"{statistics.mean(x[1] for x in v):+.1f}% | {statistics.mean(x[2] for x in v):+.1f}% |")
names = ["< 1.05×"] + [f"{lo:.2f}–{hi:.2f}×" for lo, hi in zip(edges, edges[1:])] + [f"≥ {edges[-1]:.2f}×"]
lines += ["", "| predicted edge over plain | bets | plain steps saved | brought ÷ predicted tokens |",
          "|---|---:|---:|---:|"]
for b in sorted(rows):
    n, saved_steps, predicted, emitted = rows[b]
    lines.append(f"| {names[b]} | {n} | {saved_steps:+.1f} | {emitted / predicted:.2f} |")
open(f"{out}/regret.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines[-len(by_cat) - len(rows) - 5:]))
EOF
