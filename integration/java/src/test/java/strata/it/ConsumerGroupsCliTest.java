package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import strata.it.CliToolsTest.Result;

/** kafka-consumer-groups (ConsumerGroupCommand of kafka-tools 4.1) against strata, checked on printed content. */
@Timeout(value = 300, unit = TimeUnit.SECONDS)
class ConsumerGroupsCliTest {
  static final String CGC = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand";
  static Admin admin;

  @BeforeAll
  static void setUp() {
    admin = Kafka.admin();
  }

  @AfterAll
  static void tearDown() {
    if (admin != null) admin.close(Duration.ofSeconds(5));
  }

  static Result cgc(String... args) throws Exception {
    List<String> a = new ArrayList<>(List.of("--bootstrap-server", Kafka.bootstrap()));
    a.addAll(List.of(args));
    return CliToolsTest.run(null, CGC, a.toArray(new String[0]));
  }

  /** Rows of the first table whose header line contains all of the given columns. */
  static List<Map<String, String>> table(Result r, String... mustHave) {
    List<String> lines = Arrays.asList(r.out().split("\\R"));
    List<Map<String, String>> rows = new ArrayList<>();
    for (int i = 0; i < lines.size(); i++) {
      String h = lines.get(i).strip();
      List<String> cols = Arrays.asList(h.split("\\s+"));
      if (!cols.containsAll(List.of(mustHave))) continue;
      for (int j = i + 1; j < lines.size() && !lines.get(j).isBlank(); j++) {
        String[] f = lines.get(j).strip().split("\\s+");
        assertEquals(cols.size(), f.length, "row does not match header " + cols + ": '" + lines.get(j) + "'\n" + r);
        Map<String, String> row = new LinkedHashMap<>();
        for (int k = 0; k < f.length; k++) row.put(cols.get(k), f[k]);
        rows.add(row);
      }
      return rows;
    }
    throw new AssertionError("no table with columns " + Arrays.toString(mustHave) + " in:\n" + r);
  }

  static Map<String, Map<String, String>> byPartition(List<Map<String, String>> rows) {
    Map<String, Map<String, String>> m = new HashMap<>();
    for (Map<String, String> r : rows) m.put(r.get("TOPIC") + ":" + r.get("PARTITION"), r);
    return m;
  }

  static Map<TopicPartition, Long> committed(String g) throws Exception {
    Map<TopicPartition, Long> out = new HashMap<>();
    admin.listConsumerGroupOffsets(g).partitionsToOffsetAndMetadata().get()
        .forEach((tp, om) -> { if (om != null) out.put(tp, om.offset()); });
    return out;
  }

  static Result ok(Result r) {
    assertEquals(0, r.exit(), "tool failed: " + r);
    assertFalse(r.out().contains("Error:") || r.err().contains("Error:"), "tool printed an error: " + r);
    return r;
  }

  @Test
  void listDescribeResetDeleteOffsetsDelete() throws Exception {
    String t = Kafka.topic("cli-groups");
    String g = Kafka.topic("cli-group");
    Kafka.createTopic(admin, t, 2, Map.of());
    TopicPartition p0 = new TopicPartition(t, 0);
    TopicPartition p1 = new TopicPartition(t, 1);
    // p0: 10 records, p1: 6 records, record i of each partition stamped t0 + i s
    long t0 = Instant.now().minus(1, ChronoUnit.HOURS).truncatedTo(ChronoUnit.SECONDS).toEpochMilli();
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
      for (int i = 0; i < 10; i++) p.send(new ProducerRecord<>(t, 0, t0 + i * 1000L, Kafka.utf8("k" + i), Kafka.utf8("a" + i)));
      for (int i = 0; i < 6; i++) p.send(new ProducerRecord<>(t, 1, t0 + i * 1000L, Kafka.utf8("k" + i), Kafka.utf8("b" + i)));
      p.flush();
    }

