"""What the fleet's router costs a request: the same `vllm bench serve` run straight at a vLLM server and through the
router in front of it, run as on the router VM (vm/router_agent.py): the fleet's generated config with one replica
and least-busy routing, `--proxies` LiteLLM processes of one gunicorn worker each (the pinned LiteLLM version)
sharing a local redis-server, behind HAProxy's leastconn on one port (the agent's own haproxy_config), all on
127.0.0.1.

Prints, per concurrency level, output throughput and median TTFT both ways, and the ratios router / direct. One
untimed warm-up run each way first, then rounds that alternate which side goes first. Needs a running server, the
proxy venv (scripts/install-litellm-proxy.sh), haproxy and redis-server:

    python benchmarks/router_overhead.py --url http://127.0.0.1:8000 --model tiny-gemma4 --tokenizer MODEL_DIR \
        --vllm-bin ~/.cache/tpuserve/vllm-venv/bin/vllm
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.processes import background, find_binary, wait_for_port  # noqa: E402
from tpuserve.deploy.litellm_config import fleet_config  # noqa: E402
from tpuserve.deploy.stack import free_local_port  # noqa: E402
from tpuserve.measure.bench import Workload, bench_serve_args  # noqa: E402
from vm.router_agent import haproxy_config, with_shared_state  # noqa: E402

DEFAULT_LITELLM = Path.home() / ".cache" / "tpuserve" / "litellm-proxy-venv" / "bin" / "litellm"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
PROXY_BOOT_TIMEOUT_S = 300.0
WEDGE_S = 30.0  # the router agent's threshold for a worker that takes connections and answers none


@dataclass(frozen=True)
class Run:
    output_tok_s: float
    median_ttft_ms: float
    completed: int


def wait_healthy(url: str, processes: list[subprocess.Popen], workdir: Path,
                 master: subprocess.Popen | None = None) -> None:
    """Until url/health/liveliness answers 200 (LiteLLM's unauthenticated liveness route, which HAProxy checks).
    A worker that takes the connection and answers nothing for 30 s wedged at boot (vm/router_agent.py's docstring):
    its gunicorn master (`master`) gets the SIGHUP the agent sends, which forks a fresh one."""
    deadline = time.monotonic() + PROXY_BOOT_TIMEOUT_S
    silent_since: float | None = None
    while time.monotonic() < deadline:
        for process in processes:
            if process.poll() is not None:
                raise click.ClickException(f"{process.args[0]} exited with {process.returncode}; see the logs in "
                                           f"{workdir}")
        try:
            if requests.get(f"{url}/health/liveliness", timeout=2).status_code == 200:
                return
            silent_since = None
        except requests.ReadTimeout:
            silent_since = silent_since or time.monotonic()
            if master is not None and time.monotonic() - silent_since >= WEDGE_S:
                master.send_signal(signal.SIGHUP)
                silent_since = None
        except requests.RequestException:
            silent_since = None
        time.sleep(0.5)
    raise click.ClickException(f"{url} did not answer within {PROXY_BOOT_TIMEOUT_S:.0f} s")


@contextlib.contextmanager
def start_router(litellm_bin: Path, url: str, model: str, workdir: Path, master_key: str,
                 proxies: int) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """The router as the VM runs it, for one replica: Redis, `proxies` single-worker LiteLLM processes on the shared
    config, HAProxy in front. Yields HAProxy's URL and the proxy processes (whose CPU is the router's cost)."""
    with contextlib.ExitStack() as running:
        def start(argv: list[str], log: str, env: dict[str, str] | None = None) -> subprocess.Popen:
            try:
                return running.enter_context(background(argv, workdir / log, env))
            except OSError as err:
                raise click.ClickException(f"{argv[0]}: {err}") from err

        def binary(name: str) -> str:
            try:
                return find_binary(name)
            except FileNotFoundError as missing:
                raise click.ClickException(str(missing)) from missing

        redis_port = free_local_port()
        started = [start([binary("redis-server"), "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no"], "redis.log")]
        wait_for_port(redis_port)
        config = workdir / "router.yaml"  # JSON, which YAML reads (the agent writes it so)
        config.write_text(with_shared_state(json.dumps(fleet_config([("bench-r1", url)], model)), "127.0.0.1",
                                            redis_port))
        env = {**os.environ, **OFFLINE_ENV, "LITELLM_MASTER_KEY": master_key, "TPUSERVE_API_KEY": "none"}
        ports = [free_local_port() for _ in range(proxies)]
        proxy_processes = [start([str(litellm_bin), "--config", str(config), "--host", "127.0.0.1", "--port",
                                  str(port), "--run_gunicorn", "--num_workers", "1"], f"proxy{i}.log", env)
                           for i, port in enumerate(ports)]
        started += proxy_processes
        for port, process in zip(ports, proxy_processes):
            wait_healthy(f"http://127.0.0.1:{port}", started, workdir, master=process)
        front = free_local_port()
        (workdir / "haproxy.cfg").write_text(haproxy_config(front, ports))
        started.append(start([binary("haproxy"), "-db", "-f", str(workdir / "haproxy.cfg")], "haproxy.log"))
        wait_healthy(f"http://127.0.0.1:{front}", started, workdir)
        yield f"http://127.0.0.1:{front}", proxy_processes


def cpu_seconds(process_group: int) -> float:
    """CPU time (user + system) of every live process in the group: a proxy's gunicorn master and its worker."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == process_group:  # pgrp; utime and stime follow at 11 and 12 (proc(5), after the name)
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def bench_once(vllm_bin: str, workload: Workload, concurrency: int, out: Path, name: str, key: str,
               chat: bool = False) -> Run:
    """One `vllm bench serve` (the toolkit's argv builder) with the proxy's key as the bearer token (vLLM ignores it);
    `chat` swaps its /v1/completions for /v1/chat/completions, what chat clients of the router send."""
    argv = bench_serve_args(vllm_bin, workload, concurrency, str(out), f"{name}.json")
    if chat:
        argv[argv.index("--backend") + 1] = "openai-chat"
        argv[argv.index("--endpoint") + 1] = "/v1/chat/completions"
    subprocess.run(argv, check=True, env={**os.environ, **OFFLINE_ENV, "OPENAI_API_KEY": key},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads((out / f"{name}.json").read_text())
    return Run(result["output_throughput"], result["median_ttft_ms"], result["completed"])


@click.command()
@click.option("--url", required=True, help="The vLLM server (direct side).")
@click.option("--model", required=True)
@click.option("--tokenizer")
@click.option("--vllm-bin", default="vllm", show_default=True)
@click.option("--litellm-bin", type=click.Path(path_type=Path), default=DEFAULT_LITELLM, show_default=True)
@click.option("--concurrency", default="1,8", show_default=True)
@click.option("--input-len", default=64, show_default=True)
@click.option("--output-len", default=32, show_default=True)
@click.option("--num-prompts", default=32, show_default=True)
@click.option("--proxies", default=2, show_default=True,
              help="LiteLLM processes of one worker each behind HAProxy: the router VM runs one per vCPU.")
@click.option("--rounds", default=2, show_default=True, help="Rounds after the warm-up; the order alternates.")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]), default="chat", show_default=True,
              help="Which OpenAI endpoint both sides are measured on.")
