//! One Streams group under Kafka Streams' rebalance protocol (KIP-1071).
//!
//! The consumer group protocol moved partition assignment from a group
//! leader to the broker; this protocol does the same for Kafka Streams'
//! *tasks*. The first member sends the application's topology
//! (subtopologies, their source, repartition and changelog topics), and the
//! coordinator works out what the classic Streams leader used to: how many
//! partitions each repartition and changelog topic needs, whether
//! co-partitioned topics agree, which internal topics are missing (the API
//! layer creates them), and, once every topic is there, one task per input
//! partition of each subtopology, spread over the members by the sticky
//! task assignor with standbys on other processes.
//!
//! Until the topology is *ready* the group is NotReady: members get no
//! tasks and a status saying why, and keep heartbeating; the heartbeat after
//! the topics appear bumps the group epoch and assigns. From there the
//! group moves as a consumer group does (see `consumer`): every change of
//! membership, topics or assignment configs bumps the group epoch, the
//! target assignment follows, and each member reconciles towards it alone,
//! revoking first and taking a task only once its previous owner (or a
//! member of its own process, which shares the state directory) has let go.
//!
//! Synchronous, with time and topics passed in; every change comes back as
//! `__consumer_offsets` records (`streams_records`) and `restore` replays them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::consumer::{Records, Topics, LEAVE_EPOCH, STATIC_LEAVE_EPOCH};
use super::records::RecordKey;
use super::streams_records::{
    encode_target, StreamsCurrentValue, StreamsGroupValue, StreamsMemberValue, TaskEpochs, Topology,
};
use super::task_assignor::{self, Kind, TaskMember, TaskSet};
use super::CoordinatorError;

/// Kafka's group.streams.* broker settings.
#[derive(Debug, Clone)]
pub struct StreamsGroupConfig {
    pub heartbeat_interval: Duration,
    pub session_timeout: Duration,
    pub num_standby_replicas: u32,
    /// How long a new group waits for more members before its first assignment.
    pub initial_rebalance_delay: Duration,
    /// The least time between two target assignments.
    pub assignment_interval: Duration,
    pub max_size: usize,
}

impl Default for StreamsGroupConfig {
    /// Kafka's defaults.
    fn default() -> Self {
        StreamsGroupConfig {
            heartbeat_interval: Duration::from_millis(5000),
            session_timeout: Duration::from_millis(45000),
            num_standby_replicas: 0,
            initial_rebalance_delay: Duration::from_millis(3000),
            assignment_interval: Duration::from_millis(1000),
            max_size: i32::MAX as usize,
        }
    }
}

/// group.streams.acceptable.recovery.lag's default, sent to members.
pub(crate) const ACCEPTABLE_RECOVERY_LAG: i64 = 10_000;
/// group.streams.task.offset.interval.ms's default.
pub(crate) const TASK_OFFSET_INTERVAL_MS: i32 = 60_000;
const NUM_STANDBY_REPLICAS: &str = "num.standby.replicas";

/// Heartbeat status codes.
pub(crate) const STALE_TOPOLOGY: i8 = 0;
pub(crate) const MISSING_SOURCE_TOPICS: i8 = 1;
pub(crate) const INCORRECTLY_PARTITIONED_TOPICS: i8 = 2;
pub(crate) const MISSING_INTERNAL_TOPICS: i8 = 3;
pub(crate) const SHUTDOWN_APPLICATION: i8 = 4;
pub(crate) const ASSIGNMENT_DELAYED: i8 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemberState {
    Stable,
    UnrevokedTasks,
    UnreleasedTasks,
}

impl MemberState {
    fn code(self) -> i8 {
        match self {
            MemberState::Stable => 1,
            MemberState::UnrevokedTasks => 2,
            MemberState::UnreleasedTasks => 3,
        }
    }

    fn from_code(code: i8) -> MemberState {
        match code {
            2 => MemberState::UnrevokedTasks,
            3 => MemberState::UnreleasedTasks,
            _ => MemberState::Stable,
        }
    }
}

/// (subtopology, partition, offset) as members report them.
pub(crate) type TaskOffsets = Vec<(String, i32, i64)>;

#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub id: String,
    pub meta: StreamsMemberValue,
    pub epoch: i32,
    pub previous_epoch: i32,
    pub state: MemberState,
    pub assigned: TaskSet,
    pub revoking: TaskSet,
    /// The member epoch each of its active tasks was given at.
    pub active_epochs: TaskEpochs,
    /// Last reported, kept in memory only (as in Kafka).
    pub task_offsets: TaskOffsets,
    pub task_end_offsets: TaskOffsets,
    last_seen: Instant,
    revoke_deadline: Option<Instant>,
}

impl Member {
    fn new(id: String, now: Instant) -> Member {
        Member {
            id,
            meta: StreamsMemberValue {
                rebalance_timeout_ms: -1,
                topology_epoch: -1,
                ..StreamsMemberValue::default()
            },
            epoch: 0,
            previous_epoch: 0,
            state: MemberState::Stable,
            assigned: TaskSet::default(),
            revoking: TaskSet::default(),
            active_epochs: TaskEpochs::new(),
            task_offsets: Vec::new(),
            task_end_offsets: Vec::new(),
            last_seen: now,
            revoke_deadline: None,
        }
    }

    fn current_value(&self) -> StreamsCurrentValue {
        StreamsCurrentValue {
            member_epoch: self.epoch,
            previous_member_epoch: self.previous_epoch,
            state: self.state.code(),
            assigned: self.assigned.clone(),
            revoking: self.revoking.clone(),
            active_epochs: self.active_epochs.clone(),
        }
    }

    /// Whether it holds the task (assigned or still revoking) as `kind`.
    fn owns(&self, kind: Kind, subtopology: &str, partition: i32) -> bool {
        self.assigned.contains(kind, subtopology, partition)
            || self.revoking.contains(kind, subtopology, partition)
    }
}

/// A StreamsGroupHeartbeat, decoded. `None` fields are unchanged.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeartbeatParams {
    pub member_id: String,
    pub member_epoch: i32,
    pub endpoint_information_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub topology: Option<Topology>,
    /// What the member owns: set only when all three lists were sent.
    pub owned: Option<TaskSet>,
    /// Some of the three task lists were sent, not all.
    pub partly_owned: bool,
    pub process_id: Option<String>,
    pub user_endpoint: Option<(String, u16)>,
    pub client_tags: Option<Vec<(String, String)>>,
    pub task_offsets: Option<TaskOffsets>,
    pub task_end_offsets: Option<TaskOffsets>,
    pub shutdown_application: bool,
    pub client_id: String,
    pub client_host: String,
}

/// A topic the API layer is to create for the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewTopic {
    pub name: String,
    pub partitions: i32,
    /// -1: the broker's default.
    pub replication_factor: i16,
    pub configs: Vec<(String, String)>,
}

