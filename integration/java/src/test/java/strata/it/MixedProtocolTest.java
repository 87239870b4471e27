package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.GroupProtocol;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.TopicPartition;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import strata.it.CliToolsTest.Result;
import strata.it.GroupSupport.Ledger;
import strata.it.GroupSupport.Member;
import strata.it.GroupSupport.ProcessMember;

/**
 * Classic (group.protocol=classic) and consumer-protocol (group.protocol=consumer) Java consumers
 * in one group, as Kafka 4 allows with group.consumer.migration.policy=bidirectional: a
 * consumer-protocol member upgrades a classic group, a classic member joins a consumer group, the
 * last consumer-protocol member leaving downgrades the group, and every partition has one owner
 * and every record is consumed once in a committed batch through joins, leaves and a SIGKILL.
 */
@Timeout(value = 300, unit = TimeUnit.SECONDS)
class MixedProtocolTest {
  static Admin admin;

  @BeforeAll
  static void setUp() {
    admin = Kafka.admin();
  }

  @AfterAll
  static void tearDown() {
    if (admin != null) admin.close(Duration.ofSeconds(5));
  }

  static Properties classic(String group, String clientId) {
    return GroupSupport.consumerProps(Kafka.bootstrap(), group, Map.of(
        ConsumerConfig.GROUP_PROTOCOL_CONFIG, GroupProtocol.CLASSIC.name(),
        ConsumerConfig.CLIENT_ID_CONFIG, clientId));
  }

