#!/usr/bin/env bash
# Multi-turn sessions (issue #26) on treespec's server and llama.cpp's, side by side:
# `treespec bench --sessions` plays every session on every server, each answer generated live and
# fed back, the servers interleaved session group by session group (see
# crates/treespec-bench/src/sessions/mod.rs).
#
#   scripts/session-bench.sh OUT [SESSION FILES...]      (default files: bench/inputs/sessions/*.jsonl)
#
# Servers (all started first, side by side, each on its own port; only one works at a time):
#   treespec:plain      treespec serve -m T -t 2 --method plain
#   treespec:auto       treespec serve -m T --draft D -t 2 --method auto   (without D: --method suffix)
#   treespec:suffix     treespec serve -m T -t 2 --method suffix            (optional)
#   treespec:auto-before  treespec:auto run by another build, $BEFORE_BIN     (optional: an A/B of two builds)
#   treespec:auto-chunkN  treespec:auto with --prefill-chunk N                 (optional)
#   treespec:plain-decodeN, treespec:auto-decodeN  plain / auto with --decode-chunk N (optional)
#   llama:plain         llama-server -m T -t 2 -tb 2 -ngl 0 --jinja --no-webui
#   llama:ngram-mod     the same with --spec-type ngram-mod (llama.cpp's default n-gram drafter)
#   llama:draft         the same with -md D (optional)
#   llama:TYPE          the same with --spec-type TYPE, for its other n-gram drafters (optional:
#                       llama:ngram-simple, llama:ngram-map-k, llama:ngram-map-k4v, llama:ngram-cache)
# llama-server comes from scripts/peer-bench.sh build (same ggml CPU flags as treespec's build).
# Both servers keep their prompt caches at their defaults: a client's later turns reuse the
# earlier turns' KV on both.
#
# Environment: TARGET (default models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf), DRAFT (default
# models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf; empty: none), SERVERS (default "treespec:plain
# treespec:auto llama:plain llama:ngram-mod"), CONCURRENCY (1), PER_WORKLOAD (sessions per
# workload; default all), WORKLOADS (comma-separated; default all), REPEAT (1), CTX (per session,
# 8192), BASE_PORT (8180), EXTRA (more `treespec bench` flags, e.g. --log).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
out="${1:?usage: scripts/session-bench.sh OUT [SESSION FILES...]}"
shift
files=("$@")
[[ ${#files[@]} -gt 0 ]] || files=(bench/inputs/sessions/*.jsonl)
TARGET="${TARGET:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
DRAFT="${DRAFT-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}"
SERVERS="${SERVERS:-treespec:plain treespec:auto llama:plain llama:ngram-mod}"
CONCURRENCY="${CONCURRENCY:-1}"
CTX="${CTX:-8192}"
BASE_PORT="${BASE_PORT:-8180}"
TREESPEC_BIN="${TREESPEC_BIN:-target/release/treespec}"
peers="${TREESPEC_PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/treespec/peers}"
LLAMA_SERVER_BIN="${LLAMA_SERVER_BIN:-$peers/build/bin/llama-server}"
log() { printf '[session-bench] %s\n' "$*" >&2; }
[[ -x "$TREESPEC_BIN" ]] || { log "no $TREESPEC_BIN: cargo build --release -p treespec-cli"; exit 1; }
[[ -f "$TARGET" ]] || { log "no $TARGET: bash scripts/fetch-models.sh qwen"; exit 1; }
if [[ "$SERVERS" == *llama:* && ! -x "$LLAMA_SERVER_BIN" ]]; then
    log "no $LLAMA_SERVER_BIN: run scripts/peer-bench.sh build (or leave llama:* out of SERVERS)"
    exit 1
fi
mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# The command line of each server name.
server_cmd() {
    local name="$1" port="$2" draft=() ts_slots=() ll_slots=(-np "$CONCURRENCY" --kv-unified -c $((CTX * CONCURRENCY)))
    [[ -n "$DRAFT" ]] && draft=(--draft "$DRAFT")
    # Both servers get the same cells: CTX per session, one cache shared by all of them.
    ts_slots=(--parallel "$CONCURRENCY" -c $((CTX * CONCURRENCY)))
    case "$name" in
    treespec:plain) echo "$TREESPEC_BIN" serve -m "$TARGET" -t 2 --method plain --port "$port" "${ts_slots[@]}" ;;
    treespec:auto)
        if [[ -n "$DRAFT" ]]; then
            echo "$TREESPEC_BIN" serve -m "$TARGET" "${draft[@]}" -t 2 --method auto --port "$port" "${ts_slots[@]}"
        else
            echo "$TREESPEC_BIN" serve -m "$TARGET" -t 2 --method suffix --port "$port" "${ts_slots[@]}"
        fi
        ;;
    treespec:suffix) echo "$TREESPEC_BIN" serve -m "$TARGET" -t 2 --method suffix --port "$port" "${ts_slots[@]}" ;;
    treespec:auto-before)
        # Another build's `auto` beside this one's, interleaved session by session (A/B of two builds).
        [[ -x "${BEFORE_BIN:-}" ]] || { log "treespec:auto-before needs BEFORE_BIN, another build's treespec"; exit 1; }
        echo "$BEFORE_BIN" serve -m "$TARGET" "${draft[@]}" -t 2 --method auto --port "$port" "${ts_slots[@]}"
        ;;
    treespec:auto-chunk*)
        # `auto` with a larger prefill chunk (treespec:auto-chunk2048: --prefill-chunk 2048).
        echo "$TREESPEC_BIN" serve -m "$TARGET" "${draft[@]}" -t 2 --method auto --prefill-chunk "${name#treespec:auto-chunk}" \
            --port "$port" "${ts_slots[@]}"
        ;;
    treespec:plain-decode*)
        # Prompt tokens a step reads beside decoding requests (plain-decode128: --decode-chunk 128).
        echo "$TREESPEC_BIN" serve -m "$TARGET" -t 2 --method plain --decode-chunk "${name#treespec:plain-decode}" \
            --port "$port" "${ts_slots[@]}"
        ;;
    treespec:auto-decode*)
        echo "$TREESPEC_BIN" serve -m "$TARGET" "${draft[@]}" -t 2 --method auto --decode-chunk "${name#treespec:auto-decode}" \
            --port "$port" "${ts_slots[@]}"
        ;;
    llama:plain) echo "$LLAMA_SERVER_BIN" -m "$TARGET" -t 2 -tb 2 -ngl 0 --jinja --no-webui --port "$port" "${ll_slots[@]}" ;;
    llama:ngram-mod)
        echo "$LLAMA_SERVER_BIN" -m "$TARGET" -t 2 -tb 2 -ngl 0 --jinja --no-webui --spec-type ngram-mod \
            --port "$port" "${ll_slots[@]}"
        ;;
    llama:draft)
        echo "$LLAMA_SERVER_BIN" -m "$TARGET" -md "$DRAFT" -t 2 -tb 2 -ngl 0 -ngld 0 --jinja --no-webui \
            --port "$port" "${ll_slots[@]}"
        ;;
    llama:ngram-*)
        echo "$LLAMA_SERVER_BIN" -m "$TARGET" -t 2 -tb 2 -ngl 0 --jinja --no-webui --spec-type "${name#llama:}" \
            --port "$port" "${ll_slots[@]}"
        ;;
    *) log "unknown server $name"; exit 1 ;;
    esac
}