/// One user endpoint (Streams' `application.server`) and the partitions of
/// the tasks behind it, for interactive queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EndpointPartitions {
    pub endpoint: (String, u16),
    pub active: Vec<(String, Vec<i32>)>,
    pub standby: Vec<(String, Vec<i32>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeartbeatResult {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    pub status: Vec<(i8, String)>,
    /// Sent when it changed or the member joined.
    pub assignment: Option<TaskSet>,
    pub endpoint_information_epoch: i32,
    pub endpoints: Option<Vec<EndpointPartitions>>,
    /// Internal topics the topology needs that do not exist.
    pub create: Vec<NewTopic>,
}

/// Checks the fields Kafka requires (INVALID_REQUEST otherwise).
pub(crate) fn validate(group_id: &str, p: &HeartbeatParams) -> Result<(), CoordinatorError> {
    let invalid = |m: String| Err(CoordinatorError::InvalidRequest(m));
    if let Some(t) = &p.topology {
        if t.subtopologies
            .iter()
            .any(|s| !s.source_topic_regex.is_empty())
        {
            return invalid("Regular expressions for source topics are not supported yet.".into());
        }
    }
    if p.member_id.trim().is_empty() {
        return invalid("MemberId can't be empty.".into());
    }
    if group_id.trim().is_empty() {
        return invalid("GroupId can't be empty.".into());
    }
    if p.instance_id
        .as_deref()
        .is_some_and(|i| i.trim().is_empty())
    {
        return invalid("InstanceId can't be empty.".into());
    }
    if p.rack_id.as_deref().is_some_and(|r| r.trim().is_empty()) {
        return invalid("RackId can't be empty.".into());
    }
    match p.member_epoch {
        0 => {
            if p.rebalance_timeout_ms == -1 {
                return invalid("RebalanceTimeoutMs must be provided in first request.".into());
            }
            if !p.owned.as_ref().is_some_and(TaskSet::is_empty) {
                return invalid("ActiveTasks must be empty when (re-)joining.".into());
            }
            let Some(t) = &p.topology else {
                return invalid("Topology must be non-null when (re-)joining.".into());
            };
            for s in &t.subtopologies {
                if let Some(c) = s.changelog_topics.iter().find(|c| c.partitions != 0) {
                    return Err(CoordinatorError::StreamsInvalidTopology(format!(
                        "Changelog topic {} must have an undefined partition count, but it is set to {}.",
                        c.name, c.partitions
                    )));
                }
            }
        }
        STATIC_LEAVE_EPOCH if p.instance_id.is_none() => {
            return invalid("InstanceId can't be null.".into());
        }
        e if e < STATIC_LEAVE_EPOCH => {
            return invalid(format!(
                "MemberEpoch is {e}, but must be greater than or equal to -2."
            ));
        }
        _ => {}
    }
    if p.partly_owned {
        return invalid("If one task-type is non-null, all must be non-null.".into());
    }
    if p.member_epoch != 0 && p.topology.is_some() {
        return invalid("Topology can only be provided when (re-)joining.".into());
    }
    Ok(())
}

/// The topology against the topics that exist: the task count of every
/// subtopology once all is in place, or why it is not.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Configured {
    /// Task counts; empty unless ready.
    pub tasks: BTreeMap<String, i32>,
    /// The partition count decided for each internal topic.
    pub internal: BTreeMap<String, i32>,
    /// What keeps it from being ready.
    pub problem: Option<(i8, String)>,
    pub create: Vec<NewTopic>,
}

impl Configured {
    pub(crate) fn is_ready(&self) -> bool {
        self.problem.is_none()
    }
}

/// "a, b, c and 2 additional topics", as Kafka lists topics in a status.
fn summarize(names: &[String]) -> String {
    if names.is_empty() {
        return "<none>".into();
    }
    let head = names[..names.len().min(3)].join(", ");
    match names.len() {
        n if n > 3 => format!("{head} and {} additional topics", n - 3),
        _ => head,
    }
}

/// Kafka's InternalTopicManager.configureTopics. Errors are topologies no
/// topic change can fix (STREAMS_INVALID_TOPOLOGY).
pub(crate) fn configure(t: &Topology, topics: &Topics) -> Result<Configured, CoordinatorError> {
    let not_ready = |code: i8, why: String| {
        Ok(Configured {
            problem: Some((code, why)),
            ..Configured::default()
        })
    };
    let invalid = |why: &str| Err(CoordinatorError::StreamsInvalidTopology(why.to_string()));
    let existing = |name: &str| topics.get(name).map(|m| m.partitions);
    let mut missing: Vec<String> = t
        .subtopologies
        .iter()
        .flat_map(|s| &s.source_topics)
        .filter(|n| existing(n).is_none())
        .cloned()
        .collect();
    if !missing.is_empty() {
        missing.sort();
        missing.dedup();
        return not_ready(
            MISSING_SOURCE_TOPICS,
            format!("Source topics {} are missing.", summarize(&missing)),
        );
    }
    // Repartition topics: as declared, else as many partitions as the most
    // of the inputs of the subtopology writing them.
    let mut repartition: BTreeMap<String, i32> = BTreeMap::new();
    let mut fixed: BTreeSet<String> = BTreeSet::new();
    for s in &t.subtopologies {
        for r in &s.repartition_source_topics {
            if r.partitions != 0 {
                repartition.insert(r.name.clone(), r.partitions);
                fixed.insert(r.name.clone());
            }
        }
    }
    let count = |name: &str, repartition: &BTreeMap<String, i32>| {
        existing(name).or_else(|| repartition.get(name).copied())
    };
    loop {
        let mut progress = false;
        let mut unresolved = false;
        for s in &t.subtopologies {
            for sink in &s.repartition_sink_topics {
                if repartition.contains_key(sink) {
                    continue;
                }
                let inputs = s
                    .source_topics
                    .iter()
                    .chain(s.repartition_source_topics.iter().map(|r| &r.name))
                    .filter_map(|n| count(n, &repartition))
                    .max();
                match inputs {
                    Some(n) => {
                        repartition.insert(sink.clone(), n);
                        progress = true;
                    }
                    None => unresolved = true,
                }
            }
        }
        if !unresolved {
            break;
        }
        if !progress {
            return invalid(
                "Failed to compute number of partitions for all repartition topics. There may be \
                 loops in the topology that cannot be resolved.",
            );
        }
    }
    for s in &t.subtopologies {
        for r in &s.repartition_source_topics {
            if !repartition.contains_key(&r.name) {
                return invalid(
                    "Failed to compute number of partitions for all repartition topics, because \
                     a repartition source topic is never used as a sink topic.",
                );
            }
        }
    }
    // Co-partitioned topics must agree; flexible repartition topics follow.
    for s in &t.subtopologies {
        for g in &s.copartition_groups {
            let pick = |ix: &[i16], names: &[String]| -> Vec<String> {
                ix.iter()
                    .filter_map(|i| names.get(*i as usize).cloned())
                    .collect()
            };
            let external = pick(&g.source_topics, &s.source_topics);
            let reparts: Vec<String> = g
                .repartition_source_topics
                .iter()
                .filter_map(|i| s.repartition_source_topics.get(*i as usize))
                .map(|r| r.name.clone())
                .collect();
            let target = if external.is_empty() {
                let fixed_counts: BTreeMap<&String, i32> = reparts
                    .iter()
                    .filter(|n| fixed.contains(*n))
                    .map(|n| (n, repartition[n]))
                    .collect();
                if !fixed_counts.is_empty() {
                    let first = *fixed_counts.values().next().expect("non-empty");
                    if fixed_counts.values().any(|c| *c != first) {
                        return not_ready(
                            INCORRECTLY_PARTITIONED_TOPICS,
                            format!(
                                "Following topics do not have the same number of partitions: [{}]",
                                show_counts(&fixed_counts)
                            ),
                        );
                    }
                    first
                } else {
                    let max = reparts
                        .iter()
                        .filter_map(|n| count(n, &repartition))
                        .max()
                        .unwrap_or(0);
                    if max == 0 {
                        return invalid(
                            "All topics in the copartition group had undefined partition number.",
                        );
                    }
                    max
                }
            } else {
                let counts: BTreeMap<&String, i32> = external
                    .iter()
                    .filter_map(|n| existing(n).map(|c| (n, c)))
                    .collect();
                let first = counts.values().next().copied().unwrap_or(0);
                if counts.values().any(|c| *c != first) {
                    return not_ready(
                        INCORRECTLY_PARTITIONED_TOPICS,
                        format!(
                            "Following topics do not have the same number of partitions: [{}]",
                            show_counts(&counts)
                        ),
                    );
                }
                first
            };
            for r in &reparts {
                if fixed.contains(r) && repartition[r] != target {
                    return not_ready(
                        INCORRECTLY_PARTITIONED_TOPICS,
                        format!(
                            "Number of partitions [{}] of repartition topic [{r}] doesn't match \
                             number of partitions [{target}] of the source topic.",
                            repartition[r]
                        ),
                    );
                }
                repartition.insert(r.clone(), target);
            }
        }
    }
    let mut out = Configured::default();
    let mut wanted: Vec<(&crate::coordinator::streams_records::TopicInfo, i32)> = Vec::new();
    for s in &t.subtopologies {
        let tasks = s
            .source_topics
            .iter()
            .chain(s.repartition_source_topics.iter().map(|r| &r.name))
            .filter_map(|n| count(n, &repartition))
            .max();
        let Some(tasks) = tasks else {
            return invalid(&format!("No source topics found for subtopology {}", s.id));
        };
        out.tasks.insert(s.id.clone(), tasks);
        for r in &s.repartition_source_topics {
            wanted.push((r, repartition[&r.name]));
        }
        for c in &s.changelog_topics {
            wanted.push((c, tasks));
        }
    }
    for (info, partitions) in wanted {
        out.internal.insert(info.name.clone(), partitions);
        match existing(&info.name) {
            Some(found) if found != partitions => {
                return not_ready(
                    INCORRECTLY_PARTITIONED_TOPICS,
                    format!(
                        "Existing topic {} has different number of partitions: expected \
                         {partitions}, found {found}",
                        info.name
                    ),
                );
            }
            Some(_) => {}
            None if out.create.iter().any(|c| c.name == info.name) => {}
            None => out.create.push(NewTopic {
                name: info.name.clone(),
                partitions,
                replication_factor: match info.replication_factor {
                    0 => -1,
                    rf => rf,
                },
                configs: info.configs.clone(),
            }),
        }
    }
    if !out.create.is_empty() {
        let names: Vec<String> = out.create.iter().map(|c| c.name.clone()).collect();
        out.problem = Some((
            MISSING_INTERNAL_TOPICS,
            format!("Internal topics are missing: {}", summarize(&names)),
        ));
        out.tasks.clear();
    }
    Ok(out)
}

