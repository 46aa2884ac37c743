#!/usr/bin/env python3
"""Turns bench/cost-model.sh's counts into the cost model's tables (Markdown on stdout).

Inputs in --out: TARGET.strace (strace -c), TARGET-switches.json, TARGET.callgrind (a
profile of --vg-requests deliveries), TARGET-W.dhat and TARGET-(W+N).dhat (two heap
profiles whose difference is N deliveries). A missing input leaves its rows out.
"""

import argparse
import json
import re
import subprocess
from pathlib import Path

# Components, by the crate a function belongs to (self cost: the instructions spent in the
# function's own body). Generic code is counted under the crate that defines it, so drops
# and moves of hookgate's types show as `core`.
COMPONENTS = [
    ("TLS (rustls, ring)", {"rustls", "tokio_rustls", "ring"}),
    ("HTTP (hyper, httparse)", {"hyper", "hyper_util", "httparse", "http", "h2", "http_body",
                                "http_body_util", "want", "try_lock"}),
    ("HMAC and digests (hmac, sha2)", {"hmac", "sha2", "digest", "subtle", "hex",
                                       "block_buffer"}),
    ("JSON (serde_json)", {"serde_json", "serde", "unicode_normalization"}),
    ("state store (expiring_lsm)", {"expiring_lsm", "crc32fast", "disk_seam", "nohash_hasher"}),
    ("AMQP (lapin)", {"lapin", "amq_protocol", "amq_protocol_types", "amq_protocol_uri",
                      "tcp_stream", "flume", "pinky_swear", "async_rs", "executor_trait",
                      "reactor_trait", "cookie_factory"}),
    ("metrics (prometheus_client)", {"prometheus_client"}),
    ("logs and spans (tracing)", {"tracing", "tracing_core", "tracing_subscriber",
                                  "sharded_slab", "thread_local"}),
    ("runtime (tokio, futures)", {"tokio", "mio", "futures_util", "futures_core",
                                  "futures_channel", "parking_lot", "parking_lot_core",
                                  "crossbeam_channel", "crossbeam_utils", "tokio_util",
                                  "event_listener", "async_task", "slab"}),
    ("hookgate's own code", {"hookgate"}),
    ("core, alloc, std (moves, drops, formatting, maps)", {"core", "alloc", "std",
                                                           "hashbrown", "bytes", "smallvec",
                                                           "itoa", "ryu", "time", "uuid",
                                                           "rand", "rand_core", "base64"}),
]
ALLOCATOR = "allocator (malloc, mimalloc)"
MEMORY = "memcpy, memmove, memset"
LIBC = "libc (syscall wrappers, threads)"
OTHER = "other"
ALLOC_SYMBOL = re.compile(r"^(_?mi_|mi_|malloc|free|realloc|calloc|cfree|posix_memalign|"
                          r"_int_malloc|_int_free|_int_realloc|malloc_consolidate|"
                          r"__libc_(malloc|free|realloc|calloc)|tcache_|unlink_chunk|"
                          r"aligned_alloc|__rust_(alloc|dealloc|realloc))")
MEMORY_SYMBOL = re.compile(r"^(__)?mem(cpy|move|set|cmp)|^__memcpy|^__memmove|^__memset|"
                           r"^__memcmp|^__nss|^bcmp")
# tracing's `Instrumented::poll` wraps each connection's future (its span is off unless
# the log is at debug). With LTO the connection's hyper code is inlined into it, so its
# cost is the connection's HTTP work, the ceilings' `Connection::poll`, not tracing's.
CONNECTION_SYMBOL = re.compile(r"^<tracing::instrument::Instrumented<T> as "
                               r"core::future::future::Future>::poll$")
RING_SYMBOL = re.compile(r"^(ring_core_|aes_|gcm_|chacha|x25519|fiat_|bn_|sha256_block|"
                         r"sha512_block|GFp_|LIMBS_|ecp_nistz)")

