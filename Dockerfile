# ctxgate in a container: a Rust builder stage, then a slim Debian runtime running as an unprivileged user.
#
#   docker build -t ctxgate .
#   docker run -p 8787:8787 -v ctxgate-data:/var/lib/ctxgate ctxgate
#
# Config: /etc/ctxgate/ctxgate.toml (deploy/ctxgate.toml: listens on 0.0.0.0:8787, SQLite store in the
# /var/lib/ctxgate volume, JSON logs; several instances: CTXGATE_STORE__BACKEND=redis and CTXGATE_STORE__REDIS_URL,
# see deploy/docker-compose.yml). Mount your own file over it, or override any key from the environment as
# CTXGATE_<SECTION>__<KEY> (e.g. CTXGATE_UPSTREAM__BASE_URL, CTXGATE_ADMIN__TOKEN). Arguments after the image name
# are passed to `ctxgate serve` (e.g. `--upstream http://llm:8000/v1`).

# --- build -------------------------------------------------------------------------------------------------------
FROM rust:1.95-slim-bookworm AS builder
WORKDIR /src
# Only what the build needs (see .dockerignore): the manifest, the lock file, the code, and config/ (the
# embedded defaults, model table and summary prompt). benches/ is declared in Cargo.toml, so cargo wants it.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY config ./config
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ctxgate \
    && cp target/release/ctxgate /usr/local/bin/ctxgate

# --- run ---------------------------------------------------------------------------------------------------------
FROM debian:bookworm-slim
# curl answers the HEALTHCHECK; ca-certificates is for tools run inside the container (ctxgate itself ships
# its TLS roots). Not version-pinned (DL3008): Debian's security updates remove superseded versions from the
# archive, so pins would break the build; the base image tag pins the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 ctxgate \
    && useradd --system --uid 10001 --gid ctxgate --home-dir /var/lib/ctxgate --shell /usr/sbin/nologin ctxgate \
    && mkdir -p /etc/ctxgate /var/lib/ctxgate \
    && chown ctxgate:ctxgate /var/lib/ctxgate
COPY --from=builder /usr/local/bin/ctxgate /usr/local/bin/ctxgate
COPY deploy/ctxgate.toml /etc/ctxgate/ctxgate.toml
USER 10001:10001
WORKDIR /var/lib/ctxgate
VOLUME ["/var/lib/ctxgate"]
EXPOSE 8787
# Liveness only (/healthz): the process answers. Readiness is /readyz (200; its JSON says "degraded" while the
# store — e.g. Redis — does not answer): for load balancers and Kubernetes readinessProbe, not for this check, since
# a gateway whose store is down still serves every request (as plain proxying) and must not be restarted for it.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["curl", "--fail", "--silent", "--show-error", "--max-time", "2", "http://127.0.0.1:8787/healthz"]
# SIGTERM (docker stop; the default stop signal) gives in-flight streams server.shutdown_grace_secs (30 s), then
# drains background work and store writes within server.drain_secs (10 s): give it `docker stop --time 45` /
# compose `stop_grace_period: 45s`.
ENTRYPOINT ["ctxgate", "serve", "--config", "/etc/ctxgate/ctxgate.toml"]
