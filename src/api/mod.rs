//! The Kafka protocol front end: one module per API family.
//!
//! Each API is one place: its module exports its `dispatch` table entry
//! (versions, handler, the ACL a whole request needs) and says where its
//! responses keep their error codes. `Broker::handle_frame` decodes a
//! request frame, runs the handler that the table in `dispatch` names for it
//! and returns a `Reply`: a future of the encoded response frame. Everything
//! that must happen in request order (offset assignment above all) runs
//! before the future is returned; the future only waits (for fsync, for data
//! to arrive), which lets the connection pipeline requests while answering
//! in order.
//! Errors from the catalog and the log become Kafka error codes here and
//! nowhere else.

mod acls;
mod authorize;
mod broker_client;
pub(crate) mod broker_configs;
mod config_resources;
mod configs;
mod consumer_groups;
mod delegation_tokens;
mod dispatch;
mod error;
mod features;
mod fetch;
mod fetch_session;
mod group_configs;
mod groups;
mod leader_hints;
mod log_dirs;
mod metadata;
pub(crate) mod metrics;
mod offsets;
mod partitions;
mod produce;
mod producer_id;
mod producers;
mod quorum;
mod quotas;
mod scram_credentials;
mod share_fetch;
mod share_groups;
mod share_state;
mod streams_groups;
mod topics;
mod transactions;
mod txn_markers;
mod versions;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use kafka_protocol::messages::{ApiKey, RequestHeader};
use kafka_protocol::protocol::Decodable;

use crate::access::Access;
use crate::catalog::Catalog;
use crate::clock::SharedClock;
use crate::cluster::ClusterNode;
use crate::coordinator::txn::{ProducerIdSource, TxnCoordinator};
use crate::coordinator::GroupCoordinator;
use crate::principal::Principal;

pub(crate) use broker_client::InterBroker;
pub(crate) use broker_configs::Reconfigure;
pub(crate) use configs::StaticConfig;
use dispatch::Ctx;
pub(crate) use dispatch::Encoder;

pub(crate) use share_fetch::{connection_closed, run_share_timers};
pub(crate) use transactions::run_markers;

/// An encoded response frame (length prefix included); empty when the
/// protocol sends no response (produce with acks=0); `None` when the response
/// could not be encoded and the connection must close.
pub(crate) type Reply = Pin<Box<dyn Future<Output = Option<Bytes>> + Send>>;

/// Why a frame could not be answered; the connection is closed, as Kafka does.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("request frame shorter than a request header")]
    Truncated,
    #[error("unknown API key {0}")]
    UnknownApi(i16),
    #[error("unsupported version {1} of {0:?}")]
    UnsupportedVersion(ApiKey, i16),
    #[error("malformed {0:?} request: {1}")]
    Malformed(ApiKey, String),
}

/// The broker's settings the handlers answer by; the server builds them
/// from its flags.
#[derive(Debug, Clone)]
pub(crate) struct ApiSettings {
    pub node_id: i32,
    /// Partitions of a topic created without a count.
    pub num_partitions: i32,
    pub auto_create_topics: bool,
    /// Whether an acks=all write waits for an fsync (single node); in
    /// cluster mode it always waits for the write-ahead log.
    pub fsync_acks: bool,
    /// Benchmark baseline: acknowledge produce requests without storing them.
    pub null_sink: bool,
    pub data_dir: std::path::PathBuf,
    /// The object store's URL, the second log directory DescribeLogDirs shows.
    pub store_url: String,
    /// The settings the flags set, under Kafka's names (broker DescribeConfigs).
    pub static_configs: Vec<StaticConfig>,
}

/// What the handlers work with, built before the `Broker`.
pub(crate) struct Services {
    pub catalog: Arc<Catalog>,
    pub coordinator: Arc<GroupCoordinator>,
    pub txn: Arc<TxnCoordinator>,
    /// The share coordinator (`__share_group_state`).
    pub share: Arc<crate::coordinator::share_store::ShareCoordinator>,
    pub clock: SharedClock,
    /// Cluster mode: the brokers, the leaders, and what this one serves.
    pub cluster: Option<Arc<ClusterNode>>,
    pub access: Arc<Access>,
    /// Request counts and latencies, kept only with `--metrics-listen`.
    pub metrics: Option<Arc<metrics::RequestMetrics>>,
    /// Applies dynamic broker configs to the listeners and connections.
    pub reconfigure: Arc<dyn Reconfigure>,
}

