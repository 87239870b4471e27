# Strata broker image. Two stages: the build stage compiles the broker with
# the Rust toolchain; the runtime stage is debian:bookworm-slim with the
# binary, CA certificates (S3 over TLS) and curl (the health check), run as
# the unprivileged user `strata` that owns /data.
#
# Every flag of `strata serve` is also an environment variable (STRATA_*,
# see `strata serve --help` and the README's Docker section).
#
# No Docker engine runs in CI: scripts/docker-check reads this file and runs
# its build and runtime steps on the CI machine (same base, same packages,
# same commands, same user), starts the binary as that user configured by
# environment only and runs the HEALTHCHECK command. Keep each step a plain
# RUN / COPY / ENV / USER line it can follow.

FROM rust:1-bookworm AS build
WORKDIR /src
# etcd-client (cluster mode) compiles etcd's protobuf definitions at build time.
RUN apt-get update && apt-get install -y --no-install-recommends protobuf-compiler && rm -rf /var/lib/apt/lists/*
COPY Cargo.toml Cargo.lock ./
COPY vendor ./vendor
COPY src ./src
RUN cargo build --release --locked --bin strata

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl && rm -rf /var/lib/apt/lists/*
RUN (getent group strata || groupadd --system --gid 10001 strata) && (getent passwd strata || useradd --system --uid 10001 --gid strata --home-dir /data --no-create-home --shell /usr/sbin/nologin strata) && mkdir -p /data && chown strata:strata /data
COPY --from=build /src/target/release/strata /usr/local/bin/strata
ENV STRATA_DATA_DIR=/data STRATA_LISTEN=0.0.0.0:9092 STRATA_METRICS_LISTEN=0.0.0.0:9644
USER strata
WORKDIR /data
VOLUME /data
EXPOSE 9092 9644
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 CMD curl -fsS "http://127.0.0.1:${STRATA_METRICS_LISTEN##*:}/readyz" || exit 1
ENTRYPOINT ["strata", "serve"]
