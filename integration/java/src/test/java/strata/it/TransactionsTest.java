package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsOptions;
import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsSpec;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Transactions with the Java client, which the broker's finalized transaction.version 2 puts on
 * transactions v2 (KIP-890 part 2: partitions added by producing, an epoch bump with every commit and
 * abort): consume-transform-produce with sendOffsetsToTransaction, visibility of aborted data per
 * isolation level, fencing of an older producer, the coordinator aborting a transaction whose
 * producer vanished, and kafka-transactions.sh.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class TransactionsTest {
  static final String TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand";

  static Admin admin;

  @BeforeAll
  static void setUp() {
    admin = Kafka.admin();
  }

  @AfterAll
  static void tearDown() {
    if (admin != null) admin.close(Duration.ofSeconds(5));
  }

  static KafkaProducer<byte[], byte[]> txnProducer(String transactionalId, Map<String, String> overrides) {
    Map<String, String> o = new HashMap<>(overrides);
    o.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
    KafkaProducer<byte[], byte[]> p = Kafka.producer(o);
    p.initTransactions();
    return p;
  }

  static KafkaConsumer<byte[], byte[]> reader(IsolationLevel level) {
    return Kafka.consumer(Map.of(ConsumerConfig.ISOLATION_LEVEL_CONFIG, level.toString()));
  }

  /** Values readable at the given isolation level, from the beginning to that level's end offset. */
  static List<String> readValues(String topic, int partitions, IsolationLevel level) {
    List<String> out = new ArrayList<>();
    try (KafkaConsumer<byte[], byte[]> c = reader(level)) {
      List<TopicPartition> tps = Kafka.partitions(topic, partitions);
      c.assign(tps);
      c.seekToBeginning(tps);
      // endOffsets honours the consumer's isolation level: the LSO for read_committed
      Map<TopicPartition, Long> end = c.endOffsets(tps);
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
      while (tps.stream().anyMatch(tp -> c.position(tp) < end.get(tp))) {
        if (System.nanoTime() > deadline) fail(level + " read of " + topic + " stuck before " + end + ", got " + out);
        for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) out.add(Kafka.str(r.value()));
      }
    }
    return out;
  }

  /**
   * Asserts what a reader at this level reads, retrying for a while: the COMMIT/ABORT markers
   * that move the LSO are written after EndTxn's answer.
   */
  static void assertValues(List<String> want, String topic, int partitions, IsolationLevel level)
      throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
    List<String> got;
    while (!(got = sorted(readValues(topic, partitions, level))).equals(sorted(want))
        && System.nanoTime() < deadline) {
      Thread.sleep(200);
    }
    if (got.equals(sorted(want))) return;
    List<String> missing = new ArrayList<>(want);
    missing.removeAll(got);
    List<String> extra = new ArrayList<>(got);
    extra.removeAll(want);
    fail(level + " read of " + topic + ": " + got.size() + " values, " + want.size() + " wanted; "
        + missing.size() + " missing (e.g. " + missing.subList(0, Math.min(5, missing.size())) + "), "
        + extra.size() + " unexpected (e.g. " + extra.subList(0, Math.min(5, extra.size())) + ")");
  }

  static void produce(KafkaProducer<byte[], byte[]> p, String topic, int partitions, String prefix, int n) {
    for (int i = 0; i < n; i++) p.send(new ProducerRecord<>(topic, i % partitions, null, Kafka.utf8(prefix + "-" + i)));
  }

  static List<String> values(String prefix, int n) {
    List<String> v = new ArrayList<>();
    for (int i = 0; i < n; i++) v.add(prefix + "-" + i);
    return v;
  }

  static List<String> sorted(List<String> l) {
    List<String> s = new ArrayList<>(l);
    s.sort(null);
    return s;
  }

  static Throwable rootOf(Throwable t, Class<?> wanted) {
    for (Throwable c = t; c != null; c = c.getCause()) if (wanted.isInstance(c)) return c;
    return null;
  }

  // -----------------------------------------------------------------------------------------

  @Test
  void abortedRecordsAreHiddenFromReadCommittedAndVisibleToReadUncommitted() throws Exception {
    String t = Kafka.topic("txn-abort");
    Kafka.createTopic(admin, t, 2, Map.of());
    try (KafkaProducer<byte[], byte[]> p = txnProducer(Kafka.topic("abort-id"), Map.of())) {
      p.beginTransaction();
      produce(p, t, 2, "aborted", 100);
      p.flush();
      p.abortTransaction();
      p.beginTransaction();
      produce(p, t, 2, "committed", 50);
      p.commitTransaction();
    }
    assertValues(values("committed", 50), t, 2, IsolationLevel.READ_COMMITTED);
    List<String> all = new ArrayList<>(values("aborted", 100));
    all.addAll(values("committed", 50));
    assertValues(all, t, 2, IsolationLevel.READ_UNCOMMITTED);
  }

  @Test
  void consumeTransformProduceCommitsOutputAndOffsetsTogether() throws Exception {
    String in = Kafka.topic("ctp-in");
    String out = Kafka.topic("ctp-out");
    String group = Kafka.topic("ctp-group");
    Kafka.createTopic(admin, in, 3, Map.of());
    Kafka.createTopic(admin, out, 3, Map.of());
    int n = 600;
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
      produce(p, in, 3, "in", n);
      p.flush();
    }
    List<TopicPartition> inTps = Kafka.partitions(in, 3);

    Map<String, String> cc = Map.of(ConsumerConfig.GROUP_ID_CONFIG, group,
        ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed",
        ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "50",
        ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
    int batches = 0;
    int aborted = 0;
    try (KafkaConsumer<byte[], byte[]> c = Kafka.consumer(cc);
        KafkaProducer<byte[], byte[]> p = txnProducer(Kafka.topic("ctp-id"), Map.of())) {
      c.subscribe(List.of(in));
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
      Map<TopicPartition, Long> end = c.endOffsets(inTps);
      while (true) {
        boolean done = c.assignment().containsAll(inTps)
            && inTps.stream().allMatch(tp -> c.position(tp) >= end.get(tp));
        if (done) break;
        if (System.nanoTime() > deadline) fail("consume-transform-produce did not finish; positions "
            + c.assignment().stream().map(tp -> tp + "=" + c.position(tp)).toList());
        ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(200));
        if (recs.isEmpty()) continue;
        Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
        p.beginTransaction();
        for (ConsumerRecord<byte[], byte[]> r : recs) {
          p.send(new ProducerRecord<>(out, r.partition(), null, Kafka.utf8(Kafka.str(r.value()).toUpperCase())));
          next.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
        }
        p.sendOffsetsToTransaction(next, c.groupMetadata());
        batches++;
        if (batches % 4 == 2) {
          // an aborted batch: its output is never read committed, its offsets never committed
          p.flush();
          Map<TopicPartition, OffsetAndMetadata> before = admin.listConsumerGroupOffsets(group)
              .partitionsToOffsetAndMetadata().get();
          for (var e : next.entrySet()) {
            OffsetAndMetadata b = before.get(e.getKey());
            assertTrue(b == null || b.offset() < e.getValue().offset(),
                "pending offset " + e + " visible to the group before the commit: " + b);
          }
          p.abortTransaction();
          aborted++;
          Map<TopicPartition, OffsetAndMetadata> after = admin.listConsumerGroupOffsets(group)
              .partitionsToOffsetAndMetadata().get();
          assertEquals(before, after, "an aborted transaction changed the group's offsets");
          for (TopicPartition tp : recs.partitions()) {
            OffsetAndMetadata committed = after.get(tp);
            c.seek(tp, committed == null ? 0 : committed.offset());
          }
          continue;
        }
        p.commitTransaction();
        Map<TopicPartition, Long> want = new HashMap<>();
        next.forEach((tp, o) -> want.put(tp, o.offset()));
        awaitStableOffsets(group, want);
      }
    }
    assertTrue(aborted > 0, "no batch was aborted");

    List<String> want = new ArrayList<>();
    for (String v : values("in", n)) want.add(v.toUpperCase());
    assertValues(want, out, 3, IsolationLevel.READ_COMMITTED);
    assertTrue(readValues(out, 3, IsolationLevel.READ_UNCOMMITTED).size() > n,
        "the aborted batches are in the log for read_uncommitted readers");
    Map<TopicPartition, Long> end = new HashMap<>();
    for (TopicPartition tp : inTps) end.put(tp, (long) n / 3);
    awaitStableOffsets(group, end);
  }

  /**
   * Waits until the group's offsets of these partitions are the wanted ones. The COMMIT marker
   * that makes them visible follows EndTxn's answer; until then a stable read (KIP-447) answers
   * UNSTABLE_OFFSET_COMMIT for them, which Admin reports as absent.
   */
  static void awaitStableOffsets(String group, Map<TopicPartition, Long> want) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    Map<TopicPartition, Long> got = new HashMap<>();
    while (true) {
      Map<TopicPartition, OffsetAndMetadata> all = admin.listConsumerGroupOffsets(
          Map.of(group, new ListConsumerGroupOffsetsSpec().topicPartitions(want.keySet())),
          new ListConsumerGroupOffsetsOptions().requireStable(true)).partitionsToOffsetAndMetadata(group).get();
      got.clear();
      all.forEach((tp, o) -> got.put(tp, o == null ? null : o.offset()));
      if (got.equals(want) || System.nanoTime() > deadline) break;
      Thread.sleep(50);
    }
    assertEquals(want, got, "committed offsets of group " + group);
  }

  /**
   * The producer is on transactions v2: each commit and abort moves its epoch one up, at the
   * coordinator and in the partition (whose last marker carries it). Under v1 it would stay where
   * initTransactions put it.
   */
  @Test
  void underTransactionsV2EveryCommitAndAbortBumpsTheProducerEpoch() throws Exception {
    var features = admin.describeFeatures().featureMetadata().get();
    assertEquals(2, features.finalizedFeatures().get("transaction.version").maxVersionLevel());
    String t = Kafka.topic("txn-v2");
    String id = Kafka.topic("v2-id");
    Kafka.createTopic(admin, t, 1, Map.of());
    TopicPartition tp = new TopicPartition(t, 0);
    try (KafkaProducer<byte[], byte[]> p = txnProducer(id, Map.of())) {
      int first = admin.describeTransactions(List.of(id)).description(id).get().producerEpoch();
      for (int i = 0; i < 3; i++) {
        p.beginTransaction();
        produce(p, t, 1, "v2-" + i, 2);
        if (i == 1) p.abortTransaction();
        else p.commitTransaction();
      }
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
      while (true) {
        var d = admin.describeTransactions(List.of(id)).description(id).get();
        var producers = admin.describeProducers(List.of(tp)).partitionResult(tp).get().activeProducers();
        if (d.state() == TransactionState.COMPLETE_COMMIT && d.producerEpoch() == first + 3
            && producers.size() == 1 && producers.get(0).producerEpoch() == first + 3) break;
        if (System.nanoTime() > deadline) fail("epoch " + first + " + 3 expected: " + d + ", " + producers);
        Thread.sleep(100);
      }
    }
    List<String> want = new ArrayList<>(values("v2-0", 2));
    want.addAll(values("v2-2", 2));
    assertValues(want, t, 1, IsolationLevel.READ_COMMITTED);
  }

  @Test
  void aSecondProducerWithTheSameTransactionalIdFencesTheFirst() throws Exception {
    String t = Kafka.topic("txn-fence");
    String id = Kafka.topic("fence-id");
    Kafka.createTopic(admin, t, 1, Map.of());
    try (KafkaProducer<byte[], byte[]> older = txnProducer(id, Map.of())) {
      older.beginTransaction();
      produce(older, t, 1, "older", 10);
      older.flush();
      try (KafkaProducer<byte[], byte[]> newer = txnProducer(id, Map.of())) {
        // EndTxn with the older epoch: PRODUCER_FENCED. (A Produce with it would get Kafka's
        // INVALID_PRODUCER_EPOCH, which the client treats as abortable, not fatal.)
        Exception e = assertThrows(KafkaException.class, older::commitTransaction);
        assertTrue(rootOf(e, ProducerFencedException.class) != null, "older producer: " + e);
        newer.beginTransaction();
        produce(newer, t, 1, "newer", 5);
        newer.commitTransaction();
      }
      older.close(Duration.ZERO);
    }
    // the older producer's transaction was aborted by the newer one's initTransactions
    assertValues(values("newer", 5), t, 1, IsolationLevel.READ_COMMITTED);
  }

  @Test
  void aTransactionWhoseProducerVanishesIsAbortedAfterItsTimeout() throws Exception {
    String t = Kafka.topic("txn-timeout");
    Kafka.createTopic(admin, t, 1, Map.of());
    int timeoutMs = 3000;
    KafkaProducer<byte[], byte[]> vanished = txnProducer(Kafka.topic("timeout-id"),
        Map.of(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, String.valueOf(timeoutMs)));
    try {
      long began = System.nanoTime();
      vanished.beginTransaction();
      produce(vanished, t, 1, "open", 10);
      vanished.flush();
      // From here the producer sends nothing: to the broker it is gone.
      try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true"))) {
        produce(p, t, 1, "later", 5);
        p.flush();
      }
      TopicPartition tp = new TopicPartition(t, 0);
      try (KafkaConsumer<byte[], byte[]> c = reader(IsolationLevel.READ_COMMITTED)) {
        assertEquals(0L, c.endOffsets(List.of(tp)).get(tp), "LSO while the transaction is open");
        List<String> got = new ArrayList<>();
        c.assign(List.of(tp));
        c.seekToBeginning(List.of(tp));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(45);
        while (got.size() < 5 && System.nanoTime() < deadline) {
          for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(100))) got.add(Kafka.str(r.value()));
        }
        double secs = (System.nanoTime() - began) / 1e9;
        System.out.printf("[txn] open transaction aborted by its %d ms timeout; later data readable after %.1fs%n",
            timeoutMs, secs);
        assertEquals(values("later", 5), got, "read_committed after the timeout");
        assertTrue(secs * 1000 >= timeoutMs, "aborted before its timeout: " + secs + "s");
        assertEquals(16L, c.endOffsets(List.of(tp)).get(tp), "LSO = high watermark (10 + ABORT marker + 5)");
      }
      // The coordinator bumped the epoch when it aborted: the producer can no longer commit.
      Exception e = assertThrows(KafkaException.class, vanished::commitTransaction);
      System.out.println("[txn] commit after the timeout abort: " + e);
    } finally {
      vanished.close(Duration.ZERO);
    }
  }

  // -----------------------------------------------------------------------------------------
  // kafka-transactions.sh

  static Map<String, String> row(CliToolsTest.Result r, String key, String value) {
    List<String> lines = r.lines();
    assertTrue(!lines.isEmpty(), "no output: " + r);
    String[] head = lines.get(0).split("\\s+");
    for (String l : lines.subList(1, lines.size())) {
      String[] cols = l.split("\\s+");
      Map<String, String> m = new HashMap<>();
      for (int i = 0; i < head.length && i < cols.length; i++) m.put(head[i], cols[i]);
      if (value.equals(m.get(key))) return m;
    }
    fail("no row with " + key + "=" + value + " in:\n" + r);
    return null;
  }

  /** Runs kafka-transactions until the row with key=value has column=want (10 s at most). */
  static void awaitCli(String want, String column, String key, String value, String... args) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (true) {
      var r = CliToolsTest.ok(CliToolsTest.run(null, TRANSACTIONS, args));
      if (want.equals(row(r, key, value).get(column))) return;
      if (System.nanoTime() > deadline) fail("kafka-transactions " + String.join(" ", args) + ": " + column
          + " is not " + want + ":\n" + r);
      Thread.sleep(200);
    }
  }

  @Test
  void kafkaTransactionsListDescribeAndDescribeProducers() throws Exception {
    String b = Kafka.bootstrap();
    String t = Kafka.topic("txn-cli");
    String id = Kafka.topic("cli-id");
    Kafka.createTopic(admin, t, 2, Map.of());
    try (KafkaProducer<byte[], byte[]> p = txnProducer(id, Map.of())) {
      p.beginTransaction();
      p.send(new ProducerRecord<>(t, 1, null, Kafka.utf8("x"))).get();
      p.send(new ProducerRecord<>(t, 1, null, Kafka.utf8("y"))).get();

      var list = CliToolsTest.ok(CliToolsTest.run(null, TRANSACTIONS, "--bootstrap-server", b, "list"));
      Map<String, String> listed = row(list, "TransactionalId", id);
      assertEquals("Ongoing", listed.get("TransactionState"), list.toString());
      String producerId = listed.get("ProducerId");

      var desc = CliToolsTest.ok(CliToolsTest.run(null, TRANSACTIONS, "--bootstrap-server", b, "describe",
          "--transactional-id", id));
      Map<String, String> d = row(desc, "TransactionalId", id);
      assertEquals("Ongoing", d.get("TransactionState"), desc.toString());
      assertEquals(producerId, d.get("ProducerId"), desc.toString());
      assertEquals("60000", d.get("TransactionTimeoutMs"), desc.toString());
      assertTrue(desc.out().contains(t + "-1"), "partitions of the transaction in: " + desc);
      assertTrue(!desc.out().contains(t + "-0"), "a partition not in the transaction in: " + desc);

      var prod = CliToolsTest.ok(CliToolsTest.run(null, TRANSACTIONS, "--bootstrap-server", b, "describe-producers",
          "--topic", t, "--partition", "1"));
      Map<String, String> pr = row(prod, "ProducerId", producerId);
      assertEquals("1", pr.get("LastSequence"), prod.toString());
      assertEquals("0", pr.get("CurrentTransactionStartOffset"), prod.toString());

      p.commitTransaction();

      // PrepareCommit until the markers are written, which follows EndTxn's answer
      awaitCli("CompleteCommit", "TransactionState", "TransactionalId", id,
          "--bootstrap-server", b, "describe", "--transactional-id", id);
      awaitCli("None", "CurrentTransactionStartOffset", "ProducerId", producerId,
          "--bootstrap-server", b, "describe-producers", "--topic", t, "--partition", "1");
    }
    var missing = CliToolsTest.run(null, TRANSACTIONS, "--bootstrap-server", b, "describe",
        "--transactional-id", "no-such-" + id);
    assertTrue(missing.exit() != 0
            && (missing.err() + missing.out()).contains("Failed to describe transaction state of transactional-id"),
        "describe of an unknown id: " + missing);
  }
}