# hookgate's stages, by the inclusive cost of the functions that run them: each pattern
# names one function of the release build (with LTO, the async steps that are not named here
# are inlined into their callers). A stage whose function the build no longer has shows as
# "inlined". The guard's row covers its lock, reads, decision, the publish and the commit.
STAGES = [
    ("TLS and HTTP (self cost of rustls, ring, hyper)", None),
    ("signature check", r"^<hookgate::providers::\w+::\w+ as hookgate::providers::scheme::Verify>::verify$"),
    ("parse (fields, event)", r"^hookgate::ingress::event::parse$"),
    ("trace context (a new root)", r"^hookgate::ingress::trace::TraceContext::new_root$"),
    ("the pipeline, from the dedup keys to the last mark", r"^hookgate::pipeline::dedup::<impl hookgate::pipeline::Pipeline>::process::\{\{closure\}\}$"),
    ("  of which: dedup keys (digests)", r"^hookgate::pipeline::dedup_keys::DedupKeys::of$"),
    ("  of which: dedup claim", r"^hookgate::pipeline::dedup::<impl hookgate::pipeline::Pipeline>::claim::\{\{closure\}\}$"),
    ("  of which: the guard's check", r"^hookgate::guard::checks::GuardState::check::\{\{closure\}\}$"),
    ("  of which: the AMQP message", r"^hookgate::pipeline::event_message::message$"),
    ("  of which: hand-off to a channel owner", r"^hookgate::outbox::publish::Publisher::publish(_with)?::\{\{closure\}\}$"),
    ("  of which: the marks", r"^hookgate::pipeline::dedup::<impl hookgate::pipeline::Pipeline>::mark::\{\{closure\}\}$"),
    ("  of which: wait for the journal's sync", r"^expiring_lsm::journal::durable::<impl expiring_lsm::journal::Journal>::durable::\{\{closure\}\}$"),
    ("channel owners (batches, confirms)", r"^hookgate::outbox::publish::owner::run::\{\{closure\}\}$"),
    ("journal writer thread", r"^expiring_lsm::journal::threads::write_loop$"),
    ("metrics (self cost)", None),
    ("logs and spans (self cost)", None),
    ("answer (status body, headers)", r"^hookgate::http::webhook::(status_body|with_request_id|json)$"),
]
# Rows whose figure is a component of the self-cost table rather than a function's.
STAGE_COMPONENTS = {
    "TLS and HTTP (self cost of rustls, ring, hyper)": ["TLS (rustls, ring)", "HTTP (hyper, httparse)"],
    "metrics (self cost)": ["metrics (prometheus_client)"],
    "logs and spans (self cost)": ["logs and spans (tracing)"],
}

LINE = re.compile(r"^\s*([\d,]+)\s+(?:\([\s\d.]+%\)\s+)?(\S.*?):(.+?)(?:\s+\[.*\])?$")


def annotate(path, inclusive):
    """Function name -> instructions, from callgrind_annotate."""
    text = subprocess.run(
        ["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
         "--threshold=100", str(path)],
        check=True, capture_output=True, text=True).stdout
    costs = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            name = m.group(3).strip()
            costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    return costs


def crate_of(name):
    name = name.lstrip("<&*").replace("mut ", "").replace("dyn ", "")
    return name.split("::", 1)[0] if "::" in name else None


def component(name):
    if ALLOC_SYMBOL.match(name):
        return ALLOCATOR
    if MEMORY_SYMBOL.match(name):
        return MEMORY
    if RING_SYMBOL.match(name):
        return COMPONENTS[0][0]
    if CONNECTION_SYMBOL.match(name):
        return COMPONENTS[1][0]
    crate = crate_of(name)
    if crate is None:
        return LIBC
    if crate in ("mimalloc", "libmimalloc_sys"):
        return ALLOCATOR
    for label, crates in COMPONENTS:
        if crate in crates:
            return label
    return OTHER


