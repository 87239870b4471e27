"""A Kafka proxy that answers Produce as late as Strata's WAL could at best.

Put in front of any Kafka broker, it holds each Produce response back until
the moment a cluster-mode Strata broker with a perfect WAL would have
acknowledged that request: the next flush tick (every FLUSH_MS), then one
PUT of a log-normal latency (MEDIAN_MS, P99_MS), sent again after HEDGE_MS
with the first answer winning, and acknowledged in sequence order with the
objects before it. Other responses pass at once, in order. Run against
Apache Kafka it shows what a Kafka client makes of that latency floor by
itself: the rest of the gap to a target is the client's (scripts/bench-kafka).

Usage: wal-floor-proxy.py LISTEN_PORT UPSTREAM_PORT [FLUSH_MS MEDIAN_MS P99_MS HEDGE_MS SEED]
It prints "ready" once listening.
"""
import asyncio
import math
import random
import struct
import sys
import time

Z99 = 2.3263
PRODUCE = 0


class Wal:
    """The acknowledgement instant of the object each tick would write."""

    def __init__(self, flush_ms, median_ms, p99_ms, hedge_ms, seed):
        self.flush = flush_ms / 1000.0
        self.mu = math.log(median_ms / 1000.0)
        self.sigma = math.log(p99_ms / median_ms) / Z99
        self.hedge = hedge_ms / 1000.0 if hedge_ms > 0 else None
        self.rng = random.Random(seed)
        self.start = time.monotonic()
        self.acked = {}  # tick -> when its object is acknowledged
        self.last_tick, self.last_acked = -1, 0.0

    def put(self):
        first = self.rng.lognormvariate(self.mu, self.sigma)
        if self.hedge is not None and first > self.hedge:
            return min(first, self.hedge + self.rng.lognormvariate(self.mu, self.sigma))
        return first

    def ack_time(self, arrived):
        tick = math.floor((arrived - self.start) / self.flush) + 1
        while self.last_tick < tick:
            self.last_tick += 1
            sent = self.start + self.last_tick * self.flush
            self.last_acked = max(self.last_acked, sent + self.put())
            self.acked[self.last_tick] = self.last_acked
            self.acked.pop(self.last_tick - 1000, None)
        return self.acked[tick]


async def read_frame(reader):
    head = await reader.readexactly(4)
    (size,) = struct.unpack(">i", head)
    return head + await reader.readexactly(size)


async def serve(client_r, client_w, upstream_port, wal):
    server_r, server_w = await asyncio.open_connection("127.0.0.1", upstream_port)
    # (is produce, arrival) of each request, in order: Kafka answers in order.
    asked = asyncio.Queue()
    released = [0.0]

    async def requests():
        try:
            while True:
                frame = await read_frame(client_r)
                (api_key,) = struct.unpack(">h", frame[4:6])
                await asked.put((api_key == PRODUCE, time.monotonic()))
                server_w.write(frame)
                await server_w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            server_w.close()

    async def responses():
        try:
            while True:
                frame = await read_frame(server_r)
                produce, arrived = await asked.get()
                if produce:
                    at = max(wal.ack_time(arrived), released[0])
                    released[0] = at
                    delay = at - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                client_w.write(frame)
                await client_w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            client_w.close()

    await asyncio.gather(requests(), responses(), return_exceptions=True)


async def main():
    listen, upstream = int(sys.argv[1]), int(sys.argv[2])
    flush, median, p99, hedge, seed = (list(map(float, sys.argv[3:8])) + [50, 40, 160, 100, 1][
        len(sys.argv[3:8]):])
    wal = Wal(flush, median, p99, hedge, int(seed))
    server = await asyncio.start_server(
        lambda r, w: serve(r, w, upstream, wal), "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
