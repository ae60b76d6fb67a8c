#!/usr/bin/env bash
# treespec measured on an NVIDIA GPU that has no Rust, no network and no model files (issue #39,
# step 6; docs/GPU.md "Measured on a GPU"). Three steps, two machines:
#
#   bash scripts/gpu-check.sh prepare          # here: build and pack target-gpu/ (≈ 25 MiB)
#   bash scripts/gpu-check.sh device [--cpu]   # there, in the repository root, OUT=results dir
#   bash scripts/gpu-check.sh replay DIR       # here: predicted speed-ups on DIR's GPU curves
#
# prepare  Builds treespec with `--features dynamic-backends` (llama.cpp's backends as libraries
#          loaded at start) into target-dl/ and packs into target-gpu/: the binary, the llama.cpp
#          sources the crate vendors (so the CUDA backend is built there from exactly the code the
#          binary was built against), the header (metadata, tokenizer, tensor table) of the
#          Qwen2.5-Coder-1.5B and -0.5B files, and a few prompts. With the device tool:
#          run(command="bash scripts/gpu-check.sh device", carry=["target-gpu"], timeout_s=560).
# device   Builds llama.cpp there as shared libraries with the CUDA backend (sm_90; a warm machine
#          keeps the build), writes random-weight GGUF files with exactly the real files' shapes,
#          tensor types and tokenizer (scripts/gpu/random_gguf.py: a forward's time depends on
#          those, not on the values), and writes to $OUT summary.md, log.txt and gpu-check.tar.gz
#          (the device tool brings back 8 files at most), the archive holding:
#            profile-1.5b.json, profile-0.5b.json  T(n), n = 1…128, every layer on the GPU
#            batched-bench.txt                      llama.cpp's own timings of the same file
#            costs/*.json                           the curves `auto` caches there (what replay prices on)
#            bench-equal/, bench-self/              plain, suffix, dyspec, auto: same greedy tokens?
#            summary.md                             the table of the above
#          `--cpu` runs the same steps on this machine's CPU (no CUDA): a check of the flow — the
#          bundle, the build from the vendored sources, the backends loaded as libraries, the
#          random files — before the GPU's minutes are spent.
# replay   Prices recorded CPU answers on the GPU's curves: the suffix drafter on the main set's
#          and the session workloads' answers (acceptance as recorded, time from the GPU curve,
#          as suffix_replay does), and the draft-model methods recorded live on this CPU with the
#          budgets the GPU curves choose (TREESPEC_COSTS=file:…, never refined here), each
#          forward then timed on the GPU curve. Writes DIR/replay.md. REPLAY_LIMIT (default 6)
#          prompts per category for the live part.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[gpu-check] %s\n' "$*" >&2; }
die() {
    printf '[gpu-check] FAIL: %s\n' "$*" >&2
    exit 1
}

BUNDLE=target-gpu        # what travels (≈ 20 MiB)
WORK=target-gpu-work     # what the device step builds and writes (never carried)
TARGET_GGUF=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
DRAFT_GGUF=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

# The llama.cpp sources llama-cpp-sys-2 builds (the crate's own copy, so the libraries built from
# them match the binary's).
vendored_llama_cpp() {
    cargo metadata --format-version 1 --locked 2>/dev/null | python3 -c '
import json, os, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "llama-cpp-sys-2":
        print(os.path.join(os.path.dirname(p["manifest_path"]), "llama.cpp"))
'
}

