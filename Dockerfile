FROM rust:1-bookworm AS build
WORKDIR /src
# etcd-client (cluster mode) compiles etcd's protobuf definitions at build time.
RUN apt-get update && apt-get install -y --no-install-recommends protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN cargo build --release --bin strata

FROM debian:bookworm-slim
COPY --from=build /src/target/release/strata /usr/local/bin/strata
VOLUME /data
EXPOSE 9092
ENV STRATA_DATA_DIR=/data STRATA_LISTEN=0.0.0.0:9092
ENTRYPOINT ["strata", "serve"]
