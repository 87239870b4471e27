package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.CommonClientConfigs;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.errors.ClusterAuthorizationException;
import org.apache.kafka.common.errors.TopicAuthorizationException;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * ACLs with authenticated principals: a broker with one SASL_PLAINTEXT listener, users admin (a super user)
 * and alice (SASL PLAIN), {@code --authorizer acl} and Kafka's default of no access without an ACL.
 */
@Timeout(value = 300, unit = TimeUnit.SECONDS)
class AclsSaslTest {
  static Process broker;
  static Path dataDir;
  static int port;
  static Admin admin;

  static String bootstrap() {
    return "127.0.0.1:" + port;
  }

  static Properties as(String user, String password) {
    Properties p = new Properties();
    p.put(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG, bootstrap());
    p.put(CommonClientConfigs.SECURITY_PROTOCOL_CONFIG, "SASL_PLAINTEXT");
    p.put("sasl.mechanism", "PLAIN");
    p.put("sasl.jaas.config", "org.apache.kafka.common.security.plain.PlainLoginModule required username=\""
        + user + "\" password=\"" + password + "\";");
    return p;
  }

  @BeforeAll
  static void start() throws Exception {
    dataDir = Files.createTempDirectory("strata-it-acl-sasl-");
    try (ServerSocket s = new ServerSocket(0, 0, java.net.InetAddress.getLoopbackAddress())) {
      port = s.getLocalPort();
    }
    List<String> cmd = List.of(GroupSupport.StrataProcess.binary().toString(), "serve",
        "--listener", "SASL_PLAINTEXT://" + bootstrap(), "--data-dir", dataDir.toString(),
        "--add-scram", "SCRAM-SHA-512=[name=admin,password=admin-secret];SCRAM-SHA-512=[name=alice,password=alice-secret]",
        "--authorizer", "acl", "--super-users", "User:admin;User:broker",
        // The broker's own clients (its compaction worker) log in too.
        "--inter-broker-sasl-username", "broker");
    ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(dataDir.resolve("broker.log").toFile());
    pb.environment().put("STRATA_INTER_BROKER_SASL_PASSWORD", "broker-secret");
    broker = pb.start();
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (true) {
      try (Socket s = new Socket()) {
        s.connect(new InetSocketAddress("127.0.0.1", port), 200);
        break;
      } catch (IOException e) {
        if (!broker.isAlive() || System.nanoTime() > deadline) {
          throw new AssertionError("strata did not start: " + Files.readString(dataDir.resolve("broker.log")));
        }
        Thread.sleep(50);
      }
    }
    admin = Admin.create(as("admin", "admin-secret"));
  }

  @AfterAll
  static void stop() throws Exception {
    if (admin != null) admin.close(Duration.ofSeconds(5));
    if (broker != null) {
      broker.destroy();
      broker.waitFor(10, TimeUnit.SECONDS);
    }
  }

  static KafkaConsumer<String, String> consumer(Properties p) {
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    return new KafkaConsumer<>(p);
  }

  @Test
  void aliceReadsOnlyWhatAnAclAllowsAndCannotAdministerAcls() throws Exception {
    admin.createTopics(List.of(new NewTopic("payroll", 1, (short) 1))).all().get(30, TimeUnit.SECONDS);
    Properties pp = as("admin", "admin-secret");
    pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
      producer.send(new ProducerRecord<>("payroll", "k", "v")).get(30, TimeUnit.SECONDS);
    }

    TopicPartition tp = new TopicPartition("payroll", 0);
    try (Admin alice = Admin.create(as("alice", "alice-secret"))) {
      assertFalse(alice.listTopics().names().get(30, TimeUnit.SECONDS).contains("payroll"));
      var e = assertThrows(ExecutionException.class, () -> alice.createAcls(List.of(new AclBinding(
          new ResourcePattern(ResourceType.TOPIC, "payroll", PatternType.LITERAL),
          new AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)))).all().get(30, TimeUnit.SECONDS));
      assertInstanceOf(ClusterAuthorizationException.class, e.getCause());
    }
    try (KafkaConsumer<String, String> c = consumer(as("alice", "alice-secret"))) {
      c.assign(List.of(tp));
      assertThrows(TopicAuthorizationException.class, () -> {
        for (int i = 0; i < 50; i++) c.poll(Duration.ofMillis(200));
      });
    }

    admin.createAcls(List.of(new AclBinding(new ResourcePattern(ResourceType.TOPIC, "pay", PatternType.PREFIXED),
        new AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)))).all().get(30, TimeUnit.SECONDS);
    try (KafkaConsumer<String, String> c = consumer(as("alice", "alice-secret"))) {
      c.assign(List.of(tp));
      ConsumerRecords<String, String> got = ConsumerRecords.empty();
      for (int i = 0; i < 50 && got.isEmpty(); i++) got = c.poll(Duration.ofMillis(200));
      assertEquals(1, got.count());
    }
    try (Admin alice = Admin.create(as("alice", "alice-secret"))) {
      assertTrue(alice.listTopics().names().get(30, TimeUnit.SECONDS).contains("payroll"));
    }
  }
}
