#!/usr/bin/env bash
# hookgate against its three ceilings, in one run (results in BENCHMARKS.md):
#   http     bare hyper+rustls server: reads the body, answers 200      (the HTTP limit)
#   publish  bare server: verifies the HMAC, publishes hookgate's message with a confirm (the broker limit)
#   durable  as publish, then a record per delivery in a log synced by a group commit, one
#            fdatasync per group, before the 200 (what durability must cost on this disk)
#   hookgate the real gateway: TLS, a temporary store, guard on, random exchange + bound queue
# Each gets the same closed-loop HTTPS load (CONNECTIONS in flight, DURATION measured), then
# an open-loop run at half of hookgate's max rate; at that rate the http baseline shows the
# machine's own tail, and hookgate's histograms, scraped before and after each run, split
# its latency: the whole request, the broker's confirm (publish_duration_seconds) and the
# wait for the store's group commit (store_sync_duration_seconds).
# Also records CPU time per 10,000 accepted events (utime+stime from /proc/PID/stat) and RSS
# idle and peak under load (VmRSS sampled every 0.2 s), the broker's and the consumer's CPU
# time during each run, and (from the load tool) how busy the whole machine was.
#
# Env (defaults in brackets):
#   DURATION [20s] WARMUP [3s] CONNECTIONS [64] HTTP2 [empty; 1 = HTTP/2]
#   OUT [target/bench-load] HOOKGATE [target/release/hookgate]
#   TARGETS ["http publish durable hookgate"]
#   TRANSIENT_QUEUE [empty; 1 = a non-durable queue]
#   QUEUE_VERSION [empty = the broker's default; 1 or 2: the classic queue's storage version]
#   CONSUMER [1; empty = nobody consumes the queue, which then fills to its cap]
#   CLOSED_REQUESTS [1000000: pre-signed deliveries per closed-loop run]
#   ROUNDS [3: runs per target, alternated; the summary reports medians]
#   OPEN_RATE [empty; a rate: only open-loop runs, at that rate instead of the half rate]
#   RABBIT [amqp://guest:guest@127.0.0.1:5672/%2f]
#   NO_BUILD [empty; 1 = use the release binaries already built]
#   CLIENT [the load tool just built; another build of it, to compare two clients]
#   BASELINE [empty; the path of another hookgate build: it runs beside the first, as target
#            "baseline", with the same config on ports of its own, so two builds are
#            compared in one run, closed and open loop; the same build with the two knobs
#            below compares two configs]
#   BASELINE_STORE_DIR [empty; a folder the baseline's store is made in instead of the
#            run's temporary folder, e.g. /dev/shm (a tmpfs: its fsyncs cost nothing)]
#   BASELINE_STORE_KEYS [empty; keys added to the baseline's `store:` section, separated
#            by ';', e.g. "hot_entries: 262144; commit_interval: 2ms"]
#   PRELOADED [empty; a store folder, e.g. written by examples/dedup_window: a copy of it
#            serves a second hookgate of the same build, as target "preloaded" (closed loop
#            only), so the cost of a full dedup window is measured in the same run]
# Needs RabbitMQ; leaves it running, deletes its own exchange and queue.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-20s}
WARMUP=${WARMUP:-3s}
CONNECTIONS=${CONNECTIONS:-64}
HTTP2=${HTTP2:-}
OUT=${OUT:-target/bench-load}
RABBIT=${RABBIT:-amqp://guest:guest@127.0.0.1:5672/%2f}
TARGETS=${TARGETS:-http publish durable hookgate}
TRANSIENT_QUEUE=${TRANSIENT_QUEUE:-}
QUEUE_VERSION=${QUEUE_VERSION:-}
CONSUMER=${CONSUMER:-1}
# Enough pre-signed deliveries that a closed-loop run ends by time, not by running dry (the
# bare HTTP server takes ~33k req/s here; raise it for longer runs).
CLOSED_REQUESTS=${CLOSED_REQUESTS:-1000000}
ROUNDS=${ROUNDS:-3}
OPEN_RATE=${OPEN_RATE:-}
SECRET=bench-secret-$RANDOM$RANDOM

[ -n "${NO_BUILD:-}" ] || cargo build --release --bin hookgate --example load
HOOKGATE=${HOOKGATE:-$PWD/target/release/hookgate}
LOAD=$PWD/target/release/examples/load
CLIENT=${CLIENT:-$LOAD}

mkdir -p "$OUT"
rm -f "$OUT"/*.json
shopt -s nullglob
TMP=$(mktemp -d /tmp/hookgate-bench.XXXXXX)
RUN=$(basename "$TMP" | tr -dc 'a-zA-Z0-9' | tr 'A-Z' 'a-z')
EXCHANGE=hookgate-bench-$RUN
QUEUE=hookgate-bench-$RUN
BASELINE=${BASELINE:-}
BASELINE_STORE_DIR=${BASELINE_STORE_DIR:-}
BASELINE_STORE_KEYS=${BASELINE_STORE_KEYS:-}
BASELINE_STORE=
PRELOADED=${PRELOADED:-}
# shellcheck source=bench/common.sh
source bench/common.sh
BASE=$(free_ports 9)
PORT_HG=$BASE PORT_ADMIN=$((BASE + 1)) PORT_HTTP=$((BASE + 2)) PORT_PUB=$((BASE + 3))
PORT_BASE_HG=$((BASE + 4)) PORT_BASE_ADMIN=$((BASE + 5))
PORT_PRE_HG=$((BASE + 6)) PORT_PRE_ADMIN=$((BASE + 7)) PORT_DUR=$((BASE + 8))

"$LOAD" --gen-cert "$TMP"
"$LOAD" --amqp-setup --amqp-url "$RABBIT" --exchange "$EXCHANGE" --queue "$QUEUE" \
    ${TRANSIENT_QUEUE:+--transient-queue} ${QUEUE_VERSION:+--queue-version "$QUEUE_VERSION"}
if [[ -n $CONSUMER ]]; then
    # The handler behind the gateway: keeps the queue short, as in production. Without it the
    # queue fills to its cap during the run and the broker's confirms slow down.
    "$LOAD" --consume --amqp-url "$RABBIT" --queue "$QUEUE" >"$TMP/consumer.log" 2>&1 &
    PID_consumer=$!
    PIDS+=("$PID_consumer")
fi
# The broker's own CPU is reported next to the servers' when it runs on this machine.
PID_broker=$(pgrep -x beam.smp | head -n 1 || true)

gateway_config "$TMP/hookgate.yaml" "$PORT_HG" "$PORT_ADMIN"

BENCH_SECRET=$SECRET "$HOOKGATE" --config "$TMP/hookgate.yaml" --log-format json \
    >"$TMP/hookgate.log" 2>&1 &
PID_hookgate=$!
PIDS+=("$PID_hookgate")
# start_beside NAME BINARY PORT ADMIN_PORT [STORE_FOLDER [STORE_KEYS]]: a second gateway,
# target NAME, with the config above on ports of its own, the store STORE_FOLDER/store-NAME
# ($TMP by default), and STORE_KEYS (';'-separated) added to its `store:` section.
start_beside() {
    local name=$1 binary=$2 port=$3 admin=$4 folder=${5:-$TMP} keys=${6:-}
    sed -e "s/127.0.0.1:$PORT_HG/127.0.0.1:$port/" \
        -e "s/127.0.0.1:$PORT_ADMIN/127.0.0.1:$admin/" \
        -e "s#path: $TMP/store#path: $folder/store-$name#" "$TMP/hookgate.yaml" |
        with_store_keys "$keys" >"$TMP/$name.yaml"
    BENCH_SECRET=$SECRET "$binary" --config "$TMP/$name.yaml" --log-format json \
        >"$TMP/$name.log" 2>&1 &
    printf -v "PID_$name" '%s' $!
    PIDS+=("$!")
    TARGETS="$TARGETS $name"
}
if [[ -n $BASELINE ]]; then
    if [[ -n $BASELINE_STORE_DIR ]]; then
        BASELINE_STORE=$(mktemp -d "$BASELINE_STORE_DIR/hookgate-bench.XXXXXX")
        CLEANUP_PATHS+=("$BASELINE_STORE")
    fi
    start_beside baseline "$BASELINE" "$PORT_BASE_HG" "$PORT_BASE_ADMIN" "${BASELINE_STORE:-$TMP}" "$BASELINE_STORE_KEYS"
fi
if [[ -n $PRELOADED ]]; then
    cp -a "$PRELOADED" "$TMP/store-preloaded"
    start_beside preloaded "$HOOKGATE" "$PORT_PRE_HG" "$PORT_PRE_ADMIN"
fi
"$LOAD" --serve-baseline http --listen "127.0.0.1:$PORT_HTTP" \
    --cert "$TMP/tls.crt" --key "$TMP/tls.key" >"$TMP/http.log" 2>&1 &
PID_http=$!
PIDS+=("$PID_http")
LOAD_SECRET=$SECRET "$LOAD" --serve-baseline publish --listen "127.0.0.1:$PORT_PUB" \
    --cert "$TMP/tls.crt" --key "$TMP/tls.key" --amqp-url "$RABBIT" --exchange "$EXCHANGE" \
    >"$TMP/publish.log" 2>&1 &
PID_publish=$!
PIDS+=("$PID_publish")
# The durable ceiling's log sits in the run's folder, on the disk hookgate's store uses.
LOAD_SECRET=$SECRET "$LOAD" --serve-baseline durable --listen "127.0.0.1:$PORT_DUR" \
    --cert "$TMP/tls.crt" --key "$TMP/tls.key" --amqp-url "$RABBIT" --exchange "$EXCHANGE" \
    --log-dir "$TMP/durable" >"$TMP/durable.log" 2>&1 &
PID_durable=$!
PIDS+=("$PID_durable")

wait_for hookgate curl -sf "http://127.0.0.1:$PORT_ADMIN/readyz"
[[ -z $BASELINE ]] || wait_for baseline curl -sf "http://127.0.0.1:$PORT_BASE_ADMIN/readyz"
[[ -z $PRELOADED ]] || wait_for preloaded curl -sf "http://127.0.0.1:$PORT_PRE_ADMIN/readyz"
wait_for http bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT_HTTP"
wait_for publish bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT_PUB"
wait_for durable bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT_DUR"
sleep 1

declare -A URL=(
    [hookgate]="https://127.0.0.1:$PORT_HG/webhooks/botix"
    [http]="https://127.0.0.1:$PORT_HTTP/webhooks/botix"
    [publish]="https://127.0.0.1:$PORT_PUB/webhooks/botix"
    [durable]="https://127.0.0.1:$PORT_DUR/webhooks/botix"
    [baseline]="https://127.0.0.1:$PORT_BASE_HG/webhooks/botix"
    [preloaded]="https://127.0.0.1:$PORT_PRE_HG/webhooks/botix"
)
TICK=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# CPU ticks of a helper process (the broker, the consumer), or 0 when there is none.
helper_ticks() { if [[ -n ${1:-} && -r /proc/$1/stat ]]; then cpu_ticks "$1"; else echo 0; fi; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# Inside each gateway: its request, broker confirm and durable-state histograms, scraped
# around a run; bench/histograms.py turns two scrapes into each one's p50, p99 and share
# within 5 ms. A build without one of them reports it as null.
INSIDE=(request_duration_seconds publish_duration_seconds store_sync_duration_seconds)
declare -A ADMIN=([hookgate]=$PORT_ADMIN [baseline]=$PORT_BASE_ADMIN [preloaded]=$PORT_PRE_ADMIN)
scrape() { curl -sf "http://127.0.0.1:${ADMIN[$1]}/metrics" >"$2"; }

# load NAME JSON [args...]: one run against NAME; prints its report, writes JSON, and adds
# cpu_s, cpu_s_per_10k_accepted, rss_idle_kib, rss_peak_kib to the JSON.
load() {
    local name=$1 json=$2
    shift 2
    local pid_var=PID_$name
    local pid=${!pid_var}
    local idle cpu0 cpu1 peak=0 rss
    [[ -z ${ADMIN[$name]:-} ]] || scrape "$name" "$json.metrics0"
    idle=$(rss_kib "$pid")
    cpu0=$(cpu_ticks "$pid")
    local broker0 consumer0
    broker0=$(helper_ticks "${PID_broker:-}")
    consumer0=$(helper_ticks "${PID_consumer:-}")
    LOAD_SECRET=$SECRET "$CLIENT" --url "${URL[$name]}" --ca "$TMP/tls.crt" \
        --duration "$DURATION" --warmup "$WARMUP" --label "$name" --json "$json" \
        ${HTTP2:+--http2} "$@" &
    local lp=$!
    while kill -0 "$lp" 2>/dev/null; do
        rss=$(rss_kib "$pid")
        ((rss > peak)) && peak=$rss
        sleep 0.2
    done
    wait "$lp"
    cpu1=$(cpu_ticks "$pid")
    local broker_s consumer_s
    broker_s=$(jq -n "($(helper_ticks "${PID_broker:-}") - $broker0) / $TICK")
    consumer_s=$(jq -n "($(helper_ticks "${PID_consumer:-}") - $consumer0) / $TICK")
    if [[ -n ${ADMIN[$name]:-} ]]; then
        scrape "$name" "$json.metrics1"
        # Where the time of this run's requests (warm-up included) went: the whole request,
        # the broker's confirm, the wait for the store's group commit.
        jq --argjson inside "$(python3 bench/histograms.py "$json.metrics0" "$json.metrics1" "${INSIDE[@]}")" \
            '. + {inside_hookgate: $inside}' "$json" >"$json.tmp" && mv "$json.tmp" "$json"
        rm -f "$json.metrics0" "$json.metrics1"
        jq -r '.inside_hookgate | to_entries[] | "  inside the gateway, \(.key): p50 \(.value.p50_ms) ms, p99 \(.value.p99_ms) ms, within 5 ms \(.value.within_5ms)"' "$json"
    fi
    jq --argjson c "$(((cpu1 - cpu0)))" --argjson t "$TICK" --argjson idle "$idle" \
        --argjson peak "$peak" --argjson broker "$broker_s" --argjson consumer "$consumer_s" \
        '. + {cpu_s: ($c / $t), rss_idle_kib: $idle, rss_peak_kib: $peak,
              broker_cpu_s: $broker, consumer_cpu_s: $consumer,
              cpu_s_per_10k_accepted: (if .accepted_total > 0
                  then ($c / $t) / .accepted_total * 10000 else null end)}' \
        "$json" >"$json.tmp" && mv "$json.tmp" "$json"
    jq -r '"  cpu \(.cpu_s)s = \(.cpu_s_per_10k_accepted // "n/a") s per 10k accepted; RSS idle \(.rss_idle_kib) KiB, peak \(.rss_peak_kib) KiB",
           "  beside it: broker \(.broker_cpu_s)s, consumer \(.consumer_cpu_s)s of CPU"' "$json"
}

echo "== machine: $(nproc) cores, $(uptime)"
# Rounds alternate the targets, so a slow minute of this shared VM hits all of them, and
# the summary takes medians. The order changes from round to round, so no target always
# runs first after a pause or right after the same other one: a round's first run meets a
# broker still settling from the phase before, and a run the queue its predecessor left.
# round_order ROUND TARGET...: the targets from the (ROUND - 1)th on, wrapping around, and
# backwards in even rounds.
round_order() {
    local round=$1
    shift
    local n=$# i at
    for ((i = 0; i < n; i++)); do
        at=$(((round - 1 + i) % n + 1))
        printf '%s\n' "${!at}"
    done | if ((round % 2 == 0)); then tac; else cat; fi
}
if [[ -z $OPEN_RATE ]]; then
    for round in $(seq 1 "$ROUNDS"); do
        # shellcheck disable=SC2086 # the list is split on purpose
        for t in $(round_order "$round" $TARGETS); do
            load "$t" "$OUT/$t-closed-$round.json" --connections "$CONNECTIONS" --requests "$CLOSED_REQUESTS"
        done
    done
fi

median() { jq -s 'sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end'; }
if [[ -n $OPEN_RATE ]]; then
    HALF=$OPEN_RATE
    echo "== open loop at $HALF req/s (OPEN_RATE)"
elif [[ " $TARGETS " == *" hookgate "* ]]; then
    MAX=$(jq '.requests_per_s' "$OUT"/hookgate-closed-*.json | median)
    HALF=$(jq -n --argjson m "$MAX" '($m / 2) | floor')
    echo "== open loop at $HALF req/s (half of hookgate's median $MAX)"
fi
if [[ -n ${HALF:-} ]]; then
    OPEN_TARGETS=()
    for t in hookgate baseline durable publish http; do
        [[ " $TARGETS " != *" $t "* ]] || OPEN_TARGETS+=("$t")
    done
    for round in $(seq 1 "$ROUNDS"); do
        for t in $(round_order "$round" "${OPEN_TARGETS[@]}"); do
            load "$t" "$OUT/$t-half-$round.json" --connections "$CONNECTIONS" --rate "$HALF"
        done
    done
fi

echo "== summary: medians over $ROUNDS round(s) (also $OUT/summary.json)"
# nullglob is on: a kind of run that did not happen contributes no file.
RESULTS=("$OUT"/*-closed-*.json "$OUT"/*-half-*.json)
jq -s '
  def median: sort | if length == 0 then null
    elif length % 2 == 1 then .[length / 2 | floor]
    else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  group_by(.label + (if .rate then "-half" else "-closed" end))
  | map({key: (.[0].label + (if .[0].rate then "-half" else "-closed" end)), value: {
      rps: (map(.requests_per_s) | median),
      rps_each: map(.requests_per_s),
      accepted_per_s: (map(.accepted_per_s) | median),
      p50_ms: (map(.latency_ms.p50) | median),
      p50_ms_each: map(.latency_ms.p50),
      p99_ms: (map(.latency_ms.p99) | median),
      p99_ms_each: map(.latency_ms.p99),
      inside_hookgate: (map(.inside_hookgate // empty) | if length > 0 then
          (.[0] | keys) as $names | [$names[] as $n | {key: $n, value: {
              p50_ms: (map(.[$n].p50_ms) | median), p99_ms: (map(.[$n].p99_ms) | median),
              within_5ms: (map(.[$n].within_5ms) | median)}}] | from_entries
          else null end),
      cpu_s_per_10k_accepted: (map(.cpu_s_per_10k_accepted) | median),
      cpu_s_per_10k_accepted_each: map(.cpu_s_per_10k_accepted),
      machine_busy: (map(.machine_cpu_busy_share // empty) | median),
      rss_idle_kib: (map(.rss_idle_kib) | min),
      rss_peak_kib: (map(.rss_peak_kib) | max)}})
  | from_entries
  | . as $r
  # The budget (BENCHMARKS.md), against the verify + publish ceiling in this run: each
  # target, the loop it is measured in, the figure it compares, and whether
  # [gateway figure, ceiling figure] meets it (null without both).
  | def targets: [
      ["throughput_ge_90pct_of_publish", "closed", "rps"],
      ["cpu_per_accepted_le_1_4x_publish", "closed", "cpu_s_per_10k_accepted"],
      ["p50_at_half_le_publish_plus_1ms", "half", "p50_ms"],
      ["p99_at_half_le_2x_publish", "half", "p99_ms"]];
    def meets($target): if .[0] == null or .[1] == null then null
      elif $target == "p50_at_half_le_publish_plus_1ms" then .[0] <= .[1] + 1
      elif $target == "p99_at_half_le_2x_publish" then .[0] <= 2 * .[1]
      # A ratio to the ceiling: none when the ceiling has no figure.
      elif .[1] == 0 then null
      elif $target == "throughput_ge_90pct_of_publish" then .[0] / .[1] >= 0.9
      else .[0] / .[1] <= 1.4 end;
    # Each target on the medians of gateway `$g`.
    def met($g): [targets[] as [$t, $loop, $figure] | {key: $t,
      value: ([$r[$g + "-" + $loop][$figure], $r["publish-" + $loop][$figure]] | meets($t))}]
      | from_entries;
    # Each target round by round, each round against the same round of the ceiling: "N of
    # M", of the M rounds both ran; null without a run of `$g`.
    def met_in_rounds($g): if $r[$g + "-closed"] == null then null else
      [targets[] as [$t, $loop, $figure] | {key: $t, value:
        ([$r[$g + "-" + $loop][$figure + "_each"], $r["publish-" + $loop][$figure + "_each"]]
          | if .[0] == null or .[1] == null then null
            else transpose | map(select(.[0] != null and .[1] != null))
              | "\(map(select(meets($t))) | length) of \(length)" end)}]
      | from_entries end;
    {
      hookgate_rps: $r["hookgate-closed"].rps,
      publish_rps: $r["publish-closed"].rps,
      http_rps: $r["http-closed"].rps,
      durable_rps: $r["durable-closed"].rps,
      ratio_to_durable: (try ($r["hookgate-closed"].rps / $r["durable-closed"].rps) catch null),
      durable_ratio_to_publish: (try ($r["durable-closed"].rps / $r["publish-closed"].rps) catch null),
      ratio_to_publish: (try ($r["hookgate-closed"].rps / $r["publish-closed"].rps) catch null),
      ratio_to_publish_each_round: (try ([$r["hookgate-closed"].rps_each, $r["publish-closed"].rps_each]
          | transpose | map(.[0] / .[1])) catch null),
      accepted_ratio_to_publish: (try ($r["hookgate-closed"].accepted_per_s / $r["publish-closed"].accepted_per_s) catch null),
      ratio_to_http: (try ($r["hookgate-closed"].rps / $r["http-closed"].rps) catch null),
      baseline_rps: $r["baseline-closed"].rps,
      baseline_ratio_to_publish: (try ($r["baseline-closed"].rps / $r["publish-closed"].rps) catch null),
      baseline_ratio_to_publish_each_round: (try ([$r["baseline-closed"].rps_each, $r["publish-closed"].rps_each]
          | transpose | map(.[0] / .[1])) catch null),
      preloaded_rps: $r["preloaded-closed"].rps,
      preloaded_ratio_to_publish: (try ($r["preloaded-closed"].rps / $r["publish-closed"].rps) catch null),
      preloaded_ratio_to_publish_each_round: (try ([$r["preloaded-closed"].rps_each, $r["publish-closed"].rps_each]
          | transpose | map(.[0] / .[1])) catch null),
      half_rate: '"${HALF:-null}"',
      p50_ms_at_half: ($r | with_entries(select(.key | endswith("-half")) | .value |= .p50_ms_each)),
      p99_ms_at_half: ($r | with_entries(select(.key | endswith("-half")) | .value |= .p99_ms_each)),
      hookgate_p99_ms_at_half: $r["hookgate-half"].p99_ms,
      hookgate_p99_ms_at_half_each: $r["hookgate-half"].p99_ms_each,
      publish_p99_ms_at_half: $r["publish-half"].p99_ms,
      publish_p99_ms_at_half_each: $r["publish-half"].p99_ms_each,
      http_p99_ms_at_half: $r["http-half"].p99_ms,
      http_p99_ms_at_half_each: $r["http-half"].p99_ms_each,
      inside_hookgate_at_half: $r["hookgate-half"].inside_hookgate,
      inside_hookgate_closed: $r["hookgate-closed"].inside_hookgate,
      inside_baseline_at_half: $r["baseline-half"].inside_hookgate,
      cpu_s_per_10k_accepted: ($r | with_entries(.value |= .cpu_s_per_10k_accepted)),
      machine_cpu_busy_share: ($r | with_entries(.value |= .machine_busy)),
      rss_kib: ($r | with_entries(select(.key | endswith("-closed")) | .value |= {idle: .rss_idle_kib, peak: .rss_peak_kib})),
      targets_met: met("hookgate"),
      targets_met_in_rounds: {hookgate: met_in_rounds("hookgate"), baseline: met_in_rounds("baseline")}
    }' "${RESULTS[@]}" </dev/null | tee "$OUT/summary.json"
grep -c '"level":"ERROR"' "$TMP/hookgate.log" | sed 's/^/hookgate error log lines: /' || true