prepare() {
    [[ -f models/$TARGET_GGUF && -f models/$DRAFT_GGUF ]] || die "models/$TARGET_GGUF and models/$DRAFT_GGUF are needed (bash scripts/fetch-models.sh qwen)"
    log "building treespec with dynamic backends into target-dl/ (first time: minutes)"
    # Any x86-64 with AVX2 runs it (this machine's own features, AVX-512 say, may be missing
    # there); the libraries it links are built there, for that CPU.
    # llama-cpp-sys-2's build script links the libraries beside the binary and fails on links a
    # build with other flags left there (dangling symlinks): they are remade anyway.
    rm -f target-dl/release/lib*.so* target-dl/release/examples/lib*.so* target-dl/release/deps/libggml*.so* \
        target-dl/release/deps/libllama*.so*
    RUSTFLAGS="-C target-cpu=x86-64-v3" CARGO_PROFILE_RELEASE_DEBUG=0 \
        cargo build --release -p treespec-cli --features dynamic-backends --target-dir target-dl >&2
    local src
    src=$(vendored_llama_cpp)
    [[ -f "$src/CMakeLists.txt" ]] || die "cannot find llama-cpp-sys-2's llama.cpp sources (cargo metadata)"
    rm -rf "$BUNDLE" && mkdir -p "$BUNDLE"
    # A new bundle: the device step's sources and random files are made again from it (its
    # builds stay, so a rerun of `device --cpu` rebuilds only what changed).
    rm -rf "$WORK/src" "$WORK/models"
    strip -o "$BUNDLE/treespec" target-dl/release/treespec
    log "packing the llama.cpp sources of $src"
    local stage=$BUNDLE/stage
    mkdir -p "$stage/tools"
    tar -C "$src" -c --exclude='*.gguf' CMakeLists.txt cmake common ggml include src vendor LICENSE | tar -C "$stage" -x
    # The crate ships no tool sources; llama-batched-bench comes from the llama.cpp that
    # scripts/peer-bench.sh builds (a release or so apart; its API use is the crate's).
    local peers=${TREESPEC_PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/treespec/peers}
    local bb
    bb=$(ls -d "$peers"/llama_cpp_python-*/vendor/llama.cpp/tools/batched-bench 2>/dev/null | head -1)
    if [[ -n $bb ]]; then
        cp -r "$bb" "$stage/tools/batched-bench"
        echo 'add_subdirectory(batched-bench)' >"$stage/tools/CMakeLists.txt"
    else
        log "no llama.cpp tool sources (scripts/peer-bench.sh build fetches them): no llama-batched-bench there"
        : >"$stage/tools/CMakeLists.txt"
    fi
    tar -C "$stage" -czf "$BUNDLE/llama.cpp.tar.gz" .
    rm -rf "$stage"
    python3 scripts/gpu/random_gguf.py skeleton "models/$TARGET_GGUF" "$BUNDLE/target.skel" >&2
    python3 scripts/gpu/random_gguf.py skeleton "models/$DRAFT_GGUF" "$BUNDLE/draft.skel" >&2
    gzip -9 "$BUNDLE"/*.skel
    # Prompts for the equality check: two per category of the main set, and the code edits.
    python3 - "$BUNDLE/prompts.jsonl" <<'EOF'
import json, sys
seen, out = {}, []
for line in open("../shared/data/spec-bench/question.jsonl"):
    q = json.loads(line)
    if seen.get(q["category"], 0) < 2:
        seen[q["category"]] = seen.get(q["category"], 0) + 1
        out.append(line)
out += open("bench/inputs/prompts/code-edit.jsonl").readlines()[:2]
open(sys.argv[1], "w").writelines(out)
EOF
    du -sh "$BUNDLE" >&2
    log "ready: run(command=\"bash scripts/gpu-check.sh device\", carry=[\"$BUNDLE\"], timeout_s=560)"
}

# Build llama.cpp's shared libraries (and llama-batched-bench) from the bundle's sources.
build_libraries() {
    local build=$1 cuda=$2
    if [[ ! -d $WORK/src ]]; then
        mkdir -p "$WORK/src" && tar -C "$WORK/src" -xzf "$BUNDLE/llama.cpp.tar.gz"
    fi
    local gpu=(-DGGML_CUDA=OFF)
    if [[ $cuda == 1 ]]; then
        command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
        command -v nvcc >/dev/null || die "nvcc is not on PATH (nor in /usr/local/cuda/bin)"
        gpu=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}")
    fi
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    if [[ ! -f $build/CMakeCache.txt ]]; then
        cmake -S "$WORK/src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
            -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON \
            -DGGML_F16C=ON -DGGML_BMI2=ON "${gpu[@]}" \
            -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON >"$build.configure.log" 2>&1 || {
            tail -30 "$build.configure.log" >&2
            die "cmake configure failed"
        }
    fi
    local targets=(llama ggml-cpu)
    [[ $cuda == 1 ]] && targets+=(ggml-cuda)
    log "building ${targets[*]} ($(nproc) cores)"
    local t0=$SECONDS
    cmake --build "$build" --config Release -j "$(nproc)" --target "${targets[@]}" >"$build.build.log" 2>&1 || {
        tail -40 "$build.build.log" >&2
        die "build failed"
    }
    log "built in $((SECONDS - t0)) s"
    if [[ -f $WORK/src/tools/batched-bench/CMakeLists.txt ]]; then
        cmake --build "$build" --config Release -j "$(nproc)" --target llama-batched-bench >>"$build.build.log" 2>&1 ||
            log "llama-batched-bench did not build (see $build.build.log); going on without it"
    fi
    cp "$BUNDLE/treespec" "$build/bin/treespec"
}

device() {
    local cuda=1 ngl=(--ngl all)
    if [[ ${1:-} == --cpu ]]; then
        cuda=0 ngl=()
    fi
    [[ -f $BUNDLE/treespec ]] || die "no $BUNDLE/ here: run 'scripts/gpu-check.sh prepare' first and carry $BUNDLE"
    # The device tool brings back at most 8 files from $OUT: the results are gathered in one
    # folder and come back as one archive beside the summary and the log.
    local back=${OUT:-bench-out/gpu-check} out=$WORK/results
    rm -rf "$out" && mkdir -p "$out" "$back"
    exec > >(tee "$back/log.txt") 2>&1
    nvidia-smi -L 2>/dev/null || true
    local build=$WORK/build-$([[ $cuda == 1 ]] && echo cuda || echo cpu)
    build_libraries "$build" "$cuda"
    export LD_LIBRARY_PATH=$PWD/$build/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export XDG_CACHE_HOME=$PWD/$WORK/cache TREESPEC_CACHE_DIR=$PWD/$WORK/cache/treespec
    local ts=$build/bin/treespec
    "$ts" devices | tee "$out/devices.txt"
    if [[ $cuda == 1 ]] && ! grep -qi cuda "$out/devices.txt"; then
        die "the CUDA backend did not load (see devices.txt)"
    fi
    local models=$WORK/models
    mkdir -p "$models"
    for which in target draft; do
        local name=$TARGET_GGUF
        [[ $which == draft ]] && name=$DRAFT_GGUF
        if [[ ! -f $models/$name ]]; then
            gzip -dc "$BUNDLE/$which.skel.gz" >"$WORK/$which.skel"
            python3 scripts/gpu/random_gguf.py fill "$WORK/$which.skel" "$models/$name"
        fi
    done
    local target=$models/$TARGET_GGUF draft=$models/$DRAFT_GGUF max_n=128
    [[ $cuda == 0 ]] && max_n=${CPU_MAX_N:-16}
    log "T(n) of both models, n = 1…$max_n"
    "$ts" profile -m "$target" "${ngl[@]}" --max-n "$max_n" --prefix 128 --repeat 5 --json >"$out/profile-1.5b.json"
    "$ts" profile -m "$draft" "${ngl[@]}" --max-n "$max_n" --prefix 128 --repeat 5 --json >"$out/profile-0.5b.json"
    log "llama.cpp's batched-bench on the same file"
    local npl=1,2,4,8,16,32,64,128
    [[ $cuda == 0 ]] && npl=1,4,16
    if [[ -x $build/bin/llama-batched-bench ]]; then
        "$build/bin/llama-batched-bench" -m "$target" -ngl 99 -c 20480 -b 2048 -ub 512 -npp 128 -ntg 8 \
            -npl "$npl" >"$out/batched-bench.txt" 2>"$out/batched-bench.log" || log "batched-bench failed (see its log)"
    fi
    log "greedy equality of the methods with plain decoding (and the curves auto caches)"
    # On the CPU `--exact` holds, and greedy answers must equal plain decoding's token for token.
    # A GPU's kernels change with the batch size (docs/GPU.md, Exactness): there the table says
    # where answers part, and random weights have more near-ties than a trained model.
    local n=64 exact=()
    [[ $cuda == 0 ]] && n=24 exact=(--exact)
    "$ts" bench -m "$target" --draft "$draft" "${ngl[@]}" "${exact[@]}" --methods suffix,dyspec,auto \
        --prompts "$BUNDLE/prompts.jsonl" --per-category 1 -n "$n" --log --out "$out/bench-equal"
    # The random draft agrees with the random target on nothing, so its trees are all rejected:
    # verification of deep accepted trees is checked with the target as its own draft (every
    # node accepted) on a flat synthetic curve that makes every method draft its widest trees.
    log "greedy equality with the target as its own draft (deep trees accepted)"
    TREESPEC_COSTS=linear:10,0.05 "$ts" bench -m "$target" --draft "$target" "${ngl[@]}" "${exact[@]}" \
        --methods dyspec,auto \
        --prompts "$BUNDLE/prompts.jsonl" --per-category 1 --limit 6 -n "$n" --log --out "$out/bench-self"
    mkdir -p "$out/costs"
    cp "$TREESPEC_CACHE_DIR"/costs/*.json "$out/costs/"
    rm -f "$out"/bench-*/*.svg
    summarize "$out" >"$out/summary.md"
    cat "$out/summary.md"
    cp "$out/summary.md" "$back/summary.md"
    tar -C "$out" -czf "$back/gpu-check.tar.gz" .
    log "results: $back/gpu-check.tar.gz (replay: mkdir DIR && tar -C DIR -xzf it; gpu-check.sh replay DIR)"
    if [[ $cuda == 0 ]] && python3 - "$out" <<'EOF'
import json, sys
runs = [r for b in ("bench-equal", "bench-self") for r in json.load(open(f"{sys.argv[1]}/{b}/results.json"))["runs"]]
sys.exit(0 if any(not r.get("identical_to_plain") for r in runs) else 1)
EOF
    then
        die "with --exact on the CPU an answer differs from plain decoding (see the table)"
    fi
}