def callgrind_tables(out, targets, n):
    totals, by_target = {}, {}
    for t in targets:
        path = out / f"{t}.callgrind"
        if not path.exists():
            continue
        groups = {}
        for name, cost in annotate(path, inclusive=False).items():
            label = component(name)
            groups[label] = groups.get(label, 0) + cost
        by_target[t] = groups
        totals[t] = sum(groups.values())
    if not by_target:
        return
    cols = list(by_target)
    labels = [c for c, _ in COMPONENTS] + [ALLOCATOR, MEMORY, LIBC, OTHER]
    print(f"### Instructions per delivery, by component (self cost, {n} deliveries)\n")
    print("| component | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for label in labels:
        if any(by_target[t].get(label, 0) for t in cols):
            print(f"| {label} | " + " | ".join(
                f"{by_target[t].get(label, 0) / n:,.0f}" for t in cols) + " |")
    print("| **total (user space)** | " + " | ".join(
        f"**{totals[t] / n:,.0f}**" for t in cols) + " |\n")
    if "hookgate" in by_target:
        stage_table(out, by_target, cols, n)


def stage_table(out, by_target, cols, n):
    """The stages' instructions per delivery; the ceilings run hookgate's own verify,
    message and publisher, so those rows compare like with like."""
    inclusive = {t: annotate(out / f"{t}.callgrind", inclusive=True) for t in cols}
    print("### The stages (instructions per delivery)\n")
    print("| stage | " + " | ".join(cols) + " | function |")
    print("|---|" + "---:|" * len(cols) + "---|")
    for label, pattern in STAGES:
        if pattern is None:
            costs = [sum(by_target[t].get(c, 0) for c in STAGE_COMPONENTS[label]) for t in cols]
            shown = ""
        else:
            rx = re.compile(pattern)
            costs, names = [], set()
            for t in cols:
                hits = [(c, f) for f, c in inclusive[t].items() if rx.search(f)]
                costs.append(sum(c for c, _ in hits))
                names.update(f for _, f in hits)
            shown = ", ".join(sorted(f"`{short(f)}`" for f in names)) or "inlined"
        print(f"| {label} | " + " | ".join(f"{c / n:,.0f}" if c else "" for c in costs)
              + f" | {shown} |")
    print()


def short(function):
    """The last name of a function's path (its async body's parent for a closure)."""
    parts = [p for p in function.split("::") if not p.startswith("{{")]
    return parts[-1]


KERNEL = "kernel"


def perf_shares(path, pid):
    """Component -> share of the samples of process `pid` in a machine-wide profile (self
    time, kernel included). Read sample by sample from `perf script`: `perf report --pid`
    missed about a third of each server's kernel samples, and the ceilings' samples in
    libc (their memcpy among them)."""
    text = subprocess.run(
        ["perf", "script", "-i", str(path), "-F", "pid,ip,sym,dso"],
        check=True, capture_output=True, text=True).stdout
    shares = {}
    for line in text.splitlines():
        fields = line.split(None, 2)
        if len(fields) < 3 or fields[0] != str(pid):
            continue
        # What follows the address: the symbol, then its object in parentheses.
        symbol, _, dso = fields[2].rpartition(" (")
        label = KERNEL if dso.startswith("[kernel") else component(symbol.strip())
        shares[label] = shares.get(label, 0) + 1
    total = sum(shares.values()) or 1
    return {label: count / total for label, count in shares.items()}


def cpu_table(out, targets):
    rows = {}
    for t in targets:
        profile, total = out / f"{t}.perf", out / f"{t}-cpu.json"
        if profile.exists() and total.exists():
            cpu = json.loads(total.read_text())
            rows[t] = (cpu["cpu_us_per_request"], perf_shares(profile, cpu["pid"]))
    if not rows:
        return
    cols = list(rows)
    n = json.loads((out / f"{cols[0]}-cpu.json").read_text())["requests"]
    labels = [c for c, _ in COMPONENTS] + [ALLOCATOR, MEMORY, LIBC, KERNEL, OTHER]
    print(f"### CPU time per delivery, µs, by component ({n:,} deliveries, sampled)\n")
    print("| component | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for label in labels:
        if any(rows[t][1].get(label, 0) for t in cols):
            print(f"| {label} | " + " | ".join(
                f"{rows[t][0] * rows[t][1].get(label, 0):.1f}" for t in cols) + " |")
    print("| **total** | " + " | ".join(f"**{rows[t][0]:.1f}**" for t in cols) + " |\n")
    thread_table(out, cols)


def thread_table(out, cols):
    """CPU per delivery by thread name (the runtime's workers, the journal's writer...),
    and the context switches of all threads at the load bench's concurrency."""
    runs = {t: json.loads((out / f"{t}-cpu.json").read_text()) for t in cols}
    by_thread = {t: runs[t].get("by_thread", {}) for t in cols}
    names = sorted({name for t in cols for name, us in by_thread[t].items() if us >= 0.05},
                   key=lambda name: -max(by_thread[t].get(name, 0) for t in cols))
    if not names:
        return
    print("### CPU time per delivery, µs, by thread\n")
    print("| thread | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name in names:
        print(f"| {name} | " + " | ".join(
            f"{by_thread[t][name]:.1f}" if name in by_thread[t] else "" for t in cols) + " |")
    print("| context switches per delivery, all threads | " + " | ".join(
        f"{runs[t]['context_switches_per_request']:.2f}"
        if "context_switches_per_request" in runs[t] else "" for t in cols) + " |")
    print()


def dhat_totals(path):
    data = json.loads(path.read_text())
    # dhat's totals per allocation point: "tbk" blocks, "tb" bytes.
    return (sum(p.get("tbk", 0) for p in data["pps"]), sum(p.get("tb", 0) for p in data["pps"]))


SKIP_FRAME = re.compile(r": (malloc|calloc|realloc|posix_memalign|memalign|aligned_alloc|"
                        r"__rust_|alloc::|<alloc::|core::|<core::|bytes::|<bytes::|"
                        r"hashbrown::|std::|<std::)")


def heap_sites(path):
    """Allocation site (the first frame outside the allocator and std) -> bytes."""
    data = json.loads(path.read_text())
    frames = data["ftbl"]
    sites = {}
    for p in data["pps"]:
        site = next((frames[i] for i in p["fs"] if not SKIP_FRAME.search(frames[i])), "?")
        site = re.sub(r"^0x[0-9A-F]+: ", "", site)
        site = re.sub(r" \(in /.*\)$| \([^()]*:\d+\)$", "", site)
        sites[site] = sites.get(site, 0) + p.get("tb", 0)
    return sites


def heap_table(out, targets, warm, n):
    rows = []
    for t in targets:
        a, b = out / f"{t}-{warm}.dhat", out / f"{t}-{warm + n}.dhat"
        if a.exists() and b.exists():
            (blocks_a, bytes_a), (blocks_b, bytes_b) = dhat_totals(a), dhat_totals(b)
            rows.append((t, (blocks_b - blocks_a) / n, (bytes_b - bytes_a) / n))
    if rows:
        print(f"### Heap allocations per delivery ({n} deliveries, system allocator)\n")
        print("| server | blocks | bytes |")
        print("|---|---:|---:|")
        for t, blocks, size in rows:
            print(f"| {t} | {blocks:,.1f} | {size:,.0f} |")
        print()
    a, b = out / f"hookgate-{warm}.dhat", out / f"hookgate-{warm + n}.dhat"
    if a.exists() and b.exists():
        before, after = heap_sites(a), heap_sites(b)
        growth = sorted(((after[k] - before.get(k, 0)) / n, k) for k in after)[::-1][:10]
        print("hookgate's largest allocation sites (bytes per delivery; the first frame"
              " outside the allocator, std and bytes):\n")
        print("| bytes | site |")
        print("|---:|---|")
        for size, site in growth:
            print(f"| {size:,.0f} | `{site[:110]}` |")
        print()


def strace_counts(path):
    counts = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
            calls = parts[3]
            if calls.isdigit():
                counts[parts[-1]] = int(calls)
    return counts


def syscall_table(out, targets, n):
    by_target = {t: strace_counts(out / f"{t}.strace") for t in targets
                 if (out / f"{t}.strace").exists()}
    if not by_target:
        return
    cols = list(by_target)
    names = sorted({s for c in by_target.values() for s in c},
                   key=lambda s: -max(by_target[t].get(s, 0) for t in cols))
    print(f"### System calls per delivery ({n} deliveries)\n")
    print("| call | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for s in names:
        if max(by_target[t].get(s, 0) for t in cols) / n >= 0.05:
            print(f"| {s} | " + " | ".join(f"{by_target[t].get(s, 0) / n:.2f}" for t in cols) + " |")
    print("| **all** | " + " | ".join(
        f"**{sum(by_target[t].values()) / n:.2f}**" for t in cols) + " |")
    switches = []
    for t in cols:
        p = out / f"{t}-switches.json"
        switches.append(f"{json.loads(p.read_text())['context_switches_per_request']:.2f}"
                        if p.exists() else "")
    print("| context switches (all threads) | " + " | ".join(switches) + " |\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--vg-requests", type=int, required=True)
    ap.add_argument("--warm", type=int, required=True)
    ap.add_argument("--targets", nargs="+", required=True)
    a = ap.parse_args()
    cpu_table(a.out, a.targets)
    syscall_table(a.out, a.targets, a.requests)
    callgrind_tables(a.out, a.targets, a.vg_requests)
    heap_table(a.out, a.targets, a.warm, a.vg_requests)


if __name__ == "__main__":
    main()
