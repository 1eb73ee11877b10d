"""`tpuserve bench`: run `vllm bench serve` across concurrency levels, then report the saved results.

Local (default): this machine's `vllm` measures `--url`, network included. `--remote VM`: the same command runs in the
VM's container over IAP ssh, so TTFT is the server's own. How a sweep ends: docs/design/measuring.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import requests
from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from tpuserve.cli import Failure, connection_reason, echo_json, json_option, request_failure
from tpuserve.client import API_KEY_ENV, response_error
from tpuserve.deploy.stack import (Served, api_key_option, model_option, read_outputs, require_endpoint,
                                   served_endpoint, stack_options, url_option)
from tpuserve.deploy.vmssh import docker_over_iap
from tpuserve.facts import PRICE_PER_CHIP_HOUR, SINGLE_STREAM_TOK_S
from tpuserve.measure import benchreport
from tpuserve.serving import CONTAINER_NAME, DEFAULT_PORT, engine_container
from tpuserve.urls import server_root

DEFAULT_LEVELS = "1,8,32,64,100"
REMOTE_RESULT_ROOT = "/tmp/tpuserve-bench"  # in the container, before the results are copied back
VERSION_PROBE = "import importlib.metadata as m; print(m.version('vllm'))"
VLLM_VENV_ENV = "TPUSERVE_VLLM_VENV"  # the project's CPU vLLM (scripts/install-vllm-cpu.sh), else PATH, else:
DEFAULT_VLLM_VENV = (".cache", "tpuserve", "vllm-venv")  # under the home directory
HF_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # what `vllm bench serve` can load a tokenizer by
FAILED_REQUEST_LINE = re.compile(r"^Error \d+: ?(.*)$")  # `vllm bench serve` 0.32's report of a failed request
# A level's deadline and the server's liveness (docs/design/measuring.md#sweeps-end-on-their-own).
LEVEL_FLOOR_S = 180.0
LEVEL_SLACK = 3.0
LIVENESS_INTERVAL_S = 5.0
LIVENESS_TIMEOUT_S = 10.0
UNANSWERED_LIMIT_S = 30.0
STOP_GRACE_S = 5.0  # SIGTERM, then this long before SIGKILL
TIMING_REQUEST_TIMEOUT_S = 300.0
PROGRESS_INTERVAL_S = 1.0  # how often a level's log is read for its request count
BENCH_KEY_ENV = "OPENAI_API_KEY"  # the only variable `vllm bench serve` reads a key from
CONTAINER_KEY = ["sh", "-c", f'{BENCH_KEY_ENV}="${{VLLM_API_KEY:-}}" exec "$@"', "sh"]  # --remote: the container's key
TQDM_COUNT = re.compile(r"(\d+)/(\d+) \[")  # its progress bar in the level's log: "37/100 [00:12<00:20, ...]"


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
    api_key: str | None = dataclasses.field(default=None, repr=False)  # never recorded
    key_env: str = API_KEY_ENV


def bench_serve_args(vllm_bin: str, workload: Workload, concurrency: int, result_dir: str,
                     result_filename: str) -> list[str]:
    """The one `vllm bench serve` argv for one concurrency level."""
    return [vllm_bin, "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
            "--base-url", server_root(workload.url), "--model", workload.model, "--dataset-name", "random",
            "--random-input-len", str(workload.input_len), "--random-output-len", str(workload.output_len),
            "--ignore-eos", "--num-prompts", str(workload.num_prompts), "--max-concurrency", str(concurrency),
            "--ready-check-timeout-sec", "0",  # not 600 s of retries: the sweep checked the server already
            "--save-result", "--result-dir", result_dir, "--result-filename", result_filename,
            *(["--tokenizer", workload.tokenizer] if workload.tokenizer else [])]


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


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def vllm_version(target: RemoteTarget | None, url: str) -> str | None:
    """The container's vLLM from package metadata (importing vllm takes seconds), else the server's GET /version."""
    if target:
        completed = subprocess.run(target.ssh(["python3", "-c", VERSION_PROBE]), capture_output=True, text=True,
                                   check=False)
        return (completed.stdout.strip() or None) if completed.returncode == 0 else None
    try:
        response = requests.get(f"{server_root(url)}/version", timeout=5)
        response.raise_for_status()
        return response.json().get("version")
    except (requests.RequestException, ValueError):
        return None


def find_vllm(explicit: str | None) -> str:
    """The full path (sweep.json says which vLLM ran) of --vllm-bin, else of $TPUSERVE_VLLM_VENV's, PATH's or the
    project's CPU venv's `vllm`."""
    if explicit:
        if path := shutil.which(explicit):
            return path
        raise click.BadParameter(f"{explicit!r} is not an executable on PATH (install vLLM or pass its path)",
                                 param_hint="--vllm-bin")
    venv = os.environ.get(VLLM_VENV_ENV)
    candidates = [str(Path(venv) / "bin" / "vllm")] if venv else []
    candidates += [shutil.which("vllm") or "", str(Path.home().joinpath(*DEFAULT_VLLM_VENV, "bin", "vllm"))]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return candidate
    raise click.BadParameter(f"no `vllm` found in ${VLLM_VENV_ENV}, on PATH or in ~/{'/'.join(DEFAULT_VLLM_VENV)} "
                             "(scripts/install-vllm-cpu.sh installs the CPU build there); pass its path",
                             param_hint="--vllm-bin")


def tokenizer_for(model: str, card: dict[str, Any], tokenizer: str | None) -> str | None:
    """`vllm bench serve --tokenizer` (None: the model name), else the server's `root`, else ask for --tokenizer."""
    if tokenizer:
        return tokenizer
    root = card.get("root") if isinstance(card.get("root"), str) else model
    for candidate in dict.fromkeys([model, root]):
        if HF_REPO_ID.match(candidate) or Path(candidate).is_dir():
            return None if candidate == model else candidate
    loaded = f" (it loaded {root!r}, not found here)" if root != model else ""
    raise click.BadParameter(f"the server serves {model!r}{loaded}, which is neither a Hugging Face id (org/name) "
                             "nor a local directory, and `vllm bench serve` loads its tokenizer by that name: pass "
                             "--tokenizer with the model's HF id or a local copy", param_hint="--tokenizer")


