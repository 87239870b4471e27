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
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
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
 * </pre>
 */
public final class ClusterClient {
  private ClusterClient() {}

  public static void main(String[] args) throws Exception {
    switch (args[0]) {
      case "produce" -> produce(args[1], args[2], Integer.parseInt(args[3]), Path.of(args[4]), Path.of(args[5]));
      case "consume" -> consume(args[1], args[2], Path.of(args[3]));
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
}
