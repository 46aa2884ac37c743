#!/usr/bin/env bash
# The dedup window at COUNTS live marks (figures in BENCHMARKS.md, "The dedup window"). For
# each count:
#   1. examples/dedup_window fills a store with COUNT marks (COUNT/2 accepted events, each
#      with its status guard entry) and prints its memory, disk bytes per mark, claim+done
#      latency of new events and of duplicates, and its reopen time;
#   2. the release gateway starts on that store (plain HTTP, botix route, guard on): the
#      time from exec to /readyz 200 and the RSS then;
#   3. the load tool sends RATE new deliveries a second for DURATION (open loop): the
#      gateway's RSS after it, and the p50/p99 the sender saw.
# Output in $OUT/COUNT.log; the stores are deleted after each count.
#
# With MEMORY_LIMIT (e.g. 256M), steps 1 and 2 run in a memory cgroup of that limit, as in
# a pod: the page cache of the runs is charged to it too. After each step the cgroup's
# usage (resident and page cache), its peak and its OOM kills are printed. cgroup v1
# (memory.limit_in_bytes) and v2 (memory.max) are both handled; needs root.
#
# Env (defaults in brackets): COUNTS ["1000000 10000000 50000000"] RATE [2000]
#   DURATION [20s] OUT [target/bench-window] KEEP [empty; 1 = keep the stores in $OUT]
#   RABBIT [amqp://guest:guest@127.0.0.1:5672/%2f]
#   NO_BUILD [empty; 1 = use the release binaries already built]
#   REUSE [empty; 1 = skip step 1 and start on the stores KEEP left in $OUT]
#   MEMORY_LIMIT [empty; a size such as 256M = run the example and the gateway in a cgroup]
#   HOOKGATE_BIN [target/release/hookgate; another build of the gateway to compare]
# Needs RabbitMQ; deletes its own exchange and queue.
set -euo pipefail
cd "$(dirname "$0")/.."

