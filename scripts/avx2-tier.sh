#!/usr/bin/env bash
# The cold held-out benchmark (scripts/cold-bench.sh) on this machine's AVX2 tier: treespec and
# llama.cpp's tools both built without AVX-512, whatever more the CPU has.
#
#   scripts/avx2-tier.sh OUT [PROMPTS.jsonl]
#
# Why: a forward of n rows costs, relative to one row, what the CPU's widest kernels make it.
# On a Zen 5 core with AVX-512, T(8) is 4.2 × T(1) for the 1.5B target; built for AVX2 on the
# same core, 5.9–6.5 × (profile to profile); on Zen 3 (AVX2 only) 7.8 ×. What `auto` decides
# (how much to draft, whether at all) follows that shape, so a machine with AVX-512 can check
# the AVX2 tier's decisions here, on the AVX2 kernels, though not Zen 3's absolute speed.
#
# Steps: treespec with dynamic backends and llama.cpp's CPU backend built for AVX2
# (`scripts/gpu-check.sh prepare` and `cpu-build`: target-gpu-work/build-cpu/bin), llama.cpp's
# tools built for AVX2 (`PEER_ISA=avx2 scripts/peer-bench.sh build`: build-avx2/), this build's
# own cost curves profiled into OUT/avx2-cache (never the AVX-512 curves of the cache in use), then
# scripts/cold-bench.sh with them (REPEAT, N, PEERS pass through).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:?usage: scripts/avx2-tier.sh OUT [PROMPTS.jsonl]}"
shift
TARGET="${TARGET:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
DRAFT="${DRAFT-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}"
log() { printf '[avx2-tier] %s\n' "$*" >&2; }
mkdir -p "$out"
bash scripts/gpu-check.sh prepare
bindir="$(bash scripts/gpu-check.sh cpu-build)"
PEER_ISA=avx2 bash scripts/peer-bench.sh build
# treespec finds its libraries through LD_LIBRARY_PATH, set for it alone: llama.cpp's tools would
# load them too, in place of their own.
out_abs="$(cd "$out" && pwd)"
printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s/treespec" "$@"\n' "$bindir" "$bindir" >"$out/treespec"
chmod +x "$out/treespec"
export PEER_ISA=avx2 BIN="$out_abs/treespec"
export TREESPEC_CACHE_DIR="$out_abs/avx2-cache"
# The first `auto` run measures the curves of the target and the draft and caches them (kept in
# OUT/avx2-cache/costs beside the results).
log "measuring the AVX2 build's cost curves"
draft=()
[[ -n "$DRAFT" ]] && draft=(--draft "$DRAFT")
"$BIN" generate -m "$TARGET" "${draft[@]}" --method auto --reprofile -t 2 -n 8 -p "Hello" >/dev/null
"$BIN" devices >"$out/devices.txt" 2>&1 || true
lscpu | grep -E 'Model name|CPU family|^Model:' >"$out/cpu.txt"
bash scripts/cold-bench.sh "$out" "$@"
