package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.GroupProtocol;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.SubscriptionPattern;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import strata.it.CliToolsTest.Result;

/**
 * The consumer group protocol (KIP-848, group.protocol=consumer) with the Java client 4.1: members
 * sharing partitions and handing them over on join, leave and crash (SIGKILL of a member JVM),
 * commits picked up by the next owner, broker-side regex subscriptions, and kafka-consumer-groups
 * describing the group. The shared broker runs with a 500 ms heartbeat interval and 3 s sessions.
 */
@Timeout(value = 300, unit = TimeUnit.SECONDS)
class ConsumerProtocolTest {
  static Admin admin;

  @BeforeAll
  static void setUp() {
    admin = Kafka.admin();
  }

  @AfterAll
  static void tearDown() {
    if (admin != null) admin.close(Duration.ofSeconds(5));
  }

  static Properties props(String bootstrap, String group) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, GroupProtocol.CONSUMER.name());
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    return p;
  }

  static KafkaConsumer<byte[], byte[]> consumer(String group) {
    return new KafkaConsumer<>(props(Kafka.bootstrap(), group));
  }

  static void produce(String topic, int from, int count) {
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
      for (int i = from; i < from + count; i++) p.send(new ProducerRecord<>(topic, Kafka.utf8("k" + i), Kafka.utf8("v" + i)));
      p.flush();
    }
  }

  /** Polls the consumers in turn until `want` distinct values arrived, committing after each poll. */
  static int[] consume(List<KafkaConsumer<byte[], byte[]>> cs, int want, Set<String> seen) {
    int[] per = new int[cs.size()];
    long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
    while (seen.size() < want) {
      if (System.nanoTime() > deadline) throw new AssertionError("only " + seen.size() + " of " + want + " records consumed");
      for (int i = 0; i < cs.size(); i++) {
        var recs = cs.get(i).poll(Duration.ofMillis(100));
        for (ConsumerRecord<byte[], byte[]> r : recs) {
          seen.add(Kafka.str(r.value()));
          per[i]++;
        }
        if (!recs.isEmpty()) cs.get(i).commitSync();
      }
    }
    return per;
  }

  static void pollUntil(String what, List<KafkaConsumer<byte[], byte[]>> cs, java.util.function.BooleanSupplier cond) {
    long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
    while (!cond.getAsBoolean()) {
      if (System.nanoTime() > deadline) throw new AssertionError("timed out waiting for " + what);
      for (KafkaConsumer<byte[], byte[]> c : cs) {
        var recs = c.poll(Duration.ofMillis(100));
        assertTrue(recs.isEmpty(), "records while waiting for " + what);
      }
    }
  }

  static Set<String> values(int from, int to) {
    Set<String> s = new HashSet<>();
    for (int i = from; i < to; i++) s.add("v" + i);
    return s;
  }

  static Result cgc(String... args) throws Exception {
    List<String> a = new ArrayList<>(List.of("--bootstrap-server", Kafka.bootstrap()));
    a.addAll(List.of(args));
    return CliToolsTest.run(null, ConsumerGroupsCliTest.CGC, a.toArray(new String[0]));
  }

  @Test
  void membersShareHandOverOnLeaveAndToolsDescribeTheGroup() throws Exception {
    String t = Kafka.topic("cp-share");
    String g = Kafka.topic("cp-group");
    Kafka.createTopic(admin, t, 4, Map.of());
    try (KafkaConsumer<byte[], byte[]> a = consumer(g); KafkaConsumer<byte[], byte[]> b = consumer(g)) {
      a.subscribe(List.of(t));
      b.subscribe(List.of(t));
      pollUntil("a 2/2 split", List.of(a, b), () -> a.assignment().size() == 2 && b.assignment().size() == 2);
      Set<TopicPartition> both = new HashSet<>(a.assignment());
      both.addAll(b.assignment());
      assertEquals(4, both.size(), "a partition has two owners");
      produce(t, 0, 200);
      Set<String> seen = new HashSet<>();
      int[] per = consume(List.of(a, b), 200, seen);
      assertTrue(per[0] > 0 && per[1] > 0, "both consumed");

      // The admin API and the CLI see a consumer-protocol group.
      ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(g)).describedGroups().get(g).get();
      assertEquals(GroupType.CONSUMER, d.type());
      assertEquals(GroupState.STABLE, d.groupState());
      assertEquals("uniform", d.partitionAssignor());
      assertEquals(2, d.members().size());
      GroupListing listed = admin.listGroups().all().get().stream()
          .filter(l -> l.groupId().equals(g)).findFirst().orElseThrow();
      assertEquals(java.util.Optional.of(GroupType.CONSUMER), listed.type());
      Result desc = ConsumerGroupsCliTest.ok(cgc("--describe", "--group", g));
      var rows = ConsumerGroupsCliTest.byPartition(
          ConsumerGroupsCliTest.table(desc, "GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"));
      assertEquals(4, rows.size(), desc.toString());
      long total = 0;
      for (var r : rows.values()) {
        assertEquals("0", r.get("LAG"), desc.toString());
        assertTrue(!r.get("CONSUMER-ID").equals("-"), "no owner shown: " + desc);
        total += Long.parseLong(r.get("CURRENT-OFFSET"));
      }
      assertEquals(200, total, desc.toString());
      Result st = ConsumerGroupsCliTest.ok(cgc("--describe", "--group", g, "--state"));
      var srow = ConsumerGroupsCliTest.table(st, "GROUP", "STATE", "#MEMBERS").get(0);
      assertEquals("Stable", srow.get("STATE"), st.toString());
      assertEquals("2", srow.get("#MEMBERS"), st.toString());
      assertEquals("uniform", srow.get("ASSIGNMENT-STRATEGY"), st.toString());
      Result list = ConsumerGroupsCliTest.ok(cgc("--list"));
      assertTrue(list.lines().contains(g), list.toString());

      // b leaves: a takes over all four partitions from b's committed offsets.
      b.close();
      pollUntil("a to own all four", List.of(a), () -> a.assignment().size() == 4);
      produce(t, 200, 50);
      Set<String> later = new HashSet<>();
      consume(List.of(a), 50, later);
      assertEquals(values(200, 250), later);
      assertTrue(a.poll(Duration.ofMillis(500)).isEmpty(), "a record was delivered twice");
    }
  }

  @Test
  void aKilledMembersPartitionsMoveToTheSurvivorAfterItsSession() throws Exception {
    String t = Kafka.topic("cp-kill");
    String g = Kafka.topic("cp-kill-group");
    Kafka.createTopic(admin, t, 2, Map.of());
    List<String> cmd = List.of(System.getProperty("java.home") + File.separator + "bin" + File.separator + "java",
        "-Xmx256m", "-XX:TieredStopAtLevel=1", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp", CliToolsTest.classpath(), MemberMain.class.getName(), Kafka.bootstrap(), t, g);
    Process child = new ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.DISCARD).start();
    AtomicInteger childOwns = new AtomicInteger();
    Thread reader = new Thread(() -> {
      try (BufferedReader r = new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8))) {
        for (String line; (line = r.readLine()) != null; ) {
          if (line.startsWith("A ")) childOwns.set(Integer.parseInt(line.substring(2)));
        }
      } catch (Exception ignored) {
        // killed
      }
    });
    reader.setDaemon(true);
    reader.start();
    try (KafkaConsumer<byte[], byte[]> a = consumer(g)) {
      GroupSupport.await("the child to own both partitions", Duration.ofSeconds(60), () -> childOwns.get() == 2, () -> "");
      a.subscribe(List.of(t));
      pollUntil("a 1/1 split", List.of(a), () -> a.assignment().size() == 1 && childOwns.get() == 1);
      // SIGKILL: no leave, no more heartbeats. a gets the partition once the 3 s session lapses.
      child.destroyForcibly().waitFor();
      long killed = System.nanoTime();
      pollUntil("a to own both", List.of(a), () -> a.assignment().size() == 2);
      long tookMs = (System.nanoTime() - killed) / 1_000_000;
      assertTrue(tookMs >= 2000, "moved before the session could lapse: " + tookMs + " ms");
      produce(t, 0, 40);
      Set<String> seen = new HashSet<>();
      consume(List.of(a), 40, seen);
      assertEquals(values(0, 40), seen);
    } finally {
      child.destroyForcibly();
    }
  }

  @Test
  void aRegexSubscriptionPicksUpATopicCreatedLater() throws Exception {
    String prefix = Kafka.topic("cp-regex");
    String g = Kafka.topic("cp-regex-group");
    Kafka.createTopic(admin, prefix + "-a", 1, Map.of());
    Kafka.createTopic(admin, prefix + "-other", 1, Map.of());
    try (KafkaConsumer<byte[], byte[]> c = consumer(g)) {
      c.subscribe(new SubscriptionPattern(prefix + "-a.*"));
      pollUntil("the first topic", List.of(c), () -> c.assignment().size() == 1);
      Kafka.createTopic(admin, prefix + "-ab", 2, Map.of());
      pollUntil("the new topic", List.of(c), () -> c.assignment().size() == 3);
      produce(prefix + "-ab", 0, 20);
      produce(prefix + "-other", 100, 5);
      Set<String> seen = new HashSet<>();
      consume(List.of(c), 20, seen);
      assertEquals(values(0, 20), seen, "read only the matching topics");
      ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(g)).describedGroups().get(g).get();
      assertEquals(3, d.members().iterator().next().assignment().topicPartitions().size());
    }
  }

  /** A consumer-protocol member in its own JVM; prints "A n" whenever it owns n partitions. */
  static final class MemberMain {
    public static void main(String[] args) {
      try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props(args[0], args[2]))) {
        c.subscribe(List.of(args[1]));
        int last = -1;
        while (true) {
          c.poll(Duration.ofMillis(100));
          c.commitSync();
          if (c.assignment().size() != last) {
            last = c.assignment().size();
            System.out.println("A " + last);
            System.out.flush();
          }
        }
      }
    }
  }
}
