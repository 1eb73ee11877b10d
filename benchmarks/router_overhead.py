"""What the fleet's router costs a request: the same `vllm bench serve` run straight at a vLLM server and through the
LiteLLM proxy in front of it, with the proxy run as on the router VM (the fleet's generated config with one replica,
least-busy routing, `--run_gunicorn --num_workers 2`, the pinned LiteLLM version), on 127.0.0.1.

Prints, per concurrency level, output throughput and median TTFT both ways, and the ratios router / direct. One
untimed warm-up run each way first, then rounds that alternate which side goes first. Needs a running server and
the proxy venv (scripts/install-litellm-proxy.sh):

    python benchmarks/router_overhead.py --url http://127.0.0.1:8000 --model tiny-gemma4 --tokenizer MODEL_DIR \
        --vllm-bin ~/.cache/tpuserve/vllm-venv/bin/vllm
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import click
import requests
import yaml

from tpuserve.deploy.litellm_config import fleet_config
from tpuserve.deploy.stack import free_local_port
from tpuserve.measure.bench import Workload, bench_serve_args

DEFAULT_LITELLM = Path.home() / ".cache" / "tpuserve" / "litellm-proxy-venv" / "bin" / "litellm"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
PROXY_BOOT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Run:
    output_tok_s: float
    median_ttft_ms: float
    completed: int


def start_proxy(litellm_bin: Path, url: str, model: str, workdir: Path, master_key: str) -> tuple[subprocess.Popen,
                                                                                                   str]:
    """The proxy on a free port with the fleet's config for one replica; returns it once /health/liveliness is 200."""
    config = workdir / "router.yaml"
    config.write_text(yaml.safe_dump(fleet_config([("bench-r1", url)], model), sort_keys=False))
    port = free_local_port()
    env = {**os.environ, **OFFLINE_ENV, "LITELLM_MASTER_KEY": master_key, "TPUSERVE_API_KEY": "none"}
    log = (workdir / "proxy.log").open("wb")
    process = subprocess.Popen([str(litellm_bin), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                                "--run_gunicorn", "--num_workers", "2"], env=env, stdout=log, stderr=log,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + PROXY_BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise click.ClickException(f"the proxy exited with {process.returncode}; see {workdir / 'proxy.log'}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=2).status_code == 200:
                return process, f"http://127.0.0.1:{port}"
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise click.ClickException(f"the proxy did not answer within {PROXY_BOOT_TIMEOUT_S:.0f} s")


def cpu_seconds(process_group: int) -> float:
    """CPU time (user + system) of every live process in the group: the gunicorn master and its workers."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == process_group:  # pgrp; utime and stime follow at 11 and 12 (proc(5), after the name)
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def stop_proxy(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=40)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


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
@click.option("--rounds", default=2, show_default=True, help="Rounds after the warm-up; the order alternates.")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]), default="chat", show_default=True,
              help="Which OpenAI endpoint both sides are measured on.")
def main(url: str, model: str, tokenizer: str | None, vllm_bin: str, litellm_bin: Path, concurrency: str,
         input_len: int, output_len: int, num_prompts: int, rounds: int, endpoint: str) -> None:
    """Print router / direct ratios of output throughput and median TTFT for the same `vllm bench serve` runs."""
    levels = [int(level) for level in concurrency.split(",")]
    key = f"sk-{secrets.token_hex(16)}"
    with tempfile.TemporaryDirectory(prefix="router-overhead-") as tmp:
        workdir = Path(tmp)
        proxy, proxy_url = start_proxy(litellm_bin, url, model, workdir, key)
        try:
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
                        before = cpu_seconds(proxy.pid)
                        run = bench_once(vllm_bin, sides[side], level, workdir, f"{side}-c{level}-{number}", key,
                                         endpoint == "chat")
                        if side == "router":
                            proxy_cpu_s += cpu_seconds(proxy.pid) - before
                            proxied += run.completed
                        if run.completed != num_prompts:
                            raise click.ClickException(f"{side} c={level}: {run.completed} of {num_prompts} "
                                                       "requests completed")
                        runs.setdefault((side, level), []).append(run)
        finally:
            stop_proxy(proxy)

    click.echo(f"/v1/{'chat/' if endpoint == 'chat' else ''}completions, streamed: {num_prompts} prompts of "
               f"{input_len} tokens in / {output_len} out, {rounds} round(s) per side (means)")
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
