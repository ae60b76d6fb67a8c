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
#          run(command="bash scripts/gpu-check.sh device", carry=["target-gpu"], timeout_s=600).
# device   Builds llama.cpp there as shared libraries with the CUDA backend (sm_90; a warm machine
#          keeps the build), writes random-weight GGUF files with exactly the real files' shapes,
#          tensor types and tokenizer (scripts/gpu/random_gguf.py: a forward's time depends on
#          those, not on the values), and writes to $OUT summary.md, log.txt and gpu-check.tar.gz
#          (the device tool brings back 8 files at most), the archive holding:
#            profile-1.5b.json, profile-0.5b.json  T(n), n = 1…128, every layer on the GPU
#            shapes-*.json                          padded shapes changed/replayed, graphs on/off (#64)
#            replay-1.5b.json                       traces' shape sequences replayed: plain, unpadded,
#                                                   padded, measured and predicted, reuse counts
#            batched-bench.txt                      llama.cpp's own timings of the same file
#            costs/*.json                           the curves `auto` caches there (what replay prices on)
#            bench-equal/, bench-self/              plain, suffix, dyspec, auto: same greedy tokens?
#            summary.md                             the table of the above
#          Each stage that would run past DEADLINE (seconds from the start, default 540) is
#          skipped, and what came before goes back after every stage.
#          `--cpu` runs the same steps on this machine's CPU (no CUDA): a check of the flow — the
#          bundle, the build from the vendored sources, the backends loaded as libraries, the
#          random files — before the GPU's minutes are spent.
# traces   Records `auto`'s decision traces here on the real Qwen models with the H200's curve as
#          the machine's (bench/results/gpu-h200/traces/): the shape sequences `device` replays.
# cpu-build  Only the build of `device --cpu`, here: llama.cpp's libraries for the AVX2 tier with
#          the binary beside them, in target-gpu-work/build-cpu/bin (scripts/avx2-tier.sh).
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
    bb=$(ls -d "$peers"/llama_cpp_python-*/vendor/llama.cpp/tools/batched-bench 2>/dev/null | head -1 || true)
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
    bundle_traces "$BUNDLE/traces"
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
    log "ready: run(command=\"bash scripts/gpu-check.sh device\", carry=[\"$BUNDLE\"], timeout_s=600)"
}

