"""The gke pods' preStop hook: wait for the pod's endpoint to leave every router (--settle), then until vLLM's /metrics
shows no request running or waiting (at most --timeout), one line per step on the container's output. Exit 0 always:
a hook that fails only delays the stop. Why: docs/design/gke-renewal.md."""

from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pod_boot import emit  # noqa: E402 - a sibling, shipped beside this file

PREFIX = "tpu-serve drain:"
# vLLM's gauges of requests in the engine (vllm/v1/metrics/loggers.py): one series per engine, summed.
IN_FLIGHT = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})?\s+(\S+)\s*$", re.MULTILINE)
GIVE_UP_AFTER_REFUSALS = 3  # connections refused this many times in a row: the server is gone, nothing to wait for
READ_TIMEOUT_S = 10.0  # a busy server may answer /metrics slowly; a slow answer is no reason to stop waiting


def in_flight(metrics_text: str) -> int | None:
    """Requests running or waiting, from a /metrics scrape; None when it has neither gauge."""
    values = [float(value) for value in IN_FLIGHT.findall(metrics_text)]
    return round(sum(values)) if values else None


def scrape(url: str, timeout_s: float) -> int | None:
    with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout_s) as response:  # noqa: S310
        return in_flight(response.read().decode(errors="replace"))


def drain(url: str, settle_s: float, timeout_s: float, poll_s: float, log: str,
          read: Callable[[str, float], int | None] = scrape, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> tuple[str, int | None]:
    """Settle, then wait for no request in flight; (why it stopped, requests left)."""
    start = clock()
    emit(log, f"{PREFIX} pod is stopping; waiting {settle_s:.0f} s for its endpoint to leave every router")
    sleep(settle_s)
    deadline = start + settle_s + timeout_s
    refusals, left = 0, None
    while True:
        try:
            left, refusals = read(url, READ_TIMEOUT_S), 0
        except OSError as err:
            refused = isinstance(getattr(err, "reason", err), ConnectionRefusedError)
            refusals = refusals + 1 if refused else 0
            if refusals >= GIVE_UP_AFTER_REFUSALS:
                emit(log, f"{PREFIX} vLLM refuses connections: nothing left to wait for")
                return "server gone", None
        if left == 0:
            emit(log, f"{PREFIX} no request in flight after {clock() - start:.0f} s: vLLM can stop")
            return "idle", 0
        if clock() >= deadline:
            emit(log, f"{PREFIX} {left if left is not None else 'unknown'} request(s) still in flight after "
                      f"{clock() - start:.0f} s: vLLM stops now")
            return "timeout", left
        sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--settle", type=float, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--poll", type=float, default=2.0)
    parser.add_argument("--log", default="/proc/1/fd/1")
    args = parser.parse_args(argv)
    why, left = drain(args.url, args.settle, args.timeout, args.poll, args.log)
    print(f"{why}: {left if left is not None else 'unknown'} request(s) in flight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
