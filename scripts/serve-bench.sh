#!/usr/bin/env bash
# Serving under concurrent load (issue #13): treespec's batch scheduler, the same server one request at a time
# and llama.cpp's llama-server, one at a time on the same prompts, with N streaming clients.
#
#   scripts/serve-bench.sh [--quick] [--out DIR]
#
# For MODEL in the Qwen pair (Qwen2.5-Coder-1.5B Q4_K_M target, 0.5B draft) and SmolLM2-135M Q4_1
# (no draft), for N in 1 4 16, for each server: scripts/serve-bench.py starts the server on a free
# port, sends one unmeasured warm-up request, runs N client threads over max(8N, 16) streaming chat
# requests (max_tokens 64, temperature 0), appends one JSON line to DIR/results.jsonl and stops the
# server's whole process group. At the end DIR/serve-bench.md holds the table (throughput, TTFT
# and latency p50/p99, ok/failed, treespec-batch ÷ treespec-one and ÷ llama-server).
# --quick: SmolLM2 only, N in 1 4, 4 requests of 16 tokens (a smoke test, about a minute).
#
# The servers (T target, D draft, N clients, CTX per request, default 2048; 2 threads each):
#   treespec-batch  treespec serve -m T [-md D] --method $METHOD -t 2 --parallel N
#                   -c N*CTX --queue 64
#   treespec-one    treespec serve -m T [-md D] --method $METHOD -t 2 --parallel 1 -c CTX --queue 64
#                   (one request at a time; the same draft as the batch server so the two differ only
#                   in scheduling)
#   treespec-plain  as treespec-batch with --method plain and no draft (optional, for SERVERS)
#   treespec-request as treespec-batch with --batch-budget request (optional: each request sizes its
#                   own drafts instead of one budget for the whole batch)
#   treespec-draft-alone as treespec-batch with --draft-batching request (optional: each request runs
#                   its own draft forwards instead of one batched draft forward per round)
#   llama-server    llama-server -m T -np N -c N*CTX --kv-unified -t 2 -tb 2 -ngl 0 --no-webui --metrics
# Why these llama-server flags (llama.cpp from scripts/peer-bench.sh build, same ggml CPU flags as
# treespec's build): -np N slots decoded together by its continuous batching (on by default);
# --kv-unified makes the N slots share ONE KV cache of N*CTX cells, each request able to use all of
# it, which is what treespec's --parallel does with its -c (without --kv-unified an explicit -np
# splits -c into N private slices of CTX). -t 2 -tb 2: two threads for decode and prompt, like
# treespec's -t 2. -ngl 0: CPU only (the peer build has no GPU backend anyway). --no-webui: the build
# embeds no UI. Plain decoding: no draft, no --spec-type. Prompt caching stays at llama-server's
# defaults (--cache-prompt on, its host-memory cache on): treespec's batch lanes also reuse a shared
# prefix, and every measured request has its own prompt (the warm-up prompt is not in the set;
# PROMPT_LIMIT 128 per file gives 140 prompts ≥ the 128 requests of 16 clients), so what a cache can
# reuse is the chat template's system prefix, for both, and treespec's suffix history never holds a
# measured request's own earlier answer. Flash attention and weight repacking stay at their
# defaults (auto / on), as in treespec's llama.cpp.
# Eight requests per client: with two (the old default) a run is the makespan of each client's two
# requests, set by the slowest client, and rows that speed up other requests only slow it down;
# eight come close to a server's steady state, where a request that finishes early lets the next
# one in. A full run (both models, 1, 4 and 16 clients, three servers) takes about 25 minutes here.
# Each treespec server gets --queue 64 so that 16 clients never meet the 503 a full queue answers.
#
# Environment: METHOD (treespec method, default auto), CTX (2048), MAX_TOKENS (64), CLIENTS
# ("1 4 16"), REQUESTS (default max(8N, 16)), SERVERS ("treespec-batch treespec-one llama-server"),
# MODELS ("qwen smollm2"), PROMPT_LIMIT (128 prompts per file), MAX_PROMPT_CHARS (2000; longer
# prompts are skipped so that prefill does not dominate a 64-token answer), THREADS (2),
# TREESPEC_EXTRA / LLAMA_SERVER_EXTRA (extra flags), TREESPEC_BIN, LLAMA_SERVER_BIN.
# Prompts: bench/inputs/prompts/code-edit.jsonl and ../shared/data/spec-bench/question.jsonl (first turn).
#
# Run it on an otherwise idle machine: the servers use both cores, and every row records the load
# average at its start.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
log() { printf '[serve-bench] %s\n' "$*" >&2; }

quick=0
out=""
while (($#)); do
    case "$1" in
        --quick) quick=1; shift ;;
        --out) out="$2"; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) log "unknown argument $1"; exit 2 ;;
    esac
done

METHOD="${METHOD:-auto}"
CTX="${CTX:-2048}"
THREADS="${THREADS:-2}"
SERVERS="${SERVERS:-treespec-batch treespec-one llama-server}"
PROMPT_LIMIT="${PROMPT_LIMIT:-128}"
MAX_PROMPT_CHARS="${MAX_PROMPT_CHARS:-2000}"
TREESPEC_BIN="${TREESPEC_BIN:-$repo_root/target/release/treespec}"
peers="${TREESPEC_PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/treespec/peers}"
LLAMA_SERVER_BIN="${LLAMA_SERVER_BIN:-$peers/build/bin/llama-server}"
if ((quick)); then
    MODELS="${MODELS:-smollm2}"
    CLIENTS="${CLIENTS:-1 4}"
    REQUESTS="${REQUESTS:-4}"
    MAX_TOKENS="${MAX_TOKENS:-16}"
    out="${out:-bench-out/serve-bench-quick}"
