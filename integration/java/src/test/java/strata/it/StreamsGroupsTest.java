package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.StreamsGroupDescription;
import org.apache.kafka.clients.admin.StreamsGroupMemberDescription;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import strata.it.CliToolsTest.Result;
import strata.it.GroupSupport.StrataProcess;

/**
 * Kafka Streams 4.4 on the Streams rebalance protocol (KIP-1071, group.protocol=streams): the
 * broker holds the topology, creates the repartition and changelog topics, assigns the tasks and
 * hands them over as instances join and leave. The word count of {@link StreamsEosTest} runs on two
 * instances, the second joining mid-stream and the first leaving, under at_least_once and under
 * exactly_once_v2; every final count is exact. kafka-streams-groups lists, describes, resets the
 * offsets of and deletes the group. Under exactly_once_v2 the broker is also killed with -9 and restarted mid-stream: the
 * group comes back as it was.
 */
@Timeout(value = 240, unit = TimeUnit.SECONDS)
class StreamsGroupsTest {
  static final String SGC = "org.apache.kafka.tools.streams.StreamsGroupCommand";

  static List<String> brokerArgs() {
    return List.of("--group-streams-heartbeat-interval-ms", "1000",
        "--group-streams-initial-rebalance-delay-ms", "500");
  }

  @Test
  void wordCountAtLeastOnceWithInstancesJoiningAndLeaving() throws Exception {
    run(StreamsConfig.AT_LEAST_ONCE);
  }

  @Test
  void wordCountExactlyOnceWithInstancesJoiningAndLeaving() throws Exception {
    run(StreamsConfig.EXACTLY_ONCE_V2);
  }

