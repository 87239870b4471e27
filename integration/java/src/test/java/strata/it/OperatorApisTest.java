package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeTopicsOptions;
import org.apache.kafka.clients.admin.FeatureMetadata;
import org.apache.kafka.clients.admin.FeatureUpdate;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.QuorumInfo;
import org.apache.kafka.clients.admin.ReplicaInfo;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.UpdateFeaturesOptions;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.ElectionNotNeededException;
import org.apache.kafka.common.errors.InvalidReplicaAssignmentException;
import org.apache.kafka.common.errors.InvalidUpdateVersionException;
import org.apache.kafka.common.errors.NoReassignmentInProgressException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The admin APIs operators' tools probe (DescribeLogDirs, DescribeTopicPartitions, ElectLeaders,
 * DescribeQuorum, partition reassignments, broker configs, feature versions) through the Java Admin client and
 * Kafka's CLI tools, and a consumer of many partitions on fetch sessions.
 */
@Timeout(value = 180, unit = TimeUnit.SECONDS)
class OperatorApisTest {
  static final String LOG_DIRS = "org.apache.kafka.tools.LogDirsCommand";
  static final String METADATA_QUORUM = "org.apache.kafka.tools.MetadataQuorumCommand";
  static final String FEATURES = "org.apache.kafka.tools.FeatureCommand";

  static Admin admin;
  static int node;

  @BeforeAll
  static void setUp() throws Exception {
    admin = Kafka.admin();
    node = admin.describeCluster().nodes().get().iterator().next().id();
  }

  @AfterAll
  static void tearDown() {
    if (admin != null) admin.close(Duration.ofSeconds(5));
  }