COUNTS=${COUNTS:-1000000 10000000 50000000}
RATE=${RATE:-2000}
DURATION=${DURATION:-20s}
OUT=${OUT:-target/bench-window}
RABBIT=${RABBIT:-amqp://guest:guest@127.0.0.1:5672/%2f}
SECRET=bench-secret-$RANDOM$RANDOM

[ -n "${NO_BUILD:-}" ] || cargo build --release --bin hookgate --example dedup_window --example load
HOOKGATE=${HOOKGATE_BIN:-$PWD/target/release/hookgate}
LOAD=$PWD/target/release/examples/load
WINDOW=$PWD/target/release/examples/dedup_window
mkdir -p "$OUT"
TMP=$(mktemp -d /tmp/hookgate-window.XXXXXX)
RUN=$(basename "$TMP" | tr -dc 'a-zA-Z0-9' | tr 'A-Z' 'a-z')
EXCHANGE=hookgate-window-$RUN
QUEUE=hookgate-window-$RUN
# shellcheck source=bench/ports.sh
source bench/ports.sh
PORT=$(free_ports 2)
PID=
CGROUP=
cleanup() {
    [[ -z $PID ]] || kill "$PID" 2>/dev/null || true
    [[ -z $CGROUP ]] || rmdir "$CGROUP" 2>/dev/null || true
    [[ -z ${CONSUMER:-} ]] || kill "$CONSUMER" 2>/dev/null || true
    "$LOAD" --amqp-teardown --amqp-url "$RABBIT" --exchange "$EXCHANGE" --queue "$QUEUE" || true
    rm -rf "$TMP"
}
trap cleanup EXIT
"$LOAD" --amqp-setup --amqp-url "$RABBIT" --exchange "$EXCHANGE" --queue "$QUEUE"
# The handler behind the gateway keeps the queue short, as in production.
"$LOAD" --consume --amqp-url "$RABBIT" --queue "$QUEUE" >"$TMP/consumer.log" 2>&1 &
CONSUMER=$!
rss_mib() { awk '/^VmRSS:/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

# The memory cgroup: in_cgroup runs a command inside it; cgroup_report prints its usage.
if [[ -n ${MEMORY_LIMIT:-} ]]; then
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
        CGROUP=/sys/fs/cgroup/hookgate-window-$RUN
        mkdir "$CGROUP"
        echo "$MEMORY_LIMIT" >"$CGROUP/memory.max"
        echo 0 >"$CGROUP/memory.swap.max" 2>/dev/null || true
    else
        CGROUP=/sys/fs/cgroup/memory/hookgate-window-$RUN
        mkdir "$CGROUP"
        echo "$MEMORY_LIMIT" >"$CGROUP/memory.limit_in_bytes"
        echo 0 >"$CGROUP/memory.swappiness" 2>/dev/null || true
    fi
fi
# Replaces the calling shell: call it in a subshell, `(in_cgroup cmd) &` leaves its pid in $!.
in_cgroup() {
    if [[ -z $CGROUP ]]; then
        exec "$@"
    else
        exec sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$CGROUP" "$@"
    fi
}
cgroup_report() { # what
    [[ -n $CGROUP ]] || return 0
    local mib='{printf "%.1f", $NF / 1048576}'
    if [[ -f $CGROUP/memory.max ]]; then
        echo "cgroup $MEMORY_LIMIT, $1: usage $(awk "$mib" "$CGROUP/memory.current") MiB" \
            "(anon $(awk '$1 == "anon"' "$CGROUP/memory.stat" | awk "$mib")," \
            "file $(awk '$1 == "file"' "$CGROUP/memory.stat" | awk "$mib"))," \
            "peak $(awk "$mib" "$CGROUP/memory.peak" 2>/dev/null || echo '?') MiB," \
            "OOM kills $(awk '$1 == "oom_kill" {print $2}' "$CGROUP/memory.events")"
    else
        echo "cgroup $MEMORY_LIMIT, $1: usage $(awk "$mib" "$CGROUP/memory.usage_in_bytes") MiB" \
            "(rss $(awk '$1 == "total_rss"' "$CGROUP/memory.stat" | awk "$mib")," \
            "cache $(awk '$1 == "total_cache"' "$CGROUP/memory.stat" | awk "$mib"))," \
            "peak $(awk "$mib" "$CGROUP/memory.max_usage_in_bytes") MiB," \
            "limit hits $(cat "$CGROUP/memory.failcnt")," \
            "OOM kills $(awk '$1 == "oom_kill" {print $2}' "$CGROUP/memory.oom_control")"
        echo 0 >"$CGROUP/memory.max_usage_in_bytes"
    fi
}
now_ms() { date +%s%3N; }

for count in $COUNTS; do
    log=$OUT/$count.log
    [[ -n ${REUSE:-} ]] || rm -f "$log"
    store=${KEEP:+$OUT/store-$count}
    store=${store:-$TMP/store-$count}
    echo "== $count marks" | tee -a "$log"
    if [[ -z ${REUSE:-} ]]; then
        rm -rf "$store"
        (in_cgroup "$WINDOW" "$count" "$store") 2>&1 | tee -a "$log"
        cgroup_report "loading $count marks" | tee -a "$log"
    fi
    du -sh "$store" | sed 's/^/disk, whole store: /' | tee -a "$log"
    cat >"$TMP/hookgate.yaml" <<EOF
listen:
  addr: 127.0.0.1:$PORT
admin:
  addr: 127.0.0.1:$((PORT + 1))
store:
  path: $store
amqp:
  url: "$RABBIT"
  exchange: $EXCHANGE
$(<bench/route.yaml)
EOF
    start=$(now_ms)
    (BENCH_SECRET=$SECRET in_cgroup "$HOOKGATE" --config "$TMP/hookgate.yaml" --log-format json \
        >"$TMP/hookgate-$count.log" 2>&1) &
    PID=$!
    until curl -sf "http://127.0.0.1:$((PORT + 1))/readyz" >/dev/null 2>&1; do
        kill -0 "$PID" 2>/dev/null || { cat "$TMP/hookgate-$count.log"; exit 1; }
        sleep 0.02
    done
    echo "gateway: exec to ready $(($(now_ms) - start)) ms, RSS $(rss_mib "$PID") MiB" | tee -a "$log"
    LOAD_SECRET=$SECRET "$LOAD" --url "http://127.0.0.1:$PORT/webhooks/botix" \
        --rate "$RATE" --connections 32 --duration "$DURATION" --warmup 2s --label "window-$count" \
        --json "$OUT/$count-load.json" >/dev/null
    jq -r '"gateway under \(.rate) req/s: p50 \(.latency_ms.p50) ms, p99 \(.latency_ms.p99) ms, max \(.latency_ms.max) ms, \(.accepted_total) accepted"' \
        "$OUT/$count-load.json" | tee -a "$log"
    echo "gateway: RSS after the load $(rss_mib "$PID") MiB, peak $(awk '/^VmHWM:/ {printf "%.1f", $2 / 1024}' "/proc/$PID/status") MiB" | tee -a "$log"
    cgroup_report "gateway after the load" | tee -a "$log"
    kill "$PID"
    wait "$PID" || true
    PID=
    [[ -n ${KEEP:-} ]] || rm -rf "$store"
done
