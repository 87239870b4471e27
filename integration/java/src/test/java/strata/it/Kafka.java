package strata.it;

import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.requests.AbstractRequest;
import org.apache.kafka.common.requests.AbstractResponse;
import org.apache.kafka.common.requests.ApiVersionsRequest;
import org.apache.kafka.common.requests.ApiVersionsResponse;
import org.apache.kafka.common.requests.RequestHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/** Shared helpers: broker address, client factories, topic creation, reading a topic back. */
final class Kafka {
  private Kafka() {}

  private static final AtomicInteger SEQ = new AtomicInteger();

  /**
   * Broker address: `mvn test -DBOOTSTRAP=host:port` (handed to the test JVM as strata.bootstrap
   * by surefire's systemPropertyVariables), else the BOOTSTRAP environment variable.
   */
  static String bootstrap() {
    String b = System.getProperty("strata.bootstrap");
    if (b == null || b.isBlank() || b.startsWith("${")) b = System.getProperty("BOOTSTRAP");
    if (b == null || b.isBlank() || b.startsWith("${")) b = System.getenv("BOOTSTRAP");
    if (b == null || b.isBlank()) {
      throw new IllegalStateException("set BOOTSTRAP=host:port (-DBOOTSTRAP=... or environment)");
    }
    return b.trim();
  }

  /** A topic name unique to this run and call. */
  static String topic(String prefix) {
    return prefix + "-" + SEQ.incrementAndGet() + "-" + UUID.randomUUID().toString().substring(0, 8);
  }

  static Admin admin() {
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap());
    p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
    p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
    p.put(AdminClientConfig.RETRIES_CONFIG, "3");
    return Admin.create(p);
  }

  static Properties producerProps() {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap());
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
    p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
    p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
    p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
    return p;
  }

  static KafkaProducer<byte[], byte[]> producer(Map<String, String> overrides) {
    Properties p = producerProps();
    p.putAll(overrides);
    return new KafkaProducer<>(p);
  }

  /** A consumer with no group.id: only assign()/seek() are used (the broker has no group coordinator). */
  static KafkaConsumer<byte[], byte[]> consumer() {
    return consumer(Map.of());
  }

  static KafkaConsumer<byte[], byte[]> consumer(Map<String, String> overrides) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap());
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
    p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "2000");
    p.putAll(overrides);
    return new KafkaConsumer<>(p);
  }

  static void createTopic(Admin admin, String name, int partitions, Map<String, String> configs)
      throws Exception {
    NewTopic t = new NewTopic(name, partitions, (short) 1).configs(configs);
    admin.createTopics(List.of(t)).all().get();
  }

  static List<TopicPartition> partitions(String topic, int n) {
    List<TopicPartition> tps = new ArrayList<>();
    for (int i = 0; i < n; i++) tps.add(new TopicPartition(topic, i));
    return tps;
  }

  /**
   * Reads every partition from its log start to the end offset the broker reports when the read
   * starts. Fails if the consumer cannot reach the end offsets within the timeout.
   */
  static List<ConsumerRecord<byte[], byte[]>> readAll(String topic, int numPartitions, Duration timeout) {
    List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
    try (KafkaConsumer<byte[], byte[]> c = consumer()) {
      List<TopicPartition> tps = partitions(topic, numPartitions);
      c.assign(tps);
      c.seekToBeginning(tps);
      Map<TopicPartition, Long> end = c.endOffsets(tps);
      long deadline = System.nanoTime() + timeout.toNanos();
      while (true) {
        boolean done = true;
        for (TopicPartition tp : tps) if (c.position(tp) < end.get(tp)) done = false;
        if (done) break;
        if (System.nanoTime() > deadline) {
          StringBuilder sb = new StringBuilder("timed out reading " + topic + ": ");
          for (TopicPartition tp : tps) sb.append(tp).append(" pos=").append(c.position(tp)).append(" end=").append(end.get(tp)).append("; ");
          fail(sb.toString() + "records so far=" + out.size());
        }
        c.poll(Duration.ofMillis(200)).forEach(out::add);
      }
    }
    return out;
  }

  static byte[] utf8(String s) {
    return s == null ? null : s.getBytes(StandardCharsets.UTF_8);
  }

  static String str(byte[] b) {
    return b == null ? null : new String(b, StandardCharsets.UTF_8);
  }

  /**
   * Sends one request on a raw socket (for APIs the 4.x Admin no longer exposes, e.g. legacy
   * AlterConfigs), using the highest version both this client and the broker support.
   */
  static AbstractResponse rawRequest(ApiKeys api, AbstractRequest.Builder<?> builder) throws IOException {
    String[] hp = bootstrap().split(":");
    try (Socket s = new Socket()) {
      s.connect(new InetSocketAddress(hp[0], Integer.parseInt(hp[1])), 5000);
      s.setSoTimeout(15000);
      DataOutputStream out = new DataOutputStream(s.getOutputStream());
      DataInputStream in = new DataInputStream(s.getInputStream());
      ApiVersionsResponse versions =
          (ApiVersionsResponse) roundTrip(out, in, ApiKeys.API_VERSIONS,
              ApiKeys.API_VERSIONS.latestVersion(), 1, new ApiVersionsRequest.Builder());
      var range = versions.apiVersion(api.id);
      assertTrue(range != null, "broker does not advertise " + api + " in ApiVersions");
      short v = (short) Math.min(range.maxVersion(), builder.latestAllowedVersion());
      assertTrue(v >= Math.max(range.minVersion(), builder.oldestAllowedVersion()),
          "no common version for " + api + ": broker " + range);
      return roundTrip(out, in, api, v, 2, builder);
    }
  }

  private static AbstractResponse roundTrip(DataOutputStream out, DataInputStream in, ApiKeys api,
      short version, int correlationId, AbstractRequest.Builder<?> builder) throws IOException {
    RequestHeader header = new RequestHeader(api, version, "strata-it-raw", correlationId);
    ByteBuffer req = builder.build(version).serializeWithHeader(header);
    out.writeInt(req.remaining());
    out.write(req.array(), req.arrayOffset() + req.position(), req.remaining());
    out.flush();
    int len = in.readInt();
    byte[] resp = new byte[len];
    in.readFully(resp);
    return AbstractResponse.parseResponse(ByteBuffer.wrap(resp), header);
  }

  static <T> List<T> list(Collection<T> c) {
    return new ArrayList<>(c);
  }
}