# Decision traces of single requests whose shape sequences the device replays as real forwards
# (`treespec profile --replay-trace`): `auto` recorded on the CPU with the H200's curve (what `auto`
# verifies there; bench/results/gpu-h200/traces/, made by `gpu-check.sh traces`), and code edits,
# an agent's whole-file turn and a HumanEval completion recorded on Zen 5 with its own curve.
bundle_traces() {
    local dir=$1
    mkdir -p "$dir"
    cp bench/results/gpu-h200/traces/*.trace "$dir/" 2>/dev/null || log "no traces recorded with the H200's curve (gpu-check.sh traces)"
    # Apart first: their names may be the H200-curve traces' names.
    local zen5
    zen5=$(mktemp -d)
    tar -C "$zen5" -xzf bench/results/zen5-repeats/traces/traces.tar.gz edit-01.trace edit-07.trace \
        agent-whole_toolz-recipes.trace HumanEval_0.trace
    for f in "$zen5"/*.trace; do
        mv "$f" "$dir/$(basename "${f%.trace}").zen5.trace"
    done
    rmdir "$zen5"
}

# Record `auto`'s decision traces here (the real Qwen models on this CPU) with the H200's curve
# given as the machine's (TREESPEC_COSTS=file:, never refined): the trees `auto` would verify on
# the device. Into bench/results/gpu-h200/traces/.
traces() {
    [[ -f models/$TARGET_GGUF ]] || die "models/$TARGET_GGUF is needed (bash scripts/fetch-models.sh qwen)"
    local dir=bench/results/gpu-h200/traces curve=bench/results/gpu-h200/curve-1.5b.json n=${TRACE_TOKENS:-192}
    mkdir -p "$dir"
    cargo build --release -q -p treespec-cli >&2
    local i=0 line
    while IFS= read -r line; do
        i=$((i + 1))
        local id
        id=$(jq -r '.id // .question_id' <<<"$line")
        jq -j '.text // .turns[0]' <<<"$line" >"$dir/$id.prompt"
        log "auto on $id with the H200's curve ($n tokens)"
        TREESPEC_COSTS="file:$curve" TREESPEC_NO_LEARNED_PRICES=1 ./target/release/treespec generate \
            -m "models/$TARGET_GGUF" --method auto --chat -f "$dir/$id.prompt" -n "$n" \
            --decision-trace "$dir/$id.trace" --json >"$dir/$id.json"
        rm -f "$dir/$id.prompt"
    done < <(head -n "${TRACE_EDITS:-3}" bench/inputs/prompts/code-edit.jsonl; grep -m "${TRACE_CODING:-1}" '"coding"' ../shared/data/spec-bench/question.jsonl)
}

# The CUDA compiler: on PATH, in the usual toolkit folders, or in Python's CUDA packages.
find_nvcc() {
    local c
    for c in "$(command -v nvcc 2>/dev/null)" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
        [[ -n $c && -x $c ]] && {
            echo "$c"
            return 0
        }
    done
    c=$(find /opt /usr -name nvcc -type f -perm -u+x 2>/dev/null | head -1)
    [[ -n $c ]] && echo "$c"
}

# Build llama.cpp's shared libraries (and llama-batched-bench) from the bundle's sources.
build_libraries() {
    local build=$1 cuda=$2
    if [[ ! -d $WORK/src ]]; then
        mkdir -p "$WORK/src" && tar -C "$WORK/src" -xzf "$BUNDLE/llama.cpp.tar.gz"
    fi
    local gpu=(-DGGML_CUDA=OFF)
    if [[ $cuda == 1 ]]; then
        local nvcc
        nvcc=$(find_nvcc) || die "no nvcc: not on PATH, nor under /usr/local/cuda*, /opt or Python's nvidia packages"
        log "CUDA compiler: $nvcc ($("$nvcc" --version | tail -1))"
        # CMake's FindCUDAToolkit looks for the runtime and cuBLAS beside the compiler.
        gpu=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DCMAKE_CUDA_COMPILER="$nvcc"
            -DCUDAToolkit_ROOT="$(dirname "$(dirname "$nvcc")")")
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
    # llama-batched-bench in the same parallel build; should it fail, the libraries alone.
    local tools=()
    [[ -f $WORK/src/tools/batched-bench/CMakeLists.txt ]] && tools=(llama-batched-bench)
    log "building ${targets[*]} ${tools[*]} ($(nproc) cores)"
    local t0=$SECONDS
    if ! cmake --build "$build" --config Release -j "$(nproc)" --target "${targets[@]}" "${tools[@]}" >"$build.build.log" 2>&1; then
        [[ ${#tools[@]} -gt 0 ]] && log "the build with llama-batched-bench failed; the libraries alone (see $build.build.log)"
        cmake --build "$build" --config Release -j "$(nproc)" --target "${targets[@]}" >>"$build.build.log" 2>&1 || {
            tail -40 "$build.build.log" >&2
            die "build failed"
        }
    fi
    log "built in $((SECONDS - t0)) s"
    cp "$BUNDLE/treespec" "$build/bin/treespec"
}

# The bundle's llama.cpp built here for the CPU's AVX2 tier (no CUDA, no AVX-512), the binary
# beside its libraries: prints that folder (scripts/avx2-tier.sh runs treespec from it).
cpu_build() {
    [[ -f $BUNDLE/treespec ]] || die "no $BUNDLE/ here: run 'scripts/gpu-check.sh prepare' first"
    local build=$WORK/build-cpu
    build_libraries "$build" 0 >&2
    echo "$PWD/$build/bin"
}

# Seconds left of the device step's own budget (DEADLINE, counted from its start): a stage
# that would not fit is skipped, named in the log, and what came before still comes back.
fits() {
    local need=$1 what=$2
    if ((SECONDS + need > DEADLINE)); then
        log "skipped: $what (needs about ${need} s, $((DEADLINE - SECONDS)) s left)"
        return 1
    fi
}

# Everything gathered so far goes back after each stage, so a run cut short still returns it.
checkpoint() {
    local out=$1 back=$2
    summarize "$out" >"$out/summary.md" 2>"$out/summary.err" || true
    cp "$out/summary.md" "$back/summary.md"
    tar -C "$out" -czf "$back/gpu-check.tar.gz" .
}

device() {
    local cuda=1 ngl=(--ngl all)
    if [[ ${1:-} == --cpu ]]; then
        cuda=0 ngl=()
    fi
    DEADLINE=${DEADLINE:-540}
    [[ -f $BUNDLE/treespec ]] || die "no $BUNDLE/ here: run 'scripts/gpu-check.sh prepare' first and carry $BUNDLE"
    # The device tool brings back at most 8 files from $OUT: the results are gathered in one
    # folder and come back as one archive beside the summary and the log.
    local back=${OUT:-bench-out/gpu-check} out=$WORK/results
    rm -rf "$out" && mkdir -p "$out" "$back"
    exec > >(tee "$back/log.txt") 2>&1
    nvidia-smi -L 2>/dev/null || true
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv 2>/dev/null >"$out/gpu.txt" || true
    { lscpu | grep -E 'Model name|^CPU\(s\)'; } >>"$out/gpu.txt" 2>/dev/null || true
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
    python3 -c 'import numpy' 2>/dev/null || die "python3 has no numpy, which writes the random-weight files (pip install numpy)"
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
    log "T(n) of both models, n = 1…$max_n ($((DEADLINE - SECONDS)) s left)"
    # Each profile under a limit of its own: on a GPU one takes seconds, and a stall must not
    # take the rest of the run with it (an H200 run once spent four minutes on each).
    local limit=${PROFILE_LIMIT_S:-$([[ $cuda == 1 ]] && echo 90 || echo 900)} which
    for which in 1.5b:$target 0.5b:$draft; do
        timeout "$limit" "$ts" profile -m "${which#*:}" "${ngl[@]}" --max-n "$max_n" --prefix 128 --repeat 5 \
            --json >"$out/profile-${which%%:*}.json" || log "the ${which%%:*} profile failed or ran past $limit s"
        checkpoint "$out" "$back"
    done
    shapes_stage "$ts" "$target" "$draft" "$out" "$back" "$cuda" "$limit" "${ngl[@]}"
    local npl=1,2,4,8,16,32,64,128
    [[ $cuda == 0 ]] && npl=1,4,16
    if [[ -x $build/bin/llama-batched-bench ]] && fits 40 "llama-batched-bench"; then
        log "llama.cpp's batched-bench on the same file"
        "$build/bin/llama-batched-bench" -m "$target" -ngl 99 -c 20480 -b 2048 -ub 512 -npp 128 -ntg 8 \
            -npl "$npl" >"$out/batched-bench.txt" 2>"$out/batched-bench.log" || log "batched-bench failed (see its log)"
        # One sequence decoding 128 tokens: llama.cpp's own time for a plain step, host included.
        "$build/bin/llama-batched-bench" -m "$target" -ngl 99 -c 4096 -b 2048 -ub 512 -npp 128 -ntg 128 \
            -npl 1 >"$out/batched-bench-tg.txt" 2>>"$out/batched-bench.log" || log "batched-bench (TG) failed"
        checkpoint "$out" "$back"
    fi
    # On the CPU `--exact` holds, and greedy answers must equal plain decoding's token for token.
    # A GPU's kernels change with the batch size (docs/GPU.md, Exactness): there the table says
    # where answers part, and random weights have more near-ties than a trained model.
    local n=64 exact=()
    [[ $cuda == 0 ]] && n=24 exact=(--exact)
    if [[ $cuda == 1 ]]; then
        log "--exact with every layer on the GPU must be refused with a clear message"
        "$ts" generate -m "$target" "${ngl[@]}" --exact -p "hello" -n 4 >"$out/exact-refused.txt" 2>&1 &&
            echo "NOT REFUSED: exit 0" >>"$out/exact-refused.txt"
        tail -3 "$out/exact-refused.txt"
    fi
    if fits 90 "greedy equality with the 0.5B draft"; then
        log "greedy equality of the methods with plain decoding (and the curves auto caches)"
        "$ts" bench -m "$target" --draft "$draft" "${ngl[@]}" "${exact[@]}" --methods suffix,dyspec,auto \
            --prompts "$BUNDLE/prompts.jsonl" --per-category 1 -n "$n" --log --out "$out/bench-equal"
        mkdir -p "$out/costs"
        cp "$TREESPEC_CACHE_DIR"/costs/*.json "$out/costs/" 2>/dev/null || true
        rm -f "$out"/bench-*/*.svg
        checkpoint "$out" "$back"
    fi
    # The random draft agrees with the random target on nothing, so its trees are all rejected:
    # verification of deep accepted trees is checked with the target as its own draft (every
    # node accepted) on a flat synthetic curve that makes every method draft its widest trees.
    if fits 60 "greedy equality with the target as its own draft"; then
        log "greedy equality with the target as its own draft (deep trees accepted)"
        TREESPEC_COSTS=linear:10,0.05 "$ts" bench -m "$target" --draft "$target" "${ngl[@]}" "${exact[@]}" \
            --methods dyspec,auto \
            --prompts "$BUNDLE/prompts.jsonl" --per-category 1 --limit 6 -n "$n" --log --out "$out/bench-self"
        rm -f "$out"/bench-*/*.svg
        checkpoint "$out" "$back"
    fi
    # A forward's cost with a long committed context (the session workloads' documents).
    if [[ $cuda == 1 ]] && fits 40 "T(n) at 2,048 tokens of context"; then
        log "T(n) of the 1.5B shape at 2,048 tokens of context"
        timeout 60 "$ts" profile -m "$target" "${ngl[@]}" --max-n 64 --prefix 2048 --repeat 3 --json \
            >"$out/profile-1.5b-ctx2048.json" ||
            log "the long-context profile failed"
        checkpoint "$out" "$back"
    fi
    # What a tree step would cost if its size repeated from step to step (a graph replay): the
    # lever of keeping tree sizes to a few buckets (docs/GPU.md, Not done yet).
    if [[ $cuda == 1 ]] && fits 30 "T(n) with each size repeated"; then
        log "T(n) of the 1.5B shape, each size timed as the third of three in a row"
        timeout 60 "$ts" profile -m "$target" "${ngl[@]}" --sizes 1,2,4,8,16,32,64,128 --prefix 128 --repeat 5 \
            --repeated-shapes --json >"$out/profile-1.5b-repeated.json" || log "the repeated-shape profile failed"
        checkpoint "$out" "$back"
    fi
    if fits 45 "the server on the device"; then
        serve_check "$ts" "$target" "$draft" "$out" "${ngl[@]}"
        checkpoint "$out" "$back"
    fi
    cat "$out/summary.md"
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

# Issue #64 on the device: each padded shape timed changed and replayed (with CUDA graphs, and
# without: GGML_CUDA_DISABLE_GRAPHS=1, so a replay is llama.cpp's graph reuse alone), with
# llama.cpp's reuse count; then the bundled traces' shape sequences replayed as real forwards —
# unpadded, padded, and plain decoding of the same tokens — beside what those times predict.
# On the CPU (`device --cpu`, a check of the flow) small buckets and short replays.
shapes_stage() {
    local ts=$1 target=$2 draft=$3 out=$4 back=$5 cuda=$6 limit=$7
    shift 7
    local sizes=1,2,3,4,6,8,12,16,24,32,48,64 pad=() steps=${REPLAY_STEPS:-400}
    if [[ $cuda == 0 ]]; then
        sizes=1,2,4,8 pad=(--pad-shapes 4,8) steps=${REPLAY_STEPS:-12}
    fi
    local common=(--sizes "$sizes" --prefix 128 --repeat 3 --json "${pad[@]}" "$@")
    if fits 60 "the padded shapes"; then
        log "padded shapes: both models with CUDA graphs, the 1.5B without"
        timeout "$limit" "$ts" profile -m "$target" --shapes "${common[@]}" >"$out/shapes-1.5b.json" ||
            log "the 1.5B shapes failed or ran past $limit s"
        GGML_CUDA_DISABLE_GRAPHS=1 timeout "$limit" "$ts" profile -m "$target" --shapes "${common[@]}" \
            >"$out/shapes-1.5b-nographs.json" || log "the 1.5B shapes without graphs failed"
        timeout "$limit" "$ts" profile -m "$draft" --shapes "${common[@]}" >"$out/shapes-0.5b.json" ||
            log "the 0.5B shapes failed"
        checkpoint "$out" "$back"
    fi
    local traces=()
    mapfile -t traces < <(ls "$BUNDLE"/traces/*.trace 2>/dev/null)
    if [[ ${#traces[@]} -gt 0 ]] && fits 120 "the traces' shape sequences replayed"; then
        local replay=()
        for f in "${traces[@]}"; do replay+=(--replay-trace "$f"); done
        log "${#traces[@]} traces' shape sequences replayed on the 1.5B ($steps steps each)"
        timeout "$((limit * 2))" "$ts" profile -m "$target" "${replay[@]}" --replay-steps "$steps" "${common[@]}" \
            >"$out/replay-1.5b.json" || log "the replay failed or ran past $((limit * 2)) s"
        checkpoint "$out" "$back"
    fi
}

# The batched server with both models on the device: /health names the device, a streamed chat
# request is answered. Writes server.txt (PASS or FAIL lines, then the answers).
serve_check() {
    local ts=$1 target=$2 draft=$3 out=$4
    shift 4
    local port=8391 log=$out/serve.log
    log "the server on the device: /health and a streamed chat answer"
    "$ts" serve -m "$target" --draft "$draft" "$@" --port "$port" >"$log" 2>&1 &
    local pid=$! up=0
    for _ in $(seq 60); do
        curl -fs "http://127.0.0.1:$port/health" >"$out/health.json" 2>/dev/null && {
            up=1
            break
        }
        sleep 1
    done
    {
        if [[ $up == 0 ]]; then
            echo "FAIL: the server did not answer /health within 60 s"
        else
            echo "health: $(cat "$out/health.json")"
            curl -fsN -m 60 "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
                -d '{"messages":[{"role":"user","content":"Write a function that adds two numbers."}],"max_tokens":48,"stream":true}' \
                >"$out/stream.txt" 2>&1
            local chunks
            chunks=$(grep -c '^data: {' "$out/stream.txt" || true)
            if [[ $chunks -gt 1 ]] && grep -q '^data: \[DONE\]' "$out/stream.txt"; then
                echo "PASS: streamed chat answer, $chunks chunks"
            else
                echo "FAIL: streamed chat answer ($chunks chunks; see stream.txt)"
            fi
        fi
    } | tee "$out/server.txt"
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# The device run's table: T(n) of both models, llama.cpp's timings, a plain step's host time,
# identity with plain decoding, the server. Each part only where its files exist (a run cut short).
summarize() {
    python3 - "$1" <<'EOF'
import json, re, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    try:
        return json.load(open(out / name))
    except (OSError, ValueError):
        return None
t, d = load("profile-1.5b.json"), load("profile-0.5b.json")
if not t:
    print("# treespec on the device: no T(n) measured (see log.txt)")
    sys.exit()
tm = {p["n"]: p["ms"] for p in t["points"]}
dm = {p["n"]: p["ms"] for p in d["points"]} if d else {}
print(f"# treespec on {t['device']}\n")
gpu = (out / "gpu.txt").read_text().strip() if (out / "gpu.txt").exists() else ""
if gpu:
    print("```\n" + gpu + "\n```\n")
print("Random-weight files with the shapes, types and tokenizer of Qwen2.5-Coder-1.5B/0.5B Q4_K_M;")
print(f"{t['prefix']} committed tokens under each batch, median of repeats, ms.\n")
sizes = [n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n in tm]
print("| n | " + " | ".join(map(str, sizes)) + " |")
print("|---|" + "---:|" * len(sizes))
print("| 1.5B T(n) | " + " | ".join(f"{tm[n]:.2f}" for n in sizes) + " |")
print("| 1.5B T(n)/T(1) | " + " | ".join(f"{tm[n] / tm[1]:.2f}" for n in sizes) + " |")
if dm:
    print("| 0.5B T(n) | " + " | ".join(f"{dm[n]:.2f}" for n in sizes if n in dm) + " |")
long = load("profile-1.5b-ctx2048.json")
if long:
    lm = {p["n"]: p["ms"] for p in long["points"]}
    print(f"| 1.5B T(n), {long['prefix']} tokens of context | " + " | ".join(f"{lm[n]:.2f}" if n in lm else "" for n in sizes) + " |")
rep = load("profile-1.5b-repeated.json")
if rep:
    rm = {p["n"]: p["ms"] for p in rep["points"]}
    print("| 1.5B T(n), each size repeated (graph replay) | " + " | ".join(f"{rm[n]:.2f}" if n in rm else "" for n in sizes) + " |")
if dm:
    print(f"\nDraft step ÷ target step (n = 1): {dm[1] / tm[1]:.2f}.")
def table(name):
    text = (out / name).read_text() if (out / name).exists() else ""
    lines = [l for l in text.splitlines() if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")] if lines else []
    rows = [dict(zip(head, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]
    return lines, rows
lines, _ = table("batched-bench.txt")
if lines:
    print("\nllama-batched-bench on the target file (PP 128, TG 8 per sequence; its own table):\n")
    print("\n".join(lines))
# A plain step's host time: treespec's plain decode step (wall time less prefill, per forward)
# against the bare forward T(1) and against llama.cpp's own decode step on the same file.
eq = load("bench-equal/results.json")
_, tg = table("batched-bench-tg.txt")
if eq:
    plain = [r for r in eq["runs"] if r["method"] == "plain" and r["target_forwards"]]
    if plain:
        step = statistics.median(1000 * (r["wall_s"] - r["prefill_s"]) / r["target_forwards"] for r in plain)
        fwd = statistics.median(1000 * r["target_s"] / r["target_forwards"] for r in plain)
        print("\nA plain decoding step (ms; median over the plain answers of the equality run):\n")
        print("| | ms per token |")
        print("|---|---:|")
        print(f"| treespec plain, whole step | {step:.2f} |")
        print(f"| of which the target's forward and logits | {fwd:.2f} |")
        print(f"| profiled T(1) | {tm[1]:.2f} |")
        if tg:
            r = tg[0]
            print(f"| llama-batched-bench, 1 sequence, {r['TG']} tokens | {1000 * float(r['T_TG s']) / float(r['TG']):.2f} |")
print("\nGreedy answers against plain decoding on the same device:\n")
print("| draft | method | answers | identical to plain | tokens per forward |")
print("|---|---|---:|---:|---:|")
for run, draft in (("bench-equal", "0.5B (random: rejected)"), ("bench-self", "the target itself (accepted)")):
    res = load(f"{run}/results.json")
    if not res:
        print(f"| {draft} | (not run) | | | |")
        continue
    by = {}
    for r in res["runs"]:
        by.setdefault(r["method"], []).append(r)
    for m, runs in by.items():
        same = sum(1 for r in runs if r.get("identical_to_plain"))
        tpf = sum(r["emitted"] for r in runs) / max(1, sum(r["target_forwards"] for r in runs))
        print(f"| {draft} | {m} | {len(runs)} | {same} | {tpf:.2f} |")
def shapes(name):
    d = load(name)
    return {t["rows"]: t for t in d["shapes"]["times"]} if d and d.get("shapes") else None, d
s15, d15 = shapes("shapes-1.5b.json")
if s15:
    s15n, _ = shapes("shapes-1.5b-nographs.json")
    s05, d05 = shapes("shapes-0.5b.json")
    print("\nPadded shapes (measured forwards, ms): after a forward of another shape (changed) and after")
    print("forwards of their own (replayed); without CUDA graphs a replay is llama.cpp's graph reuse alone.\n")
    print("| rows | 1.5B changed | 1.5B replayed | replayed ÷ replayed T(1) | 1.5B replayed, no graphs | 0.5B changed | 0.5B replayed |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    one = s15[1]["replayed_ms"]
    for r, t in s15.items():
        ng = f"{s15n[r]['replayed_ms']:.2f}" if s15n and r in s15n else ""
        dc = f"{s05[r]['changed_ms']:.2f} | {s05[r]['replayed_ms']:.2f}" if s05 and r in s05 else " | "
        print(f"| {r} | {t['changed_ms']:.2f} | {t['replayed_ms']:.2f} | {t['replayed_ms'] / one:.2f} | {ng} | {dc} |")
    print(f"\nPadding pays on this device (the 1.5B): {d15['shapes']['padding_pays']}.")
rep = load("replay-1.5b.json")
if rep and rep.get("replays"):
    print("\nRecorded runs' shape sequences replayed as real forwards on the 1.5B shape (wall time, host")
    print("included; prediction from the shape times and T(n) measured in the same process):\n")
    print("| trace | tokens | plain ms | unpadded ×plain | predicted | reuse | padded ×plain | predicted | reuse | host ms/step |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rep["replays"]:
        p, u, q = r["plain"], r["unpadded"], r["padded"]
        name = Path(r["trace"]).stem
        pred = lambda x: p["predicted_ms"] / x["predicted_ms"]
        reuse = lambda x: f"{x['graph_reuses'] / max(1, x['forwards']):.0%}"
        print(f"| {name} | {r['tokens']} | {p['wall_ms']:.0f} | {u['speedup_vs_plain']:.2f} | {pred(u):.2f} | {reuse(u)} "
              f"| {q['speedup_vs_plain']:.2f} | {pred(q):.2f} | {reuse(q)} | {q['host_ms_per_step']:.3f} |")
for name, title in (("exact-refused.txt", "`--exact` with `-ngl all`"), ("server.txt", "The server on the device")):
    if (out / name).exists():
        print(f"\n{title}:\n\n```\n" + "\n".join((out / name).read_text().strip().splitlines()[-4:]) + "\n```")
EOF
}

replay() {
    local dir=${1:-}
    [[ -d $dir ]] || die "usage: gpu-check.sh replay DIR (the results of a device run)"
    cargo build --release -q -p treespec-cli -p treespec-bench --examples --bins >&2
    local target_curve draft_curve which
    # The curves auto cached there, fast-mode ones first (a `device --cpu` run caches exact ones
    # only); else the `treespec profile` tables made into curves (profile_curve).
    for which in 1.5b 0.5b; do
        local curve
        curve=$( (ls -t "$dir"/costs/*"$which"*-fast*.json; ls -t "$dir"/costs/*"$which"*.json) 2>/dev/null | head -1 || true)
        if [[ -z $curve && -s $dir/profile-$which.json ]]; then
            curve=$dir/curve-$which.json
            ./target/release/examples/profile_curve "$dir/profile-$which.json" "$curve" >&2
        fi
        [[ $which == 1.5b ]] && target_curve=$curve || draft_curve=$curve
    done
    [[ -n $target_curve ]] || die "$dir holds no 1.5B curve (costs/ or profile-1.5b.json)"
    local report=$dir/replay.md work=$dir/replay
    mkdir -p "$work"
    {
        echo "# Replayed on $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["device"])' "$dir/profile-1.5b.json")'s curves"
        echo
        echo "Acceptance recorded on a CPU; every forward timed on the GPU curves ($target_curve${draft_curve:+, $draft_curve})."
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
    if [[ -z $draft_curve ]]; then
        printf '\n## Draft-model methods\n\nNot replayed: the run measured no 0.5B curve.\n' >>"$report"
        log "wrote $report (no draft curve: the draft-model methods are not replayed)"
        return
    fi
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
cpu-build) cpu_build ;;
replay) replay "${2:-}" ;;
traces) traces ;;
*) die "usage: gpu-check.sh prepare | device [--cpu] | cpu-build | replay DIR | traces" ;;
esac