else
    MODELS="${MODELS:-qwen smollm2}"
    CLIENTS="${CLIENTS:-1 4 16}"
    REQUESTS="${REQUESTS:-}"
    MAX_TOKENS="${MAX_TOKENS:-64}"
    out="${out:-bench-out/serve-bench}"
fi

[[ -x "$TREESPEC_BIN" ]] || { log "no $TREESPEC_BIN: cargo build --release -p treespec-cli"; exit 1; }
if [[ " $SERVERS " == *" llama-server "* && ! -x "$LLAMA_SERVER_BIN" ]]; then
    log "no $LLAMA_SERVER_BIN: run scripts/peer-bench.sh build (or leave llama-server out of SERVERS)"
    exit 1
fi
prompts=(--prompts bench/inputs/prompts/code-edit.jsonl)
spec_bench="$repo_root/../shared/data/spec-bench/question.jsonl"
[[ -f "$spec_bench" ]] && prompts+=(--prompts "$spec_bench")

mkdir -p "$out"
results="$out/results.jsonl"
: >"$results"
{
    echo "started $(date -Is)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
    echo "nproc: $(nproc)"
    echo "loadavg: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "treespec: $(git -C "$repo_root" rev-parse --short HEAD) $(git -C "$repo_root" status --porcelain | wc -l) changed files"
    echo "llama-server: $("$LLAMA_SERVER_BIN" --version 2>&1 | grep -m1 version || echo '?')"
} >"$out/machine.txt"
log "$(tr '\n' ';' <"$out/machine.txt")"

for model in $MODELS; do
    case "$model" in
        qwen)
            target=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
            draft=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
            label="Qwen2.5-Coder-1.5B (+0.5B draft)"
            ;;
        smollm2)
            target=models/SmolLM2-135M-Instruct.Q4_1.gguf
            draft=""
            label="SmolLM2-135M"
            ;;
        *) log "unknown model $model (qwen, smollm2)"; exit 2 ;;
    esac
    [[ -f "$target" ]] || { log "missing $target: scripts/fetch-models.sh"; exit 1; }
    draft_flags=""
    if [[ -n "$draft" ]]; then
        [[ -f "$draft" ]] || { log "missing $draft: scripts/fetch-models.sh"; exit 1; }
        draft_flags="-md $draft"
    fi
    for n in $CLIENTS; do
        for server in $SERVERS; do
            # The batch scheduler with the drafting METHOD; variants add one flag.
            batch="$TREESPEC_BIN serve -m $target $draft_flags --method $METHOD -t $THREADS --port {port}"
            batch+=" --parallel $n -c $((n * CTX)) --queue 64"
            case "$server" in
                treespec-batch) cmd="$batch ${TREESPEC_EXTRA:-}" ;;
                treespec-plain)
                    # The batch scheduler decoding plain: the baseline a speculative METHOD must beat.
                    cmd="$TREESPEC_BIN serve -m $target --method plain -t $THREADS --port {port}"
                    cmd+=" --parallel $n -c $((n * CTX)) --queue 64 ${TREESPEC_EXTRA:-}"
                    ;;
                treespec-request)
                    # Each request sizing its own drafts (--batch-budget request) instead of one
                    # budget for the whole batch: the lever's ablation.
                    cmd="$batch --batch-budget request ${TREESPEC_EXTRA:-}"
                    ;;
                treespec-draft-alone)
                    # Each request running its own draft forwards (--draft-batching request) instead
                    # of one batched draft forward per round: the draft batching's ablation (a
                    # METHOD that runs the draft model).
                    cmd="$batch --draft-batching request ${TREESPEC_EXTRA:-}"
                    ;;
                treespec-one)
                    cmd="$TREESPEC_BIN serve -m $target $draft_flags --method $METHOD -t $THREADS --port {port}"
                    cmd+=" --parallel 1 -c $CTX --queue 64 ${TREESPEC_EXTRA:-}"
                    ;;
                llama-server)
                    cmd="$LLAMA_SERVER_BIN -m $target -np $n -c $((n * CTX)) --kv-unified -t $THREADS -tb $THREADS"
                    cmd+=" -ngl 0 --no-webui --metrics --host 127.0.0.1 --port {port} ${LLAMA_SERVER_EXTRA:-}"
                    ;;
                *) log "unknown server $server"; exit 2 ;;
            esac
            args=(--name "$server" --server-cmd "$cmd" "${prompts[@]}" --clients "$n" --max-tokens "$MAX_TOKENS"
                --model-label "$label" --prompt-limit "$PROMPT_LIMIT" --max-prompt-chars "$MAX_PROMPT_CHARS"
                --out "$results" --log "$out/server-$model-$n-$server.log")
            [[ -n "$REQUESTS" ]] && args+=(--requests "$REQUESTS")
            # A failed configuration is in the results (ok/failed); go on with the next.
            python3 scripts/serve-bench.py "${args[@]}" >/dev/null || log "$label / $n / $server: failures (see results)"
        done
    done
done

python3 scripts/serve-bench.py report "$results" --md "$out/serve-bench.md" >/dev/null
{
    echo
    echo "Machine: $(tr '\n' ';' <"$out/machine.txt")"
    echo "Finished $(date -Is), load average $(cut -d' ' -f1-3 /proc/loadavg)."
} >>"$out/serve-bench.md"
log "wrote $results and $out/serve-bench.md"
cat "$out/serve-bench.md"
