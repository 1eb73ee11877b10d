"""Start and stop a real `vllm serve` on 127.0.0.1 for the e2e tier.

The server gets its own process group (vLLM forks an engine-core process), so stopping it kills the whole group by
PID and nothing outlives the session. Its output goes to a log file whose tail is shown when it fails to come up.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tpuserve.serving import ServingConfig, vllm_serve_args

HEALTH_TIMEOUT_S = 420.0  # the session's servers boot together (conftest.py), on a busy 2-core machine
STOP_GRACE_S = 15.0
LOG_TAIL_LINES = 60
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Offline and quiet: no hub downloads, no usage reports, a 1 GiB KV cache that fits the CI machine.
SERVER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
              "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass(frozen=True)
class RunningServer:
    """A live `vllm serve`: `url` has no /v1; `model` is the served model name clients send."""

    url: str
    model: str
    model_dir: Path
    argv: list[str]
    log_path: Path
    process: subprocess.Popen
    api_key: str | None = None  # what clients must send (the server has it as VLLM_API_KEY); None: no key


class Boot:
    """A started server whose /health is polled (every 0.1 s) on a thread from its start, so `healthy_at` is exact
    however late a test first asks for the server."""

    def __init__(self, server: RunningServer):
        self.server = server
        self.healthy_at: float | None = None  # time.time() of the first 200 from /health
        self.failure: str | None = None
        self._watch = threading.Thread(target=self._follow, daemon=True)
        self._watch.start()

    def _follow(self) -> None:
        try:
            self.healthy_at = wait_healthy(self.server)
        except (RuntimeError, TimeoutError) as err:
            self.failure = str(err)

    def wait(self) -> RunningServer:
        """The server once /health answered 200; raises RuntimeError with the log tail if it never did."""
        self._watch.join()
        if self.failure is not None:
            raise RuntimeError(self.failure)
        return self.server


@dataclass
class BootWatch:
    """A server's boot as seen from outside: when /health first answered 200, and a `tpuserve gate --url` (as the
    local stack runs it) started together with the server."""

    server: RunningServer
    gate: subprocess.Popen
    gate_stdout: Path  # ends with the gate's JSON verdict
    healthy_at: float | None = None  # time.time() of the first 200 from /health
    gate_exited_at: float | None = None  # time.time() when the gate process ended

    def follow_gate(self) -> None:
        """Record when the gate exits (runs on a thread, so the time is exact whenever the test looks)."""
        self.gate.wait()
        self.gate_exited_at = time.time()


def cpu_serving_config(model_dir: Path, served_name: str, port: int, extra_args: tuple[str, ...] = (),
                       **overrides: Any) -> ServingConfig:
    """The dev stack's serving options with the TPU-only ones swapped for what the CPU backend runs."""
    cpu_args = ("--dtype", "float32", "--enforce-eager")
    cfg = dataclasses.replace(ServingConfig(), model=str(model_dir), max_model_len=1024, host="127.0.0.1",
                              port=port, extra_args=cpu_args + extra_args, **overrides)
    return cfg.validate(backend="cpu")


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not log_path.exists():
        return "(no log written)"
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


def terminate_with_parent() -> None:
    """Runs in the server process before exec: the kernel sends it SIGTERM when the test process dies, even by
    SIGKILL (Linux prctl PR_SET_PDEATHSIG). A started vLLM then shuts down with its engine; one still loading
    ignores SIGTERM (measured), which is why stop_server follows up with SIGKILL to the group."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_server(vllm_bin: Path, cfg: ServingConfig, served_name: str, log_path: Path,
                 env: Mapping[str, str] | None = None, api_key: str | None = None) -> RunningServer:
    """`vllm serve` with the stack's argv plus a short served name for the model directory (a test convenience the
    stack refuses in extraArgs: there `model` is the name every check asks for); `env` adds to SERVER_ENV, and
    `api_key` goes as VLLM_API_KEY, as the stack's VM gives it."""
    argv = [str(vllm_bin), "serve", *vllm_serve_args(cfg), "--served-model-name", served_name]
    key_env = {"VLLM_API_KEY": api_key} if api_key else {}
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **SERVER_ENV, **(env or {}), **key_env},
                                   start_new_session=True, preexec_fn=terminate_with_parent)
    return RunningServer(f"http://{cfg.host}:{cfg.port}", served_name, Path(cfg.model), argv, log_path, process,
                         api_key)


def wait_healthy(server: RunningServer, timeout_s: float = HEALTH_TIMEOUT_S, interval_s: float = 0.1) -> float:
    """When /health first answered 200: time.time() just before sending the request that got it (the poll before,
    `interval_s` earlier, did not), so a slow response does not make the server look later than it was. Raises with
    the log tail if the server exits or the time runs out."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if server.process.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {server.process.returncode} before /health answered:\n"
                               f"{log_tail(server.log_path)}")
        sent_at = time.time()
        try:
            if requests.get(f"{server.url}/health", timeout=2).status_code == 200:
                return sent_at
        except requests.ConnectionError:
            pass
        time.sleep(interval_s)
    raise TimeoutError(f"vllm serve /health not 200 after {timeout_s:.0f} s:\n{log_tail(server.log_path)}")


def stop_server(server: RunningServer) -> None:
    """SIGTERM the server's process group, SIGKILL it if it lingers; also when a test already stopped the API
    process (its group id is its pid: start_new_session)."""
    pgid = server.process.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        server.process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)  # engine-core children may outlive the API process
    server.process.wait()