  /** A classic member with only the given client-side assignor (eager range, or cooperative). */
  static Properties classic(String group, String clientId, String assignor) {
    Properties p = classic(group, clientId);
    p.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, assignor.equals("cooperative-sticky")
        ? org.apache.kafka.clients.consumer.CooperativeStickyAssignor.class.getName()
        : org.apache.kafka.clients.consumer.RangeAssignor.class.getName());
    return p;
  }

  static Properties consumer(String group, String clientId) {
    Properties p = GroupSupport.consumerProps(Kafka.bootstrap(), group, Map.of(
        ConsumerConfig.GROUP_PROTOCOL_CONFIG, GroupProtocol.CONSUMER.name(),
        ConsumerConfig.CLIENT_ID_CONFIG, clientId));
    // The consumer protocol takes its session and heartbeat from the broker.
    p.remove(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG);
    p.remove(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG);
    return p;
  }

  static GroupType type(String g) throws Exception {
    return admin.listGroups().all().get().stream().filter(l -> l.groupId().equals(g)).findFirst()
        .orElseThrow().type().orElseThrow();
  }

  static ConsumerGroupDescription describe(String g) throws Exception {
    return admin.describeConsumerGroups(List.of(g)).describedGroups().get(g).get();
  }

  static long committedSum(String g) {
    try {
      return GroupsTest.committed(admin, g).values().stream().mapToLong(Long::longValue).sum();
    } catch (Exception e) {
      return -1;
    }
  }

  /** Records keyed as GroupsTest.checkLedger expects, partitioned by key (so a key stays on one partition). */
  static void produce(String t, int from, int count) {
    try (var p = Kafka.producer(Map.of())) {
      for (int i = from; i < from + count; i++) {
        p.send(new org.apache.kafka.clients.producer.ProducerRecord<>(t, Kafka.utf8(GroupsTest.key(i)), Kafka.utf8(GroupsTest.value(i))));
      }
      p.flush();
    }
  }

  /** Waits until `n` records are committed and recorded in the ledger. */
  static void awaitConsumed(String what, String g, Ledger ledger, int n, Object... members) {
    GroupSupport.await(what, Duration.ofSeconds(60), () -> committedSum(g) == n && ledger.distinct() == n,
        () -> List.of(members).toString());
  }

  /** Waits until the members own disjoint partitions covering all `n`, each owning `each`. */
  static void awaitSplit(String what, int n, int[] each, Member... ms) {
    GroupSupport.await(what, Duration.ofSeconds(60), () -> {
      Set<TopicPartition> all = new HashSet<>();
      int total = 0;
      for (int i = 0; i < ms.length; i++) {
        Set<TopicPartition> o = ms[i].owned();
        if (o.size() != each[i]) return false;
        all.addAll(o);
        total += o.size();
      }
      return all.size() == n && total == n;
    }, () -> List.of(ms).toString());
  }

  @Test
  void theBrokerReportsItsMigrationPolicyAndBothProtocols() throws Exception {
    String node = String.valueOf(admin.describeCluster().nodes().get().iterator().next().id());
    var broker = new org.apache.kafka.common.config.ConfigResource(org.apache.kafka.common.config.ConfigResource.Type.BROKER, node);
    var config = admin.describeConfigs(List.of(broker)).all().get().get(broker);
    assertEquals("bidirectional", config.get("group.consumer.migration.policy").value());
    assertEquals("classic,consumer", config.get("group.coordinator.rebalance.protocols").value());
  }

  @ParameterizedTest(name = "{0}")
  @ValueSource(strings = {"range", "cooperative-sticky"})
  void aConsumerMemberUpgradesAClassicGroupAndLeavingDowngradesIt(String assignor) throws Exception {
    String t = Kafka.topic("mix-up");
    String g = Kafka.topic("mix-up-group");
    Kafka.createTopic(admin, t, 4, Map.of());
    Ledger ledger = new Ledger();
    int per = 25;
    try (Member c = new Member("classic", ledger, classic(g, "classic-client", assignor), List.of(t)).start()) {
      awaitSplit("the classic member owns all 4", 4, new int[] {4}, c);
      assertEquals(GroupType.CLASSIC, type(g));
      produce(t, 0, 4 * per);
      awaitConsumed("first batch", g, ledger, 4 * per, c);

      try (Member n = new Member("consumer", ledger, consumer(g, "consumer-client"), List.of(t)).start()) {
        awaitSplit("2 + 2 across the protocols", 4, new int[] {2, 2}, c, n);
        assertEquals(GroupType.CONSUMER, type(g), "upgraded");
        ConsumerGroupDescription d = describe(g);
        assertEquals(GroupType.CONSUMER, d.type());
        assertEquals(2, d.members().size(), d.toString());
        Map<String, Integer> byClient = new HashMap<>();
        for (MemberDescription m : d.members()) byClient.put(m.clientId(), m.assignment().topicPartitions().size());
        assertEquals(Map.of("classic-client", 2, "consumer-client", 2), byClient, d.toString());
        // kafka-consumer-groups --describe --members shows both kinds of member.
        Result members = ConsumerGroupsCliTest.ok(ConsumerGroupsCliTest.cgc("--describe", "--members", "--group", g));
        var rows = ConsumerGroupsCliTest.table(members, "GROUP", "CONSUMER-ID", "CLIENT-ID", "#PARTITIONS");
        Map<String, String> cliByClient = new HashMap<>();
        for (var r : rows) cliByClient.put(r.get("CLIENT-ID"), r.get("#PARTITIONS"));
        assertEquals(Map.of("classic-client", "2", "consumer-client", "2"), cliByClient, members.toString());

        produce(t, 4 * per, 4 * per);
        awaitConsumed("second batch", g, ledger, 8 * per, c, n);
      }
      // The consumer-protocol member left: the group is classic again and c takes everything back.
      awaitSplit("the classic member owns all 4 again", 4, new int[] {4}, c);
      assertEquals(GroupType.CLASSIC, type(g), "downgraded");
      assertEquals(GroupType.CLASSIC, describe(g).type());
      produce(t, 8 * per, 4 * per);
      awaitConsumed("third batch", g, ledger, 12 * per, c);
      GroupsTest.checkLedger(ledger, 12 * per, "upgrade and downgrade, classic member with " + assignor);
      if (assignor.equals("cooperative-sticky")) {
        // Cooperative: the classic member gave up two partitions and kept the others throughout.
        assertTrue(c.lostCalls.get() == 0, c.toString());
      }
    }
  }

  @Test
  void aClassicMemberInAConsumerGroupIsKilledAndReplacedWithoutLosingOrRepeatingCommittedRecords() throws Exception {
    String t = Kafka.topic("mix-kill");
    String g = Kafka.topic("mix-kill-group");
    Kafka.createTopic(admin, t, 4, Map.of());
    Ledger ledger = new Ledger();
    int per = 250;
    try (Member n = new Member("consumer", ledger, consumer(g, "consumer-client"), List.of(t)).start()) {
      awaitSplit("the consumer member owns all 4", 4, new int[] {4}, n);
      // A classic member in its own JVM joins the consumer group.
      ProcessMember victim = new ProcessMember("victim", ledger, Kafka.bootstrap(), t, g, GroupSupport.sessionTimeoutMs());
      try {
        GroupSupport.await("2 + 2", Duration.ofSeconds(60),
            () -> n.owned().size() == 2 && victim.assignment.split(",").length == 2, () -> n + " " + victim);
        assertEquals(GroupType.CONSUMER, type(g));
        produce(t, 0, 4 * per);
        GroupSupport.await("the victim consumes", Duration.ofSeconds(60), () -> victim.consumed.get() > 50, victim::toString);
        victim.kill9();
      } finally {
        victim.close();
      }
      awaitSplit("the survivor takes the victim's partitions", 4, new int[] {4}, n);
      awaitConsumed("everything", g, ledger, 4 * per, n);
      assertEquals(GroupType.CONSUMER, type(g));
      assertEquals(1, describe(g).members().size());

      // A new classic member resumes from the committed offsets of the partitions it gets.
      try (Member c = new Member("classic", ledger, classic(g, "classic-client"), List.of(t)).start()) {
        awaitSplit("2 + 2 again", 4, new int[] {2, 2}, n, c);
        produce(t, 4 * per, 100);
        awaitConsumed("the rest", g, ledger, 4 * per + 100, n, c);
        assertTrue(ledger.all().stream().anyMatch(x -> x.consumer().equals("classic")), "the classic member consumed");
      }
      GroupsTest.checkLedger(ledger, 4 * per + 100, "classic member killed in a consumer group");
    }
  }
}
