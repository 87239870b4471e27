package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.config.TopicConfig;
import org.apache.kafka.common.errors.InvalidConfigurationException;
import org.apache.kafka.common.errors.InvalidTimestampException;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Kafka's topic configs through the Java admin client, as Terraform, Debezium or kafka-configs.sh
 * use them, and the KIP-467 record errors the Java producer turns into per-record exceptions.
 */
@Timeout(value = 90, unit = TimeUnit.SECONDS)
class TopicConfigsTest {
  static Admin admin;

  /** Every topic config of Kafka 4.x at a valid value other than its default. */
  static final Map<String, String> EVERY_CONFIG =
      Map.ofEntries(
          Map.entry("cleanup.policy", "compact,delete"),
          Map.entry("compression.gzip.level", "5"),
          Map.entry("compression.lz4.level", "3"),
          Map.entry("compression.type", "zstd"),
          Map.entry("compression.zstd.level", "10"),
          Map.entry("delete.retention.ms", "1000"),
          Map.entry("file.delete.delay.ms", "1000"),
          Map.entry("flush.messages", "1000"),
          Map.entry("flush.ms", "5000"),
          Map.entry("follower.replication.throttled.replicas", "0:1"),
          Map.entry("index.interval.bytes", "1024"),
          Map.entry("leader.replication.throttled.replicas", "*"),
          Map.entry("local.retention.bytes", "1000000"),
          Map.entry("local.retention.ms", "60000"),
          Map.entry("max.compaction.lag.ms", "86400000"),
          Map.entry("max.message.bytes", "2000000"),
          Map.entry("message.downconversion.enable", "false"),
          Map.entry("message.timestamp.after.max.ms", "60000"),
          Map.entry("message.timestamp.before.max.ms", "86400000"),
          Map.entry("message.timestamp.type", "LogAppendTime"),
          Map.entry("min.cleanable.dirty.ratio", "0.25"),
          Map.entry("min.compaction.lag.ms", "100"),
          Map.entry("min.insync.replicas", "2"),
          Map.entry("preallocate", "true"),
          Map.entry("remote.log.copy.disable", "true"),
          Map.entry("remote.log.delete.on.disable", "true"),
          Map.entry("remote.storage.enable", "true"),
          Map.entry("retention.bytes", "100000000"),
          Map.entry("retention.ms", "3600000"),
          Map.entry("segment.bytes", "2097152"),
          Map.entry("segment.index.bytes", "1048576"),
          Map.entry("segment.jitter.ms", "1000"),
          Map.entry("segment.ms", "3600000"),
          Map.entry("unclean.leader.election.enable", "true"));

  @BeforeAll
  static void setUp() {
    admin = Kafka.admin();
  }

  @AfterAll
  static void tearDown() {
    if (admin != null) admin.close(Duration.ofSeconds(5));
  }

  static Map<String, ConfigEntry> describe(String topic) throws Exception {
    ConfigResource r = new ConfigResource(ConfigResource.Type.TOPIC, topic);
    DescribeConfigsOptions options =
        new DescribeConfigsOptions().includeSynonyms(true).includeDocumentation(true);
    Config c = admin.describeConfigs(List.of(r), options).all().get().get(r);
    assertNotNull(c, "no config returned for " + topic);
    return c.entries().stream().collect(Collectors.toMap(ConfigEntry::name, e -> e));
  }

  /** The names kafka-clients itself knows as topic configs (TopicConfig's *_CONFIG constants). */
  static List<String> clientTopicConfigNames() throws IllegalAccessException {
    List<String> names = new ArrayList<>();
    for (Field f : TopicConfig.class.getFields()) {
      if (Modifier.isStatic(f.getModifiers())
          && f.getType() == String.class
          && f.getName().endsWith("_CONFIG")) {
        names.add((String) f.get(null));
      }
    }
    return names;
  }

