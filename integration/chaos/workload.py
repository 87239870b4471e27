"""The clients (confluent-kafka), each a thread recording into the history:

  idem-N       idempotent producers (acks=all) sending 20 unique values a second
               round-robin to every partition; each ack with its (partition, offset)
  txn-A, txn-B transactional producers. Each transaction first polls (read
               committed, assign mode) the partition the other one writes, then
               writes 1-2 values to one or both of its own two partitions, and
               commits, or (a quarter of them) flushes and aborts. A and B
               write disjoint partitions: Kafka lets concurrent transactions on
               the same partitions interleave (a G0 cycle by design), so only
               cycles that no legal interleaving explains can appear.
  assign-rc, assign-ru   consumers assigned every partition from offset 0
  classic-N    members of a classic group, committing after each poll
  kip848-N     members of a KIP-848 group (group.protocol=consumer), the same

Then `final_read` reads every partition from offset 0 to its end, read
uncommitted and read committed, and `final_committed` the groups' offsets.
"""
import logging
import os
import random
import threading
import time

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic

TOPIC = "chaos"
PARTITIONS = 4
TXN_WRITES = {"txn-A": ([0, 1], 3), "txn-B": ([2, 3], 0)}  # own partitions, partition read
GROUPS = {"classic": "chaos-classic", "kip848": "chaos-kip848"}
TXN_TIMEOUT_MS = 10000

LOG = logging.getLogger("librdkafka")
# librdkafka debug contexts for the producers (say "eos,msg"), to see why
# one retried or bumped its epoch; their lines go to clients.log.
PRODUCER_DEBUG = os.environ.get("CHAOS_PRODUCER_DEBUG")


def client_log(path):
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    LOG.addHandler(handler)
    LOG.setLevel(logging.DEBUG if PRODUCER_DEBUG else logging.INFO)
    LOG.propagate = False


def base_config(bootstrap, name):
    return {"bootstrap.servers": bootstrap, "client.id": name, "logger": LOG,
            "reconnect.backoff.max.ms": 1000, "topic.metadata.refresh.interval.ms": 5000}


def create_topic(bootstrap, timeout=60):
    admin = AdminClient(base_config(bootstrap, "admin"))
    for f in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        f.result(30)
    wait_leaders(bootstrap, timeout)


def wait_leaders(bootstrap, timeout):
    """Waits until every broker is in the metadata and every partition has a leader."""
    admin = AdminClient(base_config(bootstrap, "admin"))
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            md = admin.list_topics(TOPIC, timeout=5)
            t = md.topics.get(TOPIC)
            if len(md.brokers) == 3 and t is not None and t.error is None and len(t.partitions) == PARTITIONS \
                    and all(p.error is None and p.leader >= 0 for p in t.partitions.values()):
                return True
        except KafkaException:
            pass
        time.sleep(0.5)
    return False


def err_text(err):
    return err.str() if isinstance(err, KafkaError) else str(err)


