package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.LogTruncationException;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The Java consumer validates a position that carries a leader epoch (a committed offset does) with
 * OffsetForLeaderEpoch before fetching from it (KIP-320): a position within the epoch goes on
 * consuming; one past where the broker says the epoch ended is reported as log truncation, which
 * only that request can produce (a fetch from a position past the log end gives OffsetOutOfRange).
 */
@Timeout(value = 90, unit = TimeUnit.SECONDS)
class LeaderEpochTest {

  static void produce(String topic, int from, int to) throws Exception {
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) {
      for (int i = from; i < to; i++) {
        p.send(new ProducerRecord<>(topic, 0, Kafka.utf8("k" + i), Kafka.utf8("v" + i))).get();
      }
    }
  }

  /** A consumer of `group` that never resets its position by itself. */
  static KafkaConsumer<byte[], byte[]> member(String group, TopicPartition tp) {
    KafkaConsumer<byte[], byte[]> c =
        Kafka.consumer(
            Map.of(
                ConsumerConfig.GROUP_ID_CONFIG, group,
                ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none"));
    c.assign(List.of(tp));
    return c;
  }

  static List<ConsumerRecord<byte[], byte[]>> poll(KafkaConsumer<byte[], byte[]> c, int count) {
    List<ConsumerRecord<byte[], byte[]>> got = new ArrayList<>();
    long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
    while (got.size() < count && System.nanoTime() < deadline) {
      c.poll(Duration.ofMillis(200)).forEach(got::add);
    }
    assertEquals(count, got.size(), "records consumed");
    return got;
  }

  @Test
  void committedPositionsAreValidatedAgainstTheLeaderEpochHistory() throws Exception {
    String topic = Kafka.topic("epochs");
    TopicPartition tp = new TopicPartition(topic, 0);
    try (Admin admin = Kafka.admin()) {
      Kafka.createTopic(admin, topic, 1, Map.of());
    }
    produce(topic, 0, 10);

    // Consume and commit: the committed offset carries the epoch of the last record read.
    String group = Kafka.topic("epochs-group");
    try (KafkaConsumer<byte[], byte[]> c = member(group, tp)) {
      c.seekToBeginning(List.of(tp));
      for (ConsumerRecord<byte[], byte[]> r : poll(c, 10)) {
        assertEquals(Optional.of(0), r.leaderEpoch(), "a single broker leads at epoch 0");
      }
      c.commitSync();
      OffsetAndMetadata committed = c.committed(java.util.Set.of(tp)).get(tp);
      assertEquals(10L, committed.offset());
      assertEquals(Optional.of(0), committed.leaderEpoch());
    }
    produce(topic, 10, 15);

    // A restarted member resumes from the committed position: epoch 0 ends at the log end (15),
    // so the position is valid and it reads on without any reset.
    try (KafkaConsumer<byte[], byte[]> c = member(group, tp)) {
      List<ConsumerRecord<byte[], byte[]>> rest = poll(c, 5);
      assertEquals(10L, rest.get(0).offset());
      assertEquals("v14", Kafka.str(rest.get(4).value()));
      assertEquals(15L, c.position(tp));
    }

    // A position past where epoch 0 ended: the consumer learns the divergence from the broker.
    String diverged = Kafka.topic("epochs-diverged");
    try (KafkaConsumer<byte[], byte[]> c = member(diverged, tp)) {
      c.commitSync(Map.of(tp, new OffsetAndMetadata(100L, Optional.of(0), "")));
    }
    try (KafkaConsumer<byte[], byte[]> c = member(diverged, tp)) {
      LogTruncationException e =
          assertThrows(
              LogTruncationException.class,
              () -> {
                long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
                while (System.nanoTime() < deadline) c.poll(Duration.ofMillis(200));
              });
      OffsetAndMetadata divergent = e.divergentOffsets().get(tp);
      assertTrue(divergent != null, "divergent offsets: " + e.divergentOffsets());
      assertEquals(15L, divergent.offset(), "epoch 0 ends at the log end");
      assertEquals(Optional.of(0), divergent.leaderEpoch());
    }
  }
}
