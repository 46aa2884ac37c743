#!/usr/bin/env bash
# One replica on the local store against replicas on a shared Redis, in one run (results in
# BENCHMARKS.md, "Several replicas"):
#   publish      bare server: verifies the HMAC, publishes with a confirm (the broker limit)
#   local        one gateway on its embedded store
#   redis-1      one gateway on Redis
#   redis-2      two gateways on the same Redis and key prefix, the load spread over both
#   redis-2-wait the same with redis.wait_replicas: 1 (WAIT for the Redis replica)
# Redis is a master of the run's own with one replica (loopback ports, appendonly yes,
# appendfsync everysec, no snapshots); the replica is attached for every target, so each
# pays the same replication. Each target gets the closed-loop HTTPS load (CONNECTIONS in
# flight), then the open loop at OPEN_RATE for the latency at an equal load. Rounds
# alternate the targets; the summary takes medians.
#
# Env (defaults in brackets): DURATION [10s] WARMUP [2s] CONNECTIONS [64] ROUNDS [3]
#   OPEN_RATE [1000] TARGETS ["publish local redis-1 redis-2 redis-2-wait"]
#   OUT [target/bench-replicas] HOOKGATE [target/release/hookgate]
#   NO_BUILD [empty; 1 = use the release binaries already built]
#   RABBIT [amqp://guest:guest@127.0.0.1:5672/%2f]
# Needs RabbitMQ and redis-server; deletes its own exchange, queue and Redis.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
CONNECTIONS=${CONNECTIONS:-64}
ROUNDS=${ROUNDS:-3}
OPEN_RATE=${OPEN_RATE:-1000}
TARGETS=${TARGETS:-publish local redis-1 redis-2 redis-2-wait}
OUT=${OUT:-target/bench-replicas}
RABBIT=${RABBIT:-amqp://guest:guest@127.0.0.1:5672/%2f}
SECRET=bench-secret-$RANDOM$RANDOM

[ -n "${NO_BUILD:-}" ] || cargo build --release --bin hookgate --example load
HOOKGATE=${HOOKGATE:-$PWD/target/release/hookgate}
LOAD=$PWD/target/release/examples/load

mkdir -p "$OUT"
rm -f "$OUT"/*.json
TMP=$(mktemp -d /tmp/hookgate-replicas.XXXXXX)
RUN=$(basename "$TMP" | tr -dc 'a-zA-Z0-9' | tr 'A-Z' 'a-z')
EXCHANGE=hookgate-bench-$RUN
QUEUE=hookgate-bench-$RUN

# shellcheck source=bench/common.sh
source bench/common.sh
# Redis, its replica and the ceiling, then two ports for each gateway the run starts.
BASE=$(free_ports 24)
PORT_REDIS=$BASE PORT_REPLICA=$((BASE + 1)) PORT_PUB=$((BASE + 2))
NEXT_PORT=$((BASE + 10))

redis() { # name port [redis-server args...]
    local name=$1 port=$2
    shift 2
    mkdir -p "$TMP/$name"
    redis-server --bind 127.0.0.1 --port "$port" --dir "$TMP/$name" --save '' \
        --appendonly yes --appendfsync everysec "$@" >"$TMP/$name.log" 2>&1 &
    PIDS+=("$!")
    wait_for "$name" redis-cli -p "$port" ping
}
redis redis "$PORT_REDIS"
redis replica "$PORT_REPLICA" --replicaof 127.0.0.1 "$PORT_REDIS"
wait_for "the replica's sync" bash -c \
    "redis-cli -p $PORT_REPLICA info replication | grep -q 'master_link_status:up'"

"$LOAD" --gen-cert "$TMP"
"$LOAD" --amqp-setup --amqp-url "$RABBIT" --exchange "$EXCHANGE" --queue "$QUEUE"
"$LOAD" --consume --amqp-url "$RABBIT" --queue "$QUEUE" >"$TMP/consumer.log" 2>&1 &
PIDS+=("$!")
LOAD_SECRET=$SECRET "$LOAD" --serve-baseline publish --listen "127.0.0.1:$PORT_PUB" \
    --cert "$TMP/tls.crt" --key "$TMP/tls.key" --amqp-url "$RABBIT" --exchange "$EXCHANGE" \
    >"$TMP/publish.log" 2>&1 &
PIDS+=("$!")
wait_for publish bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT_PUB"
declare -A URLS=([publish]="https://127.0.0.1:$PORT_PUB/webhooks/botix")

# gateway TARGET DEDUP_YAML: starts one more gateway of TARGET with that dedup/redis config;
# its URL is added to the target's.
gateway() {
    local target=$1 dedup=$2 port=$NEXT_PORT admin=$((NEXT_PORT + 1))
    NEXT_PORT=$((NEXT_PORT + 2))
    local name=$target-$port
    cat >"$TMP/$name.yaml" <<EOF
listen:
  addr: 127.0.0.1:$port
  tls: {cert: $TMP/tls.crt, key: $TMP/tls.key}
admin:
  addr: 127.0.0.1:$admin
store:
  path: $TMP/store-$name
amqp:
  url: "$RABBIT"
  exchange: $EXCHANGE
  routing_key: "{event}"
  declare: true
$dedup
$(<bench/route.yaml)
EOF
    BENCH_SECRET=$SECRET "$HOOKGATE" --config "$TMP/$name.yaml" --log-format json \
        >"$TMP/$name.log" 2>&1 &
    PIDS+=("$!")
    wait_for "$name" curl -sf "http://127.0.0.1:$admin/readyz"
    URLS[$target]="${URLS[$target]:-} https://127.0.0.1:$port/webhooks/botix"
}
on_redis() { # key prefix, wait_replicas
    printf 'dedup:\n  backend: redis\nredis:\n  url: "redis://127.0.0.1:%s"\n  key_prefix: "%s"\n  wait_replicas: %s\n' \
        "$PORT_REDIS" "$1" "$2"
}
for t in $TARGETS; do
    case $t in
    publish) ;;
    local) gateway local "" ;;
    redis-1) gateway redis-1 "$(on_redis hg-one: 0)" ;;
    redis-2) for _ in 1 2; do gateway redis-2 "$(on_redis hg-two: 0)"; done ;;
    redis-2-wait) for _ in 1 2; do gateway redis-2-wait "$(on_redis hg-wait: 1)"; done ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
    esac
done

# run TARGET JSON [load args...]: one run of the load tool against every URL of TARGET.
run() {
    local target=$1 json=$2 first rest also=()
    shift 2
    read -r first rest <<<"${URLS[$target]}"
    for u in ${rest:-}; do also+=(--also-url "$u"); done
    LOAD_SECRET=$SECRET "$LOAD" --url "$first" "${also[@]}" --ca "$TMP/tls.crt" \
        --duration "$DURATION" --warmup "$WARMUP" --label "$target" --json "$json" "$@"
}

echo "== machine: $(nproc) cores, $(uptime)"
for round in $(seq 1 "$ROUNDS"); do
    for t in $TARGETS; do
        run "$t" "$OUT/$t-closed-$round.json" --connections "$CONNECTIONS"
    done
done
for round in $(seq 1 "$ROUNDS"); do
    for t in $TARGETS; do
        run "$t" "$OUT/$t-open-$round.json" --connections "$CONNECTIONS" --rate "$OPEN_RATE"
    done
done

echo "== summary: medians over $ROUNDS round(s) (also $OUT/summary.json)"
jq -s '
  def median: sort | if length == 0 then null
    elif length % 2 == 1 then .[length / 2 | floor]
    else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  group_by(.label) | map({key: .[0].label, value: {
      closed_rps: (map(select(.rate == null) | .requests_per_s) | median),
      closed_rps_each: map(select(.rate == null) | .requests_per_s),
      closed_p50_ms: (map(select(.rate == null) | .latency_ms.p50) | median),
      closed_p99_ms: (map(select(.rate == null) | .latency_ms.p99) | median),
      open_p50_ms: (map(select(.rate != null) | .latency_ms.p50) | median),
      open_p99_ms: (map(select(.rate != null) | .latency_ms.p99) | median),
      open_p99_ms_each: map(select(.rate != null) | .latency_ms.p99)}})
  | from_entries
  | . as $r
  | {open_rate: '"$OPEN_RATE"', targets: $r,
     ratio_to_publish: (if $r["publish"] then ($r | map_values(.closed_rps / $r["publish"].closed_rps)) else null end)}
' "$OUT"/*.json | tee "$OUT/summary.json"
grep -h '"level":"ERROR"' "$TMP"/*.log | head -n 5 || true