/// What the handlers need to know about this broker.
pub(crate) struct Broker {
    pub catalog: Arc<Catalog>,
    pub coordinator: Arc<GroupCoordinator>,
    pub txn: Arc<TxnCoordinator>,
    pub settings: ApiSettings,
    pub host: String,
    pub port: i32,
    pub clock: SharedClock,
    /// Cluster mode: the brokers, the leaders, and what this one serves.
    pub cluster: Option<Arc<ClusterNode>>,
    /// Every listener's advertised endpoint, the first one's is `host:port`.
    pub endpoints: Vec<crate::cluster::Endpoint>,
    /// SCRAM credentials (SASL PLAIN checks them too).
    pub credentials: Arc<crate::auth::credentials::Credentials>,
    /// Delegation tokens.
    pub tokens: Arc<crate::auth::tokens::Tokens>,
    /// How this broker's own requests reach other brokers.
    pub inter_broker: Arc<InterBroker>,
    /// KIP-227 fetch sessions of this broker's consumers.
    pub(crate) fetch_sessions: fetch_session::FetchSessions,
    /// Request counts and latencies, kept only with `--metrics-listen`.
    pub metrics: Option<Arc<metrics::RequestMetrics>>,
    /// ACLs and client quotas, and whether an authorizer runs.
    pub access: Arc<Access>,
    /// Dynamic broker configs (KIP-226), as stored and applied.
    pub(crate) dynamic: broker_configs::DynamicConfigs,
    /// Finalized feature levels (KIP-584).
    pub(crate) features: features::Features,
    /// Transactions v2 batches waiting for their partition to join the
    /// producer's transaction.
    pub(crate) joins: Arc<produce::Joins>,
    /// Share groups' share-partitions and sessions (KIP-932).
    pub(crate) share: share_fetch::ShareState,
}

/// How long a connection stays muted after a throttled response (KIP-219):
/// the handlers extend it, the connection reads nothing until it passes.
#[derive(Debug, Default)]
pub(crate) struct Mute {
    until_ms: std::sync::atomic::AtomicU64,
}

impl Mute {
    pub(crate) fn extend(&self, until_ms: u64) {
        self.until_ms
            .fetch_max(until_ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// How much longer the connection stays muted at `now_ms`.
    pub(crate) fn remaining(&self, now_ms: u64) -> std::time::Duration {
        let until = self.until_ms.load(std::sync::atomic::Ordering::Relaxed);
        std::time::Duration::from_millis(until.saturating_sub(now_ms))
    }
}

/// How clients reach this broker and prove who they are.
pub(crate) struct Listeners {
    /// Every listener's advertised endpoint, the first one's is `host:port`.
    pub endpoints: Vec<crate::cluster::Endpoint>,
    pub credentials: Arc<crate::auth::credentials::Credentials>,
    /// Delegation tokens.
    pub tokens: Arc<crate::auth::tokens::Tokens>,
    /// How this broker's own requests reach other brokers.
    pub inter_broker: Arc<InterBroker>,
}

/// Who sends a connection's requests, and through what.
#[derive(Clone, Copy)]
pub(crate) struct Session<'a> {
    pub principal: &'a Principal,
    /// The peer's IP address.
    pub client_host: &'a str,
    /// The listener's name.
    pub listener: &'a str,
    /// Kafka refuses delegation token requests on PLAINTEXT, 1-way SSL and
    /// token-authenticated connections.
    pub delegation_tokens_allowed: bool,
    /// Which connection it is (share sessions end with theirs).
    pub connection: u64,
}

/// Whether this broker answers for a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// This broker serves it, at this leader epoch.
    Serve(i32),
    /// Another broker leads it (or nobody yet): NOT_LEADER_OR_FOLLOWER.
    Elsewhere,
}

impl Broker {
    /// The partition, if this broker serves it at the epoch the client
    /// believes current (-1: any); else the Kafka error code to answer with.
    pub(crate) fn served_partition(
        &self,
        topic: &crate::catalog::Topic,
        index: i32,
        client_epoch: i32,
    ) -> Result<Arc<crate::log::Partition>, i16> {
        use kafka_protocol::error::ResponseError;
        let partition = topic
            .partition(index)
            .ok_or(ResponseError::UnknownTopicOrPartition.code())?;
        match self.route(topic.id(), index) {
            Route::Elsewhere => Err(ResponseError::NotLeaderOrFollower.code()),
            Route::Serve(epoch) if client_epoch >= 0 && client_epoch > epoch => {
                Err(ResponseError::UnknownLeaderEpoch.code())
            }
            Route::Serve(epoch) if client_epoch >= 0 && client_epoch < epoch => {
                Err(ResponseError::FencedLeaderEpoch.code())
            }
            Route::Serve(_) => Ok(partition),
        }
    }

