"""The history: one JSON object a line, as Jepsen records operations.

  {"time": wall seconds, "process": "idem-0", "type": "invoke"|"ok"|"fail"|"info",
   "f": "send"|"txn"|"poll"|"commit"|"assign"|"final-read"|<fault>|..., "value": ...}

`ok` and `fail` are definite outcomes, `info` an unknown one (or an event of
the nemesis or the harness).
"""
import json
import threading
import time


class History:
    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.file = open(path, "w")

    def add(self, process, type, f, value=None):
        op = {"time": round(time.time(), 6), "process": process, "type": type, "f": f, "value": value}
        line = json.dumps(op, separators=(",", ":"))
        with self.lock:
            if not self.file.closed:  # clients still winding down after an interrupted run
                self.file.write(line + "\n")
        return op

    def close(self):
        with self.lock:
            self.file.close()


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
