package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Kafka's own command-line tools (kafka-tools 4.x main classes), each run as a separate JVM. */
@Timeout(value = 180, unit = TimeUnit.SECONDS)
class CliToolsTest {
  static final String TOPICS = "org.apache.kafka.tools.TopicCommand";
  static final String CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer";
  static final String CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer";
  static final String GET_OFFSETS = "org.apache.kafka.tools.GetOffsetShell";

  static Admin admin;

  @BeforeAll
  static void setUp() {
    admin = Kafka.admin();
  }

  @AfterAll
  static void tearDown() {
    if (admin != null) admin.close(Duration.ofSeconds(5));
  }

  record Result(int exit, String out, String err) {
    List<String> lines() {
      return Arrays.stream(out.split("\\R")).map(String::strip).filter(s -> !s.isEmpty()).toList();
    }

    @Override
    public String toString() {
      return "exit=" + exit + "\n--- stdout\n" + out + "--- stderr\n" + err;
    }
  }

  static String classpath() {
    String cp = System.getProperty("surefire.test.class.path");
    return cp != null && !cp.isBlank() ? cp : System.getProperty("java.class.path");
  }

  static Result run(String stdin, String mainClass, String... args) throws Exception {
    List<String> cmd = new ArrayList<>();
    cmd.add(System.getProperty("java.home") + File.separator + "bin" + File.separator + "java");
    cmd.add("-Xmx256m");
    cmd.add("-XX:TieredStopAtLevel=1");
    cmd.add("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn");
    cmd.add("-cp");
    cmd.add(classpath());
    cmd.add(mainClass);
    cmd.addAll(List.of(args));
    Process p = new ProcessBuilder(cmd).start();
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    Thread to = pump(p.getInputStream(), out);
    Thread te = pump(p.getErrorStream(), err);
    try (OutputStream in = p.getOutputStream()) {
      if (stdin != null) in.write(stdin.getBytes(StandardCharsets.UTF_8));
    }
    if (!p.waitFor(90, TimeUnit.SECONDS)) {
      p.destroyForcibly().waitFor();
      to.join(2000);
      te.join(2000);
      throw new AssertionError("timed out: " + String.join(" ", cmd.subList(cmd.indexOf(mainClass), cmd.size()))
          + "\n" + new Result(-1, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8)));
    }
    to.join(5000);
    te.join(5000);
    return new Result(p.exitValue(), out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
  }

  static Thread pump(InputStream in, ByteArrayOutputStream sink) {
    Thread t = new Thread(() -> {
      try (in) {
        in.transferTo(sink);
      } catch (Exception ignored) {
        // process died
      }
    });
    t.setDaemon(true);
    t.start();
    return t;
  }

  static Result ok(Result r) {
    assertEquals(0, r.exit(), "tool failed: " + r);
    return r;
  }

  @Test
  void kafkaTopicsCreateListDescribeDelete() throws Exception {
    String b = Kafka.bootstrap();
    String t = Kafka.topic("cli-topics");
    Result c = ok(run(null, TOPICS, "--bootstrap-server", b, "--create", "--topic", t,
        "--partitions", "3", "--replication-factor", "1", "--config", "cleanup.policy=compact",
        "--config", "retention.ms=54321"));
    assertTrue(c.out().contains("Created topic " + t + "."), c.toString());

    TopicDescription d = admin.describeTopics(List.of(t)).allTopicNames().get().get(t);
    assertEquals(3, d.partitions().size(), "partitions of topic created by kafka-topics");

    Result l = ok(run(null, TOPICS, "--bootstrap-server", b, "--list"));
    assertTrue(l.lines().contains(t), "--list output lacks " + t + ": " + l);

    Result ds = ok(run(null, TOPICS, "--bootstrap-server", b, "--describe", "--topic", t));
    String node = String.valueOf(admin.describeCluster().nodes().get().iterator().next().id());
    List<String> lines = ds.lines();
    String head = lines.stream().filter(s -> s.startsWith("Topic: " + t + "\t") && s.contains("PartitionCount"))
        .findFirst().orElseThrow(() -> new AssertionError("no topic summary line: " + ds));
    assertTrue(head.contains("PartitionCount: 3"), head);
    assertTrue(head.contains("ReplicationFactor: 1"), head);
    assertTrue(head.contains("TopicId: "), head);
    assertTrue(head.contains("cleanup.policy=compact"), "configs in: " + head);
    assertTrue(head.contains("retention.ms=54321"), "configs in: " + head);
    for (int i = 0; i < 3; i++) {
      final int part = i;
      String pl = lines.stream().filter(s -> s.matches("Topic: \\Q" + t + "\\E\\s+Partition: " + part + "\\s.*"))
          .findFirst().orElseThrow(() -> new AssertionError("no line for partition " + part + ": " + ds));
      assertTrue(pl.matches(".*Leader: " + node + "\\s+Replicas: " + node + "\\s+Isr: " + node + "(\\s.*)?"),
          "partition line: " + pl);
    }

    Result del = ok(run(null, TOPICS, "--bootstrap-server", b, "--delete", "--topic", t));
    assertFalse(del.err().contains("Exception"), del.toString());
    long deadline = System.currentTimeMillis() + 10_000;
    Result after;
    do {
      after = ok(run(null, TOPICS, "--bootstrap-server", b, "--list"));
    } while (after.lines().contains(t) && System.currentTimeMillis() < deadline);
    assertFalse(after.lines().contains(t), "topic still listed after --delete: " + after);
  }