fn show_counts(counts: &BTreeMap<&String, i32>) -> String {
    let inner: Vec<String> = counts.iter().map(|(n, c)| format!("{n}={c}")).collect();
    format!("{{{}}}", inner.join(", "))
}

pub(crate) struct StreamsGroup {
    pub id: String,
    pub epoch: i32,
    pub assignment_epoch: i32,
    metadata_hash: i64,
    /// The topology epoch last found ready, -1 if not ready.
    validated_topology_epoch: i32,
    /// The assignment configs the current target was computed with.
    assignment_configs: Option<Vec<(String, String)>>,
    pub topology: Option<Topology>,
    members: BTreeMap<String, Member>,
    target: BTreeMap<String, TaskSet>,
    /// Wall-clock ms since the group has had no members (offset expiry).
    pub empty_since_ms: i64,
    /// The member that asked the whole application to shut down.
    shutdown_requester: Option<String>,
    /// Bumped whenever what interactive queries see (endpoints, tasks) changes.
    endpoint_epoch: i32,
    /// A new group's first assignment waits until then.
    delayed_until: Option<Instant>,
    /// When the last target was computed: the next waits for the
    /// assignment interval, so a burst of changes costs one rebalance.
    assigned_at: Option<Instant>,
}

impl StreamsGroup {
    pub(crate) fn new(id: &str, now_ms: i64) -> StreamsGroup {
        StreamsGroup {
            id: id.to_string(),
            epoch: 1,
            assignment_epoch: 1,
            metadata_hash: 0,
            validated_topology_epoch: -1,
            assignment_configs: None,
            topology: None,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            empty_since_ms: now_ms,
            shutdown_requester: None,
            endpoint_epoch: 0,
            delayed_until: None,
            assigned_at: None,
        }
    }

    pub(crate) fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    pub(crate) fn has_members(&self) -> bool {
        !self.members.is_empty()
    }

    pub(crate) fn target_of(&self, member_id: &str) -> Option<&TaskSet> {
        self.target.get(member_id)
    }