    GroupSupport.Ledger ledger = new GroupSupport.Ledger();
    GroupSupport.Member m = new GroupSupport.Member("cli", ledger, GroupSupport.consumerProps(Kafka.bootstrap(), g,
        Map.of(ConsumerConfig.CLIENT_ID_CONFIG, "cli-client-1")), List.of(t));
    try {
      m.start();
      GroupSupport.await("member owns both partitions", Duration.ofSeconds(60), () -> m.owned().size() == 2, m::toString);
      // stop consuming at known offsets: commit 7 / 2 explicitly once everything is read
      GroupSupport.await("all 16 records consumed", Duration.ofSeconds(60), () -> ledger.distinct() == 16, m::toString);
      m.call(c -> { c.commitSync(Map.of(p0, new OffsetAndMetadata(7), p1, new OffsetAndMetadata(2))); return null; });
      // (the member commits again only after records arrive; none will)
      assertEquals(Map.of(p0, 7L, p1, 2L), committed(g));

      // --list
      Result list = ok(cgc("--list"));
      assertTrue(list.lines().contains(g), "--list lacks " + g + ": " + list);
      Result listState = ok(cgc("--list", "--state"));
      Map<String, String> stateRow = table(listState, "GROUP", "STATE").stream()
          .filter(r -> r.get("GROUP").equals(g)).findFirst().orElseThrow(() -> new AssertionError(listState.toString()));
      assertEquals("Stable", stateRow.get("STATE"), listState.toString());

      // --describe (offsets) with an active member
      Result desc = ok(cgc("--describe", "--group", g));
      Map<String, Map<String, String>> rows = byPartition(table(desc, "GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"));
      assertEquals(2, rows.size(), desc.toString());
      assertRow(rows.get(t + ":0"), g, "7", "10", "3", desc);
      assertRow(rows.get(t + ":1"), g, "2", "6", "4", desc);
      for (Map<String, String> r : rows.values()) {
        assertTrue(r.get("CONSUMER-ID").startsWith("cli-client-1-"), "consumer id column: " + r);
        assertEquals("cli-client-1", r.get("CLIENT-ID"), r.toString());
        assertTrue(r.get("HOST").contains("127.0.0.1"), "host column: " + r);
      }
      assertEquals(rows.get(t + ":0").get("CONSUMER-ID"), rows.get(t + ":1").get("CONSUMER-ID"));

      // --describe --members --verbose
      Result mem = ok(cgc("--describe", "--group", g, "--members", "--verbose"));
      List<Map<String, String>> mrows = table(mem, "GROUP", "CONSUMER-ID", "#PARTITIONS");
      assertEquals(1, mrows.size(), mem.toString());
      assertEquals("2", mrows.get(0).get("#PARTITIONS"), mem.toString());
      assertEquals("cli-client-1", mrows.get(0).get("CLIENT-ID"), mem.toString());
      assertTrue(mem.out().contains(t + ":0,1") || mem.out().contains(t + ":1,0"), "assignment column: " + mem);

      // --describe --state
      Result st = ok(cgc("--describe", "--group", g, "--state"));
      Map<String, String> srow = table(st, "GROUP", "STATE", "#MEMBERS").get(0);
      assertEquals(g, srow.get("GROUP"), st.toString());
      assertEquals("Stable", srow.get("STATE"), st.toString());
      assertEquals("1", srow.get("#MEMBERS"), st.toString());
      assertEquals("range", srow.get("ASSIGNMENT-STRATEGY"), st.toString());

      // resetting an active group is refused, offsets untouched
      Result refused = cgc("--reset-offsets", "--group", g, "--topic", t, "--to-earliest", "--execute");
      assertTrue((refused.out() + refused.err()).contains("inactive"), "reset of an active group: " + refused);
      assertEquals(Map.of(p0, 7L, p1, 2L), committed(g));
    } finally {
      m.close(); // leaves the group
    }

    GroupSupport.await("group empty", Duration.ofSeconds(30), () -> {
      try {
        return admin.describeConsumerGroups(List.of(g)).describedGroups().get(g).get().members().isEmpty();
      } catch (Exception e) {
        return false;
      }
    }, () -> "");
    Result descEmpty = ok(cgc("--describe", "--group", g));
    assertTrue((descEmpty.out() + descEmpty.err()).contains("Consumer group '" + g + "' has no active members."), descEmpty.toString());
    Map<String, Map<String, String>> erows = byPartition(table(descEmpty, "TOPIC", "PARTITION", "CURRENT-OFFSET", "LAG"));
    assertRow(erows.get(t + ":0"), g, "7", "10", "3", descEmpty);
    assertRow(erows.get(t + ":1"), g, "2", "6", "4", descEmpty);
    assertEquals("-", erows.get(t + ":0").get("CONSUMER-ID"), descEmpty.toString());
    Result stEmpty = ok(cgc("--describe", "--group", g, "--state"));
    assertEquals("Empty", table(stEmpty, "GROUP", "STATE").get(0).get("STATE"), stEmpty.toString());

    // --reset-offsets: dry run changes nothing, --execute does
    reset(g, t, Map.of(0, 0L, 1, 0L), Map.of(p0, 7L, p1, 2L), "--to-earliest");
    reset(g, t, Map.of(0, 10L, 1, 6L), Map.of(p0, 0L, p1, 0L), "--to-latest");
    reset(g, t, Map.of(0, 7L, 1, 3L), Map.of(p0, 10L, p1, 6L), "--shift-by", "-3");
    String when = Instant.ofEpochMilli(t0 + 4000).toString().replace("Z", ".000Z").replace(".000.000Z", ".000Z");
    reset(g, t, Map.of(0, 4L, 1, 4L), Map.of(p0, 7L, p1, 3L), "--to-datetime", when);
    // one partition only, to an explicit offset
    Result one = ok(cgc("--reset-offsets", "--group", g, "--topic", t + ":1", "--to-offset", "5", "--execute"));
    List<Map<String, String>> orows = table(one, "GROUP", "TOPIC", "PARTITION", "NEW-OFFSET");
    assertEquals(1, orows.size(), one.toString());
    assertEquals("5", orows.get(0).get("NEW-OFFSET"), one.toString());
    assertEquals(Map.of(p0, 4L, p1, 5L), committed(g), "after --to-offset 5 on partition 1");
    Result d2 = ok(cgc("--describe", "--group", g));
    Map<String, Map<String, String>> r2 = byPartition(table(d2, "TOPIC", "PARTITION", "CURRENT-OFFSET", "LAG"));
    assertRow(r2.get(t + ":0"), g, "4", "10", "6", d2);
    assertRow(r2.get(t + ":1"), g, "5", "6", "1", d2);

