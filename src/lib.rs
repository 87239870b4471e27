//! Strata: a Kafka-wire-compatible message broker whose log settles into
//! object storage in levels.
//!
//! Layers, outermost first; a layer imports only from the ones below it:
//!
//! ```text
//! server        the composition root: the command line, the start in phases,
//!               listeners, framing, in-order responses, the background jobs
//! api           one module per Kafka API family; Kafka error codes mapped here
//! coordinator   tier   compaction   cluster
//!               consumer groups | sealed segments in the store | merges and their jobs |
//!               membership, leaders and epochs agreed in etcd
//! manifest      the object layout and the manifest versions tier and compaction write
//! wal           cluster mode's write-ahead log: the head of every partition, in the store
//! catalog       topics, configs, producer ids   access  ACLs, quotas
//! log           partitions: segments on local disk, producer state
//! format        bytes on disk and on the wire: batches, records, key indexes, file names
//! ```
//!
//! Each layer talks to the next through narrow types: the API layer never
//! touches files, the log never sees a socket or a protocol message.
//! `principal` names who sent a request (authentication sets it, authorization
//! reads it). `auth` holds TLS, SASL and SCRAM credentials. The command line
//! is `server::config`, which alone knows flag names: every layer below takes
//! its own small settings type, built there. `metrics` holds the latency
//! histograms lower layers record into, which only `server` exports over
//! HTTP. Time and random ids come from `clock`, handed down from the server,
//! so timeouts and retention can be tested without waiting for them.

// clippy.toml keeps time and randomness to `clock`; unit tests may still
// read the real ones (timeouts, scratch names), as may tests/ and examples/.
#![cfg_attr(test, allow(clippy::disallowed_methods))]
// Items are `pub(crate)` unless `main`, the examples or the tests reach them.
#![warn(unreachable_pub)]

pub(crate) mod access;
pub(crate) mod api;
pub(crate) mod auth;
pub mod catalog;
pub mod clock;
pub mod cluster;
pub mod compaction;
pub(crate) mod coordinator;
pub mod format;
pub mod log;
pub mod manifest;
pub(crate) mod metrics;
pub(crate) mod principal;
pub mod server;
pub mod tier;
pub mod wal;