def failure_cause(log_text: str) -> str:
    """vLLM's words for why requests failed: the first failed request's last line, else the log's last line."""
    lines = [line.rstrip() for line in log_text.splitlines()]
    for index, line in enumerate(lines):
        if found := FAILED_REQUEST_LINE.match(line):
            block = [found.group(1)]
            for following in lines[index + 1:]:
                if FAILED_REQUEST_LINE.match(following) or following.startswith("="):
                    break
                block.append(following)
            return ([text.strip() for text in block if text.strip()] or ["(no reason given)"])[-1]
    return ([line.strip() for line in lines if line.strip()] or ["(empty log)"])[-1]


class LevelStopped(Exception):
    """A level ended before `vllm bench serve` finished it: its deadline passed, or the server stopped answering."""


@dataclasses.dataclass
class Pace:
    """The slowest request rate measured so far, and where from: what each level's deadline follows."""

    rate_req_s: float
    source: str

    def measured(self, level: int, rate_req_s: float) -> None:
        if 0 < rate_req_s < self.rate_req_s:
            self.rate_req_s, self.source = rate_req_s, f"concurrency {level}"

    def deadline_s(self, num_prompts: int) -> float:
        return LEVEL_FLOOR_S + LEVEL_SLACK * num_prompts / self.rate_req_s

    def explain(self, num_prompts: int) -> str:
        return (f"{num_prompts} requests at the slowest rate measured ({self.source}: {self.rate_req_s:.3g} req/s), "
                f"times {LEVEL_SLACK:g}, plus {LEVEL_FLOOR_S:g} s to start")


def bench_env(key: str | None) -> dict[str, str]:
    """This environment with the server's key as `vllm bench serve` reads it, never the user's own OpenAI key."""
    env = {name: value for name, value in os.environ.items() if name != BENCH_KEY_ENV}
    return {**env, BENCH_KEY_ENV: key} if key else env


