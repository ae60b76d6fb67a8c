#!/usr/bin/env bash
# treespec on a GPU backend, proven without a GPU: Mesa's software Vulkan device (lavapipe) runs
# llama.cpp's Vulkan backend on this CPU (docs/GPU.md).
#
#   bash scripts/vulkan-check.sh            # install, build, check (writes bench-out/vulkan-check/)
#
# 1. Installs Mesa's Vulkan drivers, the Vulkan headers and glslc when missing (Debian packages).
# 2. Builds treespec with `--features vulkan` into target-vulkan/ (the CPU build stays in target/).
# 3. Offloads every layer of SmolLM2 to the software device and checks that suffix, dyspec and
#    auto give the same greedy tokens there as plain decoding there; a mismatch prints the first
#    token where they part. Plain decoding on the device is also compared with plain decoding on
#    the CPU with --exact, and where they part is reported (the device's kernels round
#    differently: not a failure of the methods).
# 4. Starts the server with the Vulkan backend, streams one chat request and checks /health names
#    the device.
# Exits non-zero on any failed check. Not part of CI (the first Vulkan build alone takes minutes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[vulkan-check] %s\n' "$*"; }
die() {
    printf '[vulkan-check] FAIL: %s\n' "$*" >&2
    exit 1
}

need=()
for pkg in mesa-vulkan-drivers libvulkan-dev glslc spirv-headers; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if ((${#need[@]})); then
    log "installing ${need[*]}"
    apt-get install -y -q "${need[@]}" >/dev/null
fi
# Debian 12's Mesa (22.3) lavapipe crashes in llama.cpp's batched Vulkan shaders (a segfault in a
# driver thread at the first forward of 30+ rows); bookworm-backports has Mesa 25, which runs them.
mesa=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
if [[ "$mesa" == 22.* ]] && grep -q bookworm /etc/os-release; then
    log "Mesa $mesa's lavapipe crashes on llama.cpp's shaders: installing Mesa from bookworm-backports"
    echo "deb http://deb.debian.org/debian bookworm-backports main" >/etc/apt/sources.list.d/treespec-backports.list
    apt-get update -q >/dev/null
    apt-get install -y -q -t bookworm-backports mesa-vulkan-drivers >/dev/null
fi
bash scripts/setup.sh >/dev/null
bash scripts/fetch-models.sh smollm2 >/dev/null

target_dir="${VULKAN_TARGET_DIR:-target-vulkan}"
# llama.cpp's Vulkan backend needs VK_EXT_layer_settings (headers 1.3.261+); Debian 12 ships
# 1.3.239. Then the headers (only: the loader stays the system's) come from Debian 13's package,
# unpacked beside the build and found first through CMAKE_INCLUDE_PATH.
if ! grep -q VK_EXT_layer_settings /usr/include/vulkan/vulkan_core.h 2>/dev/null; then
    headers="$PWD/$target_dir/vulkan-headers"
    if [ ! -f "$headers/usr/include/vulkan/vulkan_core.h" ]; then
        log "the system's Vulkan headers are older than llama.cpp needs: unpacking Debian 13's"
        list=/etc/apt/sources.list.d/treespec-vulkan-headers.list
        echo "deb http://deb.debian.org/debian trixie main" >"$list"
        debs=$(mktemp -d)
        (apt-get update -q >/dev/null && cd "$debs" && apt-get download -q libvulkan-dev/trixie >/dev/null 2>&1) ||
            { rm -f "$list"; die "could not download Debian 13's libvulkan-dev"; }
        rm -f "$list"
        apt-get update -q >/dev/null
        mkdir -p "$headers"
        dpkg-deb -x "$debs"/libvulkan-dev_*.deb "$headers"
        rm -rf "$debs"
    fi
    export CMAKE_INCLUDE_PATH="$headers/usr/include"
fi
log "building treespec with --features vulkan into $target_dir/ (minutes the first time)"
CARGO_TARGET_DIR="$target_dir" cargo build --release -p treespec-cli --bin treespec --features vulkan
bin="$target_dir/release/treespec"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
out=bench-out/vulkan-check
mkdir -p "$out"

# The cost-aware methods would first measure this device's curve (over ten minutes on a software
# device that no user runs for speed): a GPU-like flat curve stands in, so the methods plan the
# large trees they would plan on a GPU (TREESPEC_COSTS, see crates/treespec-llama/src/runtime/costs.rs).
export TREESPEC_COSTS="${TREESPEC_COSTS:-linear:10,0.2}"
# ggml's Vulkan backend skips CPU-type devices unless they are named: lavapipe is device 0 here.
export GGML_VK_VISIBLE_DEVICES="${GGML_VK_VISIBLE_DEVICES:-0}"
"$bin" devices | tee "$out/devices.txt"
device=$(awk '/^  Vulkan[0-9]+:/ {sub(":", "", $1); print $1; exit}' "$out/devices.txt")
[ -n "$device" ] || die "no Vulkan device (is mesa-vulkan-drivers installed?)"
log "offloading to $device"

prompt="${VULKAN_CHECK_PROMPT:-def fibonacci(n):}"
n="${VULKAN_CHECK_TOKENS:-32}"
tokens() { python3 -c 'import json,sys; print(json.load(sys.stdin)["token_ids"])'; }
# first_difference REF GOT: where two token lists part (or their common length).
first_difference() {
    python3 - "$1" "$2" <<'EOF'
import ast, sys
ref, got = ast.literal_eval(sys.argv[1]), ast.literal_eval(sys.argv[2])
at = next((k for k, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
print(f"{at} ({ref[at:at+3]} vs {got[at:at+3]})")
EOF
}
gen() { "$bin" generate -m "$model" -t 2 -n "$n" --json -p "$prompt" "$@" 2>>"$out/generate.log" | tokens; }
log "plain decoding on the CPU (--exact), then on $device (a minute or more on a software device)…"
cpu=$(gen --exact)
device_plain=$(gen -ngl all --method plain)
echo "$cpu" >"$out/cpu-exact.txt"
echo "$device_plain" >"$out/$device-plain.txt"
if [ "$device_plain" = "$cpu" ]; then
    log "plain on $device: the CPU's exact $n tokens"
else
    # Not a failure of treespec's: the device's kernels round differently from the CPU's.
    log "plain on $device parts from the CPU's exact tokens at $(first_difference "$cpu" "$device_plain")"
fi
failed=0
for method in suffix dyspec auto; do
    log "$method on $device…"
    got=$(gen -md "$model" -ngl all --method "$method")
    echo "$got" >"$out/$device-$method.txt"
    if [ "$got" = "$device_plain" ]; then
        log "$method on $device: the same $n tokens as plain decoding on $device"
    else
        failed=$((failed + 1))
        log "$method on $device parts from plain decoding on $device at $(first_difference "$device_plain" "$got")"
    fi
done

log "serving with the Vulkan backend"
port=$((20000 + RANDOM % 20000))
"$bin" serve -m "$model" -md "$model" -t 2 -c 2048 -ngl all --port "$port" >"$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" >"$out/health.json" 2>/dev/null && break
    sleep 1
done
grep -q "$device" "$out/health.json" || die "/health does not name $device: $(cat "$out/health.json")"
curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"Say hello."}],"max_tokens":24,"stream":true}' >"$out/stream.txt"
grep -q '^data: \[DONE\]' "$out/stream.txt" || die "the streamed answer did not finish: $(head -c 400 "$out/stream.txt")"
log "served a streamed chat request on $device; /health: $(cat "$out/health.json")"

if ((failed)); then
    die "$failed methods parted from plain decoding on $device (see above)"
fi
log "PASS: every method gave plain decoding's greedy tokens on $device, and the server streamed"