    // --delete-offsets for partition 1 only
    Result delOff = ok(cgc("--delete-offsets", "--group", g, "--topic", t + ":1"));
    List<Map<String, String>> drows = table(delOff, "TOPIC", "PARTITION", "STATUS");
    assertEquals(1, drows.size(), delOff.toString());
    assertEquals("1", drows.get(0).get("PARTITION"), delOff.toString());
    assertEquals("Successful", drows.get(0).get("STATUS"), delOff.toString());
    assertEquals(Map.of(p0, 4L), committed(g), "after --delete-offsets of partition 1");
    Result d3 = ok(cgc("--describe", "--group", g));
    Map<String, Map<String, String>> r3 = byPartition(table(d3, "TOPIC", "PARTITION", "CURRENT-OFFSET"));
    assertEquals(List.of(t + ":0"), new ArrayList<>(r3.keySet()), d3.toString());

    // a new consumer of the group starts at the reset offset on p0 and at auto.offset.reset (earliest) on p1
    try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(GroupSupport.consumerProps(Kafka.bootstrap(), g, Map.of()))) {
      c.subscribe(List.of(t));
      List<String> vals = new ArrayList<>();
      long deadline = System.currentTimeMillis() + 60_000;
      while (vals.size() < 12 && System.currentTimeMillis() < deadline) {
        c.poll(Duration.ofMillis(100)).forEach(r -> vals.add(Kafka.str(r.value())));
      }
      List<String> want = new ArrayList<>();
      for (int i = 4; i < 10; i++) want.add("a" + i);
      for (int i = 0; i < 6; i++) want.add("b" + i);
      assertEquals(new java.util.TreeSet<>(want), new java.util.TreeSet<>(vals), "records read after the resets");
      assertEquals(12, vals.size(), vals.toString());
    }

    // --delete: gone from --list
    Result del = ok(cgc("--delete", "--group", g));
    assertTrue(del.out().contains("Deletion of requested consumer groups ('" + g + "') was successful."), del.toString());
    Result list2 = ok(cgc("--list"));
    assertFalse(list2.lines().contains(g), "--list still shows deleted group: " + list2);
    assertEquals(Map.of(), committed(g), "offsets of a deleted group");
    Result gone = cgc("--describe", "--group", g);
    // DescribeGroups v6 (KIP-1043): a missing group is GROUP_ID_NOT_FOUND, which the tool reports
    assertTrue((gone.out() + gone.err()).contains("GroupIdNotFoundException: Group " + g + " not found."),
        "describe of a deleted group: " + gone);
  }

  static void assertRow(Map<String, String> row, String g, String current, String end, String lag, Result r) {
    assertTrue(row != null, "missing row in " + r);
    assertEquals(g, row.getOrDefault("GROUP", g), r.toString());
    assertEquals(current, row.get("CURRENT-OFFSET"), "CURRENT-OFFSET " + row + "\n" + r);
    assertEquals(end, row.get("LOG-END-OFFSET"), "LOG-END-OFFSET " + row + "\n" + r);
    assertEquals(lag, row.get("LAG"), "LAG " + row + "\n" + r);
  }

  /** --dry-run prints the new offsets without applying them; --execute applies them. */
  void reset(String g, String t, Map<Integer, Long> want, Map<TopicPartition, Long> before, String... how) throws Exception {
    assertEquals(before, committed(g), "offsets before reset " + Arrays.toString(how));
    for (String mode : List.of("--dry-run", "--execute")) {
      List<String> args = new ArrayList<>(List.of("--reset-offsets", "--group", g, "--topic", t));
      args.addAll(List.of(how));
      args.add(mode);
      Result r = ok(cgc(args.toArray(new String[0])));
      Map<Integer, Long> printed = new HashMap<>();
      for (Map<String, String> row : table(r, "GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")) {
        assertEquals(g, row.get("GROUP"), r.toString());
        assertEquals(t, row.get("TOPIC"), r.toString());
        printed.put(Integer.parseInt(row.get("PARTITION")), Long.parseLong(row.get("NEW-OFFSET")));
      }
      assertEquals(want, printed, "NEW-OFFSET printed by " + Arrays.toString(how) + " " + mode + ":\n" + r);
      Map<TopicPartition, Long> after = committed(g);
      if (mode.equals("--dry-run")) {
        assertEquals(before, after, "--dry-run changed offsets: " + Arrays.toString(how));
      } else {
        Map<TopicPartition, Long> w = new HashMap<>();
        want.forEach((p, o) -> w.put(new TopicPartition(t, p), o));
        assertEquals(w, after, "offsets after " + Arrays.toString(how) + " --execute");
        assertNotEquals(before, after);
      }
    }
  }
}