    /// Who answers for `partition` of `topic_id`: always this broker when
    /// it runs alone.
    pub(crate) fn route(&self, topic_id: uuid::Uuid, partition: i32) -> Route {
        match &self.cluster {
            None => Route::Serve(0),
            Some(c) => match c.serving(topic_id, partition) {
                Some(epoch) => Route::Serve(epoch),
                None => Route::Elsewhere,
            },
        }
    }

    pub(crate) fn new(settings: ApiSettings, services: Services, listeners: Listeners) -> Broker {
        let (host, port) = listeners
            .endpoints
            .first()
            .map(|e| (e.host.clone(), e.port as i32))
            .unwrap_or_default();
        let Services {
            catalog,
            coordinator,
            txn,
            share,
            clock,
            cluster,
            access,
            metrics,
            reconfigure,
        } = services;
        Broker {
            catalog,
            coordinator,
            txn,
            settings: ApiSettings {
                num_partitions: settings.num_partitions.max(1),
                ..settings
            },
            host,
            port,
            clock,
            cluster,
            endpoints: listeners.endpoints,
            credentials: listeners.credentials,
            tokens: listeners.tokens,
            inter_broker: listeners.inter_broker,
            fetch_sessions: fetch_session::FetchSessions::new(
                fetch_session::CACHE_SLOTS,
                crate::clock::os_random(),
            ),
            metrics,
            access,
            dynamic: broker_configs::DynamicConfigs::new(reconfigure),
            features: features::Features::new(),
            joins: Arc::default(),
            share: share_fetch::ShareState::new(share),
        }
    }

    /// Reads the stored dynamic broker configs, group configs and feature
    /// levels and applies them if they changed (at start-up, and in a
    /// cluster to follow other brokers).
    pub(crate) async fn refresh_dynamic_configs(&self) -> Result<(), String> {
        broker_configs::refresh(self).await?;
        group_configs::refresh(self).await?;
        features::refresh(self).await
    }

    /// Where transactional producer ids come from: the catalog's allocator,
    /// or in cluster mode the blocks agreed in etcd.
    pub(crate) fn producer_ids(
        catalog: Arc<Catalog>,
        cluster: Option<Arc<ClusterNode>>,
    ) -> ProducerIdSource {
        producer_id::source(catalog, cluster)
    }

    /// Handles one request frame (without its length prefix) of a session.
    pub(crate) fn handle_frame(
        self: &Arc<Self>,
        frame: Bytes,
        session: &Session<'_>,
        mute: &Arc<Mute>,
    ) -> Result<Reply, FrameError> {
        let Session {
            principal,
            client_host,
            listener,
            delegation_tokens_allowed,
            connection,
        } = *session;
        if frame.len() < 8 {
            return Err(FrameError::Truncated);
        }
        let mut peek = &frame[..];
        let api_key = peek.get_i16();
        let version = peek.get_i16();
        let key = ApiKey::try_from(api_key).map_err(|_| FrameError::UnknownApi(api_key))?;
        let Some(api) = dispatch::find(api_key, version) else {
            if key == ApiKey::ApiVersions {
                // KIP-511: answer an unknown ApiVersions version with v0 and the list,
                // so the client can retry with a version both sides speak.
                let encoder = Encoder {
                    correlation_id: (&frame[4..8]).get_i32(),
                    header_version: 0,
                    version: 0,
                };
                let body = versions::unsupported_version_response();
                return Ok(dispatch::ready_frame(encoder.frame(&body)));
            }
            return Err(FrameError::UnsupportedVersion(key, version));
        };
        let malformed = |e: anyhow::Error| FrameError::Malformed(key, e.to_string());
        let mut body = frame;
        let header = RequestHeader::decode(&mut body, key.request_header_version(version))
            .map_err(malformed)?;
        let cx = Ctx {
            key: api_key,
            version,
            client_id: header.client_id,
            client_host,
            correlation_id: header.correlation_id,
            response_header_version: key.response_header_version(version),
            principal,
            listener,
            delegation_tokens_allowed,
            connection,
            mute,
        };
        (api.handle)(self, body, cx).map_err(malformed)
    }
}
