"""Small helpers shared by the client test modules."""

import os
import time

# Every broker-facing wait in the tests is bounded by this many seconds.
TIMEOUT = float(os.environ.get("STRATA_IT_TIMEOUT", "20"))


def wait_until(pred, timeout=TIMEOUT, interval=0.1, what="condition"):
    """Poll pred() until it returns a truthy value; returns that value."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - retried until deadline
            last_exc = e
        time.sleep(interval)
    msg = f"timed out after {timeout}s waiting for {what}"
    if last_exc is not None:
        msg += f" (last error: {last_exc!r})"
    raise AssertionError(msg)
