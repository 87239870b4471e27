package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.LongDeserializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import strata.it.GroupSupport.StrataProcess;

/**
 * Kafka Streams word count (a KTable of counts, RocksDB store with a changelog, a repartition
 * topic) under processing.guarantee=exactly_once_v2 on a private broker: the final count of every
 * word is exact and each word's committed updates only rise, also when the broker is killed with -9
 * and restarted (three times) while the application is processing. Its producers run on
 * transactions v2 (KIP-890 part 2), as the broker finalizes transaction.version 2.
 */
@Timeout(value = 240, unit = TimeUnit.SECONDS)
class StreamsEosTest {
  static final String[] WORDS = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
      "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon"};

  static List<String> brokerArgs() {
    return List.of("--group-initial-rebalance-delay-ms", "0", "--group-min-session-timeout-ms", "1000");
  }

  @Test
  void wordCountIsExact() throws Exception {
    run(false);
  }

  @Test
  void wordCountIsExactAcrossBrokerKill9() throws Exception {
    run(true);
  }

  /** Line i holds three words chosen from i, so the expected counts follow from the line count. */
  static String line(int i) {
    return WORDS[i % WORDS.length] + " " + WORDS[(i * 7 + 3) % WORDS.length] + " " + WORDS[(i / 3) % WORDS.length];
  }

  void run(boolean kill) throws Exception {
    int lines = kill ? 6000 : 3000;
    try (StrataProcess broker = new StrataProcess(brokerArgs())) {
      broker.start();
      String bs = broker.bootstrap();
      String in = Kafka.topic("wc-in");
      String out = Kafka.topic("wc-out");
      String app = Kafka.topic("wc-app");
      try (Admin a = GroupSupport.admin(bs)) {
        a.createTopics(List.of(new NewTopic(in, 3, (short) 1), new NewTopic(out, 3, (short) 1))).all().get();
      }
      Map<String, Long> want = new TreeMap<>();
      for (int i = 0; i < lines; i++) for (String w : line(i).split(" ")) want.merge(w, 1L, Long::sum);

      Path state = Files.createTempDirectory("strata-streams-");
      AtomicReference<Throwable> died = new AtomicReference<>();
      KafkaStreams streams = new KafkaStreams(topology(in, out), streamsProps(bs, app, state));
      streams.setUncaughtExceptionHandler(e -> {
        // What a user would configure for EOS: a failed thread is replaced, its tasks re-run
        // from the last committed transaction.
        System.out.println("[streams] thread failed, replacing it: " + e);
        died.compareAndSet(null, e);
        return StreamThreadExceptionResponse.REPLACE_THREAD;
      });
      long t0 = System.nanoTime();
      try {
        streams.start();
        Properties pp = GroupSupport.producerProps(bs);
        pp.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        pp.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "120000");
        pp.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "5000");
        try (KafkaProducer<String, String> p = new KafkaProducer<>(pp, new StringSerializer(), new StringSerializer())) {
          for (int i = 0; i < lines; i++) {
            p.send(new ProducerRecord<>(in, "line-" + i, line(i)));
            if (i % 200 == 199) {
              p.flush();
              Thread.sleep(40);
            }
            if (kill && i % (lines / 3) == lines / 6) { // at 1/6, 1/2 and 5/6 of the input
              awaitSomeOutput(bs, out);
              long k = System.nanoTime();
              broker.kill9();
              Thread.sleep(500);
              broker.start();
              System.out.printf("[streams] broker kill -9 + restart at line %d took %.2fs%n", i,
                  (System.nanoTime() - k) / 1e9);
            }
          }
          p.flush();
        }
        Map<String, List<Long>> updates = awaitCounts(bs, out, want, Duration.ofSeconds(150));
        for (var e : updates.entrySet()) {
          List<Long> u = e.getValue();
          for (int i = 1; i < u.size(); i++) {
            assertTrue(u.get(i) > u.get(i - 1), "committed updates of '" + e.getKey() + "' go back or repeat: " + u);
          }
        }
        if (!kill) assertTransactionsV2(bs, app);
        System.out.printf("[streams] exact counts of %d lines after %.1fs (kill=%s, thread failures: %s)%n", lines,
            (System.nanoTime() - t0) / 1e9, kill, died.get());
      } catch (Throwable e) {
        throw new AssertionError(e.getMessage() + "\n" + broker.logs(), e);
      } finally {
        streams.close(Duration.ofSeconds(20));
        try (var w = Files.walk(state)) {
          w.sorted(java.util.Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
        }
      }
    }
  }

  /**
   * Streams' producers are on transactions v2: every commit bumps a producer's epoch, so after
   * many commits the epochs are well above where initTransactions put them (under v1, with no
   * producer fenced, they stay at 0).
   */
  static void assertTransactionsV2(String bs, String app) throws Exception {
    try (Admin a = GroupSupport.admin(bs)) {
      List<String> ids = a.listTransactions().all().get().stream()
          .map(l -> l.transactionalId())
          .filter(id -> id.startsWith(app))
          .toList();
      assertTrue(!ids.isEmpty(), "no transactional ids of " + app);
      int max = 0;
      for (var d : a.describeTransactions(ids).all().get().values()) max = Math.max(max, d.producerEpoch());
      assertTrue(max >= 3, "producer epochs of " + ids + " reach only " + max);
    }
  }

  static org.apache.kafka.streams.Topology topology(String in, String out) {
    StreamsBuilder b = new StreamsBuilder();
    b.stream(in, Consumed.with(Serdes.String(), Serdes.String()))
        .flatMapValues(v -> Arrays.asList(v.split(" ")))
        .groupBy((k, w) -> w, Grouped.with(Serdes.String(), Serdes.String()))
        .count(Materialized.as("word-counts"))
        .toStream()
        .to(out, Produced.with(Serdes.String(), Serdes.Long()));
    return b.build();
  }

  static Properties streamsProps(String bs, String app, Path state) {
    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bs);
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    p.put(StreamsConfig.STATE_DIR_CONFIG, state.toString());
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "2");
    p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, "1");
    p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "100");
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), "10000");
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), "1000");
    p.put(StreamsConfig.producerPrefix(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG), "5000");
    return p;
  }

  static KafkaConsumer<String, Long> reader(String bs) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bs);
    p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    return new KafkaConsumer<>(p, new StringDeserializer(), new LongDeserializer());
  }

  static void awaitSomeOutput(String bs, String out) {
    try (KafkaConsumer<String, Long> c = reader(bs)) {
      List<TopicPartition> tps = Kafka.partitions(out, 3);
      c.assign(tps);
      c.seekToBeginning(tps);
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
      while (c.poll(Duration.ofMillis(200)).isEmpty()) {
        if (System.nanoTime() > deadline) fail("no committed word count within 60s");
      }
    }
  }

  /** Reads committed updates until the latest count of every word is the expected one. */
  static Map<String, List<Long>> awaitCounts(String bs, String out, Map<String, Long> want, Duration timeout) {
    Map<String, List<Long>> updates = new TreeMap<>();
    Map<String, Long> latest = new TreeMap<>();
    try (KafkaConsumer<String, Long> c = reader(bs)) {
      List<TopicPartition> tps = Kafka.partitions(out, 3);
      c.assign(tps);
      c.seekToBeginning(tps);
      long deadline = System.nanoTime() + timeout.toNanos();
      while (!latest.equals(want)) {
        for (ConsumerRecord<String, Long> r : c.poll(Duration.ofMillis(200))) {
          updates.computeIfAbsent(r.key(), k -> new ArrayList<>()).add(r.value());
          latest.put(r.key(), r.value());
        }
        if (System.nanoTime() > deadline) {
          Map<String, String> diff = new HashMap<>();
          for (String w : want.keySet()) {
            if (!want.get(w).equals(latest.get(w))) diff.put(w, latest.get(w) + " (want " + want.get(w) + ")");
          }
          fail("word counts not exact after " + timeout + ": " + diff);
        }
      }
      // Nothing beyond the exact counts follows (an overcount would show up here).
      long settle = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
      while (System.nanoTime() < settle) {
        for (ConsumerRecord<String, Long> r : c.poll(Duration.ofMillis(200))) {
          updates.computeIfAbsent(r.key(), k -> new ArrayList<>()).add(r.value());
          latest.put(r.key(), r.value());
        }
      }
    }
    assertEquals(want, latest, "final word counts");
    return updates;
  }
}