  @Test
  void everyTopicConfigKafkaClientsKnowsIsDescribedWithItsDefault() throws Exception {
    String topic = Kafka.topic("cfg-default");
    Kafka.createTopic(admin, topic, 1, Map.of());
    Map<String, ConfigEntry> cfg = describe(topic);
    List<String> names = clientTopicConfigNames();
    assertTrue(names.size() >= 30, "TopicConfig names: " + names);
    for (String name : names) {
      ConfigEntry e = cfg.get(name);
      assertNotNull(e, name + " is not described");
      assertEquals(ConfigEntry.ConfigSource.DEFAULT_CONFIG, e.source(), name);
    }
    for (String name : EVERY_CONFIG.keySet()) assertNotNull(cfg.get(name), name);
    assertEquals("3600000", cfg.get("message.timestamp.after.max.ms").value());
    assertEquals("producer", cfg.get("compression.type").value());
  }

  @Test
  void everyConfigAtANonDefaultValueIsStoredAndDescribed() throws Exception {
    String topic = Kafka.topic("cfg-every");
    Kafka.createTopic(admin, topic, 1, EVERY_CONFIG);
    Map<String, ConfigEntry> cfg = describe(topic);
    for (Map.Entry<String, String> want : EVERY_CONFIG.entrySet()) {
      ConfigEntry e = cfg.get(want.getKey());
      assertNotNull(e, want.getKey());
      assertEquals(want.getValue(), e.value(), want.getKey());
      assertEquals(ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, e.source(), want.getKey());
      assertNotNull(e.documentation(), want.getKey());
    }
    List<ConfigEntry.ConfigSynonym> synonyms = cfg.get("retention.ms").synonyms();
    assertEquals(2, synonyms.size(), synonyms.toString());
    assertEquals("retention.ms", synonyms.get(0).name());
    assertEquals(ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, synonyms.get(0).source());
    assertEquals("log.retention.ms", synonyms.get(1).name());
    assertEquals("604800000", synonyms.get(1).value());
    assertEquals(ConfigEntry.ConfigSource.DEFAULT_CONFIG, synonyms.get(1).source());
    assertEquals(ConfigEntry.ConfigType.DOUBLE, cfg.get("min.cleanable.dirty.ratio").type());
    assertEquals(ConfigEntry.ConfigType.LIST, cfg.get("cleanup.policy").type());
    assertEquals(ConfigEntry.ConfigType.BOOLEAN, cfg.get("preallocate").type());
    assertEquals(ConfigEntry.ConfigType.LONG, cfg.get("segment.jitter.ms").type());
  }

  @Test
  void anInvalidValueFailsTheTopicWithKafkasMessage() throws Exception {
    String topic = Kafka.topic("cfg-bad");
    NewTopic t = new NewTopic(topic, 1, (short) 1).configs(Map.of("compression.type", "brotli"));
    ExecutionException e =
        assertThrows(ExecutionException.class, () -> admin.createTopics(List.of(t)).all().get());
    assertInstanceOf(InvalidConfigurationException.class, e.getCause());
    assertTrue(
        e.getCause()
            .getMessage()
            .contains(
                "Invalid value brotli for configuration compression.type: String must be one of:"),
        e.getCause().getMessage());
    assertFalse(admin.listTopics().names().get().contains(topic));
  }

  static void alter(String topic, AlterConfigOp... ops) throws Exception {
    ConfigResource r = new ConfigResource(ConfigResource.Type.TOPIC, topic);
    Map<ConfigResource, Collection<AlterConfigOp>> changes = Map.of(r, List.of(ops));
    admin.incrementalAlterConfigs(changes).all().get();
  }

  static AlterConfigOp op(String name, String value, AlterConfigOp.OpType type) {
    return new AlterConfigOp(new ConfigEntry(name, value), type);
  }

