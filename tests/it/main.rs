//! The integration tests, one module per area, in one test binary: each
//! binary links the whole broker and librdkafka, so one link serves them all.
//! Run one area with `cargo test --release --test it cluster_membership::`.
//!
//! They share a process, so nothing here may change what is process-wide:
//! brokers listen on port 0 or on a port `common::free_port` found free,
//! each test has its own temporary directories, no test sets environment
//! variables, the working directory or a panic hook, and clusters (a real
//! etcd and broker processes) run one at a time across all modules
//! (`common::cluster`). `hostile_input.rs` is a binary of its own because it
//! installs a counting global allocator and a panic hook for the whole
//! process.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

#[path = "../common/mod.rs"]
mod common;

mod acls_quotas;
mod bad_input;
mod broker_configs;
mod clients_rdkafka;
mod cluster;
mod cluster_etcd;
mod cluster_membership;
mod cluster_outages;
mod cluster_workloads;
mod compaction;
mod compaction_jobs;
mod connection_limits;
mod consumer_groups;
mod consumer_protocol;
mod crash_recovery;
mod delegation_tokens;
mod fetch_sessions;
mod group_configs;
mod group_protocol;
mod inter_broker;
mod kafka44_versions;
mod leader_epochs;
mod metrics;
mod replicas_and_log_dirs;
mod security;
mod share_groups;
mod simulation;
mod simulation_control;
mod tiered;
mod topic_configs;
mod transactions;
mod txn_coordinator;
mod txn_log;
mod visibility;
