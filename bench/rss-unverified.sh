#!/usr/bin/env bash
# Memory before authentication, worst case (figures in BENCHMARKS.md): the release gateway
# (plain HTTP, default limits otherwise) against examples/unverified_flood: CONNECTIONS
# HTTP/2 connections × STREAMS streams, each body declaring just under max_body_bytes, sent
# slowly and never finished, held for HOLD. The gateway's VmRSS is sampled every 0.2 s.
# Runs once with the budget BUDGET and once with a budget larger than the whole flood (as
# if there were none), and prints idle RSS, peak RSS and the bytes the flood declared.
#
# Env (defaults in brackets): CONNECTIONS [256] STREAMS [16] HOLD [20s] BUDGET [32MiB]
#   OUT [target/bench-rss] NO_BUILD [empty; 1 = use the release binaries already built]
# Needs nothing else: nothing is verified, so no broker is used.
set -euo pipefail
cd "$(dirname "$0")/.."

CONNECTIONS=${CONNECTIONS:-256}
STREAMS=${STREAMS:-16}
HOLD=${HOLD:-20s}
BUDGET=${BUDGET:-32MiB}
OUT=${OUT:-target/bench-rss}
BODY=65535 # max_body_bytes (64 KiB) - 1

[ -n "${NO_BUILD:-}" ] || cargo build --release --bin hookgate --example unverified_flood
mkdir -p "$OUT"

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

run_one() { # label budget
  local label=$1 budget=$2 dir
  dir=$(mktemp -d)
  cat >"$dir/hookgate.yaml" <<EOF
listen:
  addr: 127.0.0.1:0
admin:
  addr: 127.0.0.1:0
store:
  path: $dir/store
amqp:
  url: amqp://guest:guest@127.0.0.1:1/%2f
limits:
  max_unverified_body_bytes: $budget
  body_read_timeout: 120s
routes:
  - name: botix
    path: /webhooks/botix
    secrets:
      - secret_env: RSS_BENCH_SECRET
EOF
  RSS_BENCH_SECRET=rss-bench-secret-0123456789 target/release/hookgate run \
    --config "$dir/hookgate.yaml" --log-format json 2>"$OUT/$label.log" &
  local pid=$!
  local addr=""
  for _ in $(seq 100); do
    addr=$(grep -o '"message":"listening".*' "$OUT/$label.log" | grep -o '"addr":"[^"]*"' | head -1 | cut -d'"' -f4 || true)
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "gateway did not start" >&2; kill "$pid"; exit 1; }
  sleep 1
  local idle peak=0 now
  idle=$(rss_kib "$pid")
  target/release/examples/unverified_flood --addr "$addr" --connections "$CONNECTIONS" \
    --streams "$STREAMS" --body-bytes "$BODY" --hold "$HOLD" >"$OUT/$label.flood" &
  local flood=$!
  while kill -0 "$flood" 2>/dev/null; do
    now=$(rss_kib "$pid")
    ((now > peak)) && peak=$now
    sleep 0.2
  done
  wait "$flood" || true
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
  printf '%-10s budget %-8s idle %6d KiB  peak %7d KiB  (+%d KiB)  %s\n' \
    "$label" "$budget" "$idle" "$peak" "$((peak - idle))" "$(tr '\n' ' ' <"$OUT/$label.flood")"
}

echo "flood: $CONNECTIONS connections × $STREAMS streams × $BODY-byte bodies = $((CONNECTIONS * STREAMS * BODY / 1024)) KiB declared"
run_one budget "$BUDGET"
run_one no-budget 4GiB
