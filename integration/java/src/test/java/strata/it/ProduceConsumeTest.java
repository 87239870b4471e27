package strata.it;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RecordTooLargeException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.record.TimestampType;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

@Timeout(value = 120, unit = TimeUnit.SECONDS)
class ProduceConsumeTest {
  static Admin admin;

  @BeforeAll
  static void setUp() {
    admin = Kafka.admin();
  }

  @AfterAll
  static void tearDown() {
    if (admin != null) admin.close(Duration.ofSeconds(5));
  }

  // Record i of the 1000-record test: partition i%3, key null when i%10==3, value null when i%7==5.
  static byte[] key(int i) {
    return i % 10 == 3 ? null : Kafka.utf8("key-" + i);
  }

  static byte[] value(int i) {
    return i % 7 == 5 ? null : Kafka.utf8("value-" + i + "-" + "x".repeat(i % 50));
  }

  static List<Header> headers(int i) {
    List<Header> h = new ArrayList<>();
    h.add(new RecordHeader("idx", ByteBuffer.allocate(4).putInt(i).array()));
    if (i % 4 == 0) h.add(new RecordHeader("nullable", null));
    if (i % 6 == 0) {
      h.add(new RecordHeader("dup", Kafka.utf8("first")));
      h.add(new RecordHeader("dup", Kafka.utf8("second")));
    }
    return h;
  }

