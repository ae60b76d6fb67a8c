#!/usr/bin/env bash
# The cost curve measured on a quiet machine and on one another process keeps busy, and what
# `auto` decides on each (docs/METHODS.md, "Measuring the curve on a busy machine").
#
#   bash scripts/curve-under-load.sh [OUT]     # default bench/results/curve-under-load
#
# Measures the target's cost curve three times, each into a fresh cache folder, as the first
# `--method auto` run on a machine does: quiet; while scripts/busy-neighbour.py keeps every core
# busy in random bursts (0.5–3 s on, 0.5–3 s off: an IDE, a browser); and while it keeps every
# core busy throughout (a build). Then compares each curve with the quiet one size by size, and
# replays the main set's recorded answers (bench/results/main-greedy/plain-tokens.jsonl) through the
# suffix drafter deciding on each curve and timed on the quiet one (suffix_replay): when the
# decisions are the same, so are the times. Needs the Qwen target (scripts/fetch-models.sh) and
# a machine with nothing else running.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/curve-under-load}
T=${TARGET:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
cargo build --release -p treespec-cli
cargo build --release -p treespec-bench --example suffix_replay
BIN=target/release/treespec

measure() { # NAME [LOAD]
  local name=$1 load=${2:-}
  local dir
  dir=$(mktemp -d)
  local pid=
  if [ -n "$load" ]; then
    python3 scripts/busy-neighbour.py "$load" 900 & pid=$!
    sleep 5
  fi
  echo "== measuring the curve: $name (load average $(cut -d' ' -f1 /proc/loadavg))"
  TREESPEC_CACHE_DIR=$dir "$BIN" generate -m "$T" -t "$THREADS" --method auto -p hi -n 1 \
    2>&1 | grep '^\[treespec\]' | tee "$OUT/$name.log"
  [ -n "$pid" ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; pkill -f busy-neighbour.py || true; }
  cp "$dir"/costs/*.json "$OUT/$name.json"
  rm -rf "$dir"
  sleep 20 # let the load average settle
}

# PHASES (default all three) re-measures only some; the others are read from OUT.
for phase in ${PHASES:-quiet bursts sustained}; do
  case $phase in
    quiet) measure quiet ;;
    *) measure "$phase" "$phase" ;;
  esac
done

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
curves = {k: json.load(open(f"{out}/{k}.json")) for k in ("quiet", "bursts", "sustained")}
def ms(c, n):
    c = c["curve"]
    return c["ms"][n - 1]
lines = ["| n | quiet, ms | bursts, ms | ÷ quiet | sustained, ms | ÷ quiet |", "|---:|---:|---:|---:|---:|---:|"]
worst = {"bursts": 1.0, "sustained": 1.0}
for n in range(1, 65):
    q = ms(curves["quiet"], n)
    row = [str(n), f"{q:.1f}"]
    for k in ("bursts", "sustained"):
        v = ms(curves[k], n)
        r = v / q
        if abs(r - 1) > abs(worst[k] - 1):
            worst[k] = r
        row += [f"{v:.1f}", f"{r:.3f}"]
    lines.append("| " + " | ".join(row) + " |")
with open(f"{out}/curves.md", "w") as f:
    f.write("\n".join(lines) + "\n\n")
    for k in ("bursts", "sustained"):
        f.write(f"- {k}: worst ratio to quiet over n = 1..64: {worst[k]:.3f}; cached noisy: {curves[k]['noisy'] or 'no'}\n")
    f.write(f"- quiet: cached noisy: {curves['quiet']['noisy'] or 'no'}\n")
print(open(f"{out}/curves.md").read())
PY

TOKENS=bench/results/main-greedy/plain-tokens.jsonl
for k in quiet bursts sustained; do
  echo "== replay: decisions on the $k curve, timed on the quiet one"
  target/release/examples/suffix_replay "$TOKENS" "$OUT/$k.json" --score "$OUT/quiet.json" --trace \
    2>/dev/null > "$OUT/replay-$k.out"
  grep -v '^TRACE' "$OUT/replay-$k.out" | tee "$OUT/replay-$k.md"
  grep '^TRACE' "$OUT/replay-$k.out" > "$OUT/replay-$k.trace"
  rm "$OUT/replay-$k.out"
done
for k in bursts sustained; do
  same=$(diff "$OUT/replay-quiet.trace" "$OUT/replay-$k.trace" | grep -c '^>' || true)
  total=$(wc -l < "$OUT/replay-quiet.trace")
  echo "- $k: $same of $total drafting steps differ from the quiet curve's" | tee -a "$OUT/curves.md"
done
