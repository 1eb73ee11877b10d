"""How much wall time `tpuserve bench sweep` adds over running the same `vllm bench serve` commands directly.

Runs the sweep (as a user would, `python -m tpuserve bench sweep`) and the exact commands a sweep recorded in
sweep.json (only --result-dir changed) directly, and prints sweep wall time / direct wall time. The issue asks for
the ratio to be within 5%. Needs a running server:

    python benchmarks/sweep_overhead.py --url http://127.0.0.1:8000 --model tiny-gemma4 --tokenizer MODEL_DIR \
        --vllm-bin ~/.cache/tpuserve/vllm-venv/bin/vllm
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import click

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


@dataclass(frozen=True)
class Overhead:
    """One sweep and one direct replay of its commands; `vllm_s` is the sweep's own runs' wall time."""

    sweep_s: float
    direct_s: float
    vllm_s: float
    sweep_dir: Path
    direct_dir: Path

    @property
    def ratio(self) -> float:
        """End to end, as the issue asks; includes run-to-run noise of vLLM and of the machine."""
        return self.sweep_s / self.direct_s

    @property
    def tool_ratio(self) -> float:
        """What the sweep adds around the same `vllm bench serve` processes, free of their variance."""
        return self.sweep_s / self.vllm_s


def run_sweep(sweep_args: list[str], out: Path) -> float:
    """Wall seconds of one `tpuserve bench sweep` into `out`."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "tpuserve", "bench", "sweep", *sweep_args, "--out", str(out)],
                   check=True, env={**os.environ, **OFFLINE_ENV}, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def direct_commands(sweep_dir: Path, result_dir: Path) -> list[list[str]]:
    """The sweep's recorded commands, saving into `result_dir` instead."""
    commands = []
    for run in json.loads((sweep_dir / "sweep.json").read_text())["runs"]:
        argv = list(run["command"])
        argv[argv.index("--result-dir") + 1] = str(result_dir)
        commands.append(argv)
    return commands


def run_direct(commands: list[list[str]]) -> float:
    start = time.monotonic()
    for argv in commands:
        subprocess.run(argv, check=True, env={**os.environ, **OFFLINE_ENV}, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def measure(sweep_args: list[str], workdir: Path, rounds: int = 2) -> list[Overhead]:
    """An untimed warm-up sweep first (a fresh server and a cold page cache slow whatever runs first by up to 2×),
    then rounds that alternate which side goes first."""
    warmup_dir = workdir / "warmup"
    run_sweep(sweep_args, warmup_dir)
    results: list[Overhead] = []
    for number in range(rounds):
        sweep_dir, direct_dir = workdir / f"sweep-{number}", workdir / f"direct-{number}"
        commands = direct_commands(warmup_dir, direct_dir)
        if number % 2 == 0:
            direct_s = run_direct(commands)
            sweep_s = run_sweep(sweep_args, sweep_dir)
        else:
            sweep_s = run_sweep(sweep_args, sweep_dir)
            direct_s = run_direct(commands)
        runs = json.loads((sweep_dir / "sweep.json").read_text())["runs"]
        results.append(Overhead(sweep_s, direct_s, sum(run["wall_s"] for run in runs), sweep_dir, direct_dir))
    return results


def describe(result: Overhead) -> str:
    return (f"sweep {result.sweep_s:.2f} s / direct {result.direct_s:.2f} s = {result.ratio:.3f}; "
            f"sweep / its own vllm runs {result.vllm_s:.2f} s = {result.tool_ratio:.3f}")


@click.command()
@click.option("--url", required=True)
@click.option("--model", required=True)
@click.option("--tokenizer")
@click.option("--vllm-bin", default="vllm", show_default=True)
@click.option("--concurrency", default="1,2,4", show_default=True)
@click.option("--input-len", default=64, show_default=True)
@click.option("--output-len", default=16, show_default=True)
@click.option("--num-prompts", default=8, show_default=True)
@click.option("--rounds", default=2, show_default=True, help="Rounds after the warm-up; the order alternates.")
def main(url: str, model: str, tokenizer: str | None, vllm_bin: str, concurrency: str, input_len: int,
         output_len: int, num_prompts: int, rounds: int) -> None:
    """Print sweep wall time / direct `vllm bench serve` wall time for the same commands."""
    args = ["--url", url, "--model", model, "--vllm-bin", vllm_bin, "--concurrency", concurrency,
            "--input-len", str(input_len), "--output-len", str(output_len), "--num-prompts", str(num_prompts)]
    args += ["--tokenizer", tokenizer] if tokenizer else []
    with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as workdir:
        results = measure(args, Path(workdir), rounds)
    for number, result in enumerate(results, start=1):
        click.echo(f"round {number}: {describe(result)}")
    total_sweep, total_direct = sum(r.sweep_s for r in results), sum(r.direct_s for r in results)
    click.echo(f"all rounds: sweep / direct = {total_sweep / total_direct:.3f}")

if __name__ == "__main__":
    main()