# The device run's table: T(n) of both models, llama.cpp's timings, identity with plain decoding.
summarize() {
    python3 - "$1" <<'EOF'
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
t = json.load(open(out / "profile-1.5b.json"))
d = json.load(open(out / "profile-0.5b.json"))
tm = {p["n"]: p["ms"] for p in t["points"]}
dm = {p["n"]: p["ms"] for p in d["points"]}
print(f"# treespec on {t['device']}\n")
print("Random-weight files with the shapes, types and tokenizer of Qwen2.5-Coder-1.5B/0.5B Q4_K_M;")
print(f"{t['prefix']} committed tokens under each batch, median of repeats, ms.\n")
sizes = [n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n in tm]
print("| n | " + " | ".join(map(str, sizes)) + " |")
print("|---|" + "---:|" * len(sizes))
print("| 1.5B T(n) | " + " | ".join(f"{tm[n]:.2f}" for n in sizes) + " |")
print("| 1.5B T(n)/T(1) | " + " | ".join(f"{tm[n] / tm[1]:.2f}" for n in sizes) + " |")
print("| 0.5B T(n) | " + " | ".join(f"{dm[n]:.2f}" for n in sizes if n in dm) + " |")
print(f"\nDraft step ÷ target step (n = 1): {dm[1] / tm[1]:.2f}.")
bb = (out / "batched-bench.txt").read_text() if (out / "batched-bench.txt").exists() else ""
rows = [l for l in bb.splitlines() if l.startswith("|") and re.search(r"\d", l)]
if rows:
    print("\nllama-batched-bench on the target file (PP 128, TG 8 per sequence; its own table):\n")
    print("\n".join(l for l in bb.splitlines() if l.startswith("|")))
print("\nGreedy answers against plain decoding on the same device:\n")
print("| draft | method | answers | identical to plain | tokens per forward |")
print("|---|---|---:|---:|---:|")
for run, draft in (("bench-equal", "0.5B (random: rejected)"), ("bench-self", "the target itself (accepted)")):
    res = json.load(open(out / run / "results.json"))
    by = {}
    for r in res["runs"]:
        by.setdefault(r["method"], []).append(r)
    for m, runs in by.items():
        same = sum(1 for r in runs if r.get("identical_to_plain"))
        tpf = sum(r["emitted"] for r in runs) / max(1, sum(r["target_forwards"] for r in runs))
        print(f"| {draft} | {m} | {len(runs)} | {same} | {tpf:.2f} |")
EOF
}