def time_one_request(workload: Workload) -> float:
    """Seconds one request of the workload's output length takes alone: the first level's deadline follows it."""
    url = f"{server_root(workload.url)}/v1/completions"
    start = time.monotonic()
    try:
        response = requests.post(url, timeout=TIMING_REQUEST_TIMEOUT_S, json={
            "model": workload.model, "prompt": "Hello", "max_tokens": workload.output_len, "ignore_eos": True},
                                 headers={"Authorization": f"Bearer {workload.api_key}"} if workload.api_key else {})
    except requests.RequestException as err:
        raise click.ClickException(f"timing one request before the first level: {request_failure(err)}") from err
    if response.status_code != 200:
        err = response_error(response, 0.0, workload.key_env)
        where = "" if err.url else f"POST {url} answered "
        raise click.ClickException(f"timing one request before the first level: {where}{err}")
    return max(time.monotonic() - start, 1e-3)


class Liveness:
    """Whether the server still answers GET /health; `check` says why not once it has not for UNANSWERED_LIMIT_S."""

    def __init__(self, url: str):
        self.url = f"{server_root(url)}/health"
        self.since: float | None = None

    def check(self) -> str | None:
        try:
            status = requests.get(self.url, timeout=LIVENESS_TIMEOUT_S).status_code
            why = f"answered HTTP {status}" if status >= 500 else None
        except requests.Timeout:
            why = f"no answer in {LIVENESS_TIMEOUT_S:g} s"
        except requests.RequestException as err:
            why = connection_reason(err)
        now = time.monotonic()
        self.since = None if why is None else now if self.since is None else self.since
        if self.since is None or now - self.since < UNANSWERED_LIMIT_S:
            return None
        return f"GET {self.url}: {why}, for {now - self.since:.0f} s"

    def wait_answering(self) -> str | None:
        """None once the server answers; why not once it has not for UNANSWERED_LIMIT_S."""
        while True:
            why = self.check()
            if why or self.since is None:
                return why
            time.sleep(LIVENESS_INTERVAL_S)


def end_process(process: subprocess.Popen) -> None:
    """SIGTERM to its process group (`vllm bench serve`, or gcloud and its ssh), SIGKILL after STOP_GRACE_S."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=STOP_GRACE_S)
            break
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            pass
    process.wait()


def requests_done(log_path: Path, total: int) -> int | None:
    """How many of the level's `total` requests its progress bar counts so far (None before the bar starts)."""
    with log_path.open("rb") as log:
        log.seek(max(log_path.stat().st_size - 4096, 0))
        tail = log.read().decode(errors="replace")
    counts = [int(done) for done, of in TQDM_COUNT.findall(tail) if int(of) == total]
    return counts[-1] if counts else None


def run_logged(argv: list[str], log_path: Path, deadline_s: float, explain: str,
               liveness: Liveness | None = None, env: dict[str, str] | None = None,
               on_progress: Callable[[], None] = lambda: None) -> int:
    """Run in its own session, output to `log_path`; LevelStopped at `deadline_s` or once `liveness` fails, and
    stopped with its children whatever ends this (Ctrl-C too). `on_progress` runs every PROGRESS_INTERVAL_S."""
    with log_path.open("w") as log:
        log.write(shlex.join(argv) + "\n")
        log.flush()
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        started = last_look = time.monotonic()
        try:
            while True:
                left = deadline_s - (time.monotonic() - started)
                try:
                    return process.wait(timeout=max(min(PROGRESS_INTERVAL_S, left), 0.01))
                except subprocess.TimeoutExpired:
                    pass
                on_progress()
                if time.monotonic() - started >= deadline_s:
                    raise LevelStopped(f"not finished {deadline_s:.1f} s after it began ({explain})")
                if liveness and time.monotonic() - last_look >= LIVENESS_INTERVAL_S:
                    last_look = time.monotonic()
                    why = liveness.check()
                    if why:
                        raise LevelStopped(f"the server stopped answering ({why})")
        finally:
            if process.poll() is None:
                end_process(process)


@click.group()
def bench() -> None:
    """Measure an endpoint with `vllm bench serve` and report throughput, latency and $ per million tokens."""


@bench.command()
@url_option("Server URL: host:port or http(s)://host:port, with or without /v1. Default with --remote: the "
            f"container's own http://127.0.0.1:{DEFAULT_PORT}.")
@model_option("Model to request; default: the stack's model, else the first the server lists.")
@click.option("--tokenizer", help="Tokenizer HF id or local directory; default: the model, or what the server "
              "loaded (/v1/models `root`) when the served name is neither.")
@click.option("--concurrency", "levels", default=DEFAULT_LEVELS, show_default=True, callback=lambda c, p, v:
              parse_levels(v), help="Comma-separated --max-concurrency levels, one `vllm bench serve` run each.")
