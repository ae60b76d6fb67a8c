# Sourced by scripts that run `treespec generate` cold, as a new user would on this machine.
# curves_only_cache DIR makes DIR a treespec cache holding only this machine's measured cost
# curves (copied from the cache in use: TREESPEC_CACHE_DIR, else XDG_CACHE_HOME's or ~/.cache's
# treespec), nothing learned; cold_generate DIR BIN ARGS... runs `BIN generate ARGS` on it after
# dropping whatever an earlier run learned there (prices, history), stderr discarded.
curves_only_cache() {
    local cache="$1"
    local src="${TREESPEC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/treespec}/costs"
    rm -rf "$cache" && mkdir -p "$cache/costs"
    cp "$src"/*.json "$cache/costs/" 2>/dev/null || true
}

cold_generate() {
    local cache="$1" exe="$2"
    shift 2
    rm -rf "$cache/prices" "$cache/history"
    TREESPEC_CACHE_DIR="$cache" "$exe" generate "$@" 2>/dev/null
}
