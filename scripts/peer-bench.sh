#!/usr/bin/env bash
# llama.cpp's own tools, side by side with treespec, on the same prompts and kernels.
#
#   scripts/peer-bench.sh build
#       Downloads the llama-cpp-python 0.3.36 sdist (pinned by sha256; pip only downloads it,
#       nothing is installed), and builds llama.cpp's `llama-completion`,
#       `llama-speculative-simple`, `llama-lookup` and `llama-server` from the llama.cpp tree it
#       vendors, with the CPU flags scripts/setup.sh derives for treespec (Release, GGML_NATIVE off,
#       AMX off). llama-server is built without its web UI (LLAMA_BUILD_UI and
#       LLAMA_USE_PREBUILT_UI off: no npm, no download; it embeds an empty asset table) and is the
#       peer of scripts/serve-bench.sh. The build lives outside the repository (default
#       ~/.cache/treespec/peers, or $TREESPEC_PEERS) and is reused; nothing of it is ever committed.
#       $PEER_BUILD_JOBS sets the parallel jobs (default: nproc). PEER_ISA=avx2 builds (into
#       build-avx2/) and runs the AVX2 tier only, whatever more this CPU has: the peers of a
#       treespec whose llama.cpp is built for that tier (scripts/avx2-tier.sh).
#
#   scripts/peer-bench.sh run PROMPTS.jsonl OUT.jsonl -m TARGET.gguf [-md DRAFT.gguf] [-n 128] [-t 2]
#       PROMPTS.jsonl holds the chat-formatted prompt texts exactly as `treespec bench` feeds them
#       (written by `treespec bench --dump-prompts`). For every prompt, interleaved, it runs:
#         llama.cpp plain      llama-completion -no-cnv (greedy)
#         llama.cpp ngram-mod  llama-speculative-simple --spec-type ngram-mod
#         llama.cpp lookup     llama-lookup (n-gram cache, 8 drafted tokens)
#         llama.cpp draft      llama-speculative-simple --spec-type draft-simple -md DRAFT (3 drafted
#                              tokens; with -md only)
#       and writes one JSON line per run: prompt id, category, tool, decode tokens/s, the prompt's
#       token count as the tool read it, and plain decoding's answer (`text`). The prompt file holds
#       the text plus the trailing newline `-f` drops, so the tools read the tokens treespec does
#       (scripts/lib/same_prompt.py; the comparisons leave out a prompt whose counts or greedy plain
#       answers differ).
#       $PEER_TOOLS picks a subset (e.g. "plain ngram-mod"; default: all of them that apply).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
peers="${TREESPEC_PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/treespec/peers}"
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
src="$peers/llama_cpp_python-$version/vendor/llama.cpp"
# PEER_ISA=avx2: the tier without AVX-512 (what Zen 3 and older Intel have), in its own build.
isa="${PEER_ISA:-}"
[[ -z "$isa" || "$isa" == avx2 ]] || { echo "[peer-bench] ERROR: PEER_ISA is avx2 or unset, not '$isa'" >&2; exit 1; }
build_dir="$peers/build${isa:+-$isa}"
bin="$build_dir/bin"
log() { printf '[peer-bench] %s\n' "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

# The ggml flags matching the Rust target features scripts/setup.sh wrote for this CPU.
cmake_cpu_flags() {
    local cfg="$repo_root/.cargo/config.toml" flags=()
    [[ -f "$cfg" ]] || bash "$repo_root/scripts/setup.sh" >&2
    local features
    features="$(grep -o 'target-feature=[^"]*' "$cfg" | head -1)"
    has() { [[ "$features" == *"+$1"* ]]; }
    has avx2 && flags+=(-DGGML_AVX=ON -DGGML_AVX2=ON)
    has fma && flags+=(-DGGML_FMA=ON)
    has f16c && flags+=(-DGGML_F16C=ON)
    has bmi2 && flags+=(-DGGML_BMI2=ON)
    # The AVX2 tier stops here.
    if [[ "$isa" == avx2 ]]; then
        printf '%s\n' "${flags[@]}"
        return
    fi
    has avx512f && flags+=(-DGGML_AVX512=ON)
    has avx512vbmi && flags+=(-DGGML_AVX512_VBMI=ON)
    has avx512vnni && flags+=(-DGGML_AVX512_VNNI=ON)
    has avx512bf16 && flags+=(-DGGML_AVX512_BF16=ON)
    has avxvnni && flags+=(-DGGML_AVX_VNNI=ON)
    printf '%s\n' "${flags[@]}"
}

build() {
    mkdir -p "$peers"
    local sdist="$peers/llama_cpp_python-$version.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        log "downloading the llama-cpp-python $version sdist (download only, never installed)"
        pip download --no-binary :all: --no-deps -d "$peers" "llama-cpp-python==$version" >&2
    fi
    echo "$sha256  $sdist" | sha256sum --check --status || die "$sdist: sha256 mismatch"
    [[ -d "$src" ]] || tar -xzf "$sdist" -C "$peers"
    local flags
    mapfile -t flags < <(cmake_cpu_flags)
    log "cmake flags: ${flags[*]}"
    cmake -S "$src" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF "${flags[@]}" \
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_OPENMP=ON \
        -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF >&2
    cmake --build "$build_dir" -j "${PEER_BUILD_JOBS:-$(nproc)}" \
        --target llama-completion llama-speculative-simple llama-lookup llama-server >&2
    log "built into $bin"
}

