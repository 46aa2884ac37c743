#!/usr/bin/env bash
# The sizes of the futures a delivery runs through, largest first (release build). Each
# `async fn` a delivery awaits is copied whole into its caller's state when it starts, and
# hyper moves the request's future by value: a future that grows by a kilobyte costs every
# delivery that many bytes of copying per level. Compare the figures before and after a
# change to the request path (BENCHMARKS.md, "Cost model").
#
# It asks rustc for its type-size report, an unstable flag: RUSTC_BOOTSTRAP lets the
# stable compiler print it. It rebuilds hookgate's library crate only (about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."

# rustc prints the report only when it compiles the crate.
touch src/lib.rs
RUSTC_BOOTSTRAP=1 cargo rustc --quiet --release --lib -- -Zprint-type-sizes 2>/dev/null |
    sed -nE 's/^print-type-size type: `(\{async (fn body of |block@)[^`]*)`: ([0-9]+) bytes.*/\3\t\1/p' |
    grep -E 'connections\.rs:1[0-9]{2}:|webhook\.rs|http::webhook::|pipeline::|guard::checks::|outbox::Outbox::deliver' |
    grep -vE 'redis::|reconcile|admin_listener' |
    sort -rn | awk -F'\t' '!seen[$2]++ { printf "%6d  %.120s\n", $1, $2 }'
