package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.errors.TopicAuthorizationException;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * ACLs and client quotas through Kafka's CLI (kafka-acls, kafka-configs) and the Java client, on a private
 * broker started with {@code --authorizer acl --allow-everyone-if-no-acl-found true} (every client is
 * User:ANONYMOUS until authentication exists, so resources without ACLs stay open).
 */
@Timeout(value = 300, unit = TimeUnit.SECONDS)
class AclsQuotasTest {
  static final String ACLS = "org.apache.kafka.tools.AclCommand";
  static final String CONFIGS = "org.apache.kafka.tools.ConfigCommand";

  static GroupSupport.StrataProcess broker;
  static Admin admin;

  @BeforeAll
  static void start() throws Exception {
    broker = new GroupSupport.StrataProcess(List.of("--authorizer", "acl", "--allow-everyone-if-no-acl-found", "true"));
    broker.start();
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, broker.bootstrap());
    admin = Admin.create(p);
  }

  @AfterAll
  static void stop() throws Exception {
    if (admin != null) admin.close(Duration.ofSeconds(5));
    if (broker != null) broker.close();
  }

  static CliToolsTest.Result cli(String main, String... args) throws Exception {
    String[] all = new String[args.length + 2];
    all[0] = "--bootstrap-server";
    all[1] = broker.bootstrap();
    System.arraycopy(args, 0, all, 2, args.length);
    return CliToolsTest.run(null, main, all);
  }

  static void produce(String topic) throws Exception {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, broker.bootstrap());
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
      producer.send(new ProducerRecord<>(topic, "k", "v")).get(30, TimeUnit.SECONDS);
    }
  }

  static KafkaConsumer<String, String> consumer() {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, broker.bootstrap());
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    return new KafkaConsumer<>(p);
  }

  @Test
  void kafkaAclsAddsListsAndRemoves() throws Exception {
    admin.createTopics(List.of(new NewTopic("acl-cli", 1, (short) 1))).all().get(30, TimeUnit.SECONDS);
    var add = cli(ACLS, "--add", "--allow-principal", "User:bob", "--operation", "Read", "--operation", "Describe",
        "--topic", "acl-cli");
    assertEquals(0, add.exit(), add.toString());
    var prefixed = cli(ACLS, "--add", "--deny-principal", "User:eve", "--operation", "All", "--topic", "acl-c",
        "--resource-pattern-type", "prefixed");
    assertEquals(0, prefixed.exit(), prefixed.toString());

    var list = cli(ACLS, "--list", "--topic", "acl-cli");
    assertEquals(0, list.exit(), list.toString());
    assertTrue(list.out().contains("principal=User:bob, host=*, operation=READ, permissionType=ALLOW"), list.toString());
    assertTrue(list.out().contains("principal=User:bob, host=*, operation=DESCRIBE, permissionType=ALLOW"), list.toString());
    assertFalse(list.out().contains("User:eve"), list.toString());
    // MATCH: every binding that applies to the topic, the prefixed one included.
    var matching = new AclBindingFilter(new ResourcePatternFilter(ResourceType.TOPIC, "acl-cli", PatternType.MATCH),
        AccessControlEntryFilter.ANY);
    var all = admin.describeAcls(matching).values().get(30, TimeUnit.SECONDS);
    assertEquals(3, all.size(), all.toString());

    var remove = cli(ACLS, "--remove", "--force", "--allow-principal", "User:bob", "--operation", "Read",
        "--operation", "Describe", "--topic", "acl-cli");
    assertEquals(0, remove.exit(), remove.toString());
    var after = admin.describeAcls(matching).values().get(30, TimeUnit.SECONDS);
    assertEquals(1, after.size(), after.toString());
    assertEquals("User:eve", after.iterator().next().entry().principal());
  }

  @Test
  void aPrincipalWithoutReadGetsTopicAuthorizationFailedAndDoesNotSeeTheTopic() throws Exception {
    produce("acl-hidden");
    produce("acl-visible");
    var add = cli(ACLS, "--add", "--allow-principal", "User:bob", "--operation", "Read", "--topic", "acl-hidden");
    assertEquals(0, add.exit(), add.toString());

    var names = admin.listTopics().names().get(30, TimeUnit.SECONDS);
    assertTrue(names.contains("acl-visible"), names.toString());
    assertFalse(names.contains("acl-hidden"), names.toString());

    try (KafkaConsumer<String, String> c = consumer()) {
      c.assign(List.of(new TopicPartition("acl-hidden", 0)));
      c.seekToBeginning(List.of(new TopicPartition("acl-hidden", 0)));
      assertThrows(TopicAuthorizationException.class, () -> {
        for (int i = 0; i < 50; i++) c.poll(Duration.ofMillis(200));
      });
    }
    var e = assertThrows(ExecutionException.class,
        () -> admin.describeTopics(List.of("acl-hidden")).allTopicNames().get(30, TimeUnit.SECONDS));
    assertInstanceOf(TopicAuthorizationException.class, e.getCause());
  }

  @Test
  void kafkaConfigsSetsAndDescribesClientQuotas() throws Exception {
    var alter = cli(CONFIGS, "--alter", "--add-config", "producer_byte_rate=1024,consumer_byte_rate=2048",
        "--entity-type", "clients", "--entity-name", "c1");
    assertEquals(0, alter.exit(), alter.toString());
    var user = cli(CONFIGS, "--alter", "--add-config", "request_percentage=50", "--entity-type", "users",
        "--entity-name", "alice", "--entity-type", "clients", "--entity-default");
    assertEquals(0, user.exit(), user.toString());

    var describe = cli(CONFIGS, "--describe", "--entity-type", "clients", "--entity-name", "c1");
    assertEquals(0, describe.exit(), describe.toString());
    assertTrue(describe.out().contains("producer_byte_rate=1024.0"), describe.toString());
    assertTrue(describe.out().contains("consumer_byte_rate=2048.0"), describe.toString());

    Map<ClientQuotaEntity, Map<String, Double>> quotas =
        admin.describeClientQuotas(ClientQuotaFilter.all()).entities().get(30, TimeUnit.SECONDS);
    var both = new java.util.HashMap<String, String>();
    both.put(ClientQuotaEntity.USER, "alice");
    both.put(ClientQuotaEntity.CLIENT_ID, null);
    assertEquals(Map.of("request_percentage", 50.0), quotas.get(new ClientQuotaEntity(both)), quotas.toString());

    var delete = cli(CONFIGS, "--alter", "--delete-config", "producer_byte_rate", "--entity-type", "clients",
        "--entity-name", "c1");
    assertEquals(0, delete.exit(), delete.toString());
    var again = cli(CONFIGS, "--describe", "--entity-type", "clients", "--entity-name", "c1");
    assertFalse(again.out().contains("producer_byte_rate"), again.toString());
    assertTrue(again.out().contains("consumer_byte_rate=2048.0"), again.toString());
  }
}