@click.option("--input-len", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--num-prompts", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="New directory for the result JSONs, logs and sweep.json.")
@click.option("--vllm-bin", help=f"The `vllm` executable (local mode); default: ${VLLM_VENV_ENV}/bin/vllm, then "
              f"PATH, then ~/{'/'.join(DEFAULT_VLLM_VENV)}/bin/vllm.")
@click.option("--remote", "vm", help="Run inside this VM's container through IAP ssh instead of locally.")
@click.option("--zone", help="The VM's zone (--remote).")
@click.option("--project", help="The VM's project (--remote).")
@click.option("--container", help=f"The container to run in (--remote); default {CONTAINER_NAME}, or the first "
              "engine's on a VM of several (the stack's `engines`): its 127.0.0.1:8000 is the front either way.")
@api_key_option("Environment variable holding the server's API key (vLLM's --api-key): `vllm bench serve` gets it "
                "as its OPENAI_API_KEY. --remote uses the container's own VLLM_API_KEY.")
@stack_options
@json_option
def sweep(url: str | None, model: str | None, tokenizer: str | None, levels: list[int], input_len: int,
          output_len: int, num_prompts: int, out: Path, vllm_bin: str | None, vm: str | None, zone: str | None,
          project: str | None, container: str | None, api_key_env: str, stack: str | None,
          stack_outputs: Path | None, as_json: bool) -> None:
    """Run `vllm bench serve` (random dataset) once per concurrency level and save every result in --out.

    \b
    Local (default): this machine's vLLM measures --url, network included: what a client sees.
    --remote VM: runs inside the VM's container over IAP ssh, so TTFT is the server's own.
    A level where every request failed, or one past its deadline or whose server stopped answering, ends the sweep
    (exit 1), keeping the levels that finished; sweep.json records the commands, parameters and why it ended.
    """
    outputs = read_outputs(stack, stack_outputs)
    if vm is not None:
        known = outputs or {}
        zone, project, model = zone or known.get("zone"), project or known.get("project"), model or known.get("model")
        if not model:
            raise click.BadParameter("required with --remote (or give --stack)", param_hint="--model")
        target = RemoteTarget(vm, zone, project, container or engine_container(int(known.get("engines") or 1)))
        run_sweep(Served(server_root(url or f"http://127.0.0.1:{DEFAULT_PORT}"), model), tokenizer, levels,
                  input_len, output_len, num_prompts, out, "vllm", target, outputs, as_json)
        return
    require_endpoint(url, outputs)  # a missing --url is the first thing to say, with or without a vllm here
    vllm_path = find_vllm(vllm_bin)
    with served_endpoint(url, model, outputs, api_key_env) as served:
        limit = served.card.get("max_model_len")  # lengths it cannot serve would fail every request with a 400
        if isinstance(limit, int) and input_len + output_len > limit:
            raise click.BadParameter(f"{input_len} + {output_len} = {input_len + output_len} tokens per request "
                                     f"exceed the server's max_model_len {limit} (from /v1/models): every request "
                                     "would fail; lower --input-len or --output-len",
                                     param_hint="--input-len/--output-len")
        tokenizer = tokenizer_for(served.model, served.card, tokenizer)
        run_sweep(served, tokenizer, levels, input_len, output_len, num_prompts, out, vllm_path, None, outputs,
                  as_json)


def run_sweep(served: Served, tokenizer: str | None, levels: list[int], input_len: int, output_len: int,
              num_prompts: int, out: Path, vllm_bin: str, target: RemoteTarget | None,
              outputs: dict[str, Any] | None, as_json: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if (out / benchreport.SWEEP_MANIFEST).exists() or any(out.glob("c*.json")):  # a report never mixes two sweeps
        raise click.BadParameter(f"{out} already holds a sweep; choose a new directory", param_hint="--out")
    workload = Workload(served.url, served.model, tokenizer, input_len, output_len, num_prompts, served.api_key,
                        served.key_env)
    manifest = {"tool": "tpuserve bench sweep", "mode": "remote" if target else "local",
                "remote": dataclasses.asdict(target) if target else None, "started_at": now(), "finished_at": None,
                "vllm_version": vllm_version(target, workload.url), "model": workload.model,
                "parameters": {"url": workload.url, "tokenizer": workload.tokenizer, "concurrency": levels,
                               "input_len": input_len, "output_len": output_len, "num_prompts": num_prompts,
                               "dataset": "random"},
                "stack_outputs": outputs, "runs": [], "unfinished": None}
    if target:  # the server is the container's own: no request can be timed from here
        pace = Pace(SINGLE_STREAM_TOK_S / output_len, f"the reference {SINGLE_STREAM_TOK_S:g} tok/s single stream")
    else:
        seconds = time_one_request(workload)
        pace = Pace(1 / seconds, "one timed request")
        manifest["timing_request"] = {"seconds": seconds, "request_rate": pace.rate_req_s}
    remote_dir = f"{REMOTE_RESULT_ROOT}/{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    level = levels[0]
    try:  # a level all failed or stopped ends the sweep, sweep.json rewritten after each level
        with Progress(*columns, console=Console(stderr=True)) as progress:
            task = progress.add_task("levels", total=len(levels))
            for level in levels:
                run_one(level, workload, out, manifest, vllm_bin, target, remote_dir, pace, progress, task)
    except (click.ClickException, KeyboardInterrupt) as err:
        cause = err if isinstance(err, click.ClickException) else None
        # Ctrl-C: the level's `vllm bench serve` is stopped already (run_logged); 130 = 128 + SIGINT, as a shell's
        reason = cause.message if cause else f"interrupted (Ctrl-C) during concurrency {level}"
        code = cause.exit_code if cause else 130
        raise Failure(reason, end_unfinished(out, manifest, level, reason, len(levels)), code) from cause
    manifest["finished_at"] = now()
    write_manifest(out, manifest)
    if as_json:
        echo_json(manifest)
        return
    partial = [f"concurrency {run['concurrency']}: {run['failed']} of {run['completed'] + run['failed']} failed"
               for run in manifest["runs"] if run.get("failed")]
    note = f" ({'; '.join(partial)})" if partial else ""
    saved = f"{len(levels)} level{'' if len(levels) == 1 else 's'}"
    click.echo(f"{saved} saved in {out}{note}; `tpuserve bench report {out}` prints the table.")


def end_unfinished(out: Path, manifest: dict[str, Any], level: int, reason: str, planned: int) -> dict[str, Any]:
    """Mark sweep.json unfinished and say which levels are kept; returns that as the error document's fields."""
    measured = [run["concurrency"] for run in manifest["runs"] if run["completed"]]
    manifest["unfinished"] = {"concurrency": level, "reason": reason, "at": now()}
    write_manifest(out, manifest)
    if measured:
        names = ", ".join(map(str, measured))
        kept = (f"concurrency {names} ({len(measured)} of {planned} levels) {'is' if len(measured) == 1 else 'are'} "
                f"kept in {out}; sweep.json is marked unfinished; `tpuserve bench report {out}` reports what "
                "finished")
    else:
        kept = f"no level measured anything; sweep.json in {out} is marked unfinished"
    click.echo(f"the sweep ended early: {kept}", err=True)
    return {"out": str(out), "kept": measured, "unfinished": manifest["unfinished"]}


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    (out / benchreport.SWEEP_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def run_one(level: int, workload: Workload, out: Path, manifest: dict[str, Any], vllm_bin: str,
            target: RemoteTarget | None, remote_dir: str, pace: Pace, progress: Any, task: Any) -> None:
    """One level: the server still answers (local mode), then its run, recorded and printed."""
    if target is None:
        progress.update(task, description=f"concurrency {level} (does the server answer?)")
        why = Liveness(workload.url).wait_answering()
        if why:
            raise click.ClickException(f"concurrency {level}: not started, the server stopped answering ({why})")
    deadline_s = pace.deadline_s(workload.num_prompts)
    progress.update(task, description=f"levels (concurrency {level}: deadline {deadline_s:.0f} s)")
    requests_task = progress.add_task(f"concurrency {level} requests", total=workload.num_prompts)
    filename, log_path = f"c{level}.json", out / f"c{level}.log"
    if target:
        argv = target.ssh([*CONTAINER_KEY, *bench_serve_args("vllm", workload, level, remote_dir, filename)])
    else:
        argv = bench_serve_args(vllm_bin, workload, level, str(out), filename)

    def show_requests() -> None:
        done = requests_done(log_path, workload.num_prompts)
        if done is not None:
            progress.update(requests_task, completed=done)

    started_at, start = now(), time.monotonic()
    try:
        # Remote: the server's URL is the container's own, not reachable from here to watch; the deadline holds.
        returncode = run_logged(argv, log_path, deadline_s, pace.explain(workload.num_prompts),
                                None if target else Liveness(workload.url),
                                bench_env(None if target else workload.api_key), show_requests)
    except LevelStopped as stopped:
        raise click.ClickException(f"concurrency {level}: {stopped}; `vllm bench serve` was stopped (log: "
                                   f"{log_path})") from stopped
    finally:
        progress.remove_task(requests_task)
    wall_s = time.monotonic() - start
    if returncode != 0:
        raise click.ClickException(f"concurrency {level}: `vllm bench serve` exited with {returncode}: "
                                   f"{failure_cause(log_path.read_text(errors='replace'))} (log: {log_path})")
    if target:  # copy the result back, checked
        remote_path = f"{remote_dir}/{filename}"
        copied = subprocess.run(target.ssh(["cat", remote_path]), capture_output=True, text=True, check=False)
        if copied.returncode != 0:
            raise click.ClickException(f"copying {remote_path} back from {target.vm} failed: {copied.stderr.strip()}")
        try:
            json.loads(copied.stdout)
        except json.JSONDecodeError as error:
            raise click.ClickException(f"{remote_path} on {target.vm} is not JSON: {error}") from error
        (out / filename).write_text(copied.stdout)
    if not (out / filename).is_file():
        raise click.ClickException(f"concurrency {level}: no {filename} was saved; see {log_path}")
    result = json.loads((out / filename).read_text())
    completed, failed = benchreport.request_counts(result, workload.num_prompts)
    run = {"concurrency": level, "command": argv, "result_file": filename, "log_file": log_path.name,
           "started_at": started_at, "wall_s": round(wall_s, 3), "deadline_s": round(deadline_s, 1),
           "completed": completed, "failed": failed, "request_rate": result.get("request_throughput")}
    if failed:
        run["cause"] = failure_cause(log_path.read_text(errors="replace"))
    pace.measured(level, run["request_rate"] or 0.0)
    manifest["runs"].append(run)
    write_manifest(out, manifest)
    progress.advance(task)
    cause = f"; vLLM: {run['cause']}" if failed else ""
    progress.console.print(f"concurrency {level}: {completed} completed, {failed} failed{cause}", markup=False,
                           highlight=False)
    if completed == 0:
        raise click.ClickException(f"concurrency {level}: all {failed} requests failed; vLLM: {run.get('cause')} "
                                   f"(log: {log_path})")


@bench.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--price-per-hour", type=click.FloatRange(min=0, min_open=True), default=PRICE_PER_CHIP_HOUR,
              show_default=True, help="$ per hour of the machine (default: one v6e chip, flex-start), for $/M.")
@click.option("--format", "output_format", type=click.Choice(["table", "markdown", "json"]), default="table",
              show_default=True, help="--json is the same as --format json.")
@json_option
@click.option("--allow-mismatch", is_flag=True, help="Compare two runs even when their request lengths differ.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="Also write a PNG plot here.")
def report(dirs: tuple[Path, ...], price_per_hour: float, output_format: str, as_json: bool, allow_mismatch: bool,
           plot: Path | None) -> None:
    """One row per concurrency from saved results in DIR; two DIRs compare them: the first is the baseline,
    ratio = second (candidate) / first. Levels where requests failed, and implausible rates, are flagged."""
    if len(dirs) > 2:
        raise click.BadParameter("one DIR to report, two to compare (the first is the baseline)", param_hint="DIRS")
    output_format = "json" if as_json else output_format
    names = [path.resolve().name for path in dirs]  # a run's label: its directory's name, or path if names clash
    runs = {directory.resolve().name if len(set(names)) == len(names) else str(directory):
            benchreport.report_rows(directory, price_per_hour) for directory in dirs}
    infos = [benchreport.run_info(directory) for directory in dirs]
    notes = [f"{label + ': ' if len(dirs) == 2 else ''}unfinished sweep: {info.unfinished}"
             for label, info in zip(runs, infos) if info.unfinished]
    notes += [note for label, rows in runs.items()
              for note in benchreport.report_notes(rows, label if len(dirs) == 2 else "")]
    if len(dirs) == 1:
        rows = next(iter(runs.values()))
        title = f"{dirs[0]}: {infos[0].model} · {infos[0].lengths} at ${price_per_hour:g}/h"
        print_table(title, [header for header, _, _ in benchreport.COLUMNS.values()], rows,
                    [benchreport.row_cells(row) for row in rows], output_format, notes,
                    table_headers=[short for _, short, _ in benchreport.COLUMNS.values()])
    else:
        if not allow_mismatch:
            notes = benchreport.check_comparable(*infos) + notes
        comparisons = benchreport.compare_rows(*runs.values())
        title = (f"candidate {dirs[1]} vs baseline {dirs[0]} (ratio = candidate / baseline): {infos[1].model} · "
                 f"{infos[1].lengths} at ${price_per_hour:g}/h")
        base, other = ({row.concurrency for row in rows} for rows in runs.values())
        one_sided = [(level, "baseline") for level in base - other] + [(level, "candidate") for level in other - base]
        notes += [f"concurrency {level}: measured only by the {side}" for level, side in sorted(one_sided)]
        print_table(title, benchreport.COMPARISON_HEADERS, comparisons,
                    [benchreport.comparison_cells(item) for item in comparisons], output_format, notes,
                    baseline=str(dirs[0]), candidate=str(dirs[1]))
    if plot:
        benchreport.plot_runs(runs, plot, benchreport.plot_title(infos, price_per_hour))
        click.echo(f"plot written to {plot}", err=True)


TABLE_GAP = 3  # columns between two columns of a terminal table: padding, rich's divider, padding
# A cell that reads as a number (or a stand-in for one: '—', '∞', 'n/a', 'all 5 failed'): right-aligned.
NUMERIC_CELL = re.compile(r"^([\d.,]+( ⚠)?|[—∞]|n/a|all \d+ failed)$")


def print_table(title: str, headers: list[str], records: list[benchreport.BenchRow] | list[benchreport.Comparison],
                cells: list[list[str]], output_format: str, notes: list[str],
                table_headers: list[str] | None = None, **json_fields: str) -> None:
    """`records` as JSON, or their `cells` as markdown or a terminal table (columns as wide as their widest cell,
    else a block per row: docs/design/measuring.md#probe), with the notes after it."""
    if output_format == "json":
        echo_json({"title": title, **json_fields, "rows": [dataclasses.asdict(record) for record in records],
                   "notes": notes})
        return
    if output_format == "markdown":
        click.echo("\n".join([benchreport.markdown_table(headers, cells), *(f"\n> ⚠ {note}" for note in notes)]))
        return
    console = Console()
    # The full headings on one line, else wrapped between words, else the short ones: the first that fits.
    layouts = [(heading, [max(([cell_len(header)] if one_line else [cell_len(word) for word in header.split()])
                              + [cell_len(row[i]) for row in cells]) for i, header in enumerate(heading)])
               for heading in (headers, table_headers) if heading for one_line in (True, False)]
    fitting = [(heading, widths) for heading, widths in layouts
               if sum(widths) + TABLE_GAP * (len(widths) - 1) <= console.width]
    wrap = {"markup": False, "highlight": False, "soft_wrap": False}
    console.print(Text(title, style="italic"))
    if fitting:
        shown, widths = fitting[0]
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), show_edge=False)
        for index, (header, width) in enumerate(zip(shown, widths)):
            numeric = all(NUMERIC_CELL.match(row[index]) for row in cells)
            table.add_column(header, justify="right" if numeric else "left", width=width)
        for row in cells:
            table.add_row(*row)
        console.print(table)
    else:
        for row in cells:
            console.print(f"{headers[0]} {row[0]}", style="bold", **wrap)
            line = ""
            for header, cell in zip(headers[1:], row[1:]):
                pair = f"{header} {cell}"
                if line and cell_len(line) + 3 + cell_len(pair) > console.width - 2:
                    console.print(Text(f"  {line}", no_wrap=True, overflow="ignore"), **wrap)
                    line = ""
                line = f"{line} · {pair}" if line else pair
            console.print(Text(f"  {line}", no_wrap=True, overflow="ignore"), **wrap)
    for note in notes:
        console.print(f"⚠ {note}", markup=False, highlight=False)
