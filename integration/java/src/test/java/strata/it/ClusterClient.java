package strata.it;

import java.io.IOException;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The Java client's part in integration/cluster/run.sh (not a JUnit test: the suite runs it beside
 * a librdkafka producer while it kills brokers, so it is a plain program).
 *
 * <pre>
 * produce BOOTSTRAP TOPIC PARTITIONS STOP_FILE OUT   idempotent acks=all producer of java-N records,
 *                                                    round-robin over the partitions, one every 2 ms
 *                                                    until STOP_FILE exists; OUT gets one line per
 *                                                    outcome: "ack N PARTITION OFFSET MILLIS" or
 *                                                    "fail N PARTITION MILLIS ERROR", then "sent N"
 * consume BOOTSTRAP TOPIC OUT                        every record of the topic, start to end, as
 *                                                    "PARTITION OFFSET VALUE" lines
 * share-consume BOOTSTRAP TOPIC GROUP STOP_FILE OUT  a KafkaShareConsumer of share group GROUP from the
 *                                                    topic's start, each delivery as a line like
 *                                                    consume's, until STOP_FILE exists and every offset
 *                                                    below the end offsets was delivered
 * </pre>
 */
public final class ClusterClient {
  private ClusterClient() {}

  public static void main(String[] args) throws Exception {
    switch (args[0]) {
      case "produce" -> produce(args[1], args[2], Integer.parseInt(args[3]), Path.of(args[4]), Path.of(args[5]));
      case "consume" -> consume(args[1], args[2], Path.of(args[3]));
      case "share-consume" -> shareConsume(args[1], args[2], args[3], Path.of(args[4]), Path.of(args[5]));
      default -> throw new IllegalArgumentException("unknown command " + args[0]);
    }
  }

  static void produce(String bootstrap, String topic, int partitions, Path stop, Path out)
      throws IOException, InterruptedException {
    Properties props = new Properties();
    props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ProducerConfig.ACKS_CONFIG, "all");
    props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
    props.put(ProducerConfig.RETRY_BACKOFF_MS_CONFIG, "100");
    props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "60000");
    props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    int sent = 0;
    try (PrintWriter w = new PrintWriter(Files.newBufferedWriter(out, StandardCharsets.UTF_8));
        KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
      long nextFlush = 0;
      while (!Files.exists(stop)) {
        int n = sent++;
        int partition = n % partitions;
        producer.send(
            new ProducerRecord<>(topic, partition, "k" + n, "java-" + n),
            (md, e) -> {
              long now = System.currentTimeMillis();
              synchronized (w) {
                if (e == null) {
                  w.printf("ack %d %d %d %d%n", n, md.partition(), md.offset(), now);
                } else {
                  w.printf("fail %d %d %d %s%n", n, partition, now, e.toString().replace('\n', ' '));
                }
              }
            });
        long now = System.currentTimeMillis();
        if (now >= nextFlush) {
          synchronized (w) {
            w.flush();
          }
          nextFlush = now + 200;
        }
        Thread.sleep(2);
      }
      producer.flush();
      synchronized (w) {
        w.printf("sent %d%n", sent);
      }
    }
  }

  static void consume(String bootstrap, String topic, Path out) throws IOException {
    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props);
        PrintWriter w = new PrintWriter(Files.newBufferedWriter(out, StandardCharsets.UTF_8))) {
      List<TopicPartition> tps = new ArrayList<>();
      consumer.partitionsFor(topic, Duration.ofSeconds(30)).forEach(p -> tps.add(new TopicPartition(topic, p.partition())));
      consumer.assign(tps);
      consumer.seekToBeginning(tps);
      Map<TopicPartition, Long> end = consumer.endOffsets(tps, Duration.ofSeconds(30));
      long deadline = System.currentTimeMillis() + 60_000;
      while (tps.stream().anyMatch(tp -> consumer.position(tp) < end.get(tp))) {
        if (System.currentTimeMillis() > deadline) {
          throw new IllegalStateException("did not reach the end offsets " + end);
        }
        for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
          w.printf("%d %d %s%n", r.partition(), r.offset(), r.value());
        }
      }
      System.err.println("java consumer read up to " + end);
    }
  }

  /**
   * A KafkaShareConsumer (Kafka 4.4) reading the topic from its start through a share group, across the
   * broker failures the script causes, writing each delivery as "partition offset value". Once `stop`
   * exists it reads on until it has seen every offset below the end offsets.
   */
  static void shareConsume(String bootstrap, String topic, String group, Path stop, Path out) throws Exception {
    try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
      var res = new ConfigResource(ConfigResource.Type.GROUP, group);
      var op = new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET);
      admin.incrementalAlterConfigs(Map.of(res, List.of(op))).all().get();
    }
    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    Map<Integer, java.util.BitSet> seen = new java.util.HashMap<>();
    try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(props);
        PrintWriter w = new PrintWriter(Files.newBufferedWriter(out, StandardCharsets.UTF_8))) {
      consumer.subscribe(List.of(topic));
      Map<TopicPartition, Long> end = null;
      long deadline = Long.MAX_VALUE;
      while (true) {
        for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
          w.printf("%d %d %s%n", r.partition(), r.offset(), r.value());
          seen.computeIfAbsent(r.partition(), p -> new java.util.BitSet()).set((int) r.offset());
        }
        w.flush();
        if (end == null && Files.exists(stop)) {
          try (KafkaConsumer<String, String> c = new KafkaConsumer<>(Map.of(
              "bootstrap.servers", bootstrap,
              "key.deserializer", StringDeserializer.class.getName(),
              "value.deserializer", StringDeserializer.class.getName()))) {
            List<TopicPartition> tps = new ArrayList<>();
            c.partitionsFor(topic, Duration.ofSeconds(30)).forEach(p -> tps.add(new TopicPartition(topic, p.partition())));
            end = c.endOffsets(tps, Duration.ofSeconds(30));
          }
          deadline = System.currentTimeMillis() + 90_000;
        }
        if (end != null) {
          boolean all = end.entrySet().stream().allMatch(e -> {
            java.util.BitSet b = seen.getOrDefault(e.getKey().partition(), new java.util.BitSet());
            return b.nextClearBit(0) >= e.getValue();
          });
          if (all) {
            System.err.println("share consumer saw every offset below " + end);
            return;
          }
          if (System.currentTimeMillis() > deadline) {
            StringBuilder missing = new StringBuilder();
            for (var e : end.entrySet()) {
              java.util.BitSet b = seen.getOrDefault(e.getKey().partition(), new java.util.BitSet());
              int first = b.nextClearBit(0);
              if (first < e.getValue()) {
                missing.append(' ').append(e.getKey()).append(" from ").append(first).append(" (")
                    .append(e.getValue() - b.get(0, e.getValue().intValue()).cardinality()).append(" missing)");
              }
            }
            throw new IllegalStateException("the share consumer did not see every offset below " + end + ":" + missing);
          }
        }
      }
    }
  }
}
