package strata.it;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.function.Consumer;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.CommitFailedException;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RebalanceInProgressException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Helpers for the consumer-group tests: a consumer running its poll/process/commit loop in its own
 * thread (Member), a consumer in a separate JVM that can be killed with SIGKILL (MemberMain), a
 * ledger of every consumption (Ledger), and a private strata process that can be kill -9'ed and
 * restarted on the same port and data directory (StrataProcess).
 */
final class GroupSupport {
  private GroupSupport() {}

  /**
   * session.timeout.ms for group members. run.sh starts the shared broker with
   * --group-min-session-timeout-ms 1000 and exports GROUP_SESSION_TIMEOUT_MS=3000; against a broker
   * with Kafka's defaults (min 6000) the tests fall back to 6000.
   */
  static int sessionTimeoutMs() {
    String v = System.getProperty("GROUP_SESSION_TIMEOUT_MS");
    if (v == null || v.isBlank() || v.startsWith("${")) v = System.getenv("GROUP_SESSION_TIMEOUT_MS");
    return v == null || v.isBlank() ? 6000 : Integer.parseInt(v.trim());
  }

  static Properties consumerProps(String bootstrap, String group, Map<String, String> overrides) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
    p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "500");
    int st = sessionTimeoutMs();
    p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, String.valueOf(st));
    p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, String.valueOf(Math.max(100, st / 4)));
    p.putAll(overrides);
    return p;
  }

  static Admin admin(String bootstrap) {
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
    p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
    p.put(AdminClientConfig.RETRIES_CONFIG, "5");
    return Admin.create(p);
  }

  static Properties producerProps(String bootstrap) {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
    p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
    p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
    p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "60000");
    return p;
  }

  static void await(String what, Duration timeout, BooleanSupplier cond, java.util.function.Supplier<String> state) {
    long deadline = System.nanoTime() + timeout.toNanos();
    while (!cond.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError("timed out after " + timeout.toSeconds() + "s waiting for " + what + "; state: " + state.get());
      }
      try {
        Thread.sleep(50);
      } catch (InterruptedException e) {
        throw new AssertionError(e);
      }
    }
  }

  static String tps(Collection<TopicPartition> c) {
    TreeSet<String> s = new TreeSet<>();
    for (TopicPartition tp : c) s.add(tp.topic() + ":" + tp.partition());
    return s.toString();
  }

  // ------------------------------------------------------------------------------------------

  /** One consumption of one record by one consumer, and whether its batch's commitSync succeeded. */
  record Consumption(String consumer, int partition, long offset, String key, String value, boolean committed) {}

  /** Every consumption by every member of a test, by record value. */
  static final class Ledger {
    final Map<String, List<Consumption>> byValue = new ConcurrentHashMap<>();
    final AtomicInteger total = new AtomicInteger();

    void add(Consumption c) {
      byValue.computeIfAbsent(c.value(), k -> Collections.synchronizedList(new ArrayList<>())).add(c);
      total.incrementAndGet();
    }

    int distinct() {
      return byValue.size();
    }

    List<Consumption> all() {
      List<Consumption> out = new ArrayList<>();
      for (List<Consumption> l : byValue.values()) synchronized (l) { out.addAll(l); }
      return out;
    }
  }

  /** A KafkaConsumer in a group, polling in its own thread, committing synchronously after each batch. */
  static final class Member implements AutoCloseable {
    final String name;
    final Ledger ledger;
    final Properties props;
    final Collection<String> topics;
    final Thread thread;
    final Set<TopicPartition> owned = ConcurrentHashMap.newKeySet();
    final AtomicInteger assignedCalls = new AtomicInteger();
    final AtomicInteger revokedCalls = new AtomicInteger();
    final AtomicInteger lostCalls = new AtomicInteger();
    final AtomicInteger commitFailures = new AtomicInteger();
    final List<String> events = Collections.synchronizedList(new ArrayList<>());
    volatile int generation = -1;
    volatile String memberId = "";
    volatile boolean stop;
    volatile boolean abandon; // stop without close(): the consumer object is simply dropped
    volatile CloseOptions closeOptions = CloseOptions.timeout(Duration.ofSeconds(10));
    volatile Throwable error;
    volatile Consumer<KafkaConsumer<byte[], byte[]>> task; // runs once on the polling thread
    private volatile KafkaConsumer<byte[], byte[]> consumer;

    Member(String name, Ledger ledger, Properties props, Collection<String> topics) {
      this.name = name;
      this.ledger = ledger;
      this.props = props;
      this.topics = topics;
      this.thread = new Thread(this::run, "member-" + name);
      this.thread.setDaemon(true);
    }

    Member start() {
      thread.start();
      return this;
    }

    Set<TopicPartition> owned() {
      return new HashSet<>(owned);
    }

    private void run() {
      KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props);
      consumer = c;
      try {
        c.subscribe(topics, new ConsumerRebalanceListener() {
          @Override
          public void onPartitionsRevoked(Collection<TopicPartition> parts) {
            revokedCalls.incrementAndGet();
            owned.removeAll(parts);
            events.add("revoked " + tps(parts));
          }

          @Override
          public void onPartitionsAssigned(Collection<TopicPartition> parts) {
            assignedCalls.incrementAndGet();
            owned.addAll(parts);
            events.add("assigned " + tps(parts) + " gen " + c.groupMetadata().generationId());
          }

          @Override
          public void onPartitionsLost(Collection<TopicPartition> parts) {
            lostCalls.incrementAndGet();
            owned.removeAll(parts);
            events.add("lost " + tps(parts));
          }
        });
        while (!stop) {
          Consumer<KafkaConsumer<byte[], byte[]>> t = task;
          if (t != null) {
            task = null;
            t.accept(c);
          }
          ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(100));
          generation = c.groupMetadata().generationId();
          memberId = c.groupMetadata().memberId();
          if (recs.isEmpty()) continue;
          List<ConsumerRecord<byte[], byte[]>> batch = new ArrayList<>();
          recs.forEach(batch::add);
          boolean committed;
          try {
            c.commitSync();
            committed = true;
          } catch (CommitFailedException | RebalanceInProgressException e) {
            committed = false;
            commitFailures.incrementAndGet();
            events.add("commit failed: " + e);
          }
          for (ConsumerRecord<byte[], byte[]> r : batch) {
            ledger.add(new Consumption(name, r.partition(), r.offset(), Kafka.str(r.key()), Kafka.str(r.value()), committed));
          }
          generation = c.groupMetadata().generationId();
        }
      } catch (WakeupException e) {
        // close requested
      } catch (Throwable t) {
        error = t;
        events.add("error: " + t);
      } finally {
        if (!abandon) {
          try {
            c.close(closeOptions);
          } catch (Throwable t) {
            events.add("close error: " + t);
          }
        }
      }
    }

    /** Runs fn on the polling thread (the consumer is not thread-safe) and waits for it. */
    <T> T call(java.util.function.Function<KafkaConsumer<byte[], byte[]>, T> fn) throws Exception {
      java.util.concurrent.CompletableFuture<T> f = new java.util.concurrent.CompletableFuture<>();
      task = c -> {
        try {
          f.complete(fn.apply(c));
        } catch (Throwable t) {
          f.completeExceptionally(t);
        }
      };
      return f.get(60, TimeUnit.SECONDS);
    }

    void stopAndClose(CloseOptions opts) throws InterruptedException {
      closeOptions = opts;
      stop = true;
      thread.join(30_000);
    }

    @Override
    public void close() throws InterruptedException {
      if (thread.isAlive()) {
        stop = true;
        thread.join(30_000);
      }
    }

    @Override
    public String toString() {
      return name + "{owned=" + tps(owned) + " gen=" + generation + " assigned=" + assignedCalls + " revoked="
          + revokedCalls + " lost=" + lostCalls + " commitFailures=" + commitFailures + " error=" + error
          + " events=" + events + "}";
    }
  }

  // ------------------------------------------------------------------------------------------

  /**
   * A group member in its own JVM, so the test can kill it with SIGKILL (a real crash: no
   * LeaveGroup, no more heartbeats). Prints "A <partitions>" on assignment, "R p o key value" per
   * record processed, "C" after each successful commitSync.
   * Args: bootstrap topic group sessionTimeoutMs [classic|consumer]
   */
  static final class MemberMain {
    public static void main(String[] args) {
      PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
      Properties p = new Properties();
      p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
      p.put(ConsumerConfig.GROUP_ID_CONFIG, args[2]);
      p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
      p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
      p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
      p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
      p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "500");
      int st = Integer.parseInt(args[3]);
      p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, String.valueOf(st));
      p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, String.valueOf(Math.max(100, st / 4)));
      if (args.length > 4 && args[4].equalsIgnoreCase("consumer")) {
        // The consumer protocol takes its session and heartbeat from the broker.
        p.remove(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG);
        p.remove(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG);
        p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
      }
      try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
        c.subscribe(List.of(args[1]), new ConsumerRebalanceListener() {
          @Override
          public void onPartitionsRevoked(Collection<TopicPartition> parts) {
            out.println("V " + tps(parts));
            out.flush();
          }

          @Override
          public void onPartitionsAssigned(Collection<TopicPartition> parts) {
            out.println("A " + tps(c.assignment()));
            out.flush();
          }
        });
        while (true) {
          ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(100));
          if (recs.isEmpty()) continue;
          for (ConsumerRecord<byte[], byte[]> r : recs) {
            out.println("R " + r.partition() + " " + r.offset() + " " + Kafka.str(r.key()) + " " + Kafka.str(r.value()));
          }
          out.flush();
          try {
            Thread.sleep(20); // "processing": a SIGKILL may land between processing and commit
            c.commitSync();
            out.println("C");
          } catch (CommitFailedException | RebalanceInProgressException e) {
            out.println("F " + e);
          } catch (InterruptedException e) {
            return;
          }
          out.flush();
        }
      }
    }
  }

  /** Parent side of a MemberMain process. */
  static final class ProcessMember implements AutoCloseable {
    final String name;
    final Process process;
    final Ledger ledger;
    final Thread reader;
    final List<Consumption> pending = new ArrayList<>();
    volatile String assignment = "";
    final AtomicInteger consumed = new AtomicInteger();
    final List<String> otherLines = Collections.synchronizedList(new ArrayList<>());
    final StringBuilder stderr = new StringBuilder();

    ProcessMember(String name, Ledger ledger, String bootstrap, String topic, String group, int sessionTimeoutMs)
        throws IOException {
      this(name, ledger, bootstrap, topic, group, sessionTimeoutMs, "classic");
    }

    /** groupProtocol: "classic" or "consumer". */
    ProcessMember(String name, Ledger ledger, String bootstrap, String topic, String group, int sessionTimeoutMs,
        String groupProtocol) throws IOException {
      this.name = name;
      this.ledger = ledger;
      List<String> cmd = new ArrayList<>();
      cmd.add(System.getProperty("java.home") + File.separator + "bin" + File.separator + "java");
      cmd.add("-Xmx256m");
      cmd.add("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn");
      cmd.add("-cp");
      cmd.add(CliToolsTest.classpath());
      cmd.add(MemberMain.class.getName());
      cmd.addAll(List.of(bootstrap, topic, group, String.valueOf(sessionTimeoutMs), groupProtocol));
      process = new ProcessBuilder(cmd).start();
      reader = new Thread(this::read, "reader-" + name);
      reader.setDaemon(true);
      reader.start();
      Thread err = new Thread(() -> {
        try (BufferedReader r = new BufferedReader(new InputStreamReader(process.getErrorStream(), StandardCharsets.UTF_8))) {
          String l;
          while ((l = r.readLine()) != null) synchronized (stderr) { stderr.append(l).append('\n'); }
        } catch (IOException ignored) {
          // killed
        }
      });
      err.setDaemon(true);
      err.start();
    }

    private void read() {
      try (BufferedReader r = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
        String l;
        while ((l = r.readLine()) != null) {
          if (l.startsWith("R ")) {
            String[] f = l.split(" ", 5);
            synchronized (pending) {
              pending.add(new Consumption(name, Integer.parseInt(f[1]), Long.parseLong(f[2]), f[3], f[4], false));
            }
          } else if (l.equals("C") || l.startsWith("F ")) {
            boolean ok = l.equals("C");
            synchronized (pending) {
              for (Consumption c : pending) {
                ledger.add(new Consumption(c.consumer(), c.partition(), c.offset(), c.key(), c.value(), ok));
                consumed.incrementAndGet();
              }
              pending.clear();
            }
            if (!ok) otherLines.add(l);
          } else if (l.startsWith("A ")) {
            assignment = l.substring(2);
          } else {
            otherLines.add(l);
          }
        }
      } catch (IOException ignored) {
        // killed
      }
      // whatever was processed but not reported committed when the process died: uncommitted
      synchronized (pending) {
        for (Consumption c : pending) ledger.add(c);
        pending.clear();
      }
    }

    /** Sends SIGKILL without waiting. */
    void kill9ASAP() {
      process.destroyForcibly();
    }

    /** SIGKILL (Process.destroyForcibly on Linux) and wait for the output to be drained. */
    void kill9() throws InterruptedException {
      process.destroyForcibly();
      process.waitFor(10, TimeUnit.SECONDS);
      reader.join(10_000);
    }

    @Override
    public void close() throws InterruptedException {
      if (process.isAlive()) kill9();
    }

    @Override
    public String toString() {
      String e;
      synchronized (stderr) { e = stderr.toString(); }
      return name + "{alive=" + process.isAlive() + " assignment=" + assignment + " consumed=" + consumed
          + " other=" + otherLines + " stderr=" + (e.length() > 3000 ? e.substring(e.length() - 3000) : e) + "}";
    }
  }

  // ------------------------------------------------------------------------------------------

  /** A private strata broker (its own port and data dir) that a test may kill -9 and restart. */
  static final class StrataProcess implements AutoCloseable {
    final Path bin;
    final Path dataDir;
    final int port;
    final List<String> extraArgs;
    Process process;
    int starts;

    StrataProcess(List<String> extraArgs) throws IOException {
      this.bin = binary();
      this.dataDir = Files.createTempDirectory("strata-it-groups-");
      try (ServerSocket s = new ServerSocket(0, 0, java.net.InetAddress.getLoopbackAddress())) {
        this.port = s.getLocalPort();
      }
      this.extraArgs = extraArgs;
    }

    static Path binary() {
      String b = System.getenv("STRATA_BIN");
      Path p = b != null && !b.isBlank() ? Path.of(b) : Path.of("../../target/release/strata").toAbsolutePath().normalize();
      if (!Files.isExecutable(p)) throw new IllegalStateException("strata binary not found at " + p + " (set STRATA_BIN)");
      return p;
    }

    String bootstrap() {
      return "127.0.0.1:" + port;
    }

    Path log() {
      return dataDir.resolve("broker-" + starts + ".log");
    }

    void start() throws Exception {
      starts++;
      List<String> cmd = new ArrayList<>(List.of(bin.toString(), "serve", "--listen", bootstrap(),
          "--advertised-listener", bootstrap(), "--data-dir", dataDir.toString()));
      cmd.addAll(extraArgs);
      process = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log().toFile()).start();
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
      while (true) {
        try (Socket s = new Socket()) {
          s.connect(new InetSocketAddress("127.0.0.1", port), 200);
          return;
        } catch (IOException e) {
          if (!process.isAlive() || System.nanoTime() > deadline) {
            throw new AssertionError("strata did not start on " + bootstrap() + ":\n" + logs());
          }
          Thread.sleep(50);
        }
      }
    }

    /** SIGKILL: no shutdown hooks, no flush. */
    void kill9() throws InterruptedException {
      process.destroyForcibly();
      if (!process.waitFor(10, TimeUnit.SECONDS)) throw new AssertionError("strata did not die on SIGKILL");
    }

    String logs() {
      StringBuilder sb = new StringBuilder();
      for (int i = 1; i <= starts; i++) {
        Path p = dataDir.resolve("broker-" + i + ".log");
        try {
          List<String> lines = Files.readAllLines(p, StandardCharsets.UTF_8);
          sb.append("--- ").append(p).append(" (last 40 lines)\n");
          for (String l : lines.subList(Math.max(0, lines.size() - 40), lines.size())) sb.append(l).append('\n');
        } catch (IOException e) {
          sb.append("--- ").append(p).append(": ").append(e).append('\n');
        }
      }
      return sb.toString();
    }

    @Override
    public void close() throws Exception {
      if (process != null && process.isAlive()) {
        process.destroy();
        if (!process.waitFor(10, TimeUnit.SECONDS)) process.destroyForcibly().waitFor();
      }
      if ("1".equals(System.getenv("KEEP_BROKER_DATA"))) {
        System.err.println("private broker data kept in " + dataDir);
      } else {
        try (var w = Files.walk(dataDir)) {
          w.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        }
      }
    }
  }
}