  static void produce(String topic, int partitions, int perPartition) throws Exception {
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
      for (int part = 0; part < partitions; part++) {
        for (int i = 0; i < perPartition; i++) {
          p.send(new ProducerRecord<>(topic, part, null, Kafka.utf8("v-" + part + "-" + i)));
        }
      }
      p.flush();
    }
  }

  @Test
  void describeLogDirsReportsEveryPartitionsLocalBytes() throws Exception {
    String t = Kafka.topic("logdirs");
    Kafka.createTopic(admin, t, 3, Map.of());
    produce(t, 2, 50);
    Map<String, LogDirDescription> dirs = admin.describeLogDirs(List.of(node)).allDescriptions().get().get(node);
    assertEquals(2, dirs.size(), "the data directory and the object store: " + dirs.keySet());
    LogDirDescription local = dirs.values().stream().filter(d -> d.totalBytes().isPresent()).findFirst().orElseThrow();
    assertTrue(local.usableBytes().orElseThrow() > 0 && local.usableBytes().getAsLong() <= local.totalBytes().getAsLong());
    Map<TopicPartition, ReplicaInfo> replicas = local.replicaInfos();
    for (int p = 0; p < 3; p++) {
      ReplicaInfo r = replicas.get(new TopicPartition(t, p));
      assertTrue(r != null, "partition " + p + " missing from " + replicas.keySet());
      if (p < 2) {
        assertTrue(r.size() > 50 * 5, "50 records in partition " + p + " but size " + r.size());
      } else {
        assertEquals(0, r.size(), "empty partition");
      }
      assertEquals(0, r.offsetLag());
      assertFalse(r.isFuture());
    }
    LogDirDescription store = dirs.values().stream().filter(d -> d.totalBytes().isEmpty()).findFirst().orElseThrow();
    assertTrue(store.replicaInfos().containsKey(new TopicPartition(t, 0)), "tiered entry lists the partition");
  }

  @Test
  void kafkaLogDirsDescribeShowsEachPartition() throws Exception {
    String t = Kafka.topic("logdirs-cli");
    Kafka.createTopic(admin, t, 2, Map.of());
    produce(t, 2, 10);
    CliToolsTest.Result r = CliToolsTest.ok(CliToolsTest.run(null, LOG_DIRS, "--bootstrap-server", Kafka.bootstrap(),
        "--describe", "--topic-list", t));
    String json = r.lines().stream().filter(l -> l.startsWith("{")).findFirst().orElseThrow(() -> new AssertionError(r.toString()));
    assertTrue(json.contains("\"broker\":" + node), json);
    assertTrue(json.contains("\"partition\":\"" + t + "-0\""), json);
    assertTrue(json.contains("\"partition\":\"" + t + "-1\""), json);
    assertFalse(json.contains("\"error\":\"") , json);
  }

  @Test
  void describeTopicsPagesThroughPartitions() throws Exception {
    String a = Kafka.topic("dtp-a");
    String b = Kafka.topic("dtp-b");
    Kafka.createTopic(admin, a, 5, Map.of());
    Kafka.createTopic(admin, b, 3, Map.of());
    // The Admin client pages with DescribeTopicPartitions' cursor, 2 partitions a response.
    Map<String, TopicDescription> d = admin.describeTopics(List.of(a, b),
        new DescribeTopicsOptions().partitionSizeLimitPerResponse(2)).allTopicNames().get();
    assertEquals(5, d.get(a).partitions().size());
    assertEquals(3, d.get(b).partitions().size());
    for (TopicDescription td : d.values()) {
      for (int i = 0; i < td.partitions().size(); i++) {
        assertEquals(i, td.partitions().get(i).partition());
        assertEquals(node, td.partitions().get(i).leader().id());
        assertEquals(1, td.partitions().get(i).replicas().size());
      }
    }
    ExecutionException e = assertThrows(ExecutionException.class,
        () -> admin.describeTopics(List.of(Kafka.topic("dtp-missing"))).allTopicNames().get());
    assertInstanceOf(UnknownTopicOrPartitionException.class, e.getCause());
  }

  @Test
  void electLeadersAnswersElectionNotNeeded() throws Exception {
    String t = Kafka.topic("elect");
    Kafka.createTopic(admin, t, 2, Map.of());
    Set<TopicPartition> tps = Set.of(new TopicPartition(t, 0), new TopicPartition(t, 1));
    Map<TopicPartition, Optional<Throwable>> r = admin.electLeaders(ElectionType.PREFERRED, tps).partitions().get();
    assertEquals(tps, r.keySet());
    for (Optional<Throwable> err : r.values()) {
      assertInstanceOf(ElectionNotNeededException.class, err.orElseThrow());
    }
    Map<TopicPartition, Optional<Throwable>> missing = admin.electLeaders(ElectionType.PREFERRED,
        Set.of(new TopicPartition(t, 7))).partitions().get();
    assertInstanceOf(UnknownTopicOrPartitionException.class, missing.get(new TopicPartition(t, 7)).orElseThrow());
    // All partitions: those that need no election are left out, as Kafka does.
    assertTrue(admin.electLeaders(ElectionType.PREFERRED, null).partitions().get().isEmpty());
  }

  @Test
  void featuresAreDescribedAndUpdatesCheckedAsKafkasControllerChecksThem() throws Exception {
    FeatureMetadata f = admin.describeFeatures().featureMetadata().get();
    assertEquals(1, f.finalizedFeatures().get("group.version").maxVersionLevel());
    assertEquals(1, f.supportedFeatures().get("group.version").maxVersion());
    assertFalse(f.finalizedFeatures().containsKey("metadata.version"));
    // Checked, not applied: the shared broker keeps the consumer protocol on.
    admin.updateFeatures(Map.of("group.version", new FeatureUpdate((short) 0, FeatureUpdate.UpgradeType.SAFE_DOWNGRADE)),
        new UpdateFeaturesOptions().validateOnly(true)).all().get();
    ExecutionException e = assertThrows(ExecutionException.class, () -> admin.updateFeatures(
        Map.of("group.version", new FeatureUpdate((short) 2, FeatureUpdate.UpgradeType.UPGRADE)),
        new UpdateFeaturesOptions()).all().get());
    assertInstanceOf(InvalidUpdateVersionException.class, e.getCause());
    assertTrue(e.getCause().getMessage().contains("only supports versions [0-1]"), e.getCause().getMessage());
    assertEquals(f.finalizedFeaturesEpoch(), admin.describeFeatures().featureMetadata().get().finalizedFeaturesEpoch());
    CliToolsTest.Result r = CliToolsTest.ok(CliToolsTest.run(null, FEATURES, "--bootstrap-server",
        Kafka.bootstrap(), "describe"));
    assertTrue(r.out().contains("Feature: group.version") && r.out().contains("FinalizedVersionLevel: 1"), r.toString());
  }

  @Test
  void describeMetadataQuorumNamesThisBrokerAsTheOnlyVoter() throws Exception {
    QuorumInfo q = admin.describeMetadataQuorum().quorumInfo().get();
    assertEquals(node, q.leaderId());
    assertEquals(1, q.voters().size());
    assertEquals(node, q.voters().get(0).replicaId());
    assertTrue(q.observers().isEmpty());
    CliToolsTest.Result r = CliToolsTest.ok(CliToolsTest.run(null, METADATA_QUORUM, "--bootstrap-server",
        Kafka.bootstrap(), "describe", "--status"));
    assertTrue(r.out().contains("LeaderId:") && r.out().contains("CurrentVoters:"), r.toString());
  }

  @Test
  void partitionReassignmentsAreNoneAndOnlyTheLeaderIsAccepted() throws Exception {
    String t = Kafka.topic("reassign");
    Kafka.createTopic(admin, t, 1, Map.of());
    TopicPartition tp = new TopicPartition(t, 0);
    assertTrue(admin.listPartitionReassignments().reassignments().get().isEmpty());
    // To the broker that already holds it: nothing to do, success.
    admin.alterPartitionReassignments(Map.of(tp, Optional.of(new NewPartitionReassignment(List.of(node)))))
        .all().get();
    ExecutionException e = assertThrows(ExecutionException.class, () -> admin.alterPartitionReassignments(
        Map.of(tp, Optional.of(new NewPartitionReassignment(List.of(node + 100))))).all().get());
    assertInstanceOf(InvalidReplicaAssignmentException.class, e.getCause());
    e = assertThrows(ExecutionException.class,
        () -> admin.alterPartitionReassignments(Map.of(tp, Optional.empty())).all().get());
    assertInstanceOf(NoReassignmentInProgressException.class, e.getCause());
    assertTrue(admin.listPartitionReassignments(Set.of(tp)).reassignments().get().isEmpty());
  }

  @Test
  void brokerConfigsUseKafkasNamesAndTheValuesInUse() throws Exception {
    ConfigResource r = new ConfigResource(ConfigResource.Type.BROKER, String.valueOf(node));
    Config c = admin.describeConfigs(List.of(r)).all().get().get(r);
    ConfigEntry adv = c.get("advertised.listeners");
    assertEquals("PLAINTEXT://" + Kafka.bootstrap(), adv.value());
    assertEquals(ConfigEntry.ConfigSource.STATIC_BROKER_CONFIG, adv.source());
    assertTrue(adv.isReadOnly());
    assertEquals(String.valueOf(node), c.get("node.id").value());
    assertEquals(String.valueOf(node), c.get("broker.id").value());
    assertEquals("1", c.get("default.replication.factor").value());
    for (String name : List.of("listeners", "log.dirs", "num.partitions", "log.retention.ms", "log.retention.hours",
        "log.segment.bytes", "log.cleaner.min.cleanable.ratio", "compression.type", "message.max.bytes",
        "group.initial.rebalance.delay.ms", "group.min.session.timeout.ms", "group.max.session.timeout.ms",
        "offsets.retention.minutes", "max.incremental.fetch.session.cache.slots")) {
      ConfigEntry e = c.get(name);
      assertTrue(e != null && e.value() != null && !e.value().isEmpty(), "broker config " + name + ": " + e);
    }
    assertEquals("producer", c.get("compression.type").value());
    assertEquals("1000", c.get("max.incremental.fetch.session.cache.slots").value());
    assertNull(c.get("no.such.config"));
  }

  /** The Java consumer fetches with KIP-227 sessions; every record of 200 partitions still arrives. */
  @Test
  void consumerOfManyPartitionsReadsEverythingOverFetchSessions() throws Exception {
    String t = Kafka.topic("sessions");
    int parts = 200;
    Kafka.createTopic(admin, t, parts, Map.of());
    produce(t, parts, 3);
    List<TopicPartition> tps = Kafka.partitions(t, parts);
    Set<String> seen = new HashSet<>();
    try (KafkaConsumer<byte[], byte[]> c = Kafka.consumer()) {
      c.assign(tps);
      c.seekToBeginning(tps);
      long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
      while (seen.size() < parts * 3 && System.nanoTime() < deadline) {
        for (ConsumerRecord<byte[], byte[]> rec : c.poll(Duration.ofMillis(200))) {
          seen.add(Kafka.str(rec.value()));
        }
      }
      assertEquals(parts * 3, seen.size(), "records read");
      // New records on a few partitions reach the consumer through incremental fetches.
      try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
        for (int part : List.of(3, 77, 199)) {
          p.send(new ProducerRecord<>(t, part, null, Kafka.utf8("late-" + part)));
        }
        p.flush();
      }
      deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
      while (seen.size() < parts * 3 + 3 && System.nanoTime() < deadline) {
        for (ConsumerRecord<byte[], byte[]> rec : c.poll(Duration.ofMillis(200))) {
          seen.add(Kafka.str(rec.value()));
        }
      }
      assertTrue(seen.containsAll(List.of("late-3", "late-77", "late-199")), "late records");
      for (int part = 0; part < parts; part++) {
        assertEquals(part == 3 || part == 77 || part == 199 ? 4 : 3, c.position(tps.get(part)));
      }
    }
  }
}
