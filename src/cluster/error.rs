//! One error type for the cluster layer. Callers mostly need one bit from it —
//! [`ClusterError::is_retriable`] — to turn an etcd outage or a lost race into
//! a retriable Kafka error instead of a failure.

use super::NodeId;

pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("invalid cluster url {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// etcd did not answer in time or the connection failed.
    #[error("etcd unavailable: {0}")]
    Unavailable(String),
    /// etcd answered with an error that retrying will not fix.
    #[error("etcd request failed: {0}")]
    Etcd(String),
    #[error(
        "node id {0} is registered by another live broker (its etcd lease keeps being renewed); \
         give each broker its own node id"
    )]
    NodeIdInUse(NodeId),
    #[error("not the controller: deposed or never elected")]
    NotController,
    #[error("topic {0:?} already exists")]
    TopicExists(String),
    #[error("unknown topic {0:?}")]
    UnknownTopic(String),
    #[error("invalid partition count {requested}: the topic has {current}")]
    InvalidPartitions { requested: i32, current: i32 },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A compare-and-swap kept losing to concurrent writers.
    #[error("concurrent updates of {0} kept conflicting")]
    Conflict(String),
    #[error("malformed value under {key}: {reason}")]
    Malformed { key: String, reason: String },
}

impl ClusterError {
    /// Whether the same call may succeed later without anything else changing.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            ClusterError::Unavailable(_) | ClusterError::NotController | ClusterError::Conflict(_)
        )
    }
}

impl From<etcd_client::Error> for ClusterError {
    fn from(e: etcd_client::Error) -> Self {
        use etcd_client::Error as E;
        match &e {
            E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => {
                ClusterError::Unavailable(e.to_string())
            }
            E::GRpcStatus(status) if is_transient(status) => {
                ClusterError::Unavailable(e.to_string())
            }
            _ => ClusterError::Etcd(e.to_string()),
        }
    }
}

/// gRPC codes that mean "not now" rather than "never": no etcd leader, a
/// dropped connection, a server-side timeout.
fn is_transient(status: &tonic::Status) -> bool {
    use tonic::Code as C;
    matches!(
        status.code(),
        C::Unavailable
            | C::DeadlineExceeded
            | C::Cancelled
            | C::Aborted
            | C::ResourceExhausted
            | C::Unknown
    )
}
