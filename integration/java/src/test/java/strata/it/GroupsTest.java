package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.InconsistentGroupProtocolException;
import org.apache.kafka.common.errors.OffsetMetadataTooLarge;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.message.HeartbeatRequestData;
import org.apache.kafka.common.message.OffsetCommitRequestData;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.requests.HeartbeatRequest;
import org.apache.kafka.common.requests.HeartbeatResponse;
import org.apache.kafka.common.requests.OffsetCommitRequest;
import org.apache.kafka.common.requests.OffsetCommitResponse;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import strata.it.GroupSupport.Consumption;
import strata.it.GroupSupport.Ledger;
import strata.it.GroupSupport.Member;
import strata.it.GroupSupport.ProcessMember;
import strata.it.GroupSupport.StrataProcess;

/**
 * Consumer groups (classic protocol) with the Apache Kafka Java client: a member crashing
 * mid-stream, every client-side assignor, static membership, committed offsets across kill -9
 * restarts of the broker, and fencing errors.
 */
@Timeout(value = 240, unit = TimeUnit.SECONDS)
class GroupsTest {
  static Admin admin;
  static final int ST = GroupSupport.sessionTimeoutMs();

  @BeforeAll
  static void setUp() {
    admin = Kafka.admin();
  }

  @AfterAll
  static void tearDown() {
    if (admin != null) admin.close(Duration.ofSeconds(5));
  }

  static Properties props(String group, Map<String, String> overrides) {
    return GroupSupport.consumerProps(Kafka.bootstrap(), group, overrides);
  }

  static String group(String prefix) {
    return Kafka.topic("g-" + prefix);
  }

  static Map<TopicPartition, Long> committed(Admin a, String group) throws Exception {
    Map<TopicPartition, Long> out = new HashMap<>();
    a.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
        .forEach((tp, om) -> { if (om != null) out.put(tp, om.offset()); });
    return out;
  }

  static Map<TopicPartition, Long> endOffsets(String topic, int n) {
    try (KafkaConsumer<byte[], byte[]> c = Kafka.consumer()) {
      return c.endOffsets(Kafka.partitions(topic, n));
    }
  }

  static ConsumerGroupDescription describe(Admin a, String group) throws Exception {
    return a.describeConsumerGroups(List.of(group)).describedGroups().get(group).get();
  }

  static String value(int i) {
    return "v-" + i;
  }

  static String key(int i) {
    return "k-" + (i % 97);
  }

  /**
   * Checks the ledger: every produced value consumed, contents intact, keys always on one partition,
   * and no record consumed twice unless all but at most one of its consumptions were in batches
   * whose commit did not go through (so duplicates only come from rebalances/crashes).
   */
  static void checkLedger(Ledger ledger, int n, String context) {
    List<String> missing = new ArrayList<>();
    for (int i = 0; i < n; i++) if (!ledger.byValue.containsKey(value(i))) missing.add(value(i));
    assertTrue(missing.isEmpty(), missing.size() + " records never consumed (first: "
        + missing.subList(0, Math.min(10, missing.size())) + "); " + context);
    assertEquals(n, ledger.distinct(), "distinct values consumed; " + context);
    Map<String, Integer> keyPartition = new HashMap<>();
    Map<Long, String> atOffset = new HashMap<>();
    int dups = 0;
    for (Consumption c : ledger.all()) {
      int i = Integer.parseInt(c.value().substring(2));
      assertEquals(key(i), c.key(), "key of " + c);
      Integer p = keyPartition.putIfAbsent(c.key(), c.partition());
      assertTrue(p == null || p == c.partition(), "key " + c.key() + " seen on partitions " + p + " and " + c.partition());
      String prev = atOffset.putIfAbsent(((long) c.partition() << 40) | c.offset(), c.value());
      assertTrue(prev == null || prev.equals(c.value()),
          "partition " + c.partition() + " offset " + c.offset() + " delivered as " + prev + " and " + c.value());
    }
    for (Map.Entry<String, List<Consumption>> e : ledger.byValue.entrySet()) {
      List<Consumption> cs = e.getValue();
      if (cs.size() < 2) continue;
      dups += cs.size() - 1;
      long committedOnes = cs.stream().filter(Consumption::committed).count();
      assertTrue(committedOnes <= 1, "record " + e.getKey() + " redelivered after a successful commit: " + cs);
    }
    // at-least-once with commit after processing: a record whose only consumptions were never
    // committed must have been redelivered to a survivor. The one exception is the victim's last
    // batch: its commitSync may have reached the broker just before the kill, so the commit
    // happened but its acknowledgement was lost, and nothing is redelivered (correctly).
    for (Map.Entry<String, List<Consumption>> e : ledger.byValue.entrySet()) {
      boolean victimOnly = e.getValue().stream().allMatch(c -> c.consumer().equals("victim"));
      assertTrue(e.getValue().stream().anyMatch(Consumption::committed) || victimOnly,
          "record " + e.getKey() + " was never consumed in a committed batch (not redelivered after the crash?): " + e.getValue());
    }
    System.out.println("[groups] " + context + ": " + ledger.total + " consumptions, " + n + " distinct, " + dups + " duplicates");
  }

