package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.CreateTopicsOptions;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetOutOfRangeException;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.InvalidTopicException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.requests.AlterConfigsRequest;
import org.apache.kafka.common.requests.AlterConfigsResponse;
import org.apache.kafka.common.requests.ApiError;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

@Timeout(value = 90, unit = TimeUnit.SECONDS)
class AdminTest {
  static Admin admin;

  @BeforeAll
  static void setUp() {
    admin = Kafka.admin();
  }

  @AfterAll
  static void tearDown() {
    if (admin != null) admin.close(Duration.ofSeconds(5));
  }

  static Node onlyNode() throws Exception {
    Collection<Node> nodes = admin.describeCluster().nodes().get();
    assertEquals(1, nodes.size(), "nodes: " + nodes);
    return nodes.iterator().next();
  }

  static Map<String, ConfigEntry> topicConfig(String topic) throws Exception {
    ConfigResource r = new ConfigResource(ConfigResource.Type.TOPIC, topic);
    Config c = admin.describeConfigs(List.of(r)).all().get().get(r);
    assertNotNull(c, "no config returned for " + topic);
    return c.entries().stream().collect(Collectors.toMap(ConfigEntry::name, e -> e));
  }

  static void assertConfig(Map<String, ConfigEntry> cfg, String name, String value) {
    ConfigEntry e = cfg.get(name);
    assertNotNull(e, name + " missing from DescribeConfigs; got " + cfg.keySet());
    assertEquals(value, e.value(), name);
  }

  @Test
  void describeClusterHasOneNodeWhichIsController() throws Exception {
    DescribeClusterResult dc = admin.describeCluster();
    Node node = onlyNode();
    Node controller = dc.controller().get();
    assertNotNull(controller, "controller");
    assertEquals(node.id(), controller.id(), "controller id");
    String clusterId = dc.clusterId().get();
    assertNotNull(clusterId, "clusterId");
    assertFalse(clusterId.isBlank(), "clusterId");
    String[] hp = Kafka.bootstrap().split(":");
    assertEquals(Integer.parseInt(hp[1]), node.port(), "advertised port");
  }

  @Test
  void createTopicWithConfigsThenDescribeAndList() throws Exception {
    String t = Kafka.topic("admin-create");
    Kafka.createTopic(admin, t, 3, Map.of("cleanup.policy", "compact", "retention.ms", "12345"));

    assertTrue(admin.listTopics().names().get().contains(t), "listTopics contains " + t);

    Node node = onlyNode();
    TopicDescription d = admin.describeTopics(List.of(t)).allTopicNames().get().get(t);
    assertEquals(t, d.name());
    assertFalse(d.isInternal());
    assertNotNull(d.topicId(), "topicId");
    assertEquals(3, d.partitions().size(), "partition count");
    for (int i = 0; i < 3; i++) {
      TopicPartitionInfo p = d.partitions().get(i);
      assertEquals(i, p.partition());
      assertNotNull(p.leader(), "leader of partition " + i);
      assertEquals(node.id(), p.leader().id(), "leader of partition " + i);
      assertEquals(List.of(node.id()), p.replicas().stream().map(Node::id).toList(), "replicas");
      assertEquals(List.of(node.id()), p.isr().stream().map(Node::id).toList(), "isr");
    }

    Map<String, ConfigEntry> cfg = topicConfig(t);
    assertConfig(cfg, "cleanup.policy", "compact");
    assertConfig(cfg, "retention.ms", "12345");
    assertEquals(ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, cfg.get("cleanup.policy").source());
    assertEquals(ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, cfg.get("retention.ms").source());
    assertFalse(cfg.get("retention.ms").isDefault());
    // Kafka's defaults for the topic configs that were not set.
    assertConfig(cfg, "retention.bytes", "-1");
    assertConfig(cfg, "segment.bytes", "1073741824");
    assertConfig(cfg, "segment.ms", "604800000");
    assertConfig(cfg, "max.message.bytes", "1048588");
    assertConfig(cfg, "message.timestamp.type", "CreateTime");
    assertConfig(cfg, "min.compaction.lag.ms", "0");
    assertConfig(cfg, "delete.retention.ms", "86400000");
    assertTrue(cfg.get("retention.bytes").isDefault() || cfg.get("retention.bytes").source()
        != ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, "retention.bytes must not be a topic override");

    // A second create of the same name is rejected.
    ExecutionException e = assertThrows(ExecutionException.class,
        () -> admin.createTopics(List.of(new NewTopic(t, 1, (short) 1))).all().get());
    assertInstanceOf(TopicExistsException.class, e.getCause(), "cause: " + e.getCause());
  }

