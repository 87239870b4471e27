package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import strata.it.GroupSupport.StrataProcess;

/**
 * Share groups (KIP-932) with Kafka 4.4's KafkaShareConsumer, its console share consumer and
 * kafka-share-groups: records shared by more consumers than partitions, acknowledged, released,
 * rejected or left to their lock, and the state surviving a kill -9 of the broker.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class ShareGroupsTest {
  static final String SHARE_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ShareGroupCommand";
  static final String CONSOLE_SHARE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleShareConsumer";

  static void setGroupConfigs(String bs, String group, java.util.Map<String, String> configs) throws Exception {
    try (Admin a = GroupSupport.admin(bs)) {
      var res = new org.apache.kafka.common.config.ConfigResource(
          org.apache.kafka.common.config.ConfigResource.Type.GROUP, group);
      List<org.apache.kafka.clients.admin.AlterConfigOp> ops = new ArrayList<>();
      configs.forEach((k, v) -> ops.add(new org.apache.kafka.clients.admin.AlterConfigOp(
          new org.apache.kafka.clients.admin.ConfigEntry(k, v),
          org.apache.kafka.clients.admin.AlterConfigOp.OpType.SET)));
      a.incrementalAlterConfigs(java.util.Map.of(res, ops)).all().get();
    }
  }

  static void produce(String bs, String topic, int n, String prefix) throws Exception {
    try (KafkaProducer<String, String> pr =
        new KafkaProducer<>(GroupSupport.producerProps(bs), new StringSerializer(), new StringSerializer())) {
      for (int i = 0; i < n; i++) pr.send(new ProducerRecord<>(topic, prefix + i, prefix + i)).get();
    }
  }

  static Properties shareProps(String bs, String group) {
    Properties p = new Properties();
    p.put("bootstrap.servers", bs);
    p.put("group.id", group);
    return p;
  }

  @Test
  void recordsAConsumerStopsAcknowledgingComeBackAfterTheLockDuration() throws Exception {
    // Kafka keeps a group's share.record.lock.duration.ms at 15 s or more; the broker's default may be shorter.
    try (StrataProcess broker = new StrataProcess(List.of("--group-share-record-lock-duration-ms", "3000"))) {
      broker.start();
      String bs = broker.bootstrap();
      String topic = Kafka.topic("share-lock");
      String group = Kafka.topic("share-lock-g");
      try (Admin a = GroupSupport.admin(bs)) {
        a.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
      }
      setGroupConfigs(bs, group, java.util.Map.of("share.auto.offset.reset", "earliest"));
      produce(bs, topic, 5, "r");
      Properties p = shareProps(bs, group);
      p.put("share.acknowledgement.mode", "explicit");
      try (KafkaShareConsumer<String, String> stuck =
              new KafkaShareConsumer<>(p, new StringDeserializer(), new StringDeserializer());
          KafkaShareConsumer<String, String> other =
              new KafkaShareConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
        stuck.subscribe(List.of(topic));
        Set<String> held = new java.util.TreeSet<>();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (held.size() < 5 && System.nanoTime() < deadline) {
          for (ConsumerRecord<String, String> r : stuck.poll(Duration.ofMillis(200))) held.add(r.value());
        }
        assertEquals(5, held.size(), "the first consumer got every record");
        long acquired = System.nanoTime();
        // The first consumer neither acknowledges nor polls again; its locks run out.
        other.subscribe(List.of(topic));
        java.util.Map<String, Short> again = new java.util.TreeMap<>();
        deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (again.size() < 5 && System.nanoTime() < deadline) {
          for (ConsumerRecord<String, String> r : other.poll(Duration.ofMillis(200))) {
            again.put(r.value(), r.deliveryCount().orElse((short) -1));
            other.acknowledge(r, AcknowledgeType.ACCEPT);
          }
          other.commitSync();
        }
        long waitedMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - acquired);
        java.util.Map<String, Short> want = new java.util.TreeMap<>();
        for (int i = 0; i < 5; i++) want.put("r" + i, (short) 2);
        assertEquals(want, again, "redelivered after the lock\n" + broker.logs());
        assertTrue(waitedMs >= 2500, "redelivered only once the 3 s lock ran out, after " + waitedMs + " ms");
      }
    }
  }

  @Test
  void theConsoleShareConsumerAndKafkaShareGroupsWork() throws Exception {
    try (StrataProcess broker = new StrataProcess(List.of())) {
      broker.start();
      String bs = broker.bootstrap();
      String topic = Kafka.topic("share-tools");
      String group = Kafka.topic("share-tools-g");
      try (Admin a = GroupSupport.admin(bs)) {
        a.createTopics(List.of(new NewTopic(topic, 2, (short) 1))).all().get();
      }
      setGroupConfigs(bs, group, java.util.Map.of("share.auto.offset.reset", "earliest"));
      produce(bs, topic, 10, "m");
      var consumed = CliToolsTest.ok(CliToolsTest.run(null, CONSOLE_SHARE_CONSUMER, "--bootstrap-server", bs,
          "--topic", topic, "--group", group, "--max-messages", "10", "--timeout-ms", "30000"));
      assertEquals(10, consumed.lines().stream().filter(l -> l.startsWith("m")).count(), consumed.toString());

      var list = CliToolsTest.ok(sgc(bs, "--list"));
      assertTrue(list.lines().contains(group), list.toString());
      var offsets = CliToolsTest.ok(sgc(bs, "--describe", "--group", group));
      // GROUP TOPIC PARTITION START-OFFSET LAG: both partitions done with, no lag.
      List<String> rows = offsets.lines().stream().filter(l -> l.startsWith(group)).toList();
      assertEquals(2, rows.size(), offsets.toString());
      long total = 0;
      for (String row : rows) {
        String[] f = row.split("\\s+");
        assertEquals(topic, f[1], offsets.toString());
        assertEquals("0", f[4], "lag " + offsets);
        total += Long.parseLong(f[3]);
      }
      assertEquals(10, total, "start offsets add up to the records read\n" + offsets);
      var state = CliToolsTest.ok(sgc(bs, "--describe", "--group", group, "--state"));
      assertTrue(state.out().contains("Empty"), state.toString());

      // Reset to the earliest offsets: the console consumer reads all ten again.
      CliToolsTest.ok(sgc(bs, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute"));
      var reset = CliToolsTest.ok(sgc(bs, "--describe", "--group", group));
      for (String row : reset.lines().stream().filter(l -> l.startsWith(group)).toList()) {
        String[] f = row.split("\\s+");
        assertEquals("0", f[3], "start offset after the reset\n" + reset);
      }
      var again = CliToolsTest.ok(CliToolsTest.run(null, CONSOLE_SHARE_CONSUMER, "--bootstrap-server", bs,
          "--topic", topic, "--group", group, "--max-messages", "10", "--timeout-ms", "30000"));
      assertEquals(10, again.lines().stream().filter(l -> l.startsWith("m")).count(), again.toString());

      CliToolsTest.ok(sgc(bs, "--delete-offsets", "--group", group, "--topic", topic));
      var none = CliToolsTest.ok(sgc(bs, "--describe", "--group", group));
      assertTrue(none.lines().stream().noneMatch(l -> l.startsWith(group + " ") && l.contains(topic)), none.toString());
      CliToolsTest.ok(sgc(bs, "--delete", "--group", group));
      var after = CliToolsTest.ok(sgc(bs, "--list"));
      assertFalse(after.lines().contains(group), after.toString());
    }
  }

  static CliToolsTest.Result sgc(String bs, String... args) throws Exception {
    List<String> a = new ArrayList<>(List.of("--bootstrap-server", bs));
    a.addAll(List.of(args));
    return CliToolsTest.run(null, SHARE_GROUP_COMMAND, a.toArray(new String[0]));
  }
  @Test
  void fiveConsumersShareOnePartitionAndEveryRecordIsDelivered() throws Exception {
    try (StrataProcess broker = new StrataProcess(List.of())) {
      broker.start();
      String bs = broker.bootstrap();
      String topic = Kafka.topic("share-in");
      String group = Kafka.topic("share-g");
      try (Admin a = GroupSupport.admin(bs)) {
        a.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
      }
      Set<String> seen = ConcurrentHashMap.newKeySet();
      ConcurrentHashMap<String, Integer> perConsumer = new ConcurrentHashMap<>();
      AtomicBoolean stop = new AtomicBoolean();
      List<Thread> threads = new ArrayList<>();
      for (int i = 0; i < 5; i++) {
        String name = "c" + i;
        Thread t = new Thread(() -> {
          Properties p = new Properties();
          p.put("bootstrap.servers", bs);
          p.put("group.id", group);
          try (KafkaShareConsumer<String, String> c =
              new KafkaShareConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
            c.subscribe(List.of(topic));
            while (!stop.get()) {
              for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                seen.add(r.value());
                perConsumer.merge(name, 1, Integer::sum);
              }
            }
          }
        });
        t.start();
        threads.add(t);
      }
      Thread.sleep(8000);
      try (KafkaProducer<String, String> pr =
          new KafkaProducer<>(GroupSupport.producerProps(bs), new StringSerializer(), new StringSerializer())) {
        for (int i = 0; i < 1000; i++) {
          pr.send(new ProducerRecord<>(topic, "k" + i, "v" + i));
          if (i % 50 == 0) pr.flush();
        }
      }
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
      while (seen.size() < 1000 && System.nanoTime() < deadline) Thread.sleep(200);
      try (Admin a = GroupSupport.admin(bs)) {
        var d = a.describeShareGroups(List.of(group)).all().get().get(group);
        System.out.println("[share] described " + d);
        assertEquals(5, d.members().size(), d.toString());
        assertEquals(org.apache.kafka.common.GroupState.STABLE, d.groupState(), d.toString());
        for (var m : d.members()) assertEquals(1, m.assignment().topicPartitions().size(), d.toString());
      }
      stop.set(true);
      for (Thread t : threads) t.join(20000);
      System.out.println("[share] per consumer: " + perConsumer + " distinct " + seen.size());
      assertEquals(1000, seen.size(), "distinct records delivered\n" + broker.logs());
    }
  }

  @Test
  void releasedRecordsComeBackWithAHigherDeliveryCountAndRejectedOnesDoNot() throws Exception {
    try (StrataProcess broker = new StrataProcess(List.of())) {
      broker.start();
      String bs = broker.bootstrap();
      String topic = Kafka.topic("share-ack");
      try (Admin a = GroupSupport.admin(bs)) {
        a.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
      }
      Properties p = new Properties();
      p.put("bootstrap.servers", bs);
      p.put("group.id", Kafka.topic("share-ack-g"));
      p.put("share.acknowledgement.mode", "explicit");
      java.util.Map<String, List<Short>> deliveries = new java.util.TreeMap<>();
      try (KafkaShareConsumer<String, String> c =
          new KafkaShareConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
        c.subscribe(List.of(topic));
        long warm = System.nanoTime() + TimeUnit.SECONDS.toNanos(6);
        while (System.nanoTime() < warm) c.poll(Duration.ofMillis(200));
        try (KafkaProducer<String, String> pr =
            new KafkaProducer<>(GroupSupport.producerProps(bs), new StringSerializer(), new StringSerializer())) {
          for (int i = 0; i < 20; i++) pr.send(new ProducerRecord<>(topic, "k" + i, "v" + i));
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(40);
        while (System.nanoTime() < deadline) {
          for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
            short count = r.deliveryCount().orElse((short) -1);
            deliveries.computeIfAbsent(r.value(), k -> new ArrayList<>()).add(count);
            int i = Integer.parseInt(r.value().substring(1));
            AcknowledgeType t = count == 1 ? (i % 2 == 0 ? AcknowledgeType.RELEASE : AcknowledgeType.REJECT)
                : AcknowledgeType.ACCEPT;
            c.acknowledge(r, t);
          }
          c.commitSync();
          if (deliveries.size() == 20 && deliveries.entrySet().stream().filter(e -> Integer.parseInt(e.getKey().substring(1)) % 2 == 0).allMatch(e -> e.getValue().size() == 2)) break;
        }
      }
      System.out.println("[share] deliveries " + deliveries);
      for (int i = 0; i < 20; i++) {
        List<Short> d = deliveries.get("v" + i);
        List<Short> want = i % 2 == 0 ? List.of((short) 1, (short) 2) : List.of((short) 1);
        assertEquals(want, d, "deliveries of v" + i + "\n" + broker.logs());
      }
    }
  }

  @Test
  void aPoisonRecordStopsAtTheDeliveryCountLimit() throws Exception {
    try (StrataProcess broker = new StrataProcess(List.of())) {
      broker.start();
      String bs = broker.bootstrap();
      String topic = Kafka.topic("share-poison");
      String group = Kafka.topic("share-poison-g");
      try (Admin a = GroupSupport.admin(bs)) {
        a.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
        var res = new org.apache.kafka.common.config.ConfigResource(
            org.apache.kafka.common.config.ConfigResource.Type.GROUP, group);
        var ops = List.of(
            new org.apache.kafka.clients.admin.AlterConfigOp(
                new org.apache.kafka.clients.admin.ConfigEntry("share.delivery.count.limit", "2"),
                org.apache.kafka.clients.admin.AlterConfigOp.OpType.SET),
            new org.apache.kafka.clients.admin.AlterConfigOp(
                new org.apache.kafka.clients.admin.ConfigEntry("share.record.lock.duration.ms", "15000"),
                org.apache.kafka.clients.admin.AlterConfigOp.OpType.SET),
            new org.apache.kafka.clients.admin.AlterConfigOp(
                new org.apache.kafka.clients.admin.ConfigEntry("share.auto.offset.reset", "earliest"),
                org.apache.kafka.clients.admin.AlterConfigOp.OpType.SET));
        a.incrementalAlterConfigs(java.util.Map.of(res, ops)).all().get();
      }
      try (KafkaProducer<String, String> pr =
          new KafkaProducer<>(GroupSupport.producerProps(bs), new StringSerializer(), new StringSerializer())) {
        pr.send(new ProducerRecord<>(topic, "poison", "poison"));
        pr.send(new ProducerRecord<>(topic, "slow", "slow"));
      }
      Properties p = new Properties();
      p.put("bootstrap.servers", bs);
      p.put("group.id", group);
      p.put("share.acknowledgement.mode", "explicit");
      List<String> seen = new ArrayList<>();
      try (KafkaShareConsumer<String, String> c =
          new KafkaShareConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
        c.subscribe(List.of(topic));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
        boolean slowHeld = false;
        while (System.nanoTime() < deadline) {
          for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
            seen.add(r.value() + "#" + r.deliveryCount().orElse((short) -1));
            // The poison one is released every time; "slow" is accepted.
            c.acknowledge(r, r.value().equals("poison") ? AcknowledgeType.RELEASE : AcknowledgeType.ACCEPT);
          }
          c.commitSync();
        }
      }
      System.out.println("[share] poison run " + seen);
      assertEquals(List.of("poison#1", "slow#1", "poison#2"), seen);
    }
  }

  @Test
  void acknowledgementsSurviveAKill9OfTheBroker() throws Exception {
    try (StrataProcess broker = new StrataProcess(List.of())) {
      broker.start();
      String bs = broker.bootstrap();
      String topic = Kafka.topic("share-kill");
      String group = Kafka.topic("share-kill-g");
      try (Admin a = GroupSupport.admin(bs)) {
        a.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
        var res = new org.apache.kafka.common.config.ConfigResource(
            org.apache.kafka.common.config.ConfigResource.Type.GROUP, group);
        a.incrementalAlterConfigs(java.util.Map.of(res, List.of(new org.apache.kafka.clients.admin.AlterConfigOp(
            new org.apache.kafka.clients.admin.ConfigEntry("share.auto.offset.reset", "earliest"),
            org.apache.kafka.clients.admin.AlterConfigOp.OpType.SET)))).all().get();
      }
      try (KafkaProducer<String, String> pr =
          new KafkaProducer<>(GroupSupport.producerProps(bs), new StringSerializer(), new StringSerializer())) {
        for (int i = 0; i < 20; i++) pr.send(new ProducerRecord<>(topic, "k" + i, "v" + i));
      }
      Properties p = new Properties();
      p.put("bootstrap.servers", bs);
      p.put("group.id", group);
      p.put("share.acknowledgement.mode", "explicit");
      Set<String> first = new java.util.TreeSet<>();
      try (KafkaShareConsumer<String, String> c =
          new KafkaShareConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
        c.subscribe(List.of(topic));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (first.size() < 20 && System.nanoTime() < deadline) {
          for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
            first.add(r.value());
            int i = Integer.parseInt(r.value().substring(1));
            c.acknowledge(r, i < 10 ? AcknowledgeType.ACCEPT : AcknowledgeType.RELEASE);
          }
          c.commitSync();
        }
      }
      assertEquals(20, first.size(), "first pass");
      broker.kill9();
      broker.start();
      java.util.Map<String, Short> after = new java.util.TreeMap<>();
      try (KafkaShareConsumer<String, String> c =
          new KafkaShareConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
        c.subscribe(List.of(topic));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (after.size() < 10 && System.nanoTime() < deadline) {
          for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
            after.put(r.value(), r.deliveryCount().orElse((short) -1));
            c.acknowledge(r, AcknowledgeType.ACCEPT);
          }
          c.commitSync();
        }
        // Nothing more comes.
        long settle = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
        while (System.nanoTime() < settle) {
          for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
            after.put(r.value(), r.deliveryCount().orElse((short) -1));
            c.acknowledge(r, AcknowledgeType.ACCEPT);
          }
        }
      }
      System.out.println("[share] after kill -9: " + after);
      java.util.Map<String, Short> want = new java.util.TreeMap<>();
      for (int i = 10; i < 20; i++) want.put("v" + i, (short) 2);
      assertEquals(want, after, "redelivered after kill -9\n" + broker.logs());
    }
  }

  @Test
  void aConsumerKeepsConsumingAcrossABrokerKill9() throws Exception {
    try (StrataProcess broker = new StrataProcess(List.of())) {
      broker.start();
      String bs = broker.bootstrap();
      String topic = Kafka.topic("share-live");
      String group = Kafka.topic("share-live-g");
      try (Admin a = GroupSupport.admin(bs)) {
        a.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
        var res = new org.apache.kafka.common.config.ConfigResource(
            org.apache.kafka.common.config.ConfigResource.Type.GROUP, group);
        a.incrementalAlterConfigs(java.util.Map.of(res, List.of(new org.apache.kafka.clients.admin.AlterConfigOp(
            new org.apache.kafka.clients.admin.ConfigEntry("share.auto.offset.reset", "earliest"),
            org.apache.kafka.clients.admin.AlterConfigOp.OpType.SET)))).all().get();
      }
      Properties p = new Properties();
      p.put("bootstrap.servers", bs);
      p.put("group.id", group);
      Set<String> seen = new java.util.TreeSet<>();
      try (KafkaShareConsumer<String, String> c =
              new KafkaShareConsumer<>(p, new StringDeserializer(), new StringDeserializer());
          KafkaProducer<String, String> pr =
              new KafkaProducer<>(GroupSupport.producerProps(bs), new StringSerializer(), new StringSerializer())) {
        c.subscribe(List.of(topic));
        for (int i = 0; i < 10; i++) pr.send(new ProducerRecord<>(topic, "a" + i, "a" + i)).get();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (seen.size() < 10 && System.nanoTime() < deadline) {
          for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) seen.add(r.value());
        }
        c.commitSync();
        broker.kill9();
        broker.start();
        for (int i = 0; i < 10; i++) pr.send(new ProducerRecord<>(topic, "b" + i, "b" + i)).get();
        deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (seen.size() < 20 && System.nanoTime() < deadline) {
          for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) seen.add(r.value());
        }
      }
      assertEquals(20, seen.size(), "records seen across the restart: " + seen + "\n" + broker.logs());
    }
  }
}