def main(url: str, model: str, tokenizer: str | None, vllm_bin: str, litellm_bin: Path, concurrency: str,
         input_len: int, output_len: int, num_prompts: int, proxies: int, rounds: int, endpoint: str) -> None:
    """Print router / direct ratios of output throughput and median TTFT for the same `vllm bench serve` runs."""
    levels = [int(level) for level in concurrency.split(",")]
    key = f"sk-{secrets.token_hex(16)}"
    with tempfile.TemporaryDirectory(prefix="router-overhead-") as tmp, \
            start_router(litellm_bin, url, model, Path(tmp), key, proxies) as (proxy_url, proxy_processes):
        workdir = Path(tmp)

        def proxy_cpu() -> float:
            return sum(cpu_seconds(process.pid) for process in proxy_processes)

        sides = {"direct": Workload(url, model, tokenizer, input_len, output_len, num_prompts),
                 "router": Workload(proxy_url, model, tokenizer, input_len, output_len, num_prompts)}
        for side, workload in sides.items():  # warm-up, untimed
            bench_once(vllm_bin, workload, max(levels), workdir, f"warmup-{side}", key, endpoint == "chat")
        runs: dict[tuple[str, int], list[Run]] = {}
        proxy_cpu_s, proxied = 0.0, 0
        for number in range(rounds):
            order = list(sides) if number % 2 == 0 else list(reversed(sides))
            for level in levels:
                for side in order:
                    before = proxy_cpu()
                    run = bench_once(vllm_bin, sides[side], level, workdir, f"{side}-c{level}-{number}", key,
                                     endpoint == "chat")
                    if side == "router":
                        proxy_cpu_s += proxy_cpu() - before
                        proxied += run.completed
                    if run.completed != num_prompts:
                        raise click.ClickException(f"{side} c={level}: {run.completed} of {num_prompts} "
                                                   "requests completed")
                    runs.setdefault((side, level), []).append(run)

    click.echo(f"/v1/{'chat/' if endpoint == 'chat' else ''}completions, streamed: {num_prompts} prompts of "
               f"{input_len} tokens in / {output_len} out, {rounds} round(s) per side (means); router: {proxies} "
               "single-worker proxies behind HAProxy, Redis")
    click.echo(f"{'conc.':>5}  {'direct tok/s':>12}  {'router tok/s':>12}  {'tput ratio':>10}  "
               f"{'direct TTFT ms':>14}  {'router TTFT ms':>14}  {'TTFT ratio':>10}")
    for level in levels:
        direct, router = runs[("direct", level)], runs[("router", level)]
        d_tput, r_tput = (sum(r.output_tok_s for r in side) / len(side) for side in (direct, router))
        d_ttft, r_ttft = (sum(r.median_ttft_ms for r in side) / len(side) for side in (direct, router))
        click.echo(f"{level:>5}  {d_tput:>12.1f}  {r_tput:>12.1f}  {r_tput / d_tput:>10.3f}  {d_ttft:>14.1f}  "
                   f"{r_ttft:>14.1f}  {r_ttft / d_ttft:>10.3f}")
    click.echo(f"proxy CPU: {1000 * proxy_cpu_s / max(proxied, 1):.1f} ms per request ({proxied} requests), taken from "
               f"the {os.cpu_count()} CPUs vLLM also runs on here; the router VM has its own")


if __name__ == "__main__":
    main()