  @Test
  void describeConfigsOfTopicWithoutOverrides() throws Exception {
    String t = Kafka.topic("admin-defaults");
    Kafka.createTopic(admin, t, 1, Map.of());
    Map<String, ConfigEntry> cfg = topicConfig(t);
    assertConfig(cfg, "cleanup.policy", "delete");
    assertConfig(cfg, "retention.ms", "604800000");
    assertConfig(cfg, "retention.bytes", "-1");
    assertConfig(cfg, "max.message.bytes", "1048588");
    for (ConfigEntry e : cfg.values()) {
      assertTrue(e.source() != ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
          "no overrides were set but " + e.name() + " has source " + e.source());
    }
  }

  @Test
  void validateOnlyCreateDoesNotCreate() throws Exception {
    String t = Kafka.topic("admin-validate");
    admin.createTopics(List.of(new NewTopic(t, 2, (short) 1)), new CreateTopicsOptions().validateOnly(true))
        .all().get();
    assertFalse(admin.listTopics().names().get().contains(t), "validateOnly must not create " + t);
    // and the name is still free
    Kafka.createTopic(admin, t, 2, Map.of());
    assertTrue(admin.listTopics().names().get().contains(t));
  }

  static List<String> invalidNames() {
    return List.of("bad/name", "..", ".", "has space", "x".repeat(250));
  }

  @ParameterizedTest
  @MethodSource("invalidNames")
  void invalidTopicNameIsRejected(String name) throws Exception {
    ExecutionException e = assertThrows(ExecutionException.class,
        () -> admin.createTopics(List.of(new NewTopic(name, 1, (short) 1))).all().get());
    assertInstanceOf(InvalidTopicException.class, e.getCause(), "cause: " + e.getCause());
    assertFalse(admin.listTopics().names().get().contains(name));
  }

  @Test
  void incrementalAlterConfigsSetAndDelete() throws Exception {
    String t = Kafka.topic("admin-incr");
    Kafka.createTopic(admin, t, 1, Map.of("cleanup.policy", "compact", "retention.ms", "12345"));
    ConfigResource r = new ConfigResource(ConfigResource.Type.TOPIC, t);
    Map<ConfigResource, Collection<AlterConfigOp>> ops = Map.of(r, List.of(
        new AlterConfigOp(new ConfigEntry("retention.ms", "99999"), AlterConfigOp.OpType.SET),
        new AlterConfigOp(new ConfigEntry("max.message.bytes", "4096"), AlterConfigOp.OpType.SET),
        new AlterConfigOp(new ConfigEntry("cleanup.policy", null), AlterConfigOp.OpType.DELETE)));
    admin.incrementalAlterConfigs(ops).all().get();

    Map<String, ConfigEntry> cfg = topicConfig(t);
    assertConfig(cfg, "retention.ms", "99999");
    assertConfig(cfg, "max.message.bytes", "4096");
    assertConfig(cfg, "cleanup.policy", "delete");
    assertTrue(cfg.get("cleanup.policy").source() != ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
        "deleted override still reported as topic config");
    assertEquals(ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, cfg.get("retention.ms").source());
  }

  @Test
  void legacyAlterConfigsReplacesAllOverrides() throws Exception {
    // The 4.x Admin no longer has alterConfigs(); send AlterConfigs (API key 33) directly.
    String t = Kafka.topic("admin-legacy");
    Kafka.createTopic(admin, t, 1, Map.of("cleanup.policy", "compact", "retention.ms", "12345"));
    ConfigResource r = new ConfigResource(ConfigResource.Type.TOPIC, t);
    AlterConfigsRequest.Config cfgReq = new AlterConfigsRequest.Config(List.of(
        new AlterConfigsRequest.ConfigEntry("retention.ms", "777"),
        new AlterConfigsRequest.ConfigEntry("max.message.bytes", "2048")));
    AlterConfigsResponse resp = (AlterConfigsResponse) Kafka.rawRequest(ApiKeys.ALTER_CONFIGS,
        new AlterConfigsRequest.Builder(Map.of(r, cfgReq), false));
    ApiError err = resp.errors().get(r);
    assertNotNull(err, "no result for " + r + " in " + resp.data());
    assertEquals(Errors.NONE, err.error(), "AlterConfigs error: " + err);

    Map<String, ConfigEntry> cfg = topicConfig(t);
    assertConfig(cfg, "retention.ms", "777");
    assertConfig(cfg, "max.message.bytes", "2048");
    // legacy AlterConfigs replaces the whole set: cleanup.policy falls back to its default
    assertConfig(cfg, "cleanup.policy", "delete");
  }

