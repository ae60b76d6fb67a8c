# Sourced by scripts that drive a live server. start_server LOG ARGS... starts
# `target/release/treespec serve ARGS` (from the repository root) with its stderr in LOG, kills it
# when the script exits, and waits until it listens: SERVER is its pid, URL its address.
start_server() {
    local log="$1"
    shift
    target/release/treespec serve "$@" 2>"$log" &
    SERVER=$!
    trap 'kill "$SERVER" 2>/dev/null || true' EXIT
    URL=
    for _ in $(seq 600); do
        URL=$(grep -o 'listening on http://[^ ]*' "$log" | head -1 | sed 's/listening on //' || true)
        [ -n "$URL" ] && return 0
        kill -0 "$SERVER" 2>/dev/null || {
            cat "$log"
            exit 1
        }
        sleep 0.1
    done
    echo "server did not start"
    cat "$log"
    exit 1
}