  @Test
  void consoleProducerParsesKeysAndConsoleConsumerPrintsThem() throws Exception {
    String b = Kafka.bootstrap();
    String t = Kafka.topic("cli-console");
    Kafka.createTopic(admin, t, 1, Map.of());
    String input = "k1:hello\nk2:world\nk3:value:with:colons\nk4:\n";
    ok(run(input, CONSOLE_PRODUCER, "--bootstrap-server", b, "--topic", t,
        "--reader-property", "parse.key=true", "--reader-property", "key.separator=:"));

    // what the console producer wrote, read with the Java consumer
    List<ConsumerRecord<byte[], byte[]>> recs = Kafka.readAll(t, 1, Duration.ofSeconds(30));
    assertEquals(4, recs.size(), "records written by console producer");
    String[][] want = {{"k1", "hello"}, {"k2", "world"}, {"k3", "value:with:colons"}, {"k4", ""}};
    for (int i = 0; i < 4; i++) {
      assertEquals(want[i][0], Kafka.str(recs.get(i).key()), "key " + i);
      assertEquals(want[i][1], Kafka.str(recs.get(i).value()), "value " + i);
      assertEquals(i, recs.get(i).offset());
    }

    // console consumer, assign mode (--partition/--offset), so no group coordinator is needed
    Result c = ok(run(null, CONSOLE_CONSUMER, "--bootstrap-server", b, "--topic", t,
        "--partition", "0", "--offset", "earliest", "--max-messages", "4", "--timeout-ms", "30000",
        "--formatter-property", "print.key=true", "--formatter-property", "key.separator=|",
        "--formatter-property", "print.offset=true"));
    assertEquals(List.of(
        "Offset:0|k1|hello", "Offset:1|k2|world", "Offset:2|k3|value:with:colons", "Offset:3|k4|"),
        Arrays.stream(c.out().split("\\R")).filter(s -> !s.isEmpty()).toList(), c.toString());
    assertTrue(c.err().contains("Processed a total of 4 messages"), c.toString());

    // starting from an offset
    Result c2 = ok(run(null, CONSOLE_CONSUMER, "--bootstrap-server", b, "--topic", t,
        "--partition", "0", "--offset", "2", "--max-messages", "2", "--timeout-ms", "30000"));
    assertEquals(List.of("value:with:colons", ""), Arrays.asList(c2.out().split("\\R", -1)).subList(0, 2), c2.toString());
  }

  @Test
  void getOffsetShellPrintsOffsets() throws Exception {
    String b = Kafka.bootstrap();
    String t = Kafka.topic("cli-offsets");
    Kafka.createTopic(admin, t, 2, Map.of());
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
      for (int i = 0; i < 7; i++) p.send(new ProducerRecord<>(t, 0, null, Kafka.utf8("a" + i)));
      for (int i = 0; i < 3; i++) p.send(new ProducerRecord<>(t, 1, null, Kafka.utf8("b" + i)));
      p.flush();
    }
    Result latest = ok(run(null, GET_OFFSETS, "--bootstrap-server", b, "--topic", t));
    assertEquals(List.of(t + ":0:7", t + ":1:3"), latest.lines(), latest.toString());

    Result earliest = ok(run(null, GET_OFFSETS, "--bootstrap-server", b, "--topic", t, "--time", "-2"));
    assertEquals(List.of(t + ":0:0", t + ":1:0"), earliest.lines(), earliest.toString());

    Result one = ok(run(null, GET_OFFSETS, "--bootstrap-server", b, "--topic-partitions", t + ":1"));
    assertEquals(List.of(t + ":1:3"), one.lines(), one.toString());
  }
}
