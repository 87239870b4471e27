#!/usr/bin/env bash
# Strata integration tests with the real Apache Kafka Java client (kafka-clients 4.4.0), Kafka
# Streams 4.4.0 and Kafka's own CLI tools (kafka-tools 4.4.0: TopicCommand, ConsoleProducer,
# ConsoleConsumer, GetOffsetShell, TransactionsCommand), run as JUnit 5 tests by Maven Surefire
# against a freshly started broker.
#
#   integration/java/run.sh                 # builds, starts target/release/strata, runs all tests
#   integration/java/run.sh -Dtest=AdminTest            # extra args go to `mvn test`
#   KEEP_BROKER_DATA=1 integration/java/run.sh          # keep $BROKER_DATA (broker.log) afterwards
#   STRATA_BIN=/path/to/strata integration/java/run.sh  # another binary
#   BOOTSTRAP=host:port integration/java/run.sh         # use an already-running broker instead
#
# Test classes (src/test/java/strata/it/):
#   AdminTest           topics create/describe/list/delete, configs, partitions, deleteRecords, cluster
#   ProduceConsumeTest  1000 keyed records with headers/tombstones, every codec, idempotence, too-large
#   OffsetsTest         ListOffsets earliest/latest/maxTimestamp/forTimestamp, offsetsForTimes, seek
#   LeaderEpochTest     committed offsets carry leader epoch 0; the consumer validates them with
#                       OffsetForLeaderEpoch on resume, and a position past the epoch's end is truncation
#   CliToolsTest        kafka-topics, kafka-console-producer/-consumer, kafka-get-offsets output
#   GroupsTest          consumer groups: 3 members with one crashing (kill -9 / close(0)) mid-stream,
#                       every assignor, static membership, fencing errors, and committed offsets across
#                       kill -9 restarts of a private broker started with the default group settings
#   ConsumerGroupsCliTest  kafka-consumer-groups --list/--describe/--reset-offsets/--delete-offsets/--delete
#   ConsumerProtocolTest  group.protocol=consumer (KIP-848): hand-over on join/leave/SIGKILL of a member JVM,
#                       regex (SubscriptionPattern) subscriptions, Admin and kafka-consumer-groups --describe
#   MixedProtocolTest   classic and consumer-protocol members in one group: online upgrade and downgrade,
#                       a classic member SIGKILLed in a consumer group, each record consumed once
#   TopicConfigsTest    every Kafka topic config via Admin (create, describe with synonyms, incremental alter),
#                       KIP-467 per-record errors in the Java producer, recompressed batches read back
#   OperatorApisTest    describeLogDirs + kafka-log-dirs, describeTopics paged by DescribeTopicPartitions,
#                       electLeaders, describeMetadataQuorum + kafka-metadata-quorum, reassignments, broker
#                       configs, feature versions (Admin and kafka-features), a 200-partition consumer on
#                       fetch sessions
#   CompactionTest      leveled compaction of tiered segments on a private broker (--tier-interval-ms 50):
#                       gaps, original offsets and newest value per key via KafkaConsumer and kafka-console-consumer
#   TransactionsTest    on transactions v2: consume-transform-produce with sendOffsetsToTransaction (aborted
#                       batches included), aborted data per isolation level, fencing, timeout abort of a vanished
#                       producer, an epoch bump per commit and abort, kafka-transactions list / describe /
#                       describe-producers
#   StreamsEosTest      Kafka Streams word count (KTable) under exactly_once_v2 on a private broker: exact
#                       counts, also across kill -9 and restart of the broker mid-run; producers on transactions v2
#   StreamsGroupsTest   Streams 4.4 on group.protocol=streams (KIP-1071): word count under ALOS and EOS with an
#                       instance joining and one leaving (and a broker kill -9 under EOS), broker-created internal
#                       topics, kafka-streams-groups --list/--describe/--reset-offsets/--delete
#   ShareGroupsTest     share groups (KIP-932), KafkaShareConsumer 4.4: five consumers on one partition, RELEASE,
#                       REJECT, lock expiry, the delivery count limit, acknowledgements across a broker kill -9,
#                       kafka-console-share-consumer and kafka-share-groups --list/--describe/--reset-offsets/--delete
#   AclsQuotasTest      kafka-acls add/list/remove, a topic without READ refused and hidden, kafka-configs client
#                       quotas, on a private broker with --authorizer acl
#   BrokerConfigsCliTest  dynamic broker configs: kafka-configs --entity-type brokers --entity-name/--entity-default
#                       --alter/--describe, Admin describeConfigs sources and synonyms, kept across a restart
#   AclsSaslTest        ACLs for SASL PLAIN principals (super user admin, user alice) on a private SASL broker
#   integration/java/run.sh -Dtest=GroupsTest#assignorSplitsFourPartitionsTwoAndTwo   # one test
# The shared broker runs with GROUP_ARGS (default: no initial rebalance delay, 1s minimum session
# timeout, consumer-protocol heartbeats every 500 ms and 3 s sessions) so group tests are fast; members then use session.timeout.ms=GROUP_SESSION_TIMEOUT_MS (3000).
# GroupsTest#committedOffsetsSurviveBrokerKill9 starts its own broker with Kafka's defaults.
# Needs Java 17+ and Maven 3.8+ with access to Maven Central (first run downloads dependencies).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
cd "$HERE"

started=$(date +%s)
MVN=(mvn -B -ntp -Dstyle.color=never)

echo "== building test project (kafka-clients, kafka-tools, JUnit)"
# (Debian's Maven prints bare ANSI resets even with -B; drop them so our lines stay readable)
"${MVN[@]}" -q -DskipTests package | sed 's/\x1b\[0m//g'

if [ -n "${BOOTSTRAP:-}" ]; then
  echo "== using broker at BOOTSTRAP=$BOOTSTRAP"
else
  echo "== starting $STRATA_BIN"
  # shellcheck disable=SC2086
  start_broker ${GROUP_ARGS---group-initial-rebalance-delay-ms 0 --group-min-session-timeout-ms 1000 --group-consumer-heartbeat-interval-ms 500 --group-consumer-session-timeout-ms 3000} ${STRATA_ARGS:-}
  export GROUP_SESSION_TIMEOUT_MS="${GROUP_SESSION_TIMEOUT_MS:-3000}"
  echo "== broker pid $BROKER_PID at $BOOTSTRAP, data in $BROKER_DATA"
fi

export STRATA_BIN  # for tests that start (and kill -9) their own broker
rc=0
"${MVN[@]}" test -DBOOTSTRAP="$BOOTSTRAP" "$@" || rc=$?

if [ -n "${BROKER_PID:-}" ] && ! kill -0 "$BROKER_PID" 2>/dev/null; then
  echo "!! broker process $BROKER_PID is no longer running" >&2
  if [ "$rc" = 0 ]; then rc=1; fi
fi
if [ "$rc" != 0 ] && [ -n "${BROKER_DATA:-}" ] && [ -f "$BROKER_DATA/broker.log" ]; then
  echo "== last 40 lines of $BROKER_DATA/broker.log" >&2
  tail -n 40 "$BROKER_DATA/broker.log" >&2 || true
fi
echo  # Maven's trailing ANSI resets end up on this line
echo "== java integration: $([ "$rc" = 0 ] && echo PASSED || echo "FAILED (rc=$rc)") in $(( $(date +%s) - started ))s"
exit "$rc"
