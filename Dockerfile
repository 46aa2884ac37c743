# syntax=docker/dockerfile:1
# hookgate container image: a release build in the official Rust image, run from distroless.
#
# Build (BuildKit): docker build -t hookgate:0.1.0 .
# The build context is an allowlist (.dockerignore): the manifest, the lock file, the
# workspace's sources (src, crates, benches, examples, tests — whichever exist, since cargo
# reads the members and targets the manifest declares) and the production configuration. "COPY . ." therefore works whether or not
# examples/ or benches/ exist, which a COPY naming each of them would not.

FROM rust:1-bookworm AS build
WORKDIR /build
COPY . .
# The cache mounts keep the downloaded crates and the target directory between builds, so
# a change to src/ does not rebuild every dependency. Because target/ is a cache mount, the
# binary is copied out of it in the same step. --locked fails the build if Cargo.lock is
# out of date instead of silently resolving new versions.
# /out/store becomes the store's mount point, owned by the runtime user: distroless has no
# shell to create it in the runtime stage.
RUN --mount=type=cache,id=hookgate-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=hookgate-target,target=/build/target,sharing=locked \
    cargo build --release --locked \
 && install -D -m 0555 target/release/hookgate /out/hookgate \
 && install -d -m 0750 /out/store

# Runtime: distroless "cc" rather than debian:bookworm-slim. The binary links glibc and
# libgcc_s only (TLS is rustls, no OpenSSL), which is exactly what cc-debian12 holds, built
# from the same Debian 12 as the build stage, so the glibc versions match. It has no shell,
# no package manager and no setuid binaries — far less to patch and nothing for an intruder
# to use — and its ":nonroot" variant already runs as uid/gid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot

LABEL org.opencontainers.image.title="hookgate" \
      org.opencontainers.image.description="Webhook receiver gateway: HMAC verification, dedup, out-of-order guard, RabbitMQ publish with confirms" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"

COPY --from=build /out/hookgate /usr/local/bin/hookgate
COPY --from=build --chown=65532:65532 /out/store /var/lib/hookgate
# A documented default configuration; Kubernetes mounts the pod's own file over it. This is
# the file config/production.yaml links to, named by its real path: the link is not in the
# build context.
COPY deploy/kubernetes/components/hookgate-config/hookgate.yaml /etc/hookgate/hookgate.yaml

# Lets every subcommand (check-config, spool status) find the configuration without
# --config, e.g. under `kubectl exec`; an explicit --config still wins.
ENV HOOKGATE_CONFIG=/etc/hookgate/hookgate.yaml
# No transparent huge pages, also on nodes where THP is "always": the binary is built not to
# ask for them, and this makes the allocator switch them off for the process. Clearing a
# fresh 2 MiB page on the request path cost about 3 % of the CPU (BENCHMARKS.md).
ENV MIMALLOC_ALLOW_THP=0

# Numeric, so that Kubernetes' runAsNonRoot can verify it without an /etc/passwd lookup.
USER 65532:65532

# 8443: the public HTTPS listener (listen.addr). 9090: admin — /healthz, /readyz, /metrics.
EXPOSE 8443 9090

# The store: dedup marks, guard state and the spool. It must outlive the container.
VOLUME ["/var/lib/hookgate"]

# No HEALTHCHECK on purpose: the image runs under Kubernetes, whose liveness and readiness
# probes call GET /healthz and GET /readyz on port 9090; a Docker HEALTHCHECK would need a
# client binary (curl) that distroless does not have and Kubernetes ignores it anyway.
ENTRYPOINT ["/usr/local/bin/hookgate"]
CMD ["run", "--config", "/etc/hookgate/hookgate.yaml"]
