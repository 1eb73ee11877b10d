"""What the front of a VM's engines costs: two real CPU vLLM engines behind the VM's HAProxy front, against the client
spreading the load itself; prints throughput and TTFT ratios per concurrency. How: docs/design/benchmarks.md#the-front.

    .venv/bin/python benchmarks/engine_front.py [--vllm-venv ~/.cache/tpuserve/vllm-venv] [--concurrency 1,8,32]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import click
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.compile_cache import tiny_model  # noqa: E402
from tests.e2e import cpu_server  # noqa: E402
from tests.e2e.processes import cpu_seconds, haproxy_front  # noqa: E402
from tpuserve.deploy.stack import free_local_port  # noqa: E402

SERVED_NAME = "tiny-gemma4"
PROMPT = "The quick brown fox jumps over the lazy dog. " * 6


@dataclass
class Side:
    """What one side's slices of a level added up to."""

    tokens: int = 0
    seconds: float = 0.0
    ttfts: list[float] = field(default_factory=list)

    @property
    def output_tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def median_ttft_ms(self) -> float:
        return 1000 * statistics.median(self.ttfts)


class Spread:
    """The direct side's choice: the engine with the fewest of this client's requests in flight (ties in turn)."""

    def __init__(self, urls: list[str]):
        self.urls, self.in_flight, self.turn, self.lock = urls, [0] * len(urls), 0, threading.Lock()

    @contextmanager
    def pick(self) -> Iterator[str]:
        with self.lock:
            fewest = min(self.in_flight)
            candidates = [i for i, n in enumerate(self.in_flight) if n == fewest]
            index = candidates[self.turn % len(candidates)]
            self.turn += 1
            self.in_flight[index] += 1
        try:
            yield self.urls[index]
        finally:
            with self.lock:
                self.in_flight[index] -= 1


def one_request(session: requests.Session, url: str, output_len: int) -> tuple[float, int]:
    """(seconds to the first token, completion tokens) of one streamed completion."""
    started, first = time.perf_counter(), None
    with session.post(f"{url}/v1/completions", stream=True, timeout=600, json={
            "model": SERVED_NAME, "prompt": PROMPT, "max_tokens": output_len, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}) as response:
        response.raise_for_status()
        tokens = 0
        for line in response.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[len(b"data: "):])
            if first is None and any(choice.get("text") for choice in chunk.get("choices") or []):
                first = time.perf_counter() - started
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if first is None or tokens != output_len:
        raise click.ClickException(f"{url}: a completion streamed {tokens} of {output_len} tokens")
    return first, tokens


def run_slice(choose: Callable[[], AbstractContextManager[str]], concurrency: int, requests_n: int,
              output_len: int, into: Side) -> None:
    """`requests_n` completions, `concurrency` streams at a time, each stream one session (keep-alive)."""
    local = threading.local()

    def send(_: int) -> tuple[float, int]:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        with choose() as url:
            return one_request(local.session, url, output_len)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(send, range(requests_n)))
    into.seconds += time.perf_counter() - started
    into.tokens += sum(tokens for _, tokens in results)
    into.ttfts += [ttft for ttft, _ in results]


@click.command()
@click.option("--vllm-venv", type=click.Path(path_type=Path), default=Path.home() / ".cache/tpuserve/vllm-venv",
              show_default=True)
@click.option("--concurrency", default="1,8,32", show_default=True)
@click.option("--output-len", default=32, show_default=True)
@click.option("--slices", default=8, show_default=True, help="Slices per side and level, the sides in turn.")
def main(vllm_venv: Path, concurrency: str, output_len: int, slices: int) -> None:
    """Print front / direct ratios of output throughput and median TTFT for the same requests."""
    levels = [int(level) for level in concurrency.split(",")]
    model_dir = tiny_model(vllm_venv)
    cores = sorted(os.sched_getaffinity(0))
    engine_core, front_core = cores[-1], cores[0]  # one core each when there are two, else shared
    with tempfile.TemporaryDirectory(prefix="engine-front-") as tmp, ExitStack() as running:
        workdir = Path(tmp)
        engines = []
        os.sched_setaffinity(0, {engine_core})  # what this process starts inherits it
        for index in range(2):
            cfg = cpu_server.cpu_serving_config(model_dir, SERVED_NAME, free_local_port())
            engine = cpu_server.start_server(vllm_venv / "bin" / "vllm", cfg, SERVED_NAME,
                                             workdir / f"vllm-{index}.log",
                                             env={"VLLM_CPU_OMP_THREADS_BIND": str(engine_core)})
            running.callback(cpu_server.stop_server, engine)
            engines.append(engine)
        os.sched_setaffinity(0, {front_core})  # the client, and HAProxy started below
        for engine in engines:
            cpu_server.wait_healthy(engine)
        ports = [int(engine.url.rsplit(":", 1)[1]) for engine in engines]
        front_url, front_pid = running.enter_context(haproxy_front(
            workdir, free_local_port(), [(f"vllm-{i}", port) for i, port in enumerate(ports)]))

        @contextmanager
        def to_front() -> Iterator[str]:
            yield front_url

        sides = {"front": to_front, "direct": Spread([engine.url for engine in engines]).pick}
        for choose in sides.values():  # warm-up, untimed
            run_slice(choose, max(levels), 2 * max(levels), output_len, Side())
        measured = {(side, level): Side() for side in sides for level in levels}
        front_cpu_s = 0.0
        for level in levels:
            for number in range(slices):
                for side in (list(sides) if number % 2 == 0 else list(reversed(sides))):
                    before = cpu_seconds(front_pid)
                    run_slice(sides[side], level, 4 * level if level > 1 else 16, output_len, measured[(side, level)])
                    front_cpu_s += cpu_seconds(front_pid) - before if side == "front" else 0.0
        fronted = sum(len(measured[("front", level)].ttfts) for level in levels)

    click.echo(f"/v1/completions, streamed, {output_len} tokens out; per level {slices} slices a side of 4 × "
               f"concurrency requests (16 at 1), the sides in turn; 2 engines on core {engine_core}, client and front "
               f"on core {front_core}; direct = the client itself sends each request to the engine with the fewest in "
               "flight")
    click.echo(f"{'conc.':>5}  {'direct tok/s':>12}  {'front tok/s':>11}  {'tput ratio':>10}  "
               f"{'direct TTFT ms':>14}  {'front TTFT ms':>13}  {'TTFT ratio':>10}")
    for level in levels:
        direct, front = measured[("direct", level)], measured[("front", level)]
        click.echo(f"{level:>5}  {direct.output_tok_s:>12.1f}  {front.output_tok_s:>11.1f}  "
                   f"{front.output_tok_s / direct.output_tok_s:>10.3f}  {direct.median_ttft_ms:>14.1f}  "
                   f"{front.median_ttft_ms:>13.1f}  {front.median_ttft_ms / direct.median_ttft_ms:>10.3f}")
    click.echo(f"front CPU: {1000 * front_cpu_s / fronted:.2f} ms per request of {output_len} tokens ({fronted} "
               "requests)")



if __name__ == "__main__":
    main()
