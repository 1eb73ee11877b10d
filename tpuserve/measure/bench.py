"""`tpuserve bench`: run `vllm bench serve` across concurrency levels, then report the saved results.

Two places to measure from:
- local (default): the `vllm` on this machine sends requests to `--url`. Use it for what users of the endpoint
  see, network included, or against a local server.
- `--remote VM`: the same command runs inside the VM's `vllm` container over IAP ssh, so TTFT is the server's own
  and not the tunnel's; the result files are copied back. Use it to measure the deployment itself.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from tpuserve.measure import benchreport
from tpuserve.client import server_root
from tpuserve.facts import PRICE_PER_CHIP_HOUR
from tpuserve.serving import CONTAINER_NAME, DEFAULT_PORT
from tpuserve.deploy.stack import read_outputs, served_endpoint, stack_options
from tpuserve.deploy.vmssh import docker_over_iap

DEFAULT_LEVELS = "1,8,32,64,100"
# Where results land inside the container in --remote mode before they are copied back.
REMOTE_RESULT_ROOT = "/tmp/tpuserve-bench"
VERSION_PROBE = "import importlib.metadata as m; print(m.version('vllm'))"


def parse_levels(text: str) -> list[int]:
    """`1,8,32` → [1, 8, 32]; positive and distinct, in the order given."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise click.BadParameter(f"{text!r}: comma-separated integers expected", param_hint="--concurrency") from error
    if not levels or min(levels) < 1 or len(set(levels)) != len(levels):
        raise click.BadParameter(f"{text!r}: distinct positive integers expected", param_hint="--concurrency")
    return levels


@dataclasses.dataclass(frozen=True)
class Workload:
    """What every level sends: the random dataset, fixed lengths (EOS ignored, so output length is exact)."""

    url: str
    model: str
    tokenizer: str | None
    input_len: int
    output_len: int
    num_prompts: int


def bench_serve_args(vllm_bin: str, workload: Workload, concurrency: int, result_dir: str,
                     result_filename: str) -> list[str]:
    """The one `vllm bench serve` argv for one concurrency level."""
    args = [
        vllm_bin, "bench", "serve",
        "--backend", "openai", "--endpoint", "/v1/completions",
        "--base-url", server_root(workload.url),
        "--model", workload.model,
        "--dataset-name", "random",
        "--random-input-len", str(workload.input_len),
        "--random-output-len", str(workload.output_len),
        "--ignore-eos",
        "--num-prompts", str(workload.num_prompts),
        "--max-concurrency", str(concurrency),
        "--save-result", "--result-dir", result_dir, "--result-filename", result_filename,
    ]
    if workload.tokenizer:
        args += ["--tokenizer", workload.tokenizer]
    return args


@dataclasses.dataclass(frozen=True)
class RemoteTarget:
    """A VM reached through IAP ssh, running the server in a Docker container."""

    vm: str
    zone: str | None
    project: str | None
    container: str = CONTAINER_NAME

    def ssh(self, container_argv: Sequence[str]) -> list[str]:
        """gcloud argv that runs `container_argv` inside the container."""
        return docker_over_iap(self.vm, self.zone, self.project, ["exec", self.container, *container_argv])


def result_filename(concurrency: int) -> str:
    return f"c{concurrency}.json"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def server_version(url: str) -> str | None:
    """vLLM's version from the server's GET /version; None when it does not answer."""
    import requests

    try:
        response = requests.get(f"{server_root(url)}/version", timeout=5)
        response.raise_for_status()
        return response.json().get("version")
    except (requests.RequestException, ValueError):
        return None


def container_version(target: RemoteTarget) -> str | None:
    """vLLM's version in the container, read from package metadata (importing vllm would take seconds)."""
    completed = subprocess.run(target.ssh(["python3", "-c", VERSION_PROBE]), capture_output=True, text=True,
                               check=False)
    if completed.returncode != 0:
        return None
    return completed.stdout.strip() or None


def resolve_executable(name: str) -> str:
    """The full path, so sweep.json says exactly which vLLM ran."""
    path = shutil.which(name)
    if path is None:
        raise click.BadParameter(f"{name!r} is not an executable on PATH (install vLLM or pass its path)",
                                 param_hint="--vllm-bin")
    return path


def run_logged(argv: list[str], log_path: Path) -> int:
    """Run with output to a log file beside the results, so progress stays readable and nothing is lost."""
    with log_path.open("w") as log:
        log.write(shlex.join(argv) + "\n")
        log.flush()
        return subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False).returncode