  @Test
  void createPartitionsGrowsTopic() throws Exception {
    String t = Kafka.topic("admin-grow");
    Kafka.createTopic(admin, t, 3, Map.of());
    admin.createPartitions(Map.of(t, NewPartitions.increaseTo(5))).all().get();
    TopicDescription d = admin.describeTopics(List.of(t)).allTopicNames().get().get(t);
    assertEquals(5, d.partitions().size(), "partitions after createPartitions");
    Node node = onlyNode();
    for (TopicPartitionInfo p : d.partitions()) assertEquals(node.id(), p.leader().id());

    // the new partitions are usable
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
      assertEquals(0L, p.send(new ProducerRecord<>(t, 4, null, Kafka.utf8("in-p4"))).get().offset());
    }
    var off = admin.listOffsets(Map.of(new TopicPartition(t, 4), OffsetSpec.latest())).all().get();
    assertEquals(1L, off.get(new TopicPartition(t, 4)).offset());
    List<ConsumerRecord<byte[], byte[]>> recs = Kafka.readAll(t, 5, Duration.ofSeconds(30));
    assertEquals(1, recs.size());
    assertEquals(4, recs.get(0).partition());
    assertEquals("in-p4", Kafka.str(recs.get(0).value()));
  }

  @Test
  void deleteTopicRemovesIt() throws Exception {
    String t = Kafka.topic("admin-delete");
    Kafka.createTopic(admin, t, 2, Map.of());
    assertTrue(admin.listTopics().names().get().contains(t));
    admin.deleteTopics(List.of(t)).all().get();
    long deadline = System.currentTimeMillis() + 10_000;
    while (admin.listTopics().names().get().contains(t) && System.currentTimeMillis() < deadline) {
      Thread.sleep(200);
    }
    assertFalse(admin.listTopics().names().get().contains(t), "listTopics still has deleted " + t);
    ExecutionException e = assertThrows(ExecutionException.class,
        () -> admin.describeTopics(List.of(t)).allTopicNames().get());
    assertInstanceOf(UnknownTopicOrPartitionException.class, e.getCause(), "cause: " + e.getCause());
    // deleting it again fails, and the name can be reused
    ExecutionException e2 = assertThrows(ExecutionException.class,
        () -> admin.deleteTopics(List.of(t)).all().get());
    assertInstanceOf(UnknownTopicOrPartitionException.class, e2.getCause(), "cause: " + e2.getCause());
    Kafka.createTopic(admin, t, 1, Map.of());
    assertEquals(1, admin.describeTopics(List.of(t)).allTopicNames().get().get(t).partitions().size());
    var off = admin.listOffsets(Map.of(new TopicPartition(t, 0), OffsetSpec.latest())).all().get();
    assertEquals(0L, off.get(new TopicPartition(t, 0)).offset(), "recreated topic must be empty");
  }

  @Test
  void deleteRecordsMovesLogStartOffset() throws Exception {
    String t = Kafka.topic("admin-delrec");
    Kafka.createTopic(admin, t, 1, Map.of());
    TopicPartition tp = new TopicPartition(t, 0);
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
      for (int i = 0; i < 10; i++) p.send(new ProducerRecord<>(t, 0, null, Kafka.utf8("r" + i)));
      p.flush();
    }
    var lw = admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(4))).lowWatermarks().get(tp).get();
    assertEquals(4L, lw.lowWatermark(), "low watermark returned by DeleteRecords");
    Map<TopicPartition, OffsetSpec> q = new HashMap<>();
    q.put(tp, OffsetSpec.earliest());
    assertEquals(4L, admin.listOffsets(q).all().get().get(tp).offset(), "earliest after deleteRecords");
    q.put(tp, OffsetSpec.latest());
    assertEquals(10L, admin.listOffsets(q).all().get().get(tp).offset(), "latest after deleteRecords");
    List<ConsumerRecord<byte[], byte[]>> recs = Kafka.readAll(t, 1, Duration.ofSeconds(30));
    assertEquals(6, recs.size(), "records left after deleteRecords");
    for (int i = 0; i < 6; i++) {
      assertEquals(4L + i, recs.get(i).offset());
      assertEquals("r" + (4 + i), Kafka.str(recs.get(i).value()));
    }
    // fetching below the new log start offset is OFFSET_OUT_OF_RANGE
    try (KafkaConsumer<byte[], byte[]> c = Kafka.consumer(Map.of("auto.offset.reset", "none"))) {
      c.assign(List.of(tp));
      c.seek(tp, 2);
      OffsetOutOfRangeException e = assertThrows(OffsetOutOfRangeException.class, () -> {
        long deadline = System.currentTimeMillis() + 20_000;
        while (System.currentTimeMillis() < deadline) c.poll(Duration.ofMillis(200));
      });
      assertEquals(Map.of(tp, 2L), e.offsetOutOfRangePartitions());
    }
  }
}
