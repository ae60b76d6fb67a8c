#!/usr/bin/env bash
# Replicas behind a real gateway (issue #42; docs/SERVING.md "Many machines"): N `treespec serve`
# processes on this machine, or replicas already running elsewhere, with the SMG gateway
# (Shepherd Model Gateway, PyPI `smg`, pinned below) in front of them.
#
#   scripts/replicas.sh start [-n N] [--policy P] [--assign MODE] [--port PORT] [--urls URL,URL,…]
#                             [-- SERVE-ARGS…]
#   scripts/replicas.sh stop
#   scripts/replicas.sh kill I           # replica I dies at once (SIGKILL: no drain, no save)
#   scripts/replicas.sh revive I         # replica I starts again, with the same arguments
#   scripts/replicas.sh install          # SMG alone, into its own virtual environment
#
# start: N replicas (default 2) on PORT+1…PORT+N, each `target/release/treespec serve
# SERVE-ARGS --port …` (give the model, threads and method there: -m MODEL -t 1 --method auto;
# `{i}` in an argument becomes the replica's number, for what each must have of its own, such
# as --suffix-history /var/lib/treespec/history-{i}.bin), or the replicas at --urls instead;
# then SMG on PORT (default 8090) with policy P (default consistent_hashing): round_robin,
# cache_aware (SMG's own prefix tree; no client cooperation), consistent_hashing or manual
# (sticky by the X-SMG-Routing-Key header, which `treespec bench --sessions` sends with every
# turn of a conversation), power_of_two or least_load (by each replica's /v1/loads). --assign
# MODE is SMG's --assignment-mode, where `manual` places a key it has not seen: min_load (the
# replica with the fewest requests; what keeps replicas even), min_group, random (its default).
# Waits until every replica is healthy and SMG routes to all of them.
# State and logs: $REPLICAS_DIR (default /tmp/treespec-replicas).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SMG_VERSION=1.13.0
dir="${REPLICAS_DIR:-/tmp/treespec-replicas}"
venv="${TREESPEC_SMG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/treespec/smg-$SMG_VERSION}"
log() { printf '[replicas] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

install_smg() {
    if [[ -x "$venv/bin/smg" ]]; then
        echo "$venv/bin/smg"
        return
    fi
    log "installing smg==$SMG_VERSION into $venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet "smg==$SMG_VERSION" >&2
    [[ -x "$venv/bin/smg" ]] || die "smg==$SMG_VERSION installed no smg command"
    echo "$venv/bin/smg"
}

# Wait until `curl URL` succeeds (up to $2 seconds; the first start of a replica may measure its
# cost curves, which it does in the background while it already answers).
wait_for() {
    local url=$1 secs=$2 i
    for ((i = 0; i < secs * 5; i++)); do
        curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
        sleep 0.2
    done
    return 1
}

stop_all() {
    [[ -d "$dir" ]] || return 0
    for f in "$dir"/*.pid; do
        [[ -e "$f" ]] || continue
        local pid
        pid="$(cat "$f")"
        # SIGTERM: a replica drains (unready, in-flight requests finish) before it exits.
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$f"
    done
}

# Start replica $1 on port $2 + $1 with the serve arguments after them (`{i}` → $1); its log
# grows across revivals.
launch() {
    local i=$1 port=$2
    shift 2
    local args=("${@//\{i\}/$i}")
    target/release/treespec serve "${args[@]}" --host 127.0.0.1 --port $((port + i)) >>"$dir/replica-$i.log" 2>&1 &
    echo $! >"$dir/replica-$i.pid"
}

kill_one() {
    local i=${1:?usage: replicas.sh kill I}
    [[ -f "$dir/replica-$i.pid" ]] || die "no replica $i running (see $dir)"
    kill -9 "$(cat "$dir/replica-$i.pid")" 2>/dev/null || true
    rm -f "$dir/replica-$i.pid"
    log "replica $i killed"
}

revive() {
    local i=${1:?usage: replicas.sh revive I}
    [[ -f "$dir/serve-args" ]] || die "no replicas were started here ($dir)"
    [[ ! -f "$dir/replica-$i.pid" ]] || die "replica $i is running"
    local args port
    mapfile -t args <"$dir/serve-args"
    port="$(cat "$dir/port")"
    echo "[replicas] revived $(date -u +%FT%TZ)" >>"$dir/replica-$i.log"
    launch "$i" "$port" "${args[@]}"
    wait_for "http://127.0.0.1:$((port + i))/health" 600 || die "replica $i never became healthy again"
    log "replica $i back on http://127.0.0.1:$((port + i))"
}

start() {
    local n=2 policy=consistent_hashing port=8090 urls="" assign=()
    while [[ $# -gt 0 ]]; do
        case "$1" in
            -n) n=$2; shift 2 ;;
            --policy) policy=$2; shift 2 ;;
            --assign) assign=(--assignment-mode "$2"); shift 2 ;;
            --port) port=$2; shift 2 ;;
            --urls) urls=$2; shift 2 ;;
            --) shift; break ;;
            *) die "unknown option $1" ;;
        esac
    done
    local smg
    smg="$(install_smg)"
    stop_all
    mkdir -p "$dir"
    rm -f "$dir"/replica-*.log
    local workers=()
    if [[ -n "$urls" ]]; then
        IFS=, read -ra workers <<<"$urls"
    else
        [[ -x target/release/treespec ]] || die "no target/release/treespec: cargo build --release -p treespec-cli"
        # Kept for `revive`: one argument a line.
        printf '%s\n' "$@" >"$dir/serve-args"
        echo "$port" >"$dir/port"
        for i in $(seq "$n"); do
            launch "$i" "$port" "$@"
            workers+=("http://127.0.0.1:$((port + i))")
        done
    fi
    for w in "${workers[@]}"; do
        wait_for "$w/health" 600 || die "$w never became healthy (see $dir/replica-*.log)"
        # A first start measures the cost curves in the background, serving a fixed-budget
        # stand-in meanwhile: wait until the method asked for is the one serving.
        for _ in $(seq 3000); do
            curl -fsS "$w/health" 2>/dev/null | grep -q '"measuring"' || break
            sleep 0.2
        done
        log "replica $w ready"
    done
    "$smg" launch --host 127.0.0.1 --port "$port" --worker-urls "${workers[@]}" --policy "$policy" "${assign[@]}" \
        --prometheus-port $((port + 100)) --health-check-interval-secs 2 --log-level warn \
        >"$dir/smg.log" 2>&1 &
    echo $! >"$dir/smg.pid"
    local i
    for ((i = 0; i < 300; i++)); do
        if curl -fsS "http://127.0.0.1:$port/readiness" 2>/dev/null |
            python3 -c "import json,sys; r=json.load(sys.stdin); sys.exit(0 if r.get('healthy_workers') == $((${#workers[@]})) else 1)" 2>/dev/null; then
            log "SMG $SMG_VERSION on http://127.0.0.1:$port, policy $policy ${assign[*]}, ${#workers[@]} replicas"
            return 0
        fi
        sleep 0.2
    done
    die "SMG did not route to every replica within 60 s (see $dir/smg.log)"
}

case "${1:-}" in
    install) install_smg ;;
    start) shift; start "$@" ;;
    stop) stop_all; log "stopped" ;;
    kill) kill_one "${2:-}" ;;
    revive) revive "${2:-}" ;;
    *) sed -n '2,27p' "$0"; exit 2 ;;
esac