  @Test
  void thousandKeyedRecordsWithHeadersAndTombstonesRoundTrip() throws Exception {
    String t = Kafka.topic("pc-1000");
    Kafka.createTopic(admin, t, 3, Map.of());
    long ts0 = System.currentTimeMillis() - 60_000;
    List<Future<RecordMetadata>> futures = new ArrayList<>();
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of())) { // idempotent by default, acks=all
      for (int i = 0; i < 1000; i++) {
        futures.add(p.send(new ProducerRecord<>(t, i % 3, ts0 + i, key(i), value(i), headers(i))));
      }
      p.flush();
    }
    for (int i = 0; i < 1000; i++) {
      RecordMetadata md = futures.get(i).get();
      assertEquals(i % 3, md.partition(), "partition of record " + i);
      assertEquals(i / 3, md.offset(), "offset acked for record " + i);
      assertEquals(ts0 + i, md.timestamp(), "acked timestamp of record " + i);
    }

    List<ConsumerRecord<byte[], byte[]>> recs = Kafka.readAll(t, 3, Duration.ofSeconds(60));
    assertEquals(1000, recs.size(), "record count");
    Map<Integer, Long> nextOffset = new HashMap<>(Map.of(0, 0L, 1, 0L, 2, 0L));
    for (ConsumerRecord<byte[], byte[]> r : recs) {
      long expectedOffset = nextOffset.get(r.partition());
      assertEquals(expectedOffset, r.offset(), "offsets in order on partition " + r.partition());
      nextOffset.put(r.partition(), expectedOffset + 1);
      int i = (int) (r.offset() * 3 + r.partition());
      String what = "record " + i + " (" + r.partition() + "@" + r.offset() + ")";
      assertArrayEquals(key(i), r.key(), "key of " + what);
      assertArrayEquals(value(i), r.value(), "value of " + what);
      if (key(i) == null) assertNull(r.key(), "null key of " + what);
      if (value(i) == null) assertNull(r.value(), "tombstone of " + what);
      assertEquals(TimestampType.CREATE_TIME, r.timestampType(), "timestamp type of " + what);
      assertEquals(ts0 + i, r.timestamp(), "timestamp of " + what);
      Header[] got = r.headers().toArray();
      List<Header> want = headers(i);
      assertEquals(want.size(), got.length, "header count of " + what);
      for (int h = 0; h < got.length; h++) {
        assertEquals(want.get(h).key(), got[h].key(), "header key of " + what);
        assertArrayEquals(want.get(h).value(), got[h].value(), "header " + got[h].key() + " of " + what);
      }
    }
    assertEquals(Map.of(0, 334L, 1, 333L, 2, 333L), nextOffset, "records per partition");
  }

  @ParameterizedTest
  @ValueSource(strings = {"none", "gzip", "snappy", "lz4", "zstd"})
  void compressionCodecRoundTrip(String codec) throws Exception {
    String t = Kafka.topic("pc-" + codec);
    Kafka.createTopic(admin, t, 2, Map.of());
    Random rnd = new Random(codec.hashCode());
    List<byte[]> values = new ArrayList<>();
    for (int i = 0; i < 500; i++) {
      byte[] v;
      if (i % 3 == 0) {
        v = new byte[rnd.nextInt(2000)];
        rnd.nextBytes(v); // incompressible
      } else {
        v = Kafka.utf8(("compressible-" + codec + "-" + i + " ").repeat(1 + i % 40));
      }
      values.add(v);
    }
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of(
        ProducerConfig.COMPRESSION_TYPE_CONFIG, codec,
        ProducerConfig.LINGER_MS_CONFIG, "50",
        ProducerConfig.BATCH_SIZE_CONFIG, "65536"))) {
      List<Future<RecordMetadata>> fs = new ArrayList<>();
      for (int i = 0; i < values.size(); i++) {
        fs.add(p.send(new ProducerRecord<>(t, i % 2, Kafka.utf8("k" + i), values.get(i),
            List.of(new RecordHeader("codec", Kafka.utf8(codec))))));
      }
      p.flush();
      for (Future<RecordMetadata> f : fs) f.get();
    }
    List<ConsumerRecord<byte[], byte[]>> recs = Kafka.readAll(t, 2, Duration.ofSeconds(60));
    assertEquals(values.size(), recs.size(), "record count with " + codec);
    long[] next = new long[2];
    for (ConsumerRecord<byte[], byte[]> r : recs) {
      assertEquals(next[r.partition()]++, r.offset(), "offset order on partition " + r.partition());
      int i = (int) (r.offset() * 2 + r.partition());
      assertEquals("k" + i, Kafka.str(r.key()), codec + " key");
      assertArrayEquals(values.get(i), r.value(), codec + " value of record " + i);
      assertArrayEquals(Kafka.utf8(codec), r.headers().lastHeader("codec").value(), codec + " header");
    }
  }

  @Test
  void idempotentProducerNoDuplicatesNoGaps() throws Exception {
    String t = Kafka.topic("pc-idem");
    int partitions = 4;
    int n = 20_000;
    Kafka.createTopic(admin, t, partitions, Map.of());
    List<Future<RecordMetadata>> fs = new ArrayList<>(n);
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of(
        ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true",
        ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, "5",
        ProducerConfig.ACKS_CONFIG, "all",
        ProducerConfig.LINGER_MS_CONFIG, "1",
        ProducerConfig.BATCH_SIZE_CONFIG, "4096"))) {
      for (int i = 0; i < n; i++) {
        fs.add(p.send(new ProducerRecord<>(t, i % partitions, null,
            ByteBuffer.allocate(4).putInt(i).array())));
      }
      p.flush();
    }
    for (int i = 0; i < n; i++) {
      RecordMetadata md = fs.get(i).get();
      assertEquals(i / partitions, md.offset(), "acked offset of record " + i);
    }
    List<ConsumerRecord<byte[], byte[]>> recs = Kafka.readAll(t, partitions, Duration.ofSeconds(60));
    assertEquals(n, recs.size(), "record count (duplicates or losses)");
    int[] nextSeq = new int[partitions];
    for (int q = 0; q < partitions; q++) nextSeq[q] = q;
    for (ConsumerRecord<byte[], byte[]> r : recs) {
      int seq = ByteBuffer.wrap(r.value()).getInt();
      assertEquals(nextSeq[r.partition()], seq, "sequence on partition " + r.partition() + " at offset " + r.offset());
      assertEquals(seq / partitions, r.offset(), "offset of sequence " + seq);
      nextSeq[r.partition()] += partitions;
    }
    var end = admin.listOffsets(Map.of(new TopicPartition(t, 0),
        org.apache.kafka.clients.admin.OffsetSpec.latest())).all().get();
    assertEquals((long) n / partitions, end.get(new TopicPartition(t, 0)).offset());
  }

  @Test
  void recordLargerThanTopicMaxMessageBytesIsRejected() throws Exception {
    String t = Kafka.topic("pc-toolarge");
    Kafka.createTopic(admin, t, 1, Map.of("max.message.bytes", "1024"));
    try (KafkaProducer<byte[], byte[]> p = Kafka.producer(Map.of(
        ProducerConfig.MAX_REQUEST_SIZE_CONFIG, String.valueOf(10 * 1024 * 1024),
        ProducerConfig.COMPRESSION_TYPE_CONFIG, "none",
        ProducerConfig.LINGER_MS_CONFIG, "0"))) {
      byte[] big = new byte[4096];
      new Random(1).nextBytes(big);
      ExecutionException e = assertThrows(ExecutionException.class,
          () -> p.send(new ProducerRecord<>(t, 0, null, big)).get(30, TimeUnit.SECONDS));
      assertInstanceOf(RecordTooLargeException.class, e.getCause(), "cause: " + e.getCause());
      // a small record still goes through, at offset 0: the rejected one was not appended
      assertEquals(0L, p.send(new ProducerRecord<>(t, 0, null, Kafka.utf8("small"))).get().offset());
    }
    List<ConsumerRecord<byte[], byte[]>> recs = Kafka.readAll(t, 1, Duration.ofSeconds(30));
    assertEquals(1, recs.size());
    assertEquals("small", Kafka.str(recs.get(0).value()));
    assertTrue(recs.get(0).offset() == 0);
  }
}
