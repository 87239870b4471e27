//! Share sessions (KIP-932): what a share consumer fetches from a broker.
//!
//! Like a fetch session (KIP-227) it lets a consumer name its partitions
//! once and then send only changes; unlike one it is also how the broker
//! knows when a member is gone: closing the session (epoch -1), or the
//! connection it was opened on dropping, releases every record the member
//! still holds on its partitions, so others get them without waiting for
//! the locks. One session per (group, member) per broker; ShareFetch and
//! ShareAcknowledge advance the same epoch.

use std::collections::HashMap;

use uuid::Uuid;

/// A partition of a share session.
pub(crate) type TopicPartition = (Uuid, i32);

/// Session errors, each Kafka's top-level code of that name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("the share session was not found")]
    NotFound,
    #[error("the share session epoch is invalid")]
    InvalidEpoch,
    #[error("the limit of share sessions has been reached")]
    LimitReached,
    #[error("{0}")]
    InvalidRequest(String),
}

/// What a ShareFetch is to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FetchContext {
    /// A new session: every partition is answered.
    Full(Vec<TopicPartition>),
    /// The session's partitions; those just added are answered even when
    /// they have nothing.
    Incremental {
        partitions: Vec<TopicPartition>,
        added: Vec<TopicPartition>,
    },
    /// Epoch -1: no fetch; the acknowledgements are applied and then the
    /// session is closed (`close`).
    Final(Vec<TopicPartition>),
}

struct Session {
    /// The epoch the next request must carry.
    epoch: i32,
    partitions: Vec<TopicPartition>,
    connection: u64,
}

pub(crate) struct ShareSessions {
    /// group.share.max.share.sessions.
    capacity: usize,
    sessions: HashMap<(String, String), Session>,
}

fn next(epoch: i32) -> i32 {
    match epoch {
        e if e < 0 => -1,
        i32::MAX => 1,
        e => e + 1,
    }
}

impl ShareSessions {
    pub(crate) fn new(capacity: usize) -> ShareSessions {
        ShareSessions {
            capacity,
            sessions: HashMap::new(),
        }
    }

