//! Strata: a Kafka-wire-compatible message broker whose log settles into
//! object storage in levels.
//!
//! Layers, outermost first: `server` (sockets, framing, in-order responses),
//! `api` (one module per Kafka API family, mapping errors to Kafka codes),
//! `catalog` (topics, configs, producer ids), `log` (segments on disk), and
//! beside them `compaction` (key indexes and streaming merges of sealed segments).
//! Each layer talks to the next through narrow types: the API layer never
//! touches files, the log never sees a socket or a protocol message.

pub mod api;
pub mod catalog;
pub mod cluster;
pub mod compaction;
pub mod config;
pub mod coordinator;
pub mod log;
pub mod server;
pub mod tier;