  // -----------------------------------------------------------------------------------------
  // 1a. three members, one dies mid-stream

  @ParameterizedTest(name = "{0}")
  @ValueSource(strings = {"kill9", "closeZero"})
  void threeMembersOneDiesMidStreamEveryRecordAccountedFor(String how) throws Exception {
    final int n = 30_000;
    final int parts = 6;
    String t = Kafka.topic("grp-crash");
    String g = group("crash");
    Kafka.createTopic(admin, t, parts, Map.of());
    Ledger ledger = new Ledger();
    List<Member> survivors = new ArrayList<>();
    Member threadVictim = null;
    ProcessMember procVictim = null;
    try {
      survivors.add(new Member("m1", ledger, props(g, Map.of()), List.of(t)).start());
      survivors.add(new Member("m2", ledger, props(g, Map.of()), List.of(t)).start());
      if (how.equals("kill9")) {
        procVictim = new ProcessMember("victim", ledger, Kafka.bootstrap(), t, g, ST);
      } else {
        threadVictim = new Member("victim", ledger, props(g, Map.of()), List.of(t)).start();
      }
      final ProcessMember pv = procVictim;
      final Member tv = threadVictim;
      java.util.function.Supplier<String> state = () -> survivors + " victim=" + (pv != null ? pv : tv);
      java.util.function.IntSupplier victimParts = () -> pv != null
          ? (pv.assignment.equals("[]") || pv.assignment.isEmpty() ? 0 : pv.assignment.split(",").length)
          : tv.owned().size();
      GroupSupport.await("three members with 2 partitions each", Duration.ofSeconds(90),
          () -> survivors.stream().allMatch(m -> m.owned().size() == 2) && victimParts.getAsInt() == 2, state);
      ConsumerGroupDescription d0 = describe(admin, g);
      assertEquals(3, d0.members().size(), "members before the crash: " + d0);
      assertEquals(GroupState.STABLE, d0.groupState(), d0.toString());
      for (MemberDescription m : d0.members()) assertEquals(2, m.assignment().topicPartitions().size(), d0.toString());

      // producer writes while the group consumes
      AtomicReference<Throwable> prodErr = new AtomicReference<>();
      Thread producer = new Thread(() -> {
        try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(GroupSupport.producerProps(Kafka.bootstrap()))) {
          for (int i = 0; i < n; i++) {
            p.send(new ProducerRecord<>(t, Kafka.utf8(key(i)), Kafka.utf8(value(i))), (md, e) -> {
              if (e != null) prodErr.compareAndSet(null, e);
            });
            if (i % 1000 == 999) Thread.sleep(100); // ~3s of producing, spread over the crash
          }
          p.flush();
        } catch (Throwable e) {
          prodErr.compareAndSet(null, e);
        }
      }, "producer");
      producer.start();

      GroupSupport.await("a third of the records consumed", Duration.ofSeconds(60), () -> ledger.distinct() >= n / 3, state);
      long killedAt = System.nanoTime();
      int victimConsumed;
      int victimUncommitted = 0;
      if (pv != null) {
        // kill it between processing a batch and committing it (MemberMain sleeps 20ms in between)
        GroupSupport.await("victim inside process->commit window", Duration.ofSeconds(30), () -> {
          synchronized (pv.pending) { return !pv.pending.isEmpty(); }
        }, state);
        synchronized (pv.pending) {
          pv.kill9ASAP();
          victimUncommitted = pv.pending.size();
        }
        pv.kill9();
        victimConsumed = (int) ledger.all().stream().filter(c -> c.consumer().equals("victim")).count();
      } else {
        // close(Duration.ZERO) from the member's own thread: LeaveGroup is sent without waiting
        tv.stopAndClose(CloseOptions.timeout(Duration.ZERO));
        victimConsumed = (int) ledger.all().stream().filter(c -> c.consumer().equals("victim")).count();
      }
      assertTrue(victimConsumed > 0, "victim consumed nothing before it died: " + state.get());
      System.out.printf("[groups] %s: victim died after %d records, %d of them processed but not committed%n",
          how, victimConsumed, victimUncommitted);

      producer.join(120_000);
      assertEquals(null, prodErr.get(), "producer error");

      Map<TopicPartition, Long> end = endOffsets(t, parts);
      assertEquals((long) n, end.values().stream().mapToLong(Long::longValue).sum(), "end offsets " + end);
      GroupSupport.await("all records consumed and committed by the two survivors", Duration.ofSeconds(120), () -> {
        try {
          return ledger.distinct() == n && committed(admin, g).equals(end)
              && survivors.stream().allMatch(m -> m.owned().size() == 3);
        } catch (Exception e) {
          return false;
        }
      }, () -> {
        try {
          return "distinct=" + ledger.distinct() + " committed=" + committed(admin, g) + " end=" + end + " " + state.get();
        } catch (Exception e) {
          return e.toString();
        }
      });
      double secs = (System.nanoTime() - killedAt) / 1e9;
      System.out.printf("[groups] %s: all %d records committed %.1fs after the victim died (session.timeout.ms=%d)%n",
          how, n, secs, ST);

      // balanced and disjoint at the end, and the broker's view agrees with the clients'
      Set<TopicPartition> union = new HashSet<>();
      for (Member m : survivors) {
        assertEquals(3, m.owned().size(), "partitions of " + m);
        for (TopicPartition tp : m.owned()) assertTrue(union.add(tp), tp + " owned twice: " + survivors);
        assertEquals(null, m.error, m.toString());
      }
      assertEquals(new HashSet<>(Kafka.partitions(t, parts)), union);
      ConsumerGroupDescription d1 = describe(admin, g);
      assertEquals(GroupState.STABLE, d1.groupState(), d1.toString());
      assertEquals(2, d1.members().size(), "members after the crash: " + d1);
      Set<TopicPartition> brokerView = new HashSet<>();
      for (MemberDescription m : d1.members()) {
        assertEquals(3, m.assignment().topicPartitions().size(), d1.toString());
        brokerView.addAll(m.assignment().topicPartitions());
      }
      assertEquals(union, brokerView, "assignment stored by the broker");
      checkLedger(ledger, n, how);
    } finally {
      for (Member m : survivors) m.close();
      if (procVictim != null) procVictim.close();
      if (threadVictim != null) threadVictim.close();
    }
  }

  // -----------------------------------------------------------------------------------------
  // 1b. client-side assignors; the broker selects the protocol every member supports

  @ParameterizedTest(name = "{0}")
  @ValueSource(strings = {"range", "roundrobin", "sticky", "cooperative-sticky"})
  void assignorSplitsFourPartitionsTwoAndTwo(String assignor) throws Exception {
    String cls = switch (assignor) {
      case "range" -> "org.apache.kafka.clients.consumer.RangeAssignor";
      case "roundrobin" -> "org.apache.kafka.clients.consumer.RoundRobinAssignor";
      case "sticky" -> "org.apache.kafka.clients.consumer.StickyAssignor";
      default -> "org.apache.kafka.clients.consumer.CooperativeStickyAssignor";
    };
    String t = Kafka.topic("grp-assignor");
    String g = group(assignor);
    Kafka.createTopic(admin, t, 4, Map.of());
    Map<String, String> o = Map.of(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, cls);
    Ledger ledger = new Ledger();
    int per = 50;
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
      for (int i = 0; i < 4 * per; i++) p.send(new ProducerRecord<>(t, i % 4, Kafka.utf8(key(i)), Kafka.utf8(value(i))));
      p.flush();
    }
    try (Member a = new Member("a", ledger, props(g, o), List.of(t)).start()) {
      GroupSupport.await("first member owns 4 partitions", Duration.ofSeconds(60), () -> a.owned().size() == 4, a::toString);
      try (Member b = new Member("b", ledger, props(g, o), List.of(t)).start()) {
        GroupSupport.await("2 + 2 partitions", Duration.ofSeconds(60),
            () -> a.owned().size() == 2 && b.owned().size() == 2, () -> a + " " + b);
        Set<TopicPartition> u = new HashSet<>(a.owned());
        u.addAll(b.owned());
        assertEquals(new HashSet<>(Kafka.partitions(t, 4)), u, a + " " + b);
        ConsumerGroupDescription d = describe(admin, g);
        assertEquals(assignor, d.partitionAssignor(), "protocol selected by the broker: " + d);
        assertEquals(2, d.members().size(), d.toString());
        for (MemberDescription m : d.members()) assertEquals(2, m.assignment().topicPartitions().size(), d.toString());
        if (assignor.equals("cooperative-sticky")) {
          assertEquals(0, a.lostCalls.get(), a.toString());
        }
        // second batch, produced while both are members: each record goes to its partition's owner
        try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
          for (int i = 4 * per; i < 8 * per; i++) p.send(new ProducerRecord<>(t, i % 4, Kafka.utf8(key(i)), Kafka.utf8(value(i))));
          p.flush();
        }
        Map<TopicPartition, Long> end = endOffsets(t, 4);
        GroupSupport.await("all 400 records consumed and committed", Duration.ofSeconds(60),
            () -> {
              try {
                return ledger.distinct() == 8 * per && committed(admin, g).equals(end);
              } catch (Exception e) {
                return false;
              }
            }, () -> "distinct=" + ledger.distinct() + " " + a + " " + b);
        for (Consumption c : ledger.all()) {
          int i = Integer.parseInt(c.value().substring(2));
          assertEquals(i % 4, c.partition(), c.toString());
          if (i >= 4 * per) {
            Member owner = a.owned().contains(new TopicPartition(t, c.partition())) ? a : b;
            assertEquals(owner.name, c.consumer(), "second-batch record consumed by a non-owner: " + c);
          }
        }
        // keys here are not partition-bound (explicit partitions), so only check coverage/duplicates
        for (int i = 0; i < 8 * per; i++) assertTrue(ledger.byValue.containsKey(value(i)), "missing " + value(i));
        for (var e : ledger.byValue.entrySet()) {
          assertTrue(e.getValue().stream().filter(Consumption::committed).count() <= 1,
              "redelivered after commit: " + e.getValue());
        }
        assertEquals(null, a.error, a.toString());
        assertEquals(null, b.error, b.toString());
      }
    }
  }

  @Test
  void brokerSelectsTheProtocolAllMembersSupport() throws Exception {
    String t = Kafka.topic("grp-proto");
    String g = group("proto");
    Kafka.createTopic(admin, t, 4, Map.of());
    Ledger ledger = new Ledger();
    String rr = "org.apache.kafka.clients.consumer.RoundRobinAssignor";
    String range = "org.apache.kafka.clients.consumer.RangeAssignor";
    String sticky = "org.apache.kafka.clients.consumer.StickyAssignor";
    try (Member a = new Member("a", ledger, props(g, Map.of(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, rr + "," + range)), List.of(t)).start();
         Member b = new Member("b", ledger, props(g, Map.of(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, range)), List.of(t)).start()) {
      GroupSupport.await("2 + 2 partitions", Duration.ofSeconds(60),
          () -> a.owned().size() == 2 && b.owned().size() == 2, () -> a + " " + b);
      assertEquals("range", describe(admin, g).partitionAssignor(), "a prefers roundrobin but b only has range");
      // a member with no protocol in common is refused, and the group is not disturbed
      int genBefore = b.generation;
      try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(
          props(g, Map.of(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, sticky)))) {
        c.subscribe(List.of(t));
        long deadline = System.currentTimeMillis() + 30_000;
        Exception thrown = null;
        while (System.currentTimeMillis() < deadline && thrown == null) {
          try {
            c.poll(Duration.ofMillis(200));
          } catch (Exception e) {
            thrown = e;
          }
        }
        assertInstanceOf(InconsistentGroupProtocolException.class, thrown, "joining with only 'sticky'");
      }
      Thread.sleep(1000);
      assertEquals(genBefore, b.generation, "generation changed by a refused member: " + b);
      assertEquals(2, describe(admin, g).members().size());
    }
  }

  // -----------------------------------------------------------------------------------------
  // 1c. static membership

  @Test
  void staticMemberRestartWithinSessionTimeoutCausesNoRebalance() throws Exception {
    String t = Kafka.topic("grp-static");
    String g = group("static");
    Kafka.createTopic(admin, t, 4, Map.of());
    int st = Math.max(ST, 10_000); // generous, so a JVM hiccup does not expire the restarting member
    Map<String, String> common = Map.of(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, String.valueOf(st),
        ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
    Map<String, String> oa = new HashMap<>(common);
    oa.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, "instance-a");
    oa.put(ConsumerConfig.CLIENT_ID_CONFIG, "static-a");
    Map<String, String> ob = new HashMap<>(common);
    ob.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, "instance-b");
    Ledger ledger = new Ledger();
    int per = 25;
    try (Member b = new Member("b", ledger, props(g, ob), List.of(t)).start()) {
      GroupSupport.await("b (leader) owns 4", Duration.ofSeconds(60), () -> b.owned().size() == 4, b::toString);
      Member a = new Member("a", ledger, props(g, oa), List.of(t)).start();
      Member a2 = null;
      try {
        GroupSupport.await("2 + 2", Duration.ofSeconds(60), () -> a.owned().size() == 2 && b.owned().size() == 2,
            () -> a + " " + b);
        produceToPartitions(t, 4, 0, per); // first batch once both are members: a's partitions go to a
        GroupSupport.await("first 100 records committed", Duration.ofSeconds(60), () -> {
          try {
            return committed(admin, g).values().stream().mapToLong(Long::longValue).sum() == 4L * per;
          } catch (Exception e) {
            return false;
          }
        }, () -> a + " " + b);
        ConsumerGroupDescription d = describe(admin, g);
        Set<String> instances = d.members().stream().map(m -> m.groupInstanceId().orElse("-")).collect(Collectors.toSet());
        assertEquals(Set.of("instance-a", "instance-b"), instances, d.toString());
        Set<TopicPartition> aParts = a.owned();
        int gen = b.generation;
        int bAssigned = b.assignedCalls.get();
        int bRevoked = b.revokedCalls.get();
        String aMemberIdBefore = a.memberId;

        // a goes away without leaving the group, and a new consumer with the same instance id comes back
        a.stopAndClose(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.REMAIN_IN_GROUP)
            .withTimeout(Duration.ofSeconds(5)));
        assertEquals(null, a.error, a.toString());
        long closedAt = System.nanoTime();
        Member a2f = new Member("a2", ledger, props(g, oa), List.of(t)).start();
        a2 = a2f;
        GroupSupport.await("restarted static member gets its partitions back", Duration.ofSeconds(st / 1000),
            () -> a2f.owned().size() == 2, () -> a2f + " " + b);
        double restartSecs = (System.nanoTime() - closedAt) / 1e9;
        assertEquals(aParts, a2f.owned(), "restarted static member's assignment");
        Thread.sleep(2000); // several heartbeats of b
        assertEquals(gen, b.generation, "b saw a new generation: " + b);
        assertEquals(gen, a2f.generation, "restarted member's generation: " + a2f);
        assertEquals(bAssigned, b.assignedCalls.get(), "b's onPartitionsAssigned calls: " + b);
        assertEquals(bRevoked, b.revokedCalls.get(), "b's onPartitionsRevoked calls: " + b);
        assertNotEquals(aMemberIdBefore, a2f.memberId, "a new member id is issued to the restarted instance");
        System.out.printf("[groups] static member back after %.2fs, generation %d unchanged%n", restartSecs, gen);

        // the restarted instance resumes from a's committed offsets: new records only, no gaps
        int consumedBefore = ledger.total.get();
        produceToPartitions(t, 4, 4 * per, per);
        Map<TopicPartition, Long> end = endOffsets(t, 4);
        // The committed offsets move before the member records the batch in the ledger (the
        // broker stores the commit before the member reads its response), so wait for both.
        GroupSupport.await("second batch committed and recorded", Duration.ofSeconds(60), () -> {
          try {
            return committed(admin, g).equals(end) && ledger.distinct() == 8 * per;
          } catch (Exception e) {
            return false;
          }
        }, () -> a2f + " " + b);
        checkLedgerSimple(ledger, 8 * per);
        assertEquals(8 * per, ledger.total.get(), "no record delivered twice (consumed before restart: " + consumedBefore + ")");
        for (Consumption c : ledger.all()) {
          int i = Integer.parseInt(c.value().substring(2));
          boolean aPart = aParts.contains(new TopicPartition(t, c.partition()));
          String want = !aPart ? "b" : i < 4 * per ? "a" : "a2";
          assertEquals(want, c.consumer(), "consumer of " + c);
        }

        // a static member that does not come back is removed after session.timeout.ms, not earlier
        a2f.stopAndClose(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.REMAIN_IN_GROUP)
            .withTimeout(Duration.ofSeconds(5)));
        long goneAt = System.nanoTime();
        Thread.sleep(Math.min(2000, st / 3));
        assertEquals(2, b.owned().size(), "b took over before the session timeout: " + b);
        GroupSupport.await("b owns all 4 after the session timeout", Duration.ofMillis(st + 15_000),
            () -> b.owned().size() == 4, b::toString);
        double took = (System.nanoTime() - goneAt) / 1e9;
        assertTrue(took * 1000 >= st - 1500, "rebalance after " + took + "s, session timeout " + st + "ms");
        ConsumerGroupDescription d2 = describe(admin, g);
        assertEquals(1, d2.members().size(), d2.toString());
        assertEquals("instance-b", d2.members().iterator().next().groupInstanceId().orElse(null), d2.toString());
      } finally {
        a.close();
        if (a2 != null) a2.close();
      }
    }
  }

  static void produceToPartitions(String t, int parts, int from, int per) throws Exception {
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
      for (int i = from; i < from + parts * per; i++) {
        p.send(new ProducerRecord<>(t, i % parts, Kafka.utf8(key(i)), Kafka.utf8(value(i))));
      }
      p.flush();
    }
  }

  static void checkLedgerSimple(Ledger ledger, int n) {
    for (int i = 0; i < n; i++) assertTrue(ledger.byValue.containsKey(value(i)), "never consumed: " + value(i));
    assertEquals(n, ledger.distinct());
  }

  // -----------------------------------------------------------------------------------------
  // 1d. committed offsets and groups survive kill -9 of the broker (private broker, default group settings)

  @Test
  void committedOffsetsSurviveBrokerKill9() throws Exception {
    try (StrataProcess broker = new StrataProcess(List.of())) { // Kafka's defaults: 3s initial delay, 6s min session
      broker.start();
      String bs = broker.bootstrap();
      String t = Kafka.topic("grp-restart");
      String g = "restart-g";
      String g2 = "restart-g2";
      try {
        try (Admin a = GroupSupport.admin(bs)) {
          a.createTopics(List.of(new org.apache.kafka.clients.admin.NewTopic(t, 3, (short) 1))).all().get();
        }
        try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(GroupSupport.producerProps(bs))) {
          for (int i = 0; i < 90; i++) p.send(new ProducerRecord<>(t, i % 3, Kafka.utf8(key(i)), Kafka.utf8(value(i))));
          p.flush();
        }
        Map<TopicPartition, OffsetAndMetadata> want = Map.of(
            new TopicPartition(t, 0), new OffsetAndMetadata(10, "meta-0"),
            new TopicPartition(t, 1), new OffsetAndMetadata(20, "meta-1 \u00e9\u4e2d"),
            new TopicPartition(t, 2), new OffsetAndMetadata(30, ""));
        Properties cp = GroupSupport.consumerProps(bs, g, Map.of(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000",
            ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000"));
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(cp)) {
          c.subscribe(List.of(t));
          long deadline = System.currentTimeMillis() + 60_000;
          while (c.assignment().size() < 3 && System.currentTimeMillis() < deadline) c.poll(Duration.ofMillis(100));
          assertEquals(3, c.assignment().size(), "assignment with a default-config broker");
          c.commitSync(want);
        }
        try (Admin a = GroupSupport.admin(bs)) {
          a.alterConsumerGroupOffsets(g2, Map.of(new TopicPartition(t, 1), new OffsetAndMetadata(5, "other"))).all().get();
          assertOffsets(a, g, want, "before kill -9");
        }

        long t0 = System.nanoTime();
        broker.kill9();
        broker.start();
        System.out.printf("[groups] broker kill -9 + restart took %.2fs%n", (System.nanoTime() - t0) / 1e9);

        try (Admin a = GroupSupport.admin(bs)) {
          assertOffsets(a, g, want, "after kill -9 and restart");
          assertOffsets(a, g2, Map.of(new TopicPartition(t, 1), new OffsetAndMetadata(5, "other")), "second group after restart");
          Set<String> groups = a.listConsumerGroups().all().get().stream().map(ConsumerGroupListing::groupId).collect(Collectors.toSet());
          assertTrue(groups.containsAll(Set.of(g, g2)), "groups listed after restart: " + groups);
          ConsumerGroupDescription d = a.describeConsumerGroups(List.of(g)).describedGroups().get(g).get();
          assertEquals(GroupState.EMPTY, d.groupState(), d.toString());
        }

        // a new consumer of the group resumes exactly at the committed offsets
        try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(GroupSupport.producerProps(bs))) {
          for (int i = 90; i < 95; i++) p.send(new ProducerRecord<>(t, 2, Kafka.utf8(key(i)), Kafka.utf8(value(i))));
          p.flush();
        }
        Map<Integer, List<Long>> got = new TreeMap<>();
        Map<TopicPartition, Long> end = Map.of(new TopicPartition(t, 0), 30L, new TopicPartition(t, 1), 30L,
            new TopicPartition(t, 2), 35L);
        KafkaConsumer<byte[], byte[]> c2 = new KafkaConsumer<>(cp);
        try {
          c2.subscribe(List.of(t));
          long deadline = System.currentTimeMillis() + 60_000;
          int n = 0;
          while (n < 20 + 10 + 5 && System.currentTimeMillis() < deadline) {
            for (ConsumerRecord<byte[], byte[]> r : c2.poll(Duration.ofMillis(100))) {
              got.computeIfAbsent(r.partition(), k -> new ArrayList<>()).add(r.offset());
              int i = Integer.parseInt(Kafka.str(r.value()).substring(2));
              if (r.partition() < 2) assertEquals(r.offset() * 3 + r.partition(), i, "value at " + r);
              n++;
            }
            c2.commitSync();
          }
          assertEquals(range(10, 30), got.get(0), "partition 0 resumed from committed 10");
          assertEquals(range(20, 30), got.get(1), "partition 1 resumed from committed 20");
          assertEquals(range(30, 35), got.get(2), "partition 2 resumed from committed 30");
          try (Admin a = GroupSupport.admin(bs)) {
            assertEquals(end, committed(a, g), "commits of the resumed consumer");
          }

          // kill -9 with the member still active: its commits are there after restart, and it rejoins
          broker.kill9();
          broker.start();
          try (Admin a = GroupSupport.admin(bs)) {
            assertEquals(end, committed(a, g), "commits after the second kill -9");
          }
          try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(GroupSupport.producerProps(bs))) {
            for (int i = 95; i < 98; i++) p.send(new ProducerRecord<>(t, 0, Kafka.utf8(key(i)), Kafka.utf8(value(i))));
            p.flush();
          }
          List<String> after = new ArrayList<>();
          deadline = System.currentTimeMillis() + 60_000;
          while (after.size() < 3 && System.currentTimeMillis() < deadline) {
            try {
              for (ConsumerRecord<byte[], byte[]> r : c2.poll(Duration.ofMillis(100))) after.add(r.partition() + "@" + r.offset() + "=" + Kafka.str(r.value()));
              c2.commitSync();
            } catch (org.apache.kafka.common.errors.RetriableException | org.apache.kafka.clients.consumer.CommitFailedException e) {
              // reconnecting / rejoining
            }
          }
          assertEquals(List.of("0@30=v-95", "0@31=v-96", "0@32=v-97"), after, "records after the second restart");
          GroupSupport.await("commit of 33 on partition 0", Duration.ofSeconds(30), () -> {
            try (Admin a = GroupSupport.admin(bs)) {
              return Long.valueOf(33).equals(committed(a, g).get(new TopicPartition(t, 0)));
            } catch (Exception e) {
              return false;
            }
          }, () -> "");
        } finally {
          c2.close(Duration.ofSeconds(5));
        }
      } catch (Throwable e) {
        throw new AssertionError(e.getMessage() + "\nprivate broker logs:\n" + broker.logs(), e);
      }
    }
  }

  static List<Long> range(long from, long to) {
    List<Long> l = new ArrayList<>();
    for (long i = from; i < to; i++) l.add(i);
    return l;
  }

  static void assertOffsets(Admin a, String g, Map<TopicPartition, OffsetAndMetadata> want, String when) throws Exception {
    Map<TopicPartition, OffsetAndMetadata> got = a.listConsumerGroupOffsets(g).partitionsToOffsetAndMetadata().get();
    Map<TopicPartition, String> w = new TreeMap<>(java.util.Comparator.comparing(TopicPartition::toString));
    Map<TopicPartition, String> gg = new TreeMap<>(java.util.Comparator.comparing(TopicPartition::toString));
    want.forEach((tp, om) -> w.put(tp, om.offset() + "/" + om.metadata()));
    got.forEach((tp, om) -> gg.put(tp, om == null ? "null" : om.offset() + "/" + om.metadata()));
    assertEquals(w, gg, "committed offsets of " + g + " " + when);
  }

  // -----------------------------------------------------------------------------------------
  // 4. bad input: right error codes, no effect on the group or on other groups

  @Test
  void fencingAndBadCommitsGetTheRightErrorsAndLeaveGroupsAlone() throws Exception {
    String t = Kafka.topic("grp-bad");
    String g = group("bad");
    String other = group("bad-other");
    Kafka.createTopic(admin, t, 2, Map.of());
    TopicPartition p0 = new TopicPartition(t, 0);
    admin.alterConsumerGroupOffsets(other, Map.of(p0, new OffsetAndMetadata(7, "keep"))).all().get();
    Ledger ledger = new Ledger();
    try (Member m = new Member("m", ledger, props(g, Map.of()), List.of(t)).start()) {
      GroupSupport.await("member owns 2", Duration.ofSeconds(60), () -> m.owned().size() == 2 && m.generation > 0, m::toString);
      int gen = m.generation;
      String mid = m.memberId;
      m.call(c -> { c.commitSync(Map.of(p0, new OffsetAndMetadata(3, "good"))); return null; });

      // heartbeat from an unknown member / with a stale generation
      HeartbeatResponse hb1 = (HeartbeatResponse) Kafka.rawRequest(ApiKeys.HEARTBEAT, new HeartbeatRequest.Builder(
          new HeartbeatRequestData().setGroupId(g).setGenerationId(gen).setMemberId("no-such-member")));
      assertEquals(Errors.UNKNOWN_MEMBER_ID, hb1.error(), "heartbeat from unknown member");
      HeartbeatResponse hb2 = (HeartbeatResponse) Kafka.rawRequest(ApiKeys.HEARTBEAT, new HeartbeatRequest.Builder(
          new HeartbeatRequestData().setGroupId(g).setGenerationId(gen + 7).setMemberId(mid)));
      assertEquals(Errors.ILLEGAL_GENERATION, hb2.error(), "heartbeat with a wrong generation");
      HeartbeatResponse hb3 = (HeartbeatResponse) Kafka.rawRequest(ApiKeys.HEARTBEAT, new HeartbeatRequest.Builder(
          new HeartbeatRequestData().setGroupId(group("nonexistent")).setGenerationId(1).setMemberId("x")));
      assertTrue(hb3.error() == Errors.UNKNOWN_MEMBER_ID || hb3.error() == Errors.GROUP_ID_NOT_FOUND,
          "heartbeat to a group that does not exist: " + hb3.error());

      // commits with a stale generation / unknown member / unknown topic / unknown partition
      assertEquals(Errors.ILLEGAL_GENERATION, rawCommit(g, gen - 1, mid, t, 0, 99), "commit with stale generation");
      assertEquals(Errors.UNKNOWN_MEMBER_ID, rawCommit(g, gen, "no-such-member", t, 0, 99), "commit from unknown member");
      assertEquals(Errors.UNKNOWN_TOPIC_OR_PARTITION, rawCommit(g, gen, mid, "no-such-topic-" + t, 0, 99), "commit for unknown topic");
      assertEquals(Errors.UNKNOWN_TOPIC_OR_PARTITION, rawCommit(g, gen, mid, t, 9, 99), "commit for unknown partition");

      // the Java client's view of the same errors
      ExecutionException e1 = assertThrows(ExecutionException.class, () -> admin.alterConsumerGroupOffsets(other,
          Map.of(new TopicPartition("no-such-topic-" + t, 0), new OffsetAndMetadata(1))).all().get());
      assertInstanceOf(UnknownTopicOrPartitionException.class, e1.getCause(), e1.toString());
      ExecutionException e2 = assertThrows(ExecutionException.class, () -> m.call(c -> {
        c.commitSync(Map.of(new TopicPartition(t, 1), new OffsetAndMetadata(1, "x".repeat(5000))));
        return null;
      }));
      assertInstanceOf(OffsetMetadataTooLarge.class, e2.getCause(), e2.toString());

      // none of it changed anything
      Thread.sleep(500);
      assertEquals(gen, m.generation, "member's generation after bad requests: " + m);
      assertEquals(Map.of(p0, 3L), committed(admin, g), "offsets of the group after bad commits");
      assertOffsets(admin, other, Map.of(p0, new OffsetAndMetadata(7, "keep")), "other group");
      ConsumerGroupDescription d = describe(admin, g);
      assertEquals(1, d.members().size(), d.toString());
      assertEquals(GroupState.STABLE, d.groupState(), d.toString());
      assertEquals(null, m.error, m.toString());
    }
  }

  static Errors rawCommit(String g, int gen, String member, String topic, int partition, long offset) throws Exception {
    OffsetCommitRequestData data = new OffsetCommitRequestData().setGroupId(g).setGenerationIdOrMemberEpoch(gen)
        .setMemberId(member).setTopics(List.of(new OffsetCommitRequestData.OffsetCommitRequestTopic().setName(topic)
            .setPartitions(List.of(new OffsetCommitRequestData.OffsetCommitRequestPartition()
                .setPartitionIndex(partition).setCommittedOffset(offset)))));
    OffsetCommitResponse r = (OffsetCommitResponse) Kafka.rawRequest(ApiKeys.OFFSET_COMMIT, OffsetCommitRequest.Builder.forTopicNames(data));
    var topics = r.data().topics();
    if (topics.size() != 1 || topics.get(0).partitions().size() != 1) fail("unexpected commit response " + r.data());
    return Errors.forCode(topics.get(0).partitions().get(0).errorCode());
  }
}