replay() {
    local dir=${1:-}
    [[ -d $dir ]] || die "usage: gpu-check.sh replay DIR (the results of a device run)"
    local target_curve draft_curve
    # The fast-mode curves when there are any (a `device --cpu` run caches exact ones only).
    target_curve=$( (ls -t "$dir"/costs/*1.5b*-fast*.json; ls -t "$dir"/costs/*1.5b*.json) 2>/dev/null | head -1)
    draft_curve=$( (ls -t "$dir"/costs/*0.5b*-fast*.json; ls -t "$dir"/costs/*0.5b*.json) 2>/dev/null | head -1)
    [[ -n $target_curve && -n $draft_curve ]] || die "$dir/costs/ holds no 1.5B and 0.5B curves"
    cargo build --release -q -p treespec-cli -p treespec-bench --examples --bins >&2
    local report=$dir/replay.md work=$dir/replay
    mkdir -p "$work"
    {
        echo "# Replayed on $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["device"])' "$dir/profile-1.5b.json")'s curves"
        echo
        echo "Acceptance recorded on a CPU; every forward timed on the GPU curves of $dir/costs/."
        echo
        echo "## Free drafts on the main set's recorded answers (suffix_replay)"
        echo
        echo '```'
        ./target/release/examples/suffix_replay bench/results/main-greedy-books/plain-tokens.jsonl "$target_curve" 2>&1
        echo '```'
    } >"$report"
    # The session workloads' answers, tokenized by a server of the real model.
    local port=8377
    ./target/release/treespec serve -m "models/$TARGET_GGUF" --port "$port" >"$work/serve.log" 2>&1 &
    local pid=$!
    trap "kill $pid 2>/dev/null || true" EXIT
    for _ in $(seq 120); do
        curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 1
    done
    python3 scripts/session-copy-bound.py bench/results/sessions-qwen/c1-prior/sessions.json --url "http://127.0.0.1:$port" \
        --curve "$target_curve" --plain-tokens "$work/session-tokens.jsonl" >"$work/session-oracle.md"
    kill $pid 2>/dev/null || true
    {
        echo
        echo "## Free drafts on the session workloads' answers (suffix_replay; copy oracle after)"
        echo
        echo '```'
        ./target/release/examples/suffix_replay "$work/session-tokens.jsonl" "$target_curve" 2>&1
        echo '```'
        echo
        cat "$work/session-oracle.md"
    } >>"$report"
    # Draft-model trees and auto, recorded live here with the budgets the GPU curves choose.
    log "recording dyspec and auto on this CPU with the GPU's curves (minutes)"
    TREESPEC_COSTS="file:$target_curve,$draft_curve" ./target/release/treespec bench \
        -m "models/$TARGET_GGUF" --draft "models/$DRAFT_GGUF" --methods dyspec,auto --budget-max 64 \
        --categories "${REPLAY_CATEGORIES:-writing,qa,roleplay,coding}" --per-category "${REPLAY_LIMIT:-6}" \
        --log --out "$work/live" >&2
    python3 - "$work/live/results.json" "$target_curve" "$draft_curve" >>"$report" <<'EOF'
import json, statistics, sys
res = json.load(open(sys.argv[1]))
curve = lambda p: json.load(open(p))["curve"]["ms"]
t, d = curve(sys.argv[2]), curve(sys.argv[3])
at = lambda c, rows: c[min(max(1, round(rows)), len(c)) - 1]
print("\n## Draft-model methods, recorded on this CPU with the GPU curves' budgets\n")
print("Each run's target forwards priced at T(mean rows per forward), its draft forwards at the")
print("draft curve's T(mean rows per draft forward); plain at T(1) per token; prefill left out.\n")
by = {}
for r in res["runs"]:
    if r["method"] == "plain":
        continue
    rows = 1 + r["drafted"] / max(1, r["target_forwards"])
    ms = r["target_forwards"] * at(t, rows)
    if r["draft_forwards"]:
        ms += r["draft_forwards"] * at(d, r["drafted"] / r["draft_forwards"])
    plain = r["emitted"] * t[0]
    by.setdefault((r["method"], r["category"]), []).append((plain / ms, r["emitted"] / max(1, r["target_forwards"])))
print("| method | category | runs | predicted speed-up (median) | tokens per forward |")
print("|---|---|---:|---:|---:|")
for (m, c), v in sorted(by.items()):
    print(f"| {m} | {c} | {len(v)} | {statistics.median(x[0] for x in v):.2f}× | {statistics.median(x[1] for x in v):.2f} |")
EOF
    log "wrote $report"
}

case "${1:-}" in
prepare) prepare ;;
device) device "${2:-}" ;;
replay) replay "${2:-}" ;;
*) die "usage: gpu-check.sh prepare | device [--cpu] | replay DIR" ;;
esac