    /// Kafka's StreamsGroupState names.
    pub(crate) fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self
            .topology
            .as_ref()
            .is_none_or(|t| t.epoch != self.validated_topology_epoch)
        {
            "NotReady"
        } else if self.epoch > self.assignment_epoch {
            "Assigning"
        } else if self
            .members
            .values()
            .any(|m| m.epoch != self.assignment_epoch || m.state != MemberState::Stable)
        {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// The topics the application reads (sources and repartition sources):
    /// their offsets are the group's, and OffsetDelete leaves them alone.
    pub(crate) fn input_topics(&self) -> BTreeSet<String> {
        self.topology
            .iter()
            .flat_map(|t| &t.subtopologies)
            .flat_map(|s| {
                s.source_topics
                    .iter()
                    .cloned()
                    .chain(s.repartition_source_topics.iter().map(|r| r.name.clone()))
            })
            .collect()
    }

    /// The subtopology reading a topic.
    fn subtopology_of(&self, topic: &str) -> Option<&str> {
        self.topology.as_ref().and_then(|t| {
            t.subtopologies
                .iter()
                .find(|s| {
                    s.source_topics.iter().any(|n| n == topic)
                        || s.repartition_source_topics.iter().any(|r| r.name == topic)
                })
                .map(|s| s.id.as_str())
        })
    }

    /// The topology against `topics`, `None` without a topology.
    pub(crate) fn configured(&self, topics: &Topics) -> Option<Configured> {
        self.topology
            .as_ref()
            .map(|t| configure(t, topics).unwrap_or_default())
    }

    fn static_member_id(&self, instance_id: &str) -> Option<String> {
        self.members
            .values()
            .find(|m| m.meta.instance_id.as_deref() == Some(instance_id))
            .map(|m| m.id.clone())
    }

    /// Over every topic the topology names that exists: a change means a
    /// new configuration.
    fn metadata_hash(&self, topics: &Topics) -> i64 {
        let Some(t) = &self.topology else { return 0 };
        let names: BTreeSet<&String> = t
            .subtopologies
            .iter()
            .flat_map(|s| {
                s.source_topics
                    .iter()
                    .chain(s.repartition_source_topics.iter().map(|r| &r.name))
                    .chain(s.changelog_topics.iter().map(|c| &c.name))
            })
            .collect();
        super::consumer::metadata_hash(&names, topics)
    }

    fn assignment_configs(cfg: &StreamsGroupConfig) -> Vec<(String, String)> {
        vec![(
            NUM_STANDBY_REPLICAS.to_string(),
            cfg.num_standby_replicas.to_string(),
        )]
    }

    /// StreamsGroupHeartbeat, validated with `validate`.
    pub(crate) fn heartbeat(
        &mut self,
        p: HeartbeatParams,
        now: Instant,
        now_ms: i64,
        topics: &Topics,
        cfg: &StreamsGroupConfig,
        records: &mut Records,
    ) -> Result<HeartbeatResult, CoordinatorError> {
        if p.shutdown_application && self.shutdown_requester.is_none() {
            self.shutdown_requester = Some(p.member_id.clone());
        }
        if p.member_epoch == LEAVE_EPOCH || p.member_epoch == STATIC_LEAVE_EPOCH {
            return self.leave(&p, now_ms, topics, cfg, records);
        }
        // Everything that can refuse the request comes before any change.
        let new_topology = match (&self.topology, &p.topology) {
            (None, Some(t)) => Some(t.clone()),
            (Some(stored), Some(t)) if stored.epoch <= t.epoch && stored != t => {
                return Err(CoordinatorError::InvalidRequest(
                    "Topology updates are not supported yet.".into(),
                ));
            }
            _ => None,
        };
        let topology = new_topology.as_ref().or(self.topology.as_ref());
        let configured = topology.map(|t| configure(t, topics)).transpose()?;
        if let (Some(owned), Some(c)) = (&p.owned, configured.as_ref().filter(|c| c.is_ready())) {
            check_owned(owned, &c.tasks)?;
        }
        for offsets in [&p.task_offsets, &p.task_end_offsets].into_iter().flatten() {
            let mut seen = BTreeSet::new();
            for (s, part, _) in offsets {
                if !seen.insert((s, part)) {
                    return Err(CoordinatorError::InvalidRequest(format!(
                        "Task offsets contain a duplicate entry for subtopology {s} and partition {part}."
                    )));
                }
            }
        }
        let was_empty = self.members.is_empty();
        let member_id = self.admit(&p, now, cfg, records)?;
        let mut bump = false;
        let before = self.members[&member_id].clone();
        {
            let m = self.members.get_mut(&member_id).expect("admitted");
            m.last_seen = now;
            let meta = &mut m.meta;
            if let Some(v) = &p.instance_id {
                meta.instance_id = Some(v.clone());
            }
            if let Some(v) = &p.rack_id {
                meta.rack_id = Some(v.clone());
            }
            if p.rebalance_timeout_ms != -1 {
                meta.rebalance_timeout_ms = p.rebalance_timeout_ms;
            }
            if let Some(v) = &p.process_id {
                meta.process_id = v.clone();
            }
            if let Some(tags) = &p.client_tags {
                let mut tags = tags.clone();
                tags.sort();
                tags.dedup_by(|a, b| a.0 == b.0);
                meta.client_tags = tags;
            }
            if let Some(t) = &p.topology {
                meta.topology_epoch = t.epoch;
            }
            if p.member_epoch == 0 || p.user_endpoint.is_some() {
                meta.user_endpoint = p.user_endpoint.clone();
            }
            meta.client_id = p.client_id.clone();
            meta.client_host = p.client_host.clone();
            if let Some(o) = &p.task_offsets {
                m.task_offsets = o.clone();
            }
            if let Some(o) = &p.task_end_offsets {
                m.task_end_offsets = o.clone();
            }
            let (old, new) = (&before.meta, &m.meta);
            if old != new || p.member_epoch == 0 {
                records.push((member_key(&self.id, &member_id, 19), Some(new.encode())));
                bump |= match new.instance_id {
                    None => true,
                    Some(_) => {
                        old.topology_epoch != new.topology_epoch
                            || old.rack_id != new.rack_id
                            || old.client_tags != new.client_tags
                            || old.process_id != new.process_id
                    }
                };
            }
        }
        if let Some(t) = new_topology {
            records.push((
                RecordKey::StreamsTopology {
                    group: self.id.clone(),
                },
                Some(t.encode()),
            ));
            self.topology = Some(t);
        }
        let mut status = Vec::new();
        let topology_epoch = self.topology.as_ref().map_or(-1, |t| t.epoch);
        let member_topology_epoch = self.members[&member_id].meta.topology_epoch;
        if self.topology.is_some() && member_topology_epoch < topology_epoch {
            status.push((
                STALE_TOPOLOGY,
                format!(
                    "The member's topology epoch {member_topology_epoch} is behind the group's \
                     topology epoch {topology_epoch}."
                ),
            ));
        }
        let hash = self.metadata_hash(topics);
        let ready = configured.as_ref().is_some_and(Configured::is_ready);
        let validated = if ready { topology_epoch } else { -1 };
        let configs = Self::assignment_configs(cfg);
        bump |= hash != self.metadata_hash
            || validated != self.validated_topology_epoch
            || self.assignment_configs.as_ref() != Some(&configs);
        if bump {
            self.epoch += 1;
            self.metadata_hash = hash;
            self.validated_topology_epoch = validated;
            self.assignment_configs = Some(configs);
            records.push((self.group_key(), Some(self.group_value().encode())));
        }
        if was_empty && !cfg.initial_rebalance_delay.is_zero() && self.delayed_until.is_none() {
            self.delayed_until = Some(now + cfg.initial_rebalance_delay);
        }
        if self.delayed_until.is_some_and(|d| now >= d) {
            self.delayed_until = None;
        }
        let batching = self.epoch > self.assignment_epoch
            && self
                .assigned_at
                .is_some_and(|t| now < t + cfg.assignment_interval);
        if self.delayed_until.is_some() {
            status.push((
                ASSIGNMENT_DELAYED,
                "Assignment delayed due to the configured initial rebalance delay.".into(),
            ));
        } else if batching {
            status.push((
                ASSIGNMENT_DELAYED,
                "Assignment delayed due to the configured assignment interval.".into(),
            ));
        } else {
            let tasks = configured
                .as_ref()
                .filter(|c| c.is_ready())
                .map(|c| c.tasks.clone())
                .unwrap_or_default();
            if self.epoch > self.assignment_epoch {
                self.assigned_at = Some(now);
            }
            self.assign(&tasks, cfg, records);
        }
        self.reconcile(&member_id, p.owned.as_ref(), now, records);
        let mut create = Vec::new();
        if let Some((code, why)) = configured.and_then(|c| {
            create = c.create;
            c.problem
        }) {
            status.push((code, why));
        }
        if let Some(who) = &self.shutdown_requester {
            status.push((
                SHUTDOWN_APPLICATION,
                format!(
                    "Streams group member {who} encountered a fatal error and requested a \
                     shutdown for the entire application."
                ),
            ));
        }
        let m = &self.members[&member_id];
        let changed = m.assigned != before.assigned;
        if (changed && m.meta.user_endpoint.is_some())
            || m.meta.user_endpoint != before.meta.user_endpoint
        {
            self.endpoint_epoch += 1;
        }
        let endpoints =
            (p.endpoint_information_epoch != self.endpoint_epoch).then(|| self.endpoints(topics));
        let m = &self.members[&member_id];
        Ok(HeartbeatResult {
            member_id: member_id.clone(),
            member_epoch: m.epoch,
            heartbeat_interval_ms: cfg.heartbeat_interval.as_millis() as i32,
            status,
            assignment: (p.member_epoch == 0 || changed).then(|| m.assigned.clone()),
            endpoint_information_epoch: self.endpoint_epoch,
            endpoints,
            create,
        })
    }

    fn group_key(&self) -> RecordKey {
        RecordKey::StreamsGroup {
            group: self.id.clone(),
        }
    }

    fn group_value(&self) -> StreamsGroupValue {
        StreamsGroupValue {
            epoch: self.epoch,
            metadata_hash: self.metadata_hash,
            validated_topology_epoch: self.validated_topology_epoch,
            assignment_configs: self.assignment_configs.clone(),
        }
    }

    /// Finds (or, joining, creates) the member a heartbeat is from.
    fn admit(
        &mut self,
        p: &HeartbeatParams,
        now: Instant,
        cfg: &StreamsGroupConfig,
        records: &mut Records,
    ) -> Result<String, CoordinatorError> {
        if p.member_epoch != 0 {
            let m = self.known_member(p)?;
            if p.member_epoch > m.epoch {
                return Err(CoordinatorError::FencedMemberEpoch);
            }
            let owned_kept = p
                .owned
                .as_ref()
                .is_none_or(|o| o.iter().all(|(k, s, part)| m.assigned.contains(k, s, part)));
            if p.member_epoch < m.epoch && (p.member_epoch != m.previous_epoch || !owned_kept) {
                return Err(CoordinatorError::FencedMemberEpoch);
            }
            return Ok(m.id.clone());
        }
        let member_id = p.member_id.clone();
        if let Some(iid) = &p.instance_id {
            if let Some(old_id) = self.static_member_id(iid) {
                if self.members[&old_id].epoch != STATIC_LEAVE_EPOCH {
                    return Err(CoordinatorError::UnreleasedInstanceId(iid.clone()));
                }
                self.take_over(&old_id, &member_id, now, records);
                return Ok(member_id);
            }
        }
        if !self.members.contains_key(&member_id) {
            if self.members.len() >= cfg.max_size {
                return Err(CoordinatorError::GroupMaxSizeReached(cfg.max_size));
            }
            self.members
                .insert(member_id.clone(), Member::new(member_id.clone(), now));
        }
        Ok(member_id)
    }

    fn known_member(&self, p: &HeartbeatParams) -> Result<&Member, CoordinatorError> {
        match &p.instance_id {
            Some(iid) => match self.static_member_id(iid) {
                Some(id) if id != p.member_id => Err(CoordinatorError::FencedInstanceId),
                Some(id) => Ok(&self.members[&id]),
                None => Err(CoordinatorError::UnknownMemberId),
            },
            None => self
                .members
                .get(&p.member_id)
                .ok_or(CoordinatorError::UnknownMemberId),
        }
    }

    /// A static member back under a new member id takes over its tasks.
    fn take_over(&mut self, old_id: &str, member_id: &str, now: Instant, records: &mut Records) {
        let mut m = self.members.remove(old_id).expect("present");
        let target = self.target.remove(old_id).unwrap_or_default();
        if old_id != member_id {
            for key in [22, 21, 19] {
                records.push((member_key(&self.id, old_id, key), None));
            }
        }
        m.id = member_id.to_string();
        m.epoch = 0;
        m.previous_epoch = 0;
        m.revoking = TaskSet::default();
        m.last_seen = now;
        records.push((member_key(&self.id, member_id, 19), Some(m.meta.encode())));
        records.push((
            member_key(&self.id, member_id, 21),
            Some(encode_target(&target)),
        ));
        records.push((
            member_key(&self.id, member_id, 22),
            Some(m.current_value().encode()),
        ));
        self.target.insert(member_id.to_string(), target);
        self.members.insert(member_id.to_string(), m);
    }

    fn leave(
        &mut self,
        p: &HeartbeatParams,
        now_ms: i64,
        topics: &Topics,
        cfg: &StreamsGroupConfig,
        records: &mut Records,
    ) -> Result<HeartbeatResult, CoordinatorError> {
        let id = self.known_member(p)?.id.clone();
        let result = HeartbeatResult {
            member_id: id.clone(),
            member_epoch: p.member_epoch,
            heartbeat_interval_ms: 0,
            status: Vec::new(),
            assignment: None,
            endpoint_information_epoch: 0,
            endpoints: None,
            create: Vec::new(),
        };
        if p.member_epoch == STATIC_LEAVE_EPOCH {
            // It keeps its tasks for the session timeout, so a restart
            // inside it moves nothing.
            let m = self.members.get_mut(&id).expect("present");
            m.epoch = STATIC_LEAVE_EPOCH;
            m.revoking = TaskSet::default();
            m.active_epochs.values_mut().for_each(|e| *e = 0);
            records.push((
                member_key(&self.id, &id, 22),
                Some(m.current_value().encode()),
            ));
            return Ok(result);
        }
        self.remove_members(&[id], now_ms, topics, cfg, records);
        Ok(result)
    }

    /// Drops members (left, expired or fenced): their tasks are free at
    /// once and the group epoch moves on.
    pub(crate) fn remove_members(
        &mut self,
        ids: &[String],
        now_ms: i64,
        topics: &Topics,
        cfg: &StreamsGroupConfig,
        records: &mut Records,
    ) {
        let mut removed = false;
        for id in ids {
            if self.members.remove(id).is_none() {
                continue;
            }
            removed = true;
            self.target.remove(id);
            for key in [22, 21, 19] {
                records.push((member_key(&self.id, id, key), None));
            }
        }
        if !removed {
            return;
        }
        self.epoch += 1;
        records.push((self.group_key(), Some(self.group_value().encode())));
        self.endpoint_epoch += 1;
        if self.members.is_empty() {
            self.empty_since_ms = now_ms;
            self.shutdown_requester = None;
            self.delayed_until = None;
            self.assignment_epoch = self.epoch;
            records.push(self.assignment_epoch_record());
        } else {
            let tasks = self
                .configured(topics)
                .filter(Configured::is_ready)
                .map(|c| c.tasks)
                .unwrap_or_default();
            self.assign(&tasks, cfg, records);
        }
    }

    /// A new target for a new group epoch.
    fn assign(
        &mut self,
        tasks: &BTreeMap<String, i32>,
        cfg: &StreamsGroupConfig,
        records: &mut Records,
    ) {
        if self.epoch <= self.assignment_epoch {
            return;
        }
        let members: Vec<TaskMember<'_>> = self
            .members
            .values()
            .map(|m| TaskMember {
                id: &m.id,
                process_id: &m.meta.process_id,
                previous: Some(&m.assigned),
            })
            .collect();
        let target = task_assignor::assign(&members, tasks, cfg.num_standby_replicas);
        for (id, t) in &target {
            if self.target.get(id) != Some(t) {
                records.push((member_key(&self.id, id, 21), Some(encode_target(t))));
            }
        }
        self.target = target;
        self.assignment_epoch = self.epoch;
        records.push(self.assignment_epoch_record());
    }

    fn assignment_epoch_record(&self) -> (RecordKey, Option<bytes::Bytes>) {
        let key = RecordKey::StreamsTargetAssignment {
            group: self.id.clone(),
        };
        let epoch = super::records::encode_assignment_epoch(self.assignment_epoch);
        (key, Some(epoch))
    }

    /// Whether `kind` task (s, p) must wait for another member to let go:
    /// an active task while anyone else holds it active, and any task while
    /// another member of this process holds it (they share a state directory).
    fn unreleased(&self, id: &str, kind: Kind, s: &str, p: i32) -> bool {
        let process = &self.members[id].meta.process_id;
        self.members.values().filter(|o| o.id != id).any(|o| {
            let same_process = &o.meta.process_id == process;
            (kind == Kind::Active && o.owns(Kind::Active, s, p))
                || (same_process
                    && [Kind::Active, Kind::Standby, Kind::Warmup]
                        .into_iter()
                        .any(|k| o.owns(k, s, p)))
        })
    }

    /// Moves a member towards its target (Kafka's CurrentAssignmentBuilder).
    fn reconcile(
        &mut self,
        id: &str,
        owned: Option<&TaskSet>,
        now: Instant,
        records: &mut Records,
    ) {
        let target = self.target.get(id).cloned().unwrap_or_default();
        let target_epoch = self.assignment_epoch;
        let m = &self.members[id];
        if m.epoch == STATIC_LEAVE_EPOCH {
            return;
        }
        let not_released = |pending: &TaskSet| match owned {
            None => !pending.is_empty(),
            Some(o) => pending.iter().any(|(k, s, p)| o.contains(k, s, p)),
        };
        match m.state {
            MemberState::Stable if m.epoch == target_epoch => return,
            MemberState::UnrevokedTasks if not_released(&m.revoking) => return,
            _ => {}
        }
        let mut kept = TaskSet::default();
        let mut revoke = TaskSet::default();
        let mut added = TaskSet::default();
        let mut unreleased = false;
        for (k, s, p) in m.assigned.iter() {
            match target.contains(k, s, p) {
                true => kept.insert(k, s, p),
                false => revoke.insert(k, s, p),
            }
        }
        for (k, s, p) in target.iter() {
            if m.assigned.contains(k, s, p) {
                continue;
            }
            if self.unreleased(id, k, s, p) {
                unreleased = true;
            } else {
                added.insert(k, s, p);
            }
        }
        let (epoch, state, assigned, revoking) = if !revoke.is_empty() && not_released(&revoke) {
            (m.epoch, MemberState::UnrevokedTasks, kept, revoke)
        } else {
            let mut assigned = kept;
            for (k, s, p) in added.iter() {
                assigned.insert(k, s, p);
            }
            let state = match unreleased {
                true => MemberState::UnreleasedTasks,
                false => MemberState::Stable,
            };
            (target_epoch, state, assigned, TaskSet::default())
        };
        let timeout = Duration::from_millis(m.meta.rebalance_timeout_ms.max(0) as u64);
        let m = self.members.get_mut(id).expect("present");
        if epoch == m.epoch && state == m.state && assigned == m.assigned && revoking == m.revoking
        {
            return;
        }
        if epoch != m.epoch {
            m.previous_epoch = m.epoch;
            m.epoch = epoch;
        }
        if state == MemberState::UnrevokedTasks && m.state != state {
            m.revoke_deadline = Some(now + timeout);
        } else if state != MemberState::UnrevokedTasks {
            m.revoke_deadline = None;
        }
        m.state = state;
        // Tasks kept keep the epoch they were given at; new ones get this one.
        let mut epochs = TaskEpochs::new();
        for (s, ps) in assigned.active.iter().chain(&revoking.active) {
            for p in ps {
                let key = (s.clone(), *p);
                let given = m.active_epochs.get(&key).copied().unwrap_or(epoch);
                epochs.insert(key, given);
            }
        }
        m.active_epochs = epochs;
        m.assigned = assigned;
        m.revoking = revoking;
        records.push((
            member_key(&self.id, id, 22),
            Some(m.current_value().encode()),
        ));
    }

    /// Every member's endpoint and the input partitions of its tasks.
    fn endpoints(&self, topics: &Topics) -> Vec<EndpointPartitions> {
        let Some(t) = &self.topology else {
            return Vec::new();
        };
        let partitions = |tasks: &[&task_assignor::Tasks]| -> Vec<(String, Vec<i32>)> {
            let mut by_topic: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
            for s in &t.subtopologies {
                let inputs = s
                    .source_topics
                    .iter()
                    .chain(s.repartition_source_topics.iter().map(|r| &r.name));
                for topic in inputs {
                    let count = topics.get(topic).map_or(0, |m| m.partitions);
                    for ps in tasks.iter().filter_map(|t| t.get(&s.id)) {
                        let entry = by_topic.entry(topic.clone()).or_default();
                        entry.extend(ps.iter().filter(|p| **p < count));
                    }
                }
            }
            by_topic
                .into_iter()
                .filter(|(_, ps)| !ps.is_empty())
                .map(|(t, ps)| (t, ps.into_iter().collect()))
                .collect()
        };
        self.members
            .values()
            .filter_map(|m| {
                let endpoint = m.meta.user_endpoint.clone()?;
                Some(EndpointPartitions {
                    endpoint,
                    active: partitions(&[&m.assigned.active]),
                    standby: partitions(&[&m.assigned.standby, &m.assigned.warmup]),
                })
            })
            .collect()
    }

    /// Members whose session lapsed or that did not revoke in time.
    pub(crate) fn expired(&self, now: Instant, cfg: &StreamsGroupConfig) -> Vec<String> {
        self.members
            .values()
            .filter(|m| {
                now.duration_since(m.last_seen) > cfg.session_timeout
                    || m.revoke_deadline.is_some_and(|d| now >= d)
            })
            .map(|m| m.id.clone())
            .collect()
    }

    /// OffsetCommit by a member (Kafka's StreamsGroup.validateOffsetCommit):
    /// at its epoch, or at an older one for a task it has held active since.
    pub(crate) fn check_commit(
        &self,
        member_id: &str,
        epoch: i32,
        version: Option<i16>,
        partitions: &[(String, i32)],
    ) -> Result<(), CoordinatorError> {
        if epoch < 0 && self.members.is_empty() {
            return Ok(());
        }
        if version.is_none() && epoch == -1 && member_id.is_empty() {
            return Ok(());
        }
        let m = self
            .members
            .get(member_id)
            .ok_or(CoordinatorError::UnknownMemberId)?;
        if version.is_some_and(|v| v < 9) {
            return Err(CoordinatorError::UnsupportedVersion(
                "OffsetCommit version 9 or above must be used by members using the streams group protocol".into(),
            ));
        }
        if epoch == m.epoch {
            return Ok(());
        }
        if epoch > m.epoch {
            return Err(CoordinatorError::StaleMemberEpoch);
        }
        let held = partitions.iter().all(|(topic, p)| {
            self.subtopology_of(topic).is_some_and(|s| {
                m.owns(Kind::Active, s, *p)
                    && m.active_epochs
                        .get(&(s.to_string(), *p))
                        .is_some_and(|given| *given <= epoch)
            })
        });
        match held {
            true => Ok(()),
            false => Err(CoordinatorError::StaleMemberEpoch),
        }
    }

    /// OffsetFetch by a member: it must be one, at its epoch.
    pub(crate) fn check_fetch(&self, member_id: &str, epoch: i32) -> Result<(), CoordinatorError> {
        let m = self
            .members
            .get(member_id)
            .ok_or(CoordinatorError::UnknownMemberId)?;
        match m.epoch == epoch {
            true => Ok(()),
            false => Err(CoordinatorError::StaleMemberEpoch),
        }
    }

    /// Tombstones of every record of the group, for deleting it (Kafka's order).
    pub(crate) fn tombstones(&self) -> Records {
        let mut out = Records::new();
        for key in [22, 21] {
            for id in self.members.keys() {
                out.push((member_key(&self.id, id, key), None));
            }
        }
        out.push((
            RecordKey::StreamsTargetAssignment {
                group: self.id.clone(),
            },
            None,
        ));
        for id in self.members.keys() {
            out.push((member_key(&self.id, id, 19), None));
        }
        out.push((self.group_key(), None));
        out.push((
            RecordKey::StreamsTopology {
                group: self.id.clone(),
            },
            None,
        ));
        out
    }

    // Replay of the records above.

    pub(crate) fn restore_group(&mut self, v: StreamsGroupValue) {
        self.epoch = v.epoch;
        self.metadata_hash = v.metadata_hash;
        self.validated_topology_epoch = v.validated_topology_epoch;
        self.assignment_configs = v.assignment_configs;
    }

    pub(crate) fn restore_topology(&mut self, t: Option<Topology>) {
        self.topology = t;
    }

    pub(crate) fn restore_member(&mut self, id: &str, v: Option<StreamsMemberValue>, now: Instant) {
        match v {
            Some(v) => {
                self.members
                    .entry(id.to_string())
                    .or_insert_with(|| Member::new(id.to_string(), now))
                    .meta = v;
            }
            None => {
                self.members.remove(id);
            }
        }
    }

    pub(crate) fn restore_target(&mut self, id: &str, v: Option<TaskSet>) {
        match v {
            Some(v) => self.target.insert(id.to_string(), v),
            None => self.target.remove(id),
        };
    }

    pub(crate) fn restore_assignment_epoch(&mut self, epoch: Option<i32>) {
        self.assignment_epoch = epoch.unwrap_or(-1);
    }

    pub(crate) fn restore_current(&mut self, id: &str, v: StreamsCurrentValue, now: Instant) {
        let m = self
            .members
            .entry(id.to_string())
            .or_insert_with(|| Member::new(id.to_string(), now));
        m.epoch = v.member_epoch;
        m.previous_epoch = v.previous_member_epoch;
        m.state = MemberState::from_code(v.state);
        m.assigned = v.assigned;
        m.revoking = v.revoking;
        m.active_epochs = v.active_epochs;
    }

    /// After replay: fresh timers, so a restart costs no member its session.
    pub(crate) fn finish_restore(&mut self, now: Instant) {
        for m in self.members.values_mut() {
            m.last_seen = now;
            if m.state == MemberState::UnrevokedTasks {
                let timeout = Duration::from_millis(m.meta.rebalance_timeout_ms.max(0) as u64);
                m.revoke_deadline = Some(now + timeout);
            }
        }
    }
}

/// Owned tasks must be tasks of the topology.
fn check_owned(owned: &TaskSet, tasks: &BTreeMap<String, i32>) -> Result<(), CoordinatorError> {
    for (_, s, p) in owned.iter() {
        let Some(n) = tasks.get(s) else {
            return Err(CoordinatorError::InvalidRequest(format!(
                "Subtopology {s} does not exist in the topology."
            )));
        };
        if p < 0 || p >= *n {
            return Err(CoordinatorError::InvalidRequest(format!(
                "Task {p} for subtopology {s} is invalid. Number of tasks for this subtopology: {n}"
            )));
        }
    }
    Ok(())
}

/// The key of a member's record: 19 metadata, 21 target, 22 current assignment.
fn member_key(group: &str, member: &str, kind: u8) -> RecordKey {
    let (group, member) = (group.to_string(), member.to_string());
    match kind {
        19 => RecordKey::StreamsMember { group, member },
        21 => RecordKey::StreamsTargetMember { group, member },
        _ => RecordKey::StreamsCurrentAssignment { group, member },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use uuid::Uuid;

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::coordinator::consumer::TopicMeta;
    use crate::coordinator::group::Group;
    use crate::coordinator::streams_records::{Subtopology, TopicInfo};

    fn topic(n: u128, partitions: i32) -> TopicMeta {
        TopicMeta {
            id: Uuid::from_u128(n),
            partitions,
            internal: false,
        }
    }

    /// Kafka Streams' word count: subtopology 0 reads `in` and writes the
    /// repartition topic that subtopology 1 reads and counts into a store.
    fn word_count() -> Topology {
        Topology {
            epoch: 0,
            subtopologies: vec![
                Subtopology {
                    id: "0".into(),
                    source_topics: vec!["in".into()],
                    repartition_sink_topics: vec!["app-r-repartition".into()],
                    ..Subtopology::default()
                },
                Subtopology {
                    id: "1".into(),
                    repartition_source_topics: vec![TopicInfo {
                        name: "app-r-repartition".into(),
                        ..TopicInfo::default()
                    }],
                    changelog_topics: vec![TopicInfo {
                        name: "app-counts-changelog".into(),
                        configs: vec![("cleanup.policy".into(), "compact".into())],
                        ..TopicInfo::default()
                    }],
                    ..Subtopology::default()
                },
            ],
        }
    }

    struct Harness {
        group: StreamsGroup,
        clock: Arc<ManualClock>,
        topics: Topics,
        cfg: StreamsGroupConfig,
        log: Records,
    }

    impl Harness {
        fn new(topics: &[(&str, i32)]) -> Harness {
            let clock = ManualClock::new(1_700_000_000_000);
            let mut h = Harness {
                group: StreamsGroup::new("g", clock.now_ms()),
                clock,
                topics: Topics::new(),
                cfg: StreamsGroupConfig {
                    initial_rebalance_delay: Duration::ZERO,
                    assignment_interval: Duration::ZERO,
                    ..Default::default()
                },
                log: Vec::new(),
            };
            for (name, partitions) in topics {
                h.create(name, *partitions);
            }
            h
        }

        fn create(&mut self, name: &str, partitions: i32) {
            let n = self.topics.len() as u128 + 1;
            self.topics.insert(name.to_string(), topic(n, partitions));
        }

        fn send(&mut self, p: HeartbeatParams) -> Result<HeartbeatResult, CoordinatorError> {
            validate("g", &p)?;
            let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
            let mut records = Vec::new();
            let r = self
                .group
                .heartbeat(p, now, now_ms, &self.topics, &self.cfg, &mut records);
            self.log.extend(records);
            r
        }

        fn join(&mut self, id: &str, process: &str) -> HeartbeatResult {
            self.send(HeartbeatParams {
                member_id: id.into(),
                member_epoch: 0,
                endpoint_information_epoch: -1,
                rebalance_timeout_ms: 30_000,
                topology: Some(word_count()),
                owned: Some(TaskSet::default()),
                process_id: Some(process.into()),
                client_tags: Some(Vec::new()),
                ..HeartbeatParams::default()
            })
            .unwrap()
        }

        /// A heartbeat reporting `owned`, or nothing.
        fn beat(&mut self, id: &str, epoch: i32, owned: Option<&TaskSet>) -> HeartbeatResult {
            self.send(HeartbeatParams {
                member_id: id.into(),
                member_epoch: epoch,
                endpoint_information_epoch: -1,
                rebalance_timeout_ms: -1,
                owned: owned.cloned(),
                ..HeartbeatParams::default()
            })
            .unwrap()
        }
    }

    fn actives(t: &TaskSet) -> usize {
        t.active.values().map(BTreeSet::len).sum()
    }

    #[test]
    fn a_topology_missing_its_source_topic_is_not_ready_and_assigns_nothing() {
        let mut h = Harness::new(&[]);
        let r = h.join("a", "p1");
        assert_eq!(r.status[0].0, MISSING_SOURCE_TOPICS, "{r:?}");
        assert_eq!(r.status[0].1, "Source topics in are missing.");
        assert_eq!(r.assignment, Some(TaskSet::default()));
        assert!(r.create.is_empty());
        assert_eq!(h.group.state(), "NotReady");
    }

    #[test]
    fn missing_internal_topics_are_asked_for_with_the_partitions_the_topology_needs() {
        let mut h = Harness::new(&[("in", 3)]);
        let r = h.join("a", "p1");
        assert_eq!(r.status[0].0, MISSING_INTERNAL_TOPICS, "{r:?}");
        let mut create = r.create.clone();
        create.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(
            create,
            vec![
                NewTopic {
                    name: "app-counts-changelog".into(),
                    partitions: 3,
                    replication_factor: -1,
                    configs: vec![("cleanup.policy".into(), "compact".into())],
                },
                NewTopic {
                    name: "app-r-repartition".into(),
                    partitions: 3,
                    replication_factor: -1,
                    configs: vec![],
                },
            ]
        );
        assert!(actives(r.assignment.as_ref().unwrap()) == 0);
        // Once they exist the next heartbeat bumps the epoch and assigns all six tasks.
        let epoch = h.group.epoch;
        h.create("app-counts-changelog", 3);
        h.create("app-r-repartition", 3);
        let r = h.beat("a", r.member_epoch, Some(&TaskSet::default()));
        assert!(r.status.is_empty(), "{r:?}");
        assert_eq!(h.group.epoch, epoch + 1);
        assert_eq!(r.member_epoch, h.group.epoch);
        assert_eq!(actives(r.assignment.as_ref().unwrap()), 6);
        assert_eq!(h.group.state(), "Stable");
    }

    #[test]
    fn an_internal_topic_with_the_wrong_partition_count_is_reported() {
        let mut h = Harness::new(&[
            ("in", 3),
            ("app-r-repartition", 2),
            ("app-counts-changelog", 3),
        ]);
        let r = h.join("a", "p1");
        assert_eq!(r.status[0].0, INCORRECTLY_PARTITIONED_TOPICS, "{r:?}");
        assert_eq!(
            r.status[0].1,
            "Existing topic app-r-repartition has different number of partitions: expected 3, found 2"
        );
    }

    fn ready() -> Harness {
        Harness::new(&[
            ("in", 3),
            ("app-r-repartition", 3),
            ("app-counts-changelog", 3),
        ])
    }

    #[test]
    fn tasks_move_to_a_new_member_only_after_the_old_owner_revokes_them() {
        let mut h = ready();
        let a = h.join("a", "p1");
        let a_all = a.assignment.clone().unwrap();
        assert_eq!(actives(&a_all), 6);
        let b = h.join("b", "p2");
        // b is at the new epoch but gets nothing a still holds.
        assert_eq!(actives(b.assignment.as_ref().unwrap()), 0);
        assert_eq!(h.group.state(), "Reconciling");
        // a is told to keep three and stays at its epoch until it reports the rest gone.
        let a2 = h.beat("a", a.member_epoch, Some(&a_all));
        let a_kept = a2.assignment.clone().unwrap();
        assert_eq!(actives(&a_kept), 3);
        assert_eq!(a2.member_epoch, a.member_epoch);
        let b2 = h.beat("b", b.member_epoch, Some(&TaskSet::default()));
        assert_eq!(b2.assignment, None, "nothing released yet");
        let a3 = h.beat("a", a.member_epoch, Some(&a_kept));
        assert_eq!(a3.member_epoch, h.group.epoch);
        let b3 = h.beat("b", b.member_epoch, Some(&TaskSet::default()));
        let b_tasks = b3.assignment.unwrap();
        assert_eq!(actives(&b_tasks), 3);
        for (k, s, p) in b_tasks.iter() {
            assert!(!a_kept.contains(k, s, p), "{s}_{p} has two owners");
        }
        h.beat("b", b3.member_epoch, Some(&b_tasks));
        assert_eq!(h.group.state(), "Stable");
    }

    #[test]
    fn standbys_are_assigned_on_other_processes_when_configured() {
        let mut h = ready();
        h.cfg.num_standby_replicas = 1;
        let a = h.join("a", "p1");
        let b = h.join("b", "p2");
        let a_all = a.assignment.unwrap();
        let a2 = h
            .beat("a", a.member_epoch, Some(&a_all))
            .assignment
            .unwrap();
        h.beat("a", a.member_epoch, Some(&a2));
        let b2 = h.beat("b", b.member_epoch, Some(&TaskSet::default()));
        let b_tasks = b2.assignment.unwrap();
        let a_target = h.group.target_of("a").unwrap().clone();
        for (k, s, p) in b_tasks.iter() {
            if k == Kind::Standby {
                assert!(
                    a_target.contains(Kind::Active, s, p),
                    "standby {s}_{p} of a task b runs"
                );
            }
        }
        assert!(!a_target.standby.is_empty() && !b_tasks.standby.is_empty());
    }

    #[test]
    fn a_leaving_member_frees_its_tasks_and_bumps_the_epoch() {
        let mut h = ready();
        let a = h.join("a", "p1");
        h.beat("a", a.member_epoch, a.assignment.as_ref());
        let b = h.join("b", "p2");
        let epoch = h.group.epoch;
        let left = h.beat("b", LEAVE_EPOCH, None);
        assert_eq!(left.member_epoch, LEAVE_EPOCH);
        assert_eq!(h.group.epoch, epoch + 1);
        let r = h.beat("a", a.member_epoch, a.assignment.as_ref());
        assert_eq!(r.member_epoch, h.group.epoch);
        assert!(h
            .send(HeartbeatParams {
                member_id: "b".into(),
                member_epoch: b.member_epoch,
                ..HeartbeatParams::default()
            })
            .is_err_and(|e| e == CoordinatorError::UnknownMemberId));
    }

    #[test]
    fn a_changed_topology_is_refused_and_bad_requests_get_kafkas_errors() {
        let mut h = ready();
        h.join("a", "p1");
        let mut other = word_count();
        other.subtopologies[0].source_topics.push("more".into());
        let p = HeartbeatParams {
            member_id: "b".into(),
            member_epoch: 0,
            rebalance_timeout_ms: 1000,
            topology: Some(other),
            owned: Some(TaskSet::default()),
            ..HeartbeatParams::default()
        };
        assert_eq!(
            h.send(p.clone()).unwrap_err(),
            CoordinatorError::InvalidRequest("Topology updates are not supported yet.".into())
        );
        assert!(
            !h.group.members.contains_key("b"),
            "a refused member stays out"
        );
        let refused = [
            HeartbeatParams {
                member_id: String::new(),
                ..p.clone()
            },
            HeartbeatParams {
                owned: None,
                ..p.clone()
            },
            HeartbeatParams {
                topology: None,
                ..p.clone()
            },
            HeartbeatParams {
                member_epoch: 3,
                ..p.clone()
            },
            HeartbeatParams {
                member_epoch: -3,
                ..p.clone()
            },
        ];
        for bad in refused {
            assert!(matches!(
                h.send(bad),
                Err(CoordinatorError::InvalidRequest(_))
            ));
        }
        assert!(matches!(
            h.beat_err("a", 99),
            Err(CoordinatorError::FencedMemberEpoch)
        ));
    }

    impl Harness {
        fn beat_err(&mut self, id: &str, epoch: i32) -> Result<HeartbeatResult, CoordinatorError> {
            self.send(HeartbeatParams {
                member_id: id.into(),
                member_epoch: epoch,
                rebalance_timeout_ms: -1,
                ..HeartbeatParams::default()
            })
        }
    }

    #[test]
    fn offset_commits_need_the_members_epoch_or_a_task_held_since_theirs() {
        let mut h = ready();
        let a = h.join("a", "p1");
        let e = a.member_epoch;
        let g = &h.group;
        assert_eq!(g.check_commit("a", e, Some(9), &[("in".into(), 0)]), Ok(()));
        assert_eq!(
            g.check_commit("a", e + 1, Some(9), &[("in".into(), 0)]),
            Err(CoordinatorError::StaleMemberEpoch)
        );
        assert!(matches!(
            g.check_commit("a", e, Some(8), &[]),
            Err(CoordinatorError::UnsupportedVersion(_))
        ));
        assert_eq!(
            g.check_commit("x", e, Some(9), &[]),
            Err(CoordinatorError::UnknownMemberId)
        );
        // An older epoch is fine for a task it has run since then, not before.
        assert_eq!(
            g.check_commit("a", e - 1, Some(9), &[("in".into(), 1)]),
            Err(CoordinatorError::StaleMemberEpoch)
        );
        h.join("b", "p2");
        let a2 = h.beat("a", e, a.assignment.as_ref());
        let kept = a2.assignment.unwrap();
        let a3 = h.beat("a", e, Some(&kept));
        assert!(a3.member_epoch > e);
        let g = &h.group;
        let (s, ps) = kept.active.iter().next().unwrap();
        let topic = if s == "0" { "in" } else { "app-r-repartition" };
        let p = *ps.iter().next().unwrap();
        assert_eq!(
            g.check_commit("a", e, Some(9), &[(topic.into(), p)]),
            Ok(())
        );
        assert_eq!(
            g.check_commit("a", e - 1, Some(9), &[("other".into(), 1)]),
            Err(CoordinatorError::StaleMemberEpoch)
        );
    }

    #[test]
    fn expired_sessions_are_found() {
        let mut h = ready();
        h.join("a", "p1");
        h.clock
            .advance(h.cfg.session_timeout + Duration::from_millis(1));
        assert_eq!(
            h.group.expired(h.clock.now(), &h.cfg),
            vec!["a".to_string()]
        );
    }

    #[test]
    fn a_new_group_delays_its_first_assignment() {
        let mut h = ready();
        h.cfg.initial_rebalance_delay = Duration::from_secs(3);
        let a = h.join("a", "p1");
        assert_eq!(a.status[0].0, ASSIGNMENT_DELAYED);
        assert_eq!(actives(a.assignment.as_ref().unwrap()), 0);
        h.clock.advance(Duration::from_secs(3));
        let r = h.beat("a", a.member_epoch, Some(&TaskSet::default()));
        assert!(r.status.is_empty(), "{r:?}");
        assert_eq!(actives(r.assignment.as_ref().unwrap()), 6);
    }

    #[test]
    fn changes_within_the_assignment_interval_wait_for_it() {
        let mut h = ready();
        h.cfg.assignment_interval = Duration::from_secs(1);
        let a = h.join("a", "p1");
        assert_eq!(actives(a.assignment.as_ref().unwrap()), 6);
        let b = h.join("b", "p2");
        assert_eq!(b.status[0].0, ASSIGNMENT_DELAYED, "{b:?}");
        assert!(h.group.epoch > h.group.assignment_epoch);
        h.clock.advance(Duration::from_secs(1));
        let b = h.beat("b", b.member_epoch, Some(&TaskSet::default()));
        assert!(b.status.is_empty(), "{b:?}");
        assert_eq!(h.group.assignment_epoch, h.group.epoch);
        assert_eq!(actives(h.group.target_of("b").unwrap()), 3);
    }

    #[test]
    fn replaying_the_records_rebuilds_the_group() {
        let mut h = ready();
        let a = h.join("a", "p1");
        let a_all = a.assignment.clone().unwrap();
        h.join("b", "p2");
        h.beat("a", a.member_epoch, Some(&a_all));
        let mut groups: HashMap<String, Group> = HashMap::new();
        let now = h.clock.now();
        for (key, value) in h.log.clone() {
            crate::coordinator::restore_streams(&mut groups, key, value, now).unwrap();
        }
        let restored = groups["g"].streams.as_ref().unwrap();
        let g = &h.group;
        assert_eq!(
            (restored.epoch, restored.assignment_epoch, restored.state()),
            (g.epoch, g.assignment_epoch, g.state())
        );
        assert_eq!(restored.topology, g.topology);
        assert_eq!(restored.target, g.target);
        for m in g.members() {
            let r = &restored.members[&m.id];
            assert_eq!(
                (r.epoch, r.previous_epoch, r.state),
                (m.epoch, m.previous_epoch, m.state)
            );
            assert_eq!(
                (&r.assigned, &r.revoking, &r.meta, &r.active_epochs),
                (&m.assigned, &m.revoking, &m.meta, &m.active_epochs)
            );
        }
        // Deleting the group leaves nothing to replay.
        for (key, value) in g.tombstones() {
            crate::coordinator::restore_streams(&mut groups, key, value, now).unwrap();
        }
        assert!(!groups.contains_key("g"));
    }
}
