"""TCP proxies the nemesis controls, all in one asyncio process.

Each broker reaches etcd and the S3 server through proxies of its own, so a
fault can hit one broker's path and not the others'. A proxy forwards bytes
(`tcp`) or whole HTTP/1.1 exchanges (`http`, for S3), and is in one mode:

  pass     forward
  hang     accept and read nothing, forward nothing (a black hole); on healing
           whatever was held goes through, as TCP retransmits would deliver it
  refuse   reset every open connection and close new ones at once

and may add `latency_ms` (per chunk for tcp, per request for http) and, for
http, answer `error_rate` of the requests with a 503 SlowDown without
forwarding them. For http, `latency` and `errors` may instead be given per
operation (PUT, GET, HEAD, DELETE, LIST, POST; "*" for the rest): a
log-normal delay by its median and 99th percentile, held before the answer
goes back, and an error rate, e.g.
  {"names": ["s3"], "latency": {"*": {"median_ms": 40, "p99_ms": 160}},
   "errors": {"PUT": 0.01}}

Run as a child process:  proxy.py SPEC_JSON  where SPEC_JSON is a list of
{"name", "port", "upstream", "http"}. It prints "ready" once listening, then
reads one JSON command a line on stdin, e.g.
  {"names": ["s3-1"], "mode": "hang"}   {"names": [...], "latency_ms": 300}
  {"names": [...], "error_rate": 0.3}   {"names": [...], "reset": true}
  {"names": [...], "stats": true} (answers the delays drawn so far, per operation)
and answers "ok" once applied. It exits when stdin closes.
"""
import asyncio
import json
import math
import random
import sys

# The 99th percentile of the standard normal distribution.
Z99 = 2.3263

SLOW_DOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
             b"<Message>chaos: injected 503</Message></Error>")


class Proxy:
    def __init__(self, name, port, upstream, http):
        self.name, self.port, self.upstream, self.http = name, port, upstream, http
        self.mode = "pass"
        self.latency_ms = 0
        self.error_rate = 0.0
        self.latency = {}
        self.errors = {}
        self.drawn = {}
        self.rng = random.Random(name)
        self.healed = asyncio.Event()
        self.healed.set()
        self.writers = set()

    def set(self, mode=None, latency_ms=None, error_rate=None, latency=None, errors=None,
            reset=False, stats=False):
        if stats:
            return {op: summary(ds) for op, ds in sorted(self.drawn.items())}
        if reset:
            mode, latency_ms, error_rate, latency, errors = "pass", 0, 0.0, {}, {}
        if latency_ms is not None:
            self.latency_ms = latency_ms
        if error_rate is not None:
            self.error_rate = error_rate
        if latency is not None:
            self.latency = latency
        if errors is not None:
            self.errors = errors
        if mode is not None:
            self.mode = mode
            if mode == "hang":
                self.healed.clear()
            else:
                self.healed.set()
            if mode == "refuse":
                for w in list(self.writers):
                    abort(w)

    async def gate(self, delay=True):
        """Waits while hung; False once connections must go."""
        await self.healed.wait()
        if self.mode == "refuse":
            return False
        if delay and self.latency_ms:
            await asyncio.sleep(self.latency_ms / 1000)
        return True

    def request_delay(self, op):
        """Seconds to hold one http exchange of `op` back."""
        dist = self.latency.get(op, self.latency.get("*"))
        if dist is None:
            return self.latency_ms / 1000
        median, p99 = dist["median_ms"], dist["p99_ms"]
        ms = self.rng.lognormvariate(math.log(median), (math.log(p99) - math.log(median)) / Z99)
        self.drawn.setdefault(op, []).append(ms)
        return ms / 1000

    async def serve(self, reader, writer):
        self.writers.add(writer)
        up_writer = None
        try:
            if not await self.gate(delay=not self.http):
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
            self.writers.add(up_writer)
            if self.http:
                await self.relay_http(reader, writer, up_reader, up_writer)
            else:
                await asyncio.gather(self.pipe(reader, up_writer), self.pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    self.writers.discard(w)
                    abort(w)

    async def pipe(self, src, dst):
        while True:
            data = await src.read(65536)
            if not data or not await self.gate():
                break
            dst.write(data)
            await dst.drain()
        abort(dst)

    async def relay_http(self, reader, writer, up_reader, up_writer):
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            headers = parse_headers(head)
            body = await read_body(reader, headers, request=True)
            if not await self.gate(delay=False):
                return
            op = operation(head)
            delay = self.request_delay(op)
            error_rate = self.errors.get(op, self.errors.get("*", self.error_rate))
            if error_rate and self.rng.random() < error_rate:
                await asyncio.sleep(delay)
                writer.write(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(SLOW_DOWN), SLOW_DOWN))
                await writer.drain()
                continue
            up_writer.write(head + body)
            await up_writer.drain()
            resp_head = await up_reader.readuntil(b"\r\n\r\n")
            resp_headers = parse_headers(resp_head)
            status = int(resp_head.split(b" ", 2)[1])
            no_body = head.startswith(b"HEAD ") or status in (204, 304) or 100 <= status < 200
            resp_body = b"" if no_body else await read_body(up_reader, resp_headers, request=False)
            await asyncio.sleep(delay)
            if not await self.gate(delay=False):
                return
            writer.write(resp_head + resp_body)
            await writer.drain()
            if resp_headers.get("connection", "").lower() == "close" or \
                    ("content-length" not in resp_headers and "transfer-encoding" not in resp_headers
                     and not no_body):
                return


def operation(head):
    """The S3 operation of a request head: its method, or LIST for a listing."""
    method, target = head.split(b" ", 2)[:2]
    if method == b"GET" and b"list-type=" in target:
        return "LIST"
    return method.decode("latin-1")


def summary(delays):
    s = sorted(delays)
    at = lambda q: round(s[min(len(s) - 1, int(q * len(s)))], 1)
    return {"n": len(s), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(s[-1], 1)}


def parse_headers(head):
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return headers


async def read_body(reader, headers, request):
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            line = await reader.readuntil(b"\r\n")
            out += line
            size = int(line.split(b";")[0], 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    line = await reader.readuntil(b"\r\n")
                    out += line
                    if line == b"\r\n":
                        return bytes(out)
            out += await reader.readexactly(size + 2)
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    return b"" if request else await reader.read()  # a response without length ends at close


def abort(writer):
    try:
        writer.transport.abort()
    except Exception:
        pass


async def main(spec):
    proxies = {}
    for s in spec:
        p = Proxy(s["name"], s["port"], s["upstream"], s.get("http", False))
        await asyncio.start_server(p.serve, "127.0.0.1", p.port, reuse_address=True)
        proxies[p.name] = p
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        cmd = json.loads(line)
        answers = {name: proxies[name].set(**cmd) for name in cmd.pop("names")}
        if cmd.get("stats"):
            print(json.dumps(answers), flush=True)
        else:
            print("ok", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
