# Sourced by the bench scripts: free ports (bench/ports.sh), waiting for a service, the
# processes a run starts and their clean-up, and the gateway's config on the bench route.
# The caller sets LOAD, RABBIT, TMP, EXCHANGE and QUEUE before it sources this file.

# shellcheck source=bench/ports.sh
source bench/ports.sh

# `wait_for NAME COMMAND...` runs COMMAND every 0.1 s until it succeeds, for WAIT_SECONDS
# (10) at most; then it says NAME did not come up, shows $TMP/NAME.log if the caller keeps
# one, and exits.
wait_for() {
    local name=$1
    shift
    for _ in $(seq 1 $((${WAIT_SECONDS:-10} * 10))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "$name did not come up" >&2
    [[ ! -f "$TMP/$name.log" ]] || cat "$TMP/$name.log" >&2
    exit 1
}

# The processes the run started (stopped at exit) and more folders to delete at exit.
PIDS=()
CLEANUP_PATHS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    "$LOAD" --amqp-teardown --amqp-url "$RABBIT" --exchange "$EXCHANGE" --queue "$QUEUE" || true
    rm -rf "$TMP" "${CLEANUP_PATHS[@]}"
}
trap cleanup EXIT

# with_store_keys KEYS: copies a config from stdin to stdout with KEYS (';'-separated,
# "commit_interval: 1ms; hot_entries: 262144") added to its `store:` section.
with_store_keys() {
    awk -v keys="$1" '{print} /^store:$/ && keys != "" {
        n = split(keys, k, ";")
        for (i = 1; i <= n; i++) { gsub(/^ +| +$/, "", k[i]); print "  " k[i] }
    }'
}

# gateway_config FILE PORT ADMIN_PORT: hookgate's config on PORT (TLS with the run's
# certificate) and ADMIN_PORT, its store in $TMP/store, publishing to the run's exchange,
# with the route of bench/route.yaml.
gateway_config() {
    cat >"$1" <<EOF
listen:
  addr: 127.0.0.1:$2
  tls: {cert: $TMP/tls.crt, key: $TMP/tls.key}
admin:
  addr: 127.0.0.1:$3
store:
  path: $TMP/store
amqp:
  url: "$RABBIT"
  exchange: $EXCHANGE
  routing_key: "{event}"
  declare: true
$(<bench/route.yaml)
EOF
}