class Workload:
    def __init__(self, bootstrap, history, seed):
        self.bootstrap, self.h = bootstrap, history
        self.rng = random.Random(seed)  # per-client generators derive from it
        self.stopping = threading.Event()
        self.threads = []

    def start(self):
        clients = [(self.idempotent, "idem-0"), (self.idempotent, "idem-1"),
                   (self.transactional, "txn-A"), (self.transactional, "txn-B"),
                   (self.assign_consumer, "assign-rc"), (self.assign_consumer, "assign-ru")]
        clients += [(self.group_consumer, f"{kind}-{i}") for kind in GROUPS for i in range(2)]
        for target, name in clients:
            t = threading.Thread(target=self.guard, args=(target, name, random.Random(self.rng.random())),
                                 name=name, daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self, timeout=45):
        self.stopping.set()
        deadline = time.time() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.time()))
        return [t.name for t in self.threads if t.is_alive()]

    def guard(self, target, name, rng):
        """Runs one client; a crash of the client code itself is recorded, not hidden."""
        try:
            target(name, rng)
        except Exception as e:  # noqa: BLE001 - recorded for the report
            self.h.add(name, "info", "client-crash", repr(e))

    # -- producers ---------------------------------------------------------

    def producer(self, name, **extra):
        conf = base_config(self.bootstrap, name)
        # Sends outlive any outage: an in-flight send that times out makes
        # librdkafka bump the producer epoch, after which a retried batch
        # can no longer be told from a new one (a duplicate the broker
        # could not prevent). Transactions cap it at their own timeout.
        conf.update({"acks": "all", "enable.idempotence": True, "linger.ms": 10,
                     "message.timeout.ms": 120000, "retry.backoff.ms": 100}, **extra)
        if PRODUCER_DEBUG:
            conf["debug"] = PRODUCER_DEBUG
        return Producer(conf)

    def idempotent(self, name, rng):
        fatal = []
        p = self.producer(name, error_cb=lambda e: e.fatal() and fatal.append(e))
        n = 0
        while not self.stopping.is_set():
            if fatal:
                self.h.add(name, "info", "producer-fatal", err_text(fatal[0]))
                p.purge()
                p.flush(5)
                fatal.clear()
                p = self.producer(name, error_cb=lambda e: e.fatal() and fatal.append(e))
            value, partition = f"{name}-{n}", n % PARTITIONS
            n += 1
            self.h.add(name, "invoke", "send", {"value": value, "partition": partition})
            try:
                p.produce(TOPIC, value=value, partition=partition, on_delivery=self.on_send(name, value, partition))
            except BufferError as e:
                self.h.add(name, "fail", "send", {"value": value, "partition": partition, "error": str(e)})
            p.poll(0)
            time.sleep(0.05)
        left = p.flush(30)
        if left:
            p.purge()
            p.flush(5)

    def on_send(self, name, value, partition):
        def report(err, msg):
            if err is None:
                self.h.add(name, "ok", "send", {"value": value, "partition": msg.partition(), "offset": msg.offset()})
            else:  # a timed-out or failed idempotent send may still be in the log
                self.h.add(name, "info", "send", {"value": value, "partition": partition, "error": err_text(err)})
        return report

    def transactional(self, name, rng):
        own, read_partition = TXN_WRITES[name]
        reader = self.consumer(name, "read_committed", group=f"chaos-{name}-reader")
        reader.assign([TopicPartition(TOPIC, read_partition, OFFSET_BEGINNING)])
        self.h.add(name, "ok", "assign", {"partitions": [read_partition], "isolation": "rc"})
        producer, t = None, 0
        while not self.stopping.is_set():
            if producer is None:
                producer = self.producer(name, **{"transactional.id": f"chaos-{name}",
                                                  "transaction.timeout.ms": TXN_TIMEOUT_MS,
                                                  "message.timeout.ms": TXN_TIMEOUT_MS})
                try:
                    producer.init_transactions(30)
                except KafkaException as e:
                    self.h.add(name, "info", "init-transactions", err_text(e.args[0]))
                    producer = None
                    time.sleep(1)
                    continue
            txn = f"{name}-{t}"
            t += 1
            partitions = own if rng.random() < 0.6 else [rng.choice(own)]
            writes = [(p, f"{txn}-{i}") for i, p in enumerate(p for p in partitions for _ in range(rng.randint(1, 2)))]
            abort = rng.random() < 0.25
            self.h.add(name, "invoke", "txn", {"txn": txn, "writes": [list(w) for w in writes], "abort": abort})
            reads = self.poll_records(name, reader, "rc", record=False)
            offsets = {}
            outcome, error = self.run_txn(producer, writes, abort, offsets)
            if outcome == "unknown":
                producer = None  # a new one with the same transactional.id fences this one
            self.h.add(name, {"committed": "ok", "aborted": "fail"}.get(outcome, "info"), "txn",
                       {"txn": txn, "outcome": outcome, "error": error,
                        "writes": [[p, offsets.get(v), v] for p, v in writes], "reads": reads})
            time.sleep(rng.uniform(0.05, 0.2))
        reader.close()

    def run_txn(self, producer, writes, abort, offsets):
        """'committed', 'aborted' or 'unknown', and the error that led there."""
        def delivered(err, msg):
            if err is None:
                offsets[msg.value().decode()] = msg.offset()
        try:
            producer.begin_transaction()
            for p, v in writes:
                producer.produce(TOPIC, value=v, partition=p, on_delivery=delivered)
            if abort:
                producer.flush(10)  # in the log, so a reader could see it
                producer.abort_transaction(30)
                return "aborted", None
            for attempt in range(3):
                try:
                    producer.commit_transaction(30)
                    return "committed", None
                except KafkaException as e:
                    if not e.args[0].retriable() or attempt == 2:
                        raise
        except KafkaException as e:
            err = e.args[0]
            if err.txn_requires_abort():
                try:
                    producer.abort_transaction(30)
                    return "aborted", err_text(err)
                except KafkaException as e2:
                    return "unknown", f"{err_text(err)}; abort: {err_text(e2.args[0])}"
            return "unknown", err_text(err)
        except BufferError as e:
            return "unknown", str(e)

    # -- consumers ---------------------------------------------------------

    def consumer(self, name, isolation, group, **extra):
        conf = base_config(self.bootstrap, name)
        conf.update({"group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "isolation.level": isolation}, **extra)
        return Consumer(conf)

    def poll_records(self, name, consumer, iso, record=True, mode="assign", group=None):
        records = []
        for m in consumer.consume(200, 0.2):
            if m.error():
                self.h.add(name, "info", "consumer-error", err_text(m.error()))
            else:
                records.append([m.partition(), m.offset(), m.value().decode()])
        if records and record:
            self.h.add(name, "ok", "poll", {"isolation": iso, "mode": mode, "group": group, "records": records})
        return records

    def assign_consumer(self, name, rng):
        iso = name.split("-")[1]
        c = self.consumer(name, {"rc": "read_committed", "ru": "read_uncommitted"}[iso], group=f"chaos-{name}")
        c.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.h.add(name, "ok", "assign", {"partitions": list(range(PARTITIONS)), "isolation": iso})
        while not self.stopping.is_set():
            self.poll_records(name, c, iso)
        c.close()

    def group_consumer(self, name, rng):
        kind = name.split("-")[0]
        group = GROUPS[kind]
        extra = {"group.protocol": "consumer"} if kind == "kip848" else \
            {"session.timeout.ms": 10000, "heartbeat.interval.ms": 1000}
        c = self.consumer(name, "read_committed", group, **extra)

        def rebalance(event):
            return lambda consumer, parts: self.h.add(
                name, "info", "rebalance", {"event": event, "group": group, "partitions": [tp.partition for tp in parts]})
        c.subscribe([TOPIC], on_assign=rebalance("assign"), on_revoke=rebalance("revoke"), on_lost=rebalance("lost"))
        while not self.stopping.is_set():
            if self.poll_records(name, c, "rc", mode=kind, group=group):
                self.commit(name, c, group)
        c.close()

    def commit(self, name, consumer, group):
        self.h.add(name, "invoke", "commit", {"group": group})
        try:
            done = consumer.commit(asynchronous=False)
        except KafkaException as e:
            self.h.add(name, "info", "commit", {"group": group, "error": err_text(e.args[0])})
            return
        offsets = [[tp.partition, tp.offset] for tp in done if tp.error is None and tp.offset >= 0]
        self.h.add(name, "ok", "commit", {"group": group, "offsets": offsets})


def probe(bootstrap, history, timeout=60):
    """One acknowledged send to every partition: the cluster serves again."""
    p = Producer({**base_config(bootstrap, "probe"), "acks": "all", "enable.idempotence": True,
                  "message.timeout.ms": int(timeout * 1000)})
    acked = []
    for part in range(PARTITIONS):
        value = f"probe-{part}"
        history.add("probe", "invoke", "send", {"value": value, "partition": part})

        def report(err, msg, value=value, part=part):
            if err is None:
                acked.append(value)
                history.add("probe", "ok", "send", {"value": value, "partition": part, "offset": msg.offset()})
            else:
                history.add("probe", "info", "send", {"value": value, "partition": part, "error": err_text(err)})
        p.produce(TOPIC, value=value, partition=part, on_delivery=report)
    p.flush(timeout + 5)
    return len(acked) == PARTITIONS


def watermarks(bootstrap, isolation):
    c = Consumer({**base_config(bootstrap, "watermarks"), "group.id": "chaos-watermarks",
                  "isolation.level": isolation})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        c.close()


def wait_stable_ends(bootstrap, timeout):
    """Waits until the last stable offset reaches the high watermark everywhere
    (open transactions resolved); False if it never does."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if watermarks(bootstrap, "read_committed") == watermarks(bootstrap, "read_uncommitted"):
                return True
        except KafkaException:
            pass
        time.sleep(1)
    return False


def final_read(bootstrap, history, iso, timeout=60):
    """Every partition from offset 0 to its end; records the final-read op."""
    isolation = {"rc": "read_committed", "ru": "read_uncommitted"}[iso]
    c = Consumer({**base_config(bootstrap, f"final-{iso}"), "group.id": f"chaos-final-{iso}",
                  "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": True})
    c.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    records, ends, errors = [], {}, []
    deadline = time.time() + timeout
    while len(ends) < PARTITIONS and time.time() < deadline:
        for m in c.consume(500, 0.5):
            if m.error() is None:
                records.append([m.partition(), m.offset(), m.value().decode()])
            elif m.error().code() == KafkaError._PARTITION_EOF:
                ends[m.partition()] = m.offset()
            else:
                errors.append(err_text(m.error()))
    c.close()
    complete = len(ends) == PARTITIONS
    history.add("final", "ok" if complete else "info", "final-read",
                {"isolation": iso, "records": records, "ends": sorted(ends.items()), "errors": errors[:20]})
    return complete


def final_committed(bootstrap, history):
    for group in GROUPS.values():
        c = Consumer({**base_config(bootstrap, "final-committed"), "group.id": group})
        try:
            done = c.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=15)
            history.add("final", "ok", "final-committed",
                        {"group": group, "offsets": [[tp.partition, tp.offset] for tp in done if tp.offset >= 0]})
        except KafkaException as e:
            history.add("final", "info", "final-committed", {"group": group, "error": err_text(e.args[0])})
        finally:
            c.close()
