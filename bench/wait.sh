# Sourced by the bench scripts. `wait_for NAME COMMAND...` runs COMMAND every 0.1 s until it
# succeeds, for WAIT_SECONDS (10) at most; then it says NAME did not come up, shows
# $TMP/NAME.log if the caller keeps one, and exits.
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