    /// A ShareFetch's session step (Kafka's newContext).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fetch(
        &mut self,
        group: &str,
        member: &str,
        epoch: i32,
        partitions: &[TopicPartition],
        forgotten: &[TopicPartition],
        acknowledging: bool,
        connection: u64,
    ) -> Result<FetchContext, SessionError> {
        let key = (group.to_string(), member.to_string());
        match epoch {
            -1 => {
                let s = self.sessions.remove(&key).ok_or(SessionError::NotFound)?;
                Ok(FetchContext::Final(s.partitions))
            }
            0 => {
                if acknowledging {
                    return Err(SessionError::InvalidRequest(
                        "Acknowledge data present in initial fetch request.".into(),
                    ));
                }
                // A new session replaces the member's old one, whose records stay held.
                self.sessions.remove(&key);
                if self.sessions.len() >= self.capacity {
                    return Err(SessionError::LimitReached);
                }
                let mut list: Vec<TopicPartition> = Vec::new();
                for tp in partitions {
                    if !list.contains(tp) {
                        list.push(*tp);
                    }
                }
                self.sessions.insert(
                    key,
                    Session {
                        epoch: 1,
                        partitions: list.clone(),
                        connection,
                    },
                );
                Ok(FetchContext::Full(list))
            }
            e => {
                let s = self.sessions.get_mut(&key).ok_or(SessionError::NotFound)?;
                if e != s.epoch {
                    return Err(SessionError::InvalidEpoch);
                }
                let mut added = Vec::new();
                for tp in partitions {
                    if !s.partitions.contains(tp) {
                        s.partitions.push(*tp);
                        added.push(*tp);
                    }
                }
                s.partitions.retain(|tp| !forgotten.contains(tp));
                s.epoch = next(s.epoch);
                s.connection = connection;
                Ok(FetchContext::Incremental {
                    partitions: s.partitions.clone(),
                    added,
                })
            }
        }
    }

    /// A ShareAcknowledge's session step; epoch -1 ends the session and
    /// names its partitions, to release the member's records on.
    pub(crate) fn acknowledge(
        &mut self,
        group: &str,
        member: &str,
        epoch: i32,
        connection: u64,
    ) -> Result<Option<Vec<TopicPartition>>, SessionError> {
        if epoch == 0 {
            return Err(SessionError::InvalidEpoch);
        }
        let key = (group.to_string(), member.to_string());
        if epoch < 0 {
            let s = self.sessions.remove(&key).ok_or(SessionError::NotFound)?;
            return Ok(Some(s.partitions));
        }
        let s = self.sessions.get_mut(&key).ok_or(SessionError::NotFound)?;
        if epoch != s.epoch {
            return Err(SessionError::InvalidEpoch);
        }
        s.epoch = next(s.epoch);
        s.connection = connection;
        Ok(None)
    }

    /// A connection dropped: the sessions last used on it end.
    pub(crate) fn disconnected(
        &mut self,
        connection: u64,
    ) -> Vec<((String, String), Vec<TopicPartition>)> {
        let gone: Vec<(String, String)> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.connection == connection)
            .map(|(k, _)| k.clone())
            .collect();
        gone.into_iter()
            .map(|k| {
                let s = self.sessions.remove(&k).expect("present");
                (k, s.partitions)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        (Uuid::from_u128(1), p)
    }

    #[test]
    fn a_session_opens_at_epoch_zero_and_then_follows_its_epochs() {
        let mut s = ShareSessions::new(10);
        assert_eq!(
            s.fetch("g", "m", 0, &[tp(0), tp(0)], &[], false, 1),
            Ok(FetchContext::Full(vec![tp(0)]))
        );
        assert_eq!(
            s.fetch("g", "m", 1, &[tp(1)], &[], true, 1),
            Ok(FetchContext::Incremental {
                partitions: vec![tp(0), tp(1)],
                added: vec![tp(1)]
            })
        );
        // ShareAcknowledge shares the epoch.
        assert_eq!(s.acknowledge("g", "m", 2, 1), Ok(None));
        assert_eq!(
            s.fetch("g", "m", 2, &[], &[], false, 1),
            Err(SessionError::InvalidEpoch)
        );
        assert_eq!(
            s.fetch("g", "m", 3, &[], &[tp(0)], false, 1),
            Ok(FetchContext::Incremental {
                partitions: vec![tp(1)],
                added: vec![]
            })
        );
        assert_eq!(
            s.acknowledge("g", "m", 0, 1),
            Err(SessionError::InvalidEpoch)
        );
        assert_eq!(
            s.fetch("g", "other", 5, &[], &[], false, 1),
            Err(SessionError::NotFound)
        );
        assert_eq!(
            s.fetch("g", "m", 0, &[tp(0)], &[], true, 1),
            Err(SessionError::InvalidRequest(
                "Acknowledge data present in initial fetch request.".into()
            ))
        );
    }

    #[test]
    fn closing_or_disconnecting_ends_a_session_and_names_its_partitions() {
        let mut s = ShareSessions::new(10);
        s.fetch("g", "a", 0, &[tp(0)], &[], false, 1).unwrap();
        s.fetch("g", "b", 0, &[tp(1)], &[], false, 2).unwrap();
        assert_eq!(
            s.fetch("g", "a", -1, &[], &[], true, 1),
            Ok(FetchContext::Final(vec![tp(0)]))
        );
        assert_eq!(
            s.fetch("g", "a", 1, &[], &[], false, 1),
            Err(SessionError::NotFound)
        );
        assert_eq!(
            s.disconnected(2),
            vec![(("g".to_string(), "b".to_string()), vec![tp(1)])]
        );
        assert_eq!(
            s.fetch("g", "b", 1, &[], &[], false, 2),
            Err(SessionError::NotFound)
        );
    }

    #[test]
    fn sessions_beyond_the_limit_are_refused() {
        let mut s = ShareSessions::new(1);
        s.fetch("g", "a", 0, &[tp(0)], &[], false, 1).unwrap();
        assert_eq!(
            s.fetch("g", "b", 0, &[tp(0)], &[], false, 1),
            Err(SessionError::LimitReached)
        );
        // Reopening one's own session does not count twice.
        assert!(s.fetch("g", "a", 0, &[tp(0)], &[], false, 1).is_ok());
    }
}