# What the tools read and print, and whether two runs were on the same tokens (issue #68).
same_prompt="$repo_root/scripts/lib/same_prompt.py"

run() {
    local prompts="$1" out="$2"
    shift 2
    local model="" draft="" n=128 threads=2 structured=0
    while (($#)); do
        case "$1" in
            -m) model="$2"; shift 2 ;;
            -md) draft="$2"; shift 2 ;;
            -n) n="$2"; shift 2 ;;
            -t) threads="$2"; shift 2 ;;
            --structured) structured=1; shift ;;
            *) die "unknown option $1" ;;
        esac
    done
    [[ -f "$model" ]] || die "give the target with -m MODEL.gguf"
    [[ -x "$bin/llama-completion" ]] || die "the tools are not built: run $0 build"
    # The tools, chosen and checked once, before any of them runs.
    local tools=(plain ngram-mod lookup)
    [[ -n "$draft" ]] && tools+=(draft)
    [[ -n "${PEER_TOOLS:-}" ]] && read -r -a tools <<<"$PEER_TOOLS"
    local tool
    for tool in "${tools[@]}"; do
        case "$tool" in
            plain | ngram-mod | lookup) ;;
            draft) [[ -n "$draft" ]] || die "PEER_TOOLS names draft: give the draft with -md" ;;
            *) die "unknown tool '$tool' in PEER_TOOLS (plain, ngram-mod, lookup, draft)" ;;
        esac
    done
    # Structured: plain decoding under the prompt's JSON Schema (llama.cpp's grammar sampler).
    ((structured)) && tools=(json-schema)
    local common=(-m "$model" -t "$threads" -c 4096 -n "$n" --temp 0)
    local tmp
    tmp="$(mktemp -d)"
    : >"$out"
    local count
    count="$(wc -l <"$prompts")"
    local i=0
    while IFS= read -r line; do
        i=$((i + 1))
        local id category
        id="$(jq -r .id <<<"$line")"
        category="$(jq -r .category <<<"$line")"
        # The exact text treespec decodes from: `-f` drops one trailing newline, so the file
        # holds one more when the text ends in one.
        jq -j .text <<<"$line" | python3 "$same_prompt" write-prompt "$tmp/prompt.txt"
        for tool in "${tools[@]}"; do
            local cmd
            case "$tool" in
                plain) cmd=("$bin/llama-completion" "${common[@]}" -no-cnv --no-display-prompt -f "$tmp/prompt.txt") ;;
                json-schema) cmd=("$bin/llama-completion" "${common[@]}" -no-cnv --no-display-prompt -f "$tmp/prompt.txt" -j "$(jq -c .schema <<<"$line")") ;;
                ngram-mod) cmd=("$bin/llama-speculative-simple" "${common[@]}" --spec-type ngram-mod -f "$tmp/prompt.txt") ;;
                lookup) cmd=("$bin/llama-lookup" "${common[@]}" --spec-draft-n-max 8 -f "$tmp/prompt.txt") ;;
                draft) cmd=("$bin/llama-speculative-simple" "${common[@]}" -md "$draft" --spec-type draft-simple --spec-draft-n-max 3 -f "$tmp/prompt.txt") ;;
            esac
            "${cmd[@]}" </dev/null >"$tmp/stdout.txt" 2>"$tmp/log.txt" || true
            local parsed
            parsed="$(python3 "$same_prompt" parse-run "$tmp/stdout.txt" "$tmp/log.txt")"
            log "[$i/$count] $category $id llama.cpp $tool: $(jq -r .tokens_per_s <<<"$parsed") tok/s, $(jq -r .prompt_tokens <<<"$parsed") prompt tokens"
            # The answer only from plain decoding (the reference treespec plain's is checked against).
            jq -c --arg id "$id" --arg category "$category" --arg tool "llama.cpp $tool" \
                '{id: $id, category: $category, tool: $tool, tokens_per_s, prompt_tokens}
                 + (if $tool == "llama.cpp plain" or $tool == "llama.cpp json-schema" then {text} else {} end)' \
                <<<"$parsed" >>"$out"
        done
    done <"$prompts"
    rm -rf "$tmp"
}

case "${1:-}" in
    build) build ;;
    run)
        shift
        (($# >= 2)) || die "usage: $0 run PROMPTS.jsonl OUT.jsonl -m TARGET.gguf [-md DRAFT.gguf] [-n N] [-t T] [--structured]"
        run "$@"
        ;;
    *) die "usage: $0 build | run PROMPTS.jsonl OUT.jsonl -m TARGET.gguf [-md DRAFT.gguf] [-n N] [-t T] [--structured]" ;;
esac
