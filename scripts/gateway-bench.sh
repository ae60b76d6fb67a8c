#!/usr/bin/env bash
# Conversations behind a gateway (issue #42): the session runner against SMG over 2 replicas of
# `treespec serve` (1 thread each) with three routing policies, and against one server with 2
# threads and the same cells in all; every server is up side by side and the runner plays them
# one at a time, session group by session group (`treespec bench --sessions`).
#
#   scripts/gateway-bench.sh OUT [SESSION FILES...]   (default: chat, tools, agent-whole)
#
# Servers:
#   one:auto        treespec serve -t 2 --parallel C -c CTX·C
#   smg-rr:auto     SMG round_robin over 2 × (treespec serve -t 1 --parallel C -c CTX·C/2)
#   smg-cache:auto  SMG cache_aware (its own prefix tree; no client cooperation)
#   smg-sticky:auto SMG manual on X-SMG-Routing-Key (the runner sends each conversation's key
#                   with every turn), a new key placed on the replica with the fewest requests
# GATEWAYS lists them as NAME:POLICY[/ASSIGNMENT-MODE] (default: rr:round_robin
# cache:cache_aware sticky:manual/min_load; hash:consistent_hashing is the keyed policy that
# needs no table, but with 2 replicas its ring can put most conversations on one).
# Environment: TARGET (the Qwen 1.5B), METHOD (auto), CONCURRENCY (C, 4), PER_WORKLOAD (4),
# CTX (per session, 8192), BASE_PORT (8300); TURNS and MAX_TOKENS cut every session to its first
# TURNS turns and answers of at most MAX_TOKENS tokens (copies in OUT/sessions/), for a short run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:?usage: scripts/gateway-bench.sh OUT [SESSION FILES...]}"
shift
source scripts/lib/sessions.sh
port="${BASE_PORT:-8300}"
log() { printf '[gateway-bench] %s\n' "$*" >&2; }
mkdir -p "$out"
pids=()
dirs=()
cleanup() {
    for d in "${dirs[@]}"; do REPLICAS_DIR="$d" bash scripts/replicas.sh stop 2>/dev/null || true; done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# One server, 2 threads, all the cells.
target/release/treespec serve -m "$TARGET" -t 2 --method "$METHOD" --parallel "$C" -c $((CTX * C)) --port "$port" \
    >"$out/one.log" 2>&1 &
pids+=($!)
servers=(--server "one:$METHOD=http://127.0.0.1:$port")
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" | grep -q '"ready"' && break; sleep 0.5; done
# Three gateways, each over its own 2 replicas of 1 thread and half the cells.
for pair in ${GATEWAYS:-rr:round_robin cache:cache_aware sticky:manual/min_load}; do
    name="${pair%%:*}" policy="${pair#*:}" assign=()
    [[ "$policy" != */* ]] || { assign=(--assign "${policy#*/}"); policy="${policy%%/*}"; }
    port=$((port + 10))
    d="$out/replicas-$name"
    dirs+=("$d")
    REPLICAS_DIR="$d" bash scripts/replicas.sh start -n 2 --policy "$policy" "${assign[@]}" --port "$port" -- \
        -m "$TARGET" -t 1 --method "$METHOD" --parallel "$C" -c $((CTX * C / 2))
    servers+=(--server "smg-$name:$METHOD=http://127.0.0.1:$port")
done
session_files "$out" "$@"
log "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
target/release/treespec bench --sessions "$files_arg" "${servers[@]}" --concurrency "$C" --per-category "${PER_WORKLOAD:-4}" \
    --out "$out"
# Where each replica's conversations were seen before (every later turn `known` when sticky).
for d in "${dirs[@]}"; do
    for i in 1 2; do
        url="$(grep -o 'listening on http://[0-9.:]*' "$d/replica-$i.log" | head -1 | sed 's/listening on //')"
        [[ -n "$url" ]] || continue
        printf '%s replica %s: ' "$(basename "$d")" "$i"
        curl -sf "$url/metrics" | grep -E '^treespec_session_turns_total|^vllm:prefix_cache_(hits|queries)_total' | tr '\n' ' '
        echo
    done
done | tee "$out/replicas.txt"
# The routing table: later turns cached, TTFT, whole-session rate, tokens per forward, turns seen.
python3 scripts/sessions/gateway_table.py "$out" | tee "$out/routing.md"