  /** What kafka-configs.sh --alter --add-config / --delete-config send. */
  @Test
  void incrementalAlterSetsDeletesAppendsAndSubtracts() throws Exception {
    String topic = Kafka.topic("cfg-alter");
    Kafka.createTopic(admin, topic, 1, Map.of("segment.jitter.ms", "100"));
    alter(
        topic,
        op("compression.type", "gzip", AlterConfigOp.OpType.SET),
        op("message.timestamp.before.max.ms", "86400000", AlterConfigOp.OpType.SET),
        op("cleanup.policy", "compact", AlterConfigOp.OpType.APPEND),
        op("segment.jitter.ms", null, AlterConfigOp.OpType.DELETE));
    Map<String, ConfigEntry> cfg = describe(topic);
    assertEquals("gzip", cfg.get("compression.type").value());
    assertEquals("86400000", cfg.get("message.timestamp.before.max.ms").value());
    assertEquals("delete,compact", cfg.get("cleanup.policy").value());
    assertEquals("0", cfg.get("segment.jitter.ms").value());
    assertEquals(ConfigEntry.ConfigSource.DEFAULT_CONFIG, cfg.get("segment.jitter.ms").source());

    alter(topic, op("cleanup.policy", "delete", AlterConfigOp.OpType.SUBTRACT));
    assertEquals("compact", describe(topic).get("cleanup.policy").value());

    ExecutionException e =
        assertThrows(
            ExecutionException.class,
            () -> alter(topic, op("compression.zstd.level", "99", AlterConfigOp.OpType.SET)));
    assertInstanceOf(InvalidConfigurationException.class, e.getCause());
    assertEquals("3", describe(topic).get("compression.zstd.level").value());
  }

  /**
   * KIP-467: the broker fails the whole batch but names the bad record, so the Java producer fails
   * that record with INVALID_TIMESTAMP and the others of its batch with a plain KafkaException.
   */
  @Test
  void aRecordTooOldFailsItsBatchAndIsNamed() throws Exception {
    String topic = Kafka.topic("cfg-ts");
    Kafka.createTopic(admin, topic, 1, Map.of("message.timestamp.before.max.ms", "3600000"));
    long now = System.currentTimeMillis();
    long[] timestamps = {now, now - 2 * 3_600_000L, now};
    List<Future<RecordMetadata>> sent = new ArrayList<>();
    try (KafkaProducer<byte[], byte[]> p =
        Kafka.producer(Map.of("linger.ms", "2000", "batch.size", "1000000"))) {
      for (long ts : timestamps) {
        sent.add(p.send(new ProducerRecord<>(topic, 0, ts, null, Kafka.utf8("v" + ts))));
      }
      p.flush();
    }
    ExecutionException bad = assertThrows(ExecutionException.class, () -> sent.get(1).get());
    assertInstanceOf(InvalidTimestampException.class, bad.getCause());
    for (int i : new int[] {0, 2}) {
      ExecutionException other = assertThrows(ExecutionException.class, () -> sent.get(i).get());
      assertInstanceOf(KafkaException.class, other.getCause());
      assertFalse(
          other.getCause() instanceof InvalidTimestampException,
          "record " + i + " was not the bad one: " + other.getCause());
    }
  }

  /** Batches recompressed to the topic's codec and level are read back by the Java consumer. */
  @Test
  void recompressedBatchesReadBackInJava() throws Exception {
    for (String[] c :
        new String[][] {{"zstd", "none"}, {"lz4", "gzip"}, {"gzip", "zstd"}, {"snappy", "lz4"}}) {
      String topic = Kafka.topic("cfg-codec-" + c[0]);
      Kafka.createTopic(
          admin,
          topic,
          1,
          Map.of("compression.type", c[0], "compression.lz4.level", "12", "compression.gzip.level", "1"));
      try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of("compression.type", c[1]))) {
        for (int i = 0; i < 200; i++) {
          p.send(new ProducerRecord<>(topic, 0, Kafka.utf8("k" + i), Kafka.utf8("value " + i)));
        }
        p.flush();
      }
      List<ConsumerRecord<byte[], byte[]>> got = Kafka.readAll(topic, 1, Duration.ofSeconds(20));
      assertEquals(200, got.size(), c[0] + " from " + c[1]);
      for (int i = 0; i < 200; i++) {
        assertEquals(i, got.get(i).offset());
        assertEquals("k" + i, Kafka.str(got.get(i).key()));
        assertEquals("value " + i, Kafka.str(got.get(i).value()));
      }
    }
  }
}
