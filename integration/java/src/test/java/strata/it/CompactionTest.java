package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import strata.it.GroupSupport.StrataProcess;

/**
 * Leveled streaming compaction of tiered segments, seen through the Java client and Kafka's
 * console consumer. A private broker tiers every 50 ms and deletes swapped-out merge sources
 * after 100 ms; a compacted topic with tiny segments and fan-out 2 gets many versions of few
 * keys. Once `strata levels` reports that the merges have settled, a read of the partition from
 * offset 0 must show gaps (fewer records than produced), strictly increasing offsets, every
 * record at the offset it was produced at, and the newest value of every key. A second test checks
 * the size bound of min.cleanable.dirty.ratio on the issue's workload.
 */
@Timeout(value = 180, unit = TimeUnit.SECONDS)
class CompactionTest {
  static final int KEYS = 20;
  static final int VERSIONS = 40;
  static final int ROUNDS = 4;
  static final Pattern MERGED_LEVEL = Pattern.compile("(?m)^  L[1-9][0-9]*: [1-9][0-9]* segments");

  /** One record as read back: offset, key, value. */
  record Rec(long offset, String key, String value) {}

  @Test
  void compactedTopicKeepsNewestValuePerKeyAtOriginalOffsets() throws Exception {
    try (StrataProcess broker = new StrataProcess(List.of(
        "--tier-interval-ms", "50", "--compaction-delete-delay-ms", "100", "--log-level", "info"))) {
      broker.start();
      String b = broker.bootstrap();
      String t = Kafka.topic("compact");

      Properties ap = new Properties();
      ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, b);
      ap.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
      ap.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
      try (Admin admin = Admin.create(ap)) {
        Kafka.createTopic(admin, t, 1, Map.of(
            "cleanup.policy", "compact",
            "segment.bytes", "3000",
            "segment.ms", "300",
            "min.compaction.lag.ms", "0",
            "delete.retention.ms", "0",
            "strata.compaction.fanout", "2"));
      }

      // 20 keys x 40 versions in 4 flushed rounds; the offset of every record as acknowledged
      TreeMap<Long, Rec> produced = new TreeMap<>();
      Map<String, String> newest = new LinkedHashMap<>();
      try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of(
          ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, b, ProducerConfig.COMPRESSION_TYPE_CONFIG, "none"))) {
        for (int r = 0; r < ROUNDS; r++) {
          List<Future<RecordMetadata>> acks = new ArrayList<>();
          List<String[]> sent = new ArrayList<>();
          for (int v = r * VERSIONS / ROUNDS; v < (r + 1) * VERSIONS / ROUNDS; v++) {
            for (int k = 0; k < KEYS; k++) {
              String key = "key" + k;
              String value = "v" + v + "-" + key;
              acks.add(p.send(new ProducerRecord<>(t, 0, Kafka.utf8(key), Kafka.utf8(value))));
              sent.add(new String[] {key, value});
              newest.put(key, value);
            }
          }
          p.flush();
          for (int i = 0; i < acks.size(); i++) {
            long off = acks.get(i).get(30, TimeUnit.SECONDS).offset();
            produced.put(off, new Rec(off, sent.get(i)[0], sent.get(i)[1]));
          }
          Thread.sleep(400); // past segment.ms, so the next round starts a new segment
        }
      }
      int total = KEYS * VERSIONS;
      assertEquals(total, produced.size(), "distinct acknowledged offsets");
      assertEquals(List.of(0L, (long) total - 1), List.of(produced.firstKey(), produced.lastKey()),
          "acknowledged offsets of a fresh partition");

      String report = awaitSettled(broker, t, total);
      System.out.println("strata levels after compaction settled:\n" + report);

      // plain KafkaConsumer: assign + seekToBeginning, read up to the end offset
      List<Rec> direct = new ArrayList<>();
      try (KafkaConsumer<byte[], byte[]> c = Kafka.consumer(Map.of(
          ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, b))) {
        TopicPartition tp = new TopicPartition(t, 0);
        c.assign(List.of(tp));
        c.seekToBeginning(List.of(tp));
        assertEquals(0L, c.position(tp), "log start offset of the compacted partition");
        long end = c.endOffsets(List.of(tp)).get(tp);
        assertEquals(total, end, "end offset of the compacted partition");
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (c.position(tp) < end) {
          if (System.nanoTime() > deadline) {
            fail("timed out reading " + tp + " at position " + c.position(tp) + " of " + end
                + "; records so far: " + direct.size());
          }
          for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
            direct.add(new Rec(r.offset(), Kafka.str(r.key()), Kafka.str(r.value())));
          }
        }
      }
      assertCompacted("KafkaConsumer", direct, produced, newest);

      // Kafka's console consumer, assign mode from the beginning; it exits after --timeout-ms idle
      CliToolsTest.Result out = CliToolsTest.ok(CliToolsTest.run(null, CliToolsTest.CONSOLE_CONSUMER,
          "--bootstrap-server", b, "--topic", t, "--partition", "0", "--from-beginning",
          "--timeout-ms", "10000",
          "--formatter-property", "print.key=true", "--formatter-property", "print.offset=true",
          "--formatter-property", "key.separator=|"));
      Pattern line = Pattern.compile("Offset:(\\d+)\\|([^|]*)\\|(.*)");
      List<Rec> console = new ArrayList<>();
      for (String l : out.out().split("\\R")) {
        if (l.isEmpty()) continue;
        Matcher m = line.matcher(l);
        assertTrue(m.matches(), "unexpected console consumer line '" + l + "' in:\n" + out);
        console.add(new Rec(Long.parseLong(m.group(1)), m.group(2), m.group(3)));
      }
      assertTrue(out.err().contains("Processed a total of " + console.size() + " messages"), out.toString());
      assertCompacted("kafka-console-consumer", console, produced, newest);
      assertEquals(direct, console, "console consumer and KafkaConsumer read the same records");
    }
  }

  /**
   * The issue's workload: 200 keys written 100 times into 64 KiB segments, then 20 of them
   * deleted. Before min.compaction.lag.ms (3 s here) nothing may be gone; once quiet, with the
   * default min.cleanable.dirty.ratio of 0.5, the KafkaConsumer reads at most twice the live keys
   * (the idle head rolls by segment.ms), each at its original offset, the newest value per key,
   * and no deleted key's value.
   */
  @Test
  void quietCompactedTopicStaysWithinTwiceTheLiveKeys() throws Exception {
    final int keys = 200, writes = 100, deleted = 20;
    final long lagMs = 3000;
    try (StrataProcess broker = new StrataProcess(List.of(
        "--tier-interval-ms", "50", "--compaction-delete-delay-ms", "100", "--log-level", "info"))) {
      broker.start();
      String b = broker.bootstrap();
      String t = Kafka.topic("bounded");
      Properties ap = new Properties();
      ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, b);
      try (Admin admin = Admin.create(ap)) {
        Kafka.createTopic(admin, t, 1, Map.of(
            "cleanup.policy", "compact",
            "segment.bytes", "65536",
            "segment.ms", "2000",
            "min.compaction.lag.ms", Long.toString(lagMs),
            "delete.retention.ms", "0"));
      }
      TreeMap<Long, Rec> produced = new TreeMap<>();
      TreeMap<Long, Long> timestamps = new TreeMap<>();
      Map<String, String> newest = new TreeMap<>();
      try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of(
          ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, b, ProducerConfig.LINGER_MS_CONFIG, "5"))) {
        List<Future<RecordMetadata>> acks = new ArrayList<>();
        List<String[]> sent = new ArrayList<>();
        for (int v = 0; v < writes + 1; v++) {
          for (int k = 0; k < keys; k++) {
            if (v == writes && k >= deleted) break;
            String key = String.format("key%03d", k);
            String value = v == writes ? null : key + "-write" + v + "-" + "x".repeat(40);
            acks.add(p.send(new ProducerRecord<>(t, 0, Kafka.utf8(key), Kafka.utf8(value))));
            sent.add(new String[] {key, value});
            newest.put(key, value);
          }
        }
        p.flush();
        for (int i = 0; i < acks.size(); i++) {
          RecordMetadata md = acks.get(i).get(30, TimeUnit.SECONDS);
          produced.put(md.offset(), new Rec(md.offset(), sent.get(i)[0], sent.get(i)[1]));
          timestamps.put(md.offset(), md.timestamp());
        }
      }
      int total = keys * writes + deleted;
      assertEquals(total, produced.size(), "distinct acknowledged offsets");

      List<Rec> early = readAll(b, t, total);
      long earlyEnd = System.currentTimeMillis();
      assertLagObeyed(early, produced, timestamps, lagMs, earlyEnd);

      Thread.sleep(Math.max(0, timestamps.values().stream().max(Long::compare).get() + lagMs
          - System.currentTimeMillis()));
      String report = awaitSettled(broker, t, total);
      System.out.println("strata levels after compaction settled:\n" + report);
      List<Rec> got = readAll(b, t, total);
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
      while (got.size() > 2 * (keys - deleted) && System.nanoTime() < deadline) {
        Thread.sleep(300); // the broker may serve the manifest before the last swap for a moment
        got = readAll(b, t, total);
      }
      System.out.println("KafkaConsumer read " + got.size() + " of " + total + " records for "
          + (keys - deleted) + " live keys");
      assertTrue(got.size() <= 2 * (keys - deleted),
          got.size() + " records for " + (keys - deleted) + " live keys:\n" + report);
      for (Rec r : got) {
        assertEquals(produced.get(r.offset()), r, "record not at the offset it was produced at");
      }
      for (int i = 1; i < got.size(); i++) {
        assertTrue(got.get(i).offset() > got.get(i - 1).offset(), "offsets not increasing");
      }
      Map<String, String> lastSeen = new TreeMap<>();
      for (Rec r : got) lastSeen.put(r.key(), r.value());
      for (Map.Entry<String, String> e : newest.entrySet()) {
        if (e.getValue() == null) {
          assertTrue(lastSeen.get(e.getKey()) == null, e.getKey() + " was deleted, read " + lastSeen.get(e.getKey()));
        } else {
          assertEquals(e.getValue(), lastSeen.get(e.getKey()), "newest value of " + e.getKey());
        }
      }
      assertLagObeyed(got, produced, timestamps, lagMs, System.currentTimeMillis());
    }
  }

  /** A record may be missing only once it is older than min.compaction.lag.ms. */
  static void assertLagObeyed(List<Rec> got, TreeMap<Long, Rec> produced, TreeMap<Long, Long> timestamps,
      long lagMs, long readEnd) {
    java.util.Set<Long> present = new java.util.HashSet<>();
    for (Rec r : got) present.add(r.offset());
    for (Map.Entry<Long, Long> e : timestamps.entrySet()) {
      assertTrue(present.contains(e.getKey()) || e.getValue() + lagMs <= readEnd,
          "offset " + e.getKey() + " (" + produced.get(e.getKey()) + ") is gone "
              + (readEnd - e.getValue()) + " ms after it was written");
    }
  }

  /** Every record of partition 0 from the beginning up to the end offset. */
  static List<Rec> readAll(String bootstrap, String topic, long expectedEnd) {
    List<Rec> out = new ArrayList<>();
    try (KafkaConsumer<byte[], byte[]> c = Kafka.consumer(Map.of(
        ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
      TopicPartition tp = new TopicPartition(topic, 0);
      c.assign(List.of(tp));
      c.seekToBeginning(List.of(tp));
      long end = c.endOffsets(List.of(tp)).get(tp);
      assertEquals(expectedEnd, end, "end offset");
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
      while (c.position(tp) < end) {
        if (System.nanoTime() > deadline) fail("timed out at position " + c.position(tp) + " of " + end);
        for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
          out.add(new Rec(r.offset(), Kafka.str(r.key()), Kafka.str(r.value())));
        }
      }
    }
    return out;
  }

  /** Polls `strata levels` until all produced offsets are tiered, a level >= 1 exists and no merge is due. */
  static String awaitSettled(StrataProcess broker, String topic, int total) throws Exception {
    String settled = "offsets 0.." + total + ", ";
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
    String report = "";
    while (true) {
      report = levels(broker, topic);
      boolean done = report.lines().anyMatch(l -> l.contains(settled) && l.contains("next merge: none"))
          && MERGED_LEVEL.matcher(report).find();
      if (done) return report;
      if (System.nanoTime() > deadline) {
        fail("compaction did not settle within 60 s; strata levels:\n" + report + "\n" + broker.logs());
      }
      Thread.sleep(200);
    }
  }

  static String levels(StrataProcess broker, String topic) throws Exception {
    Process p = new ProcessBuilder(broker.bin.toString(), "levels", topic, "--data-dir", broker.dataDir.toString())
        .redirectErrorStream(true).start();
    p.getOutputStream().close();
    byte[] out = p.getInputStream().readAllBytes();
    if (!p.waitFor(30, TimeUnit.SECONDS)) {
      p.destroyForcibly().waitFor();
      fail("strata levels timed out");
    }
    return new String(out, StandardCharsets.UTF_8);
  }

  static void assertCompacted(String reader, List<Rec> got, TreeMap<Long, Rec> produced, Map<String, String> newest) {
    assertFalse(got.isEmpty(), reader + " read nothing");
    for (int i = 1; i < got.size(); i++) {
      assertTrue(got.get(i).offset() > got.get(i - 1).offset(),
          reader + ": offsets not strictly increasing at " + got.get(i - 1) + " -> " + got.get(i));
    }
    assertTrue(got.size() < produced.size(),
        reader + ": no gaps, read " + got.size() + " of " + produced.size() + " records");
    for (Rec r : got) {
      assertEquals(produced.get(r.offset()), r, reader + ": record not at the offset it was produced at");
    }
    Map<String, String> lastSeen = new LinkedHashMap<>();
    for (Rec r : got) lastSeen.put(r.key(), r.value());
    assertEquals(new TreeMap<>(newest), new TreeMap<>(lastSeen), reader + ": newest value per key");
  }
}
