package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

@Timeout(value = 90, unit = TimeUnit.SECONDS)
class OffsetsTest {
  static Admin admin;

  @BeforeAll
  static void setUp() {
    admin = Kafka.admin();
  }

  @AfterAll
  static void tearDown() {
    if (admin != null) admin.close(Duration.ofSeconds(5));
  }

  static final long T0 = System.currentTimeMillis() - 3_600_000L;

  /** Timestamps of the 10 records: T0 + 1000*i, except record 6 which carries the maximum. */
  static long ts(int i) {
    return i == 6 ? T0 + 100_000 : T0 + 1000L * i;
  }

  /**
   * Writes the 10 records to partition 0, either one produce request (and batch) per record or
   * all in one batch, so that the lookups must find a record inside a batch.
   */
  static TopicPartition writeTimestamped(boolean oneBatch) throws Exception {
    String t = Kafka.topic(oneBatch ? "off-batch" : "off-single");
    Kafka.createTopic(admin, t, 1, Map.of());
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of("linger.ms", oneBatch ? "1000" : "0"))) {
      var fs = new ArrayList<java.util.concurrent.Future<?>>();
      for (int i = 0; i < 10; i++) {
        var f = p.send(new ProducerRecord<>(t, 0, ts(i), Kafka.utf8("k" + i), Kafka.utf8("v" + i)));
        if (oneBatch) fs.add(f); else f.get();
      }
      p.flush();
      for (var f : fs) f.get();
    }
    return new TopicPartition(t, 0);
  }

  static ListOffsetsResultInfo listOffset(TopicPartition tp, OffsetSpec spec) throws Exception {
    return admin.listOffsets(Map.of(tp, spec)).all().get().get(tp);
  }

  @ParameterizedTest(name = "oneBatch={0}")
  @ValueSource(booleans = {false, true})
  void adminListOffsetsAllSpecs(boolean oneBatch) throws Exception {
    TopicPartition tp = writeTimestamped(oneBatch);
    assertEquals(0L, listOffset(tp, OffsetSpec.earliest()).offset(), "earliest");
    assertEquals(10L, listOffset(tp, OffsetSpec.latest()).offset(), "latest");

    ListOffsetsResultInfo max = listOffset(tp, OffsetSpec.maxTimestamp());
    assertEquals(6L, max.offset(), "maxTimestamp offset");
    assertEquals(ts(6), max.timestamp(), "maxTimestamp timestamp");

    ListOffsetsResultInfo at = listOffset(tp, OffsetSpec.forTimestamp(T0 + 3500));
    assertEquals(4L, at.offset(), "forTimestamp(T0+3500) offset");
    assertEquals(ts(4), at.timestamp(), "forTimestamp(T0+3500) timestamp");

    ListOffsetsResultInfo exact = listOffset(tp, OffsetSpec.forTimestamp(T0 + 2000));
    assertEquals(2L, exact.offset(), "forTimestamp exact match");

    ListOffsetsResultInfo mid = listOffset(tp, OffsetSpec.forTimestamp(T0 + 50_000));
    assertEquals(6L, mid.offset(), "first record with timestamp >= T0+50000");

    ListOffsetsResultInfo first = listOffset(tp, OffsetSpec.forTimestamp(T0 - 10_000));
    assertEquals(0L, first.offset(), "timestamp before all records");

    ListOffsetsResultInfo none = listOffset(tp, OffsetSpec.forTimestamp(T0 + 1_000_000));
    assertEquals(-1L, none.offset(), "timestamp after all records");
  }

  @Test
  void consumerOffsetsForTimesSeekAndPosition() throws Exception {
    TopicPartition tp = writeTimestamped(true);
    try (KafkaConsumer<byte[], byte[]> c = Kafka.consumer()) {
      c.assign(List.of(tp));

      Map<TopicPartition, OffsetAndTimestamp> r = c.offsetsForTimes(Map.of(tp, T0 + 3500));
      assertNotNull(r.get(tp), "offsetsForTimes(T0+3500)");
      assertEquals(4L, r.get(tp).offset(), "first offset with timestamp >= T0+3500");
      assertEquals(ts(4), r.get(tp).timestamp());
      // record 6 carries the largest timestamp, so it is the first one at or after T0+7500
      OffsetAndTimestamp r2 = c.offsetsForTimes(Map.of(tp, T0 + 7500)).get(tp);
      assertNotNull(r2, "offsetsForTimes(T0+7500)");
      assertEquals(6L, r2.offset(), "first offset with timestamp >= T0+7500");
      assertNull(c.offsetsForTimes(Map.of(tp, T0 + 1_000_000)).get(tp), "no record that late");

      assertEquals(Map.of(tp, 0L), c.beginningOffsets(List.of(tp)));
      assertEquals(Map.of(tp, 10L), c.endOffsets(List.of(tp)));

      c.seekToEnd(List.of(tp));
      assertEquals(10L, c.position(tp), "position after seekToEnd");
      assertTrue(c.poll(Duration.ofMillis(500)).isEmpty(), "nothing after the end");

      c.seekToBeginning(List.of(tp));
      assertEquals(0L, c.position(tp), "position after seekToBeginning");

      c.seek(tp, 7);
      List<ConsumerRecord<byte[], byte[]>> got = new ArrayList<>();
      long deadline = System.currentTimeMillis() + 20_000;
      while (got.size() < 3 && System.currentTimeMillis() < deadline) {
        c.poll(Duration.ofMillis(200)).forEach(got::add);
      }
      assertEquals(3, got.size(), "records 7..9 after seek(7)");
      for (int i = 0; i < 3; i++) {
        assertEquals(7L + i, got.get(i).offset());
        assertEquals("v" + (7 + i), Kafka.str(got.get(i).value()));
        assertEquals(ts(7 + i), got.get(i).timestamp());
      }
      assertEquals(10L, c.position(tp));
    }
  }
}
