#!/usr/bin/env python3
"""Where a run's time went inside hookgate, from two scrapes of its /metrics.

    histograms.py BEFORE AFTER NAME...

BEFORE and AFTER are the text exposition before and after the run; each NAME is a
histogram without its `hookgate_` prefix (request_duration_seconds, ...). Prints JSON:
{NAME: {count, p50_ms, p99_ms, within_5ms}} over the observations made between the two
scrapes, label sets added up. A quantile is interpolated linearly inside its bucket, so it
is as fine as the buckets are (0.1, 0.25, 0.5, 1, 2.5, 5, 10 ms ...).
"""

import json
import math
import re
import sys

BUCKET = re.compile(r'^hookgate_(\w+)_bucket\{(?:[^}]*,)?le="([^"]+)"[^}]*\}\s+(\S+)')


def buckets(path):
    """{name: {upper bound: cumulative count}}, label sets other than `le` added up."""
    found = {}
    with open(path, encoding="utf-8") as text:
        for line in text:
            match = BUCKET.match(line)
            if match:
                name, le, count = match.groups()
                bound = math.inf if le == "+Inf" else float(le)
                per_name = found.setdefault(name, {})
                per_name[bound] = per_name.get(bound, 0.0) + float(count)
    return found


def quantile(bounds, counts, q):
    """The q-quantile in ms of cumulative `counts` at upper `bounds`, or None."""
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts):
        if cumulative >= rank:
            if math.isinf(bound):
                return lower * 1000
            inside = cumulative - below
            share = (rank - below) / inside if inside else 1.0
            return round((lower + (bound - lower) * share) * 1000, 3)
        lower, below = bound, cumulative
    return None


def main():
    before, after, names = buckets(sys.argv[1]), buckets(sys.argv[2]), sys.argv[3:]
    report = {}
    for name in names:
        now, then = after.get(name, {}), before.get(name, {})
        bounds = sorted(now)
        counts = [now[b] - then.get(b, 0.0) for b in bounds]
        total = counts[-1] if counts else 0.0
        within = next((c for b, c in zip(bounds, counts) if b == 0.005), None)
        report[name] = {
            "count": int(total),
            "p50_ms": quantile(bounds, counts, 0.5),
            "p99_ms": quantile(bounds, counts, 0.99),
            "within_5ms": round(within / total, 4) if total and within is not None else None,
        }
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