def fetch_remote_result(target: RemoteTarget, remote_path: str, local_path: Path) -> None:
    completed = subprocess.run(target.ssh(["cat", remote_path]), capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise click.ClickException(f"copying {remote_path} back from {target.vm} failed: {completed.stderr.strip()}")
    try:
        json.loads(completed.stdout)
    except json.JSONDecodeError as error:
        raise click.ClickException(f"{remote_path} on {target.vm} is not JSON: {error}") from error
    local_path.write_text(completed.stdout)


def log_tail(log_path: Path, lines: int = 15) -> str:
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


def ensure_fresh_out(out: Path) -> None:
    """One sweep per directory, so a report never mixes two sweeps' rows."""
    out.mkdir(parents=True, exist_ok=True)
    if (out / benchreport.SWEEP_MANIFEST).exists() or any(out.glob("c*.json")):
        raise click.BadParameter(f"{out} already holds a sweep; choose a new directory", param_hint="--out")


@click.group()
def bench() -> None:
    """Measure an endpoint with `vllm bench serve` and report throughput, latency and $ per million tokens."""


@bench.command()
@click.option("--url", help="Server root, e.g. http://127.0.0.1:8000. Default with --remote: the container's "
              f"own http://127.0.0.1:{DEFAULT_PORT}.")
@click.option("--model", help="Model name the server serves (sent in requests); default: the stack's model.")
@click.option("--tokenizer", help="Tokenizer id or local directory, if --model is not one (offline: a directory).")
@click.option("--concurrency", "levels", default=DEFAULT_LEVELS, show_default=True, callback=lambda c, p, v:
              parse_levels(v), help="Comma-separated --max-concurrency levels, one `vllm bench serve` run each.")
@click.option("--input-len", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--num-prompts", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="New directory for the result JSONs, logs and sweep.json.")
@click.option("--vllm-bin", default="vllm", show_default=True, help="The `vllm` executable (local mode).")
@click.option("--remote", "vm", help="Run inside this VM's container through IAP ssh instead of locally.")
@click.option("--zone", help="The VM's zone (--remote).")
@click.option("--project", help="The VM's project (--remote).")
@click.option("--container", default=CONTAINER_NAME, show_default=True, help="The server's container (--remote).")
@stack_options
def sweep(url: str | None, model: str | None, tokenizer: str | None, levels: list[int], input_len: int,
          output_len: int, num_prompts: int, out: Path, vllm_bin: str, vm: str | None, zone: str | None,
          project: str | None, container: str, stack: str | None, stack_outputs: Path | None) -> None:
    """Run `vllm bench serve` (random dataset) once per concurrency level and save every result in --out.

    \b
    Local (default): this machine's vLLM measures --url, network included: what a client sees.
    --remote VM: runs inside the VM's container over IAP ssh and copies the results back, so TTFT is the
    server's own and not the tunnel's: use it to measure the deployment itself.
    Beside the results, sweep.json records the commands, vLLM version, model, parameters, times and the stack's
    outputs. With --stack, local mode reaches a gcp stack through an IAP tunnel; --remote takes its zone and project.
    """
    outputs = read_outputs(stack, stack_outputs)
    if outputs is not None and vm is not None:
        zone, project = zone or outputs.get("zone"), project or outputs.get("project")
    if url is None and vm is None and outputs is None:
        raise click.BadParameter("required unless --remote or --stack is given", param_hint="--url")
    model = model or (outputs or {}).get("model")
    if not model:
        raise click.BadParameter("required (or give --stack)", param_hint="--model")
    if vm is None:
        vllm_bin = resolve_executable(vllm_bin)
    with served_endpoint(None if vm else url, model, None if vm else outputs) as (served_url, _):
        run_sweep(served_url or url, model, tokenizer, levels, input_len, output_len, num_prompts, out, vllm_bin,
                  RemoteTarget(vm, zone, project, container) if vm else None, outputs)


def run_sweep(url: str | None, model: str, tokenizer: str | None, levels: list[int], input_len: int,
              output_len: int, num_prompts: int, out: Path, vllm_bin: str, target: RemoteTarget | None,
              outputs: dict[str, Any] | None) -> None:
    ensure_fresh_out(out)
    workload = Workload(url or f"http://127.0.0.1:{DEFAULT_PORT}", model, tokenizer, input_len, output_len,
                        num_prompts)
    manifest = start_manifest(workload, levels, target, outputs)
    remote_dir = f"{REMOTE_RESULT_ROOT}/{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    run_levels(levels, workload, out, manifest, vllm_bin, target, remote_dir)
    manifest["finished_at"] = now()
    write_manifest(out, manifest)
    click.echo(f"{len(levels)} levels saved in {out}; `tpuserve bench report {out}` prints the table.")


def start_manifest(workload: Workload, levels: list[int], target: RemoteTarget | None,
                   stack_outputs: dict[str, Any] | None) -> dict[str, Any]:
    """What sweep.json records before the first run: where, what, with which vLLM (the server's own version)."""
    return {
        "tool": "tpuserve bench sweep",
        "mode": "remote" if target else "local",
        "remote": dataclasses.asdict(target) if target else None,
        "started_at": now(),
        "finished_at": None,
        "vllm_version": container_version(target) if target else server_version(workload.url),
        "model": workload.model,
        "parameters": {"url": workload.url, "tokenizer": workload.tokenizer, "concurrency": levels,
                       "input_len": workload.input_len, "output_len": workload.output_len,
                       "num_prompts": workload.num_prompts, "dataset": "random"},
        "stack_outputs": stack_outputs,
        "runs": [],
    }


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    (out / benchreport.SWEEP_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def run_levels(levels: list[int], workload: Workload, out: Path, manifest: dict[str, Any], vllm_bin: str,
               target: RemoteTarget | None, remote_dir: str) -> None:
    """One run per level, manifest rewritten after each so an interrupted sweep still says what ran."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task("sweep", total=len(levels))
        for level in levels:
            progress.update(task, description=f"concurrency {level}")
            manifest["runs"].append(run_level(level, workload, out, vllm_bin, target, remote_dir))
            write_manifest(out, manifest)
            progress.advance(task)


def run_level(level: int, workload: Workload, out: Path, vllm_bin: str, target: RemoteTarget | None,
              remote_dir: str) -> dict[str, Any]:
    filename = result_filename(level)
    if target:
        argv = target.ssh(bench_serve_args("vllm", workload, level, remote_dir, filename))
    else:
        argv = bench_serve_args(vllm_bin, workload, level, str(out), filename)
    log_path = out / f"c{level}.log"
    started_at, start = now(), time.monotonic()
    returncode = run_logged(argv, log_path)
    wall_s = time.monotonic() - start
    if returncode != 0:
        raise click.ClickException(f"concurrency {level}: exit {returncode}; end of {log_path}:\n{log_tail(log_path)}")
    if target:
        fetch_remote_result(target, f"{remote_dir}/{filename}", out / filename)
    if not (out / filename).is_file():
        raise click.ClickException(f"concurrency {level}: no {filename} was saved; see {log_path}")
    return {"concurrency": level, "command": argv, "result_file": filename, "log_file": log_path.name,
            "started_at": started_at, "wall_s": round(wall_s, 3)}


@bench.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--price-per-hour", type=click.FloatRange(min=0, min_open=True), default=PRICE_PER_CHIP_HOUR,
              show_default=True, help="$ per hour of the machine (default: one v6e chip, flex-start), for the "
              "$ / M output tokens column.")
@click.option("--format", "output_format", type=click.Choice(["table", "markdown", "json"]), default="table",
              show_default=True)
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="Also write a PNG plot here.")
def report(dirs: tuple[Path, ...], price_per_hour: float, output_format: str, plot: Path | None) -> None:
    """One row per concurrency from saved results in DIR; two DIRs compare them (ratio = second / first)."""
    if len(dirs) > 2:
        raise click.BadParameter("one DIR to report, two to compare", param_hint="DIRS")
    try:
        runs = {run_label(directory, dirs): benchreport.report_rows(directory, price_per_hour) for directory in dirs}
        comparisons = benchreport.compare_rows(*runs.values()) if len(dirs) == 2 else None
    except benchreport.ReportError as error:
        raise click.ClickException(str(error)) from error
    if comparisons is None:
        rows = next(iter(runs.values()))
        print_table(f"{dirs[0]} at ${price_per_hour:g}/h", [header for _, header, _ in benchreport.COLUMNS], rows,
                    [benchreport.row_cells(row) for row in rows], output_format)
    else:
        print_table(f"{dirs[1]} / {dirs[0]}", benchreport.COMPARISON_HEADERS, comparisons,
                    [benchreport.comparison_cells(item) for item in comparisons], output_format)
    if plot:
        benchreport.plot_runs(runs, plot)
        click.echo(f"plot written to {plot}", err=True)


def run_label(directory: Path, dirs: tuple[Path, ...]) -> str:
    """The directory's name, or its whole path when the names alone would not tell the runs apart."""
    names = [path.resolve().name for path in dirs]
    return directory.resolve().name if len(set(names)) == len(names) else str(directory)


def print_table(title: str, headers: list[str], records: list[benchreport.BenchRow] | list[benchreport.Comparison],
                cells: list[list[str]], output_format: str) -> None:
    """`records` as JSON (null where a value is not finite), or their `cells` as markdown or a rich table."""
    if output_format == "json":
        click.echo(json.dumps([benchreport.json_record(record) for record in records], indent=2, allow_nan=False))
    elif output_format == "markdown":
        click.echo(benchreport.markdown_table(headers, cells))
    else:
        print_rich_table(title, headers, cells)


def print_rich_table(title: str, headers: list[str], cells: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for header in headers:
        table.add_column(header, justify="right")
    for row in cells:
        table.add_row(*row)
    Console().print(table)