flags=()
port="$BASE_PORT"
for name in $SERVERS; do
    cmd="$(server_cmd "$name" "$port")"
    logf="$out/${name//:/-}.log"
    log "starting $name: $cmd"
    # shellcheck disable=SC2086
    $cmd >"$logf" 2>&1 &
    pids+=($!)
    flags+=(--server "$name=http://127.0.0.1:$port")
    port=$((port + 1))
done
# Wait until every server answers /v1/models (treespec may first measure its cost curve).
port="$BASE_PORT"
for name in $SERVERS; do
    for _ in $(seq 1800); do
        curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && break
        sleep 0.5
    done
    curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null || { log "$name did not start:"; tail -20 "$out/${name//:/-}.log"; exit 1; }
    port=$((port + 1))
done
# A treespec server still measuring its cost curve prices with a stand-in: wait for `ready`.
port="$BASE_PORT"
for name in $SERVERS; do
    if [[ "$name" == treespec:* ]]; then
        for _ in $(seq 1200); do
            curl -sf "http://127.0.0.1:$port/health" | grep -q '"measuring"' || break
            sleep 0.5
        done
    fi
    port=$((port + 1))
done
sel=()
[[ -n "${PER_WORKLOAD:-}" ]] && sel+=(--per-category "$PER_WORKLOAD")
[[ -n "${WORKLOADS:-}" ]] && sel+=(--categories "$WORKLOADS")
files_arg="$(IFS=,; echo "${files[*]}")"
log "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# shellcheck disable=SC2086
status=0
"$TREESPEC_BIN" bench --sessions "$files_arg" "${flags[@]}" "${sel[@]}" --concurrency "$CONCURRENCY" \
    --repeat "${REPEAT:-1}" --out "$out" ${EXTRA:-} || status=$?

# The copy oracle on the baseline's answers, priced on the target's cached cost curve, with the
# first treespec server rebuilding the prompts (scripts/session-copy-bound.py).
cache="${TREESPEC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/treespec}/costs"
# (`-fast-v5` or, with the weights on huge pages, `-fast-hp-v5`)
curve="$(ls -t "$cache/$(basename "$TARGET" | tr '-' '_')"-*-t2-fast*-v*.json 2>/dev/null | head -1 || true)"
[[ -n "$curve" ]] || log "no cached cost curve of $TARGET at 2 threads in $cache: no copy oracle"
port="$BASE_PORT"
for name in $SERVERS; do
    if [[ "$name" == treespec:* && -n "$curve" ]]; then
        python3 scripts/session-copy-bound.py "$out/sessions.json" --url "http://127.0.0.1:$port" \
            --curve "$curve" >"$out/copy-bound.md" && cat "$out/copy-bound.md"
        break
    fi
    port=$((port + 1))
done
exit "$status"