  static Properties props(String bs, String app, Path state, String guarantee) {
    Properties p = StreamsEosTest.streamsProps(bs, app, state);
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
    p.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, "streams");
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
    p.remove(StreamsConfig.REPLICATION_FACTOR_CONFIG);
    return p;
  }

  static Result sgc(String bs, String... args) throws Exception {
    List<String> a = new ArrayList<>(List.of("--bootstrap-server", bs));
    a.addAll(List.of(args));
    return CliToolsTest.run(null, SGC, a.toArray(new String[0]));
  }

  static StreamsGroupDescription describe(Admin a, String app) throws Exception {
    return a.describeStreamsGroups(List.of(app)).all().get().get(app);
  }

  void run(String guarantee) throws Exception {
    int lines = 3000;
    try (StrataProcess broker = new StrataProcess(brokerArgs())) {
      broker.start();
      String bs = broker.bootstrap();
      String in = Kafka.topic("sg-in");
      String out = Kafka.topic("sg-out");
      String app = Kafka.topic("sg-app");
      Map<String, Long> want = new TreeMap<>();
      for (int i = 0; i < lines; i++) for (String w : StreamsEosTest.line(i).split(" ")) want.merge(w, 1L, Long::sum);
      Path stateA = Files.createTempDirectory("strata-sg-a-");
      Path stateB = Files.createTempDirectory("strata-sg-b-");
      KafkaStreams a = null;
      KafkaStreams b = null;
      try (Admin admin = GroupSupport.admin(bs);
          KafkaProducer<String, String> p =
              new KafkaProducer<>(GroupSupport.producerProps(bs), new StringSerializer(), new StringSerializer())) {
        admin.createTopics(List.of(new NewTopic(in, 3, (short) 1), new NewTopic(out, 3, (short) 1))).all().get();
        a = new KafkaStreams(StreamsEosTest.topology(in, out), props(bs, app, stateA, guarantee));
        a.start();
        for (int i = 0; i < lines / 3; i++) p.send(new ProducerRecord<>(in, "line-" + i, StreamsEosTest.line(i)));
        p.flush();
        StreamsEosTest.awaitSomeOutput(bs, out);

        // The broker created the internal topics with the partitions the topology needs.
        Set<String> names = admin.listTopics().names().get();
        List<String> internal = names.stream()
            .filter(n -> n.startsWith(app) && (n.endsWith("-repartition") || n.endsWith("-changelog")))
            .sorted().toList();
        assertEquals(2, internal.size(), "internal topics of " + app + ": " + names);
        for (TopicDescription d : admin.describeTopics(internal).allTopicNames().get().values()) {
          assertEquals(3, d.partitions().size(), d.name());
        }

        b = new KafkaStreams(StreamsEosTest.topology(in, out), props(bs, app, stateB, guarantee));
        b.start();
        for (int i = lines / 3; i < 2 * lines / 3; i++) p.send(new ProducerRecord<>(in, "line-" + i, StreamsEosTest.line(i)));
        p.flush();
        // Both instances get active tasks: 6 tasks (2 subtopologies x 3 partitions) split 3/3.
        GroupSupport.await("two members sharing the tasks", Duration.ofSeconds(60), () -> {
          try {
            StreamsGroupDescription d = describe(admin, app);
            return d.groupState() == GroupState.STABLE && d.members().size() == 2
                && d.members().stream().allMatch(m -> activeTasks(m) == 3);
          } catch (Exception e) {
            return false;
          }
        }, () -> {
          try {
            return describe(admin, app).toString();
          } catch (Exception e) {
            return e.toString();
          }
        });
        StreamsGroupDescription d = describe(admin, app);
        assertEquals(2, d.subtopologies().size(), d.toString());

        Result list = sgc(bs, "--list");
        assertTrue(list.lines().contains(app), list.toString());
        Result state = sgc(bs, "--describe", "--state", "--group", app);
        assertTrue(state.out().contains("Stable"), state.toString());
        Result members = sgc(bs, "--describe", "--members", "--group", app);
        assertEquals(0, members.exit(), members.toString());
        for (StreamsGroupMemberDescription m : d.members()) {
          assertTrue(members.out().contains(m.memberId()), "member " + m.memberId() + " in\n" + members);
        }

        if (guarantee.equals(StreamsConfig.EXACTLY_ONCE_V2)) {
          // The group's state is in __consumer_offsets: after kill -9 the members carry on
          // with their tasks and epochs, and the counts stay exact.
          broker.kill9();
          Thread.sleep(500);
          broker.start();
          StreamsGroupDescription after = describe(admin, app);
          assertEquals(d.groupEpoch(), after.groupEpoch(), after.toString());
          assertEquals(2, after.members().size(), after.toString());
        }
        Result offsets = sgc(bs, "--describe", "--offsets", "--group", app);
        assertTrue(offsets.out().contains(in) && offsets.out().contains("-repartition"), offsets.toString());

        a.close(Duration.ofSeconds(30));
        a = null;
        for (int i = 2 * lines / 3; i < lines; i++) p.send(new ProducerRecord<>(in, "line-" + i, StreamsEosTest.line(i)));
        p.flush();
        GroupSupport.await("the remaining instance takes every task", Duration.ofSeconds(60), () -> {
          try {
            StreamsGroupDescription g = describe(admin, app);
            return g.members().size() == 1 && activeTasks(g.members().iterator().next()) == 6;
          } catch (Exception e) {
            return false;
          }
        }, () -> "");
        StreamsEosTest.awaitCounts(bs, out, want, Duration.ofSeconds(90));

        b.close(Duration.ofSeconds(30));
        b = null;
        GroupSupport.await("the group is empty", Duration.ofSeconds(30), () -> {
          try {
            return describe(admin, app).groupState() == GroupState.EMPTY;
          } catch (Exception e) {
            return false;
          }
        }, () -> "");
        Result reset = sgc(bs, "--reset-offsets", "--group", app, "--input-topic", in, "--to-earliest", "--execute");
        assertEquals(0, reset.exit(), reset.toString());
        try (Admin check = GroupSupport.admin(bs)) {
          var committed = check.listConsumerGroupOffsets(app).partitionsToOffsetAndMetadata().get();
          for (int part = 0; part < 3; part++) {
            var o = committed.get(new org.apache.kafka.common.TopicPartition(in, part));
            assertEquals(0L, o == null ? -1L : o.offset(), "offset of " + in + "-" + part + " after reset\n" + reset);
          }
        }
        Result deleted = sgc(bs, "--delete", "--group", app);
        assertEquals(0, deleted.exit(), deleted.toString());
        assertFalse(sgc(bs, "--list").lines().contains(app), "group still listed after --delete");
      } catch (Throwable e) {
        throw new AssertionError(e.getMessage() + "\n" + broker.logs(), e);
      } finally {
        if (a != null) a.close(Duration.ofSeconds(10));
        if (b != null) b.close(Duration.ofSeconds(10));
        for (Path dir : List.of(stateA, stateB)) {
          try (var w = Files.walk(dir)) {
            w.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
          }
        }
      }
    }
  }

  static int activeTasks(StreamsGroupMemberDescription m) {
    return m.assignment().activeTasks().stream().mapToInt(t -> t.partitions().size()).sum();
  }
}
