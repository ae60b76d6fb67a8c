# Sourced by the gateway scripts (gateway-bench.sh, replica-restart.sh), from the repository root.
# Sets TARGET (the Qwen 1.5B), METHOD (auto), C (CONCURRENCY, 4) and CTX (cells per session, 8192)
# from the environment, checks the release binary, and gives session_files.

TARGET="${TARGET:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
METHOD="${METHOD:-auto}"
C="${CONCURRENCY:-4}"
CTX="${CTX:-8192}"
[[ -x target/release/treespec ]] || {
    echo "no target/release/treespec: cargo build --release -p treespec-cli" >&2
    exit 1
}

# session_files OUT [FILE...]: sets `files` to the session files given (default: chat, tools,
# agent-whole) and `files_arg` to them comma-joined; with TURNS or MAX_TOKENS set, to copies in
# OUT/sessions/ cut to their first TURNS turns and answers of at most MAX_TOKENS tokens.
session_files() {
    local out=$1 f
    shift
    files=("$@")
    [[ ${#files[@]} -gt 0 ]] || files=(bench/inputs/sessions/chat.jsonl bench/inputs/sessions/tools.jsonl
        bench/inputs/sessions/agent-whole.jsonl)
    if [[ -n "${TURNS:-}${MAX_TOKENS:-}" ]]; then
        mkdir -p "$out/sessions"
        local cut=()
        for f in "${files[@]}"; do
            python3 scripts/sessions/cut.py "$f" "$out/sessions/$(basename "$f")" "${TURNS:-0}" "${MAX_TOKENS:-0}"
            cut+=("$out/sessions/$(basename "$f")")
        done
        files=("${cut[@]}")
    fi
    files_arg="$(IFS=,; echo "${files[*]}")"
}
