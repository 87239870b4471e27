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
forwarding them.

Run as a child process:  proxy.py SPEC_JSON  where SPEC_JSON is a list of
{"name", "port", "upstream", "http"}. It prints "ready" once listening, then
reads one JSON command a line on stdin, e.g.
  {"names": ["s3-1"], "mode": "hang"}   {"names": [...], "latency_ms": 300}
  {"names": [...], "error_rate": 0.3}   {"names": [...], "reset": true}
and answers "ok" once applied. It exits when stdin closes.
"""
import asyncio
import json
import random
import sys

SLOW_DOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
             b"<Message>chaos: injected 503</Message></Error>")


class Proxy:
    def __init__(self, name, port, upstream, http):
        self.name, self.port, self.upstream, self.http = name, port, upstream, http
        self.mode = "pass"
        self.latency_ms = 0
        self.error_rate = 0.0
        self.rng = random.Random(name)
        self.healed = asyncio.Event()
        self.healed.set()
        self.writers = set()

    def set(self, mode=None, latency_ms=None, error_rate=None, reset=False):
        if reset:
            mode, latency_ms, error_rate = "pass", 0, 0.0
        if latency_ms is not None:
            self.latency_ms = latency_ms
        if error_rate is not None:
            self.error_rate = error_rate
        if mode is not None:
            self.mode = mode
            if mode == "hang":
                self.healed.clear()
            else:
                self.healed.set()
            if mode == "refuse":
                for w in list(self.writers):
                    abort(w)

    async def gate(self):
        """Waits while hung; False once connections must go."""
        await self.healed.wait()
        if self.mode == "refuse":
            return False
        if self.latency_ms:
            await asyncio.sleep(self.latency_ms / 1000)
        return True

    async def serve(self, reader, writer):
        self.writers.add(writer)
        up_writer = None
        try:
            if not await self.gate():
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
            if not await self.gate():
                return
            if self.error_rate and self.rng.random() < self.error_rate:
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
            if not await self.gate():
                return
            writer.write(resp_head + resp_body)
            await writer.drain()
            if resp_headers.get("connection", "").lower() == "close" or \
                    ("content-length" not in resp_headers and "transfer-encoding" not in resp_headers
                     and not no_body):
                return


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
        for name in cmd.pop("names"):
            proxies[name].set(**cmd)
        print("ok", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
