"""The `pulumi` CLI as `tpuserve up` drives it: one subprocess per command, in the project directory; state, secrets
and policy packs stay Pulumi's. Why not the Automation API: docs/design/why-the-cli.md."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from tpuserve.flex_start import DRIVER_ENV

NAMESPACE = "tpu-serve"  # Pulumi.yaml's `name`: stack config keys are `tpu-serve:<key>`
INTERRUPT_GRACE_S = 90.0  # after Ctrl-C, Pulumi finishes the operations in flight and saves the state
KILL_GRACE_S = 10.0


def missing_cli(stack: str) -> str:
    """The one line every stack command says when there is no `pulumi` to run."""
    return ("the pulumi CLI is not on PATH: `export PATH=\"$(scripts/install-pulumi.sh):$PATH\"` installs the pinned "
            "version into .tools/pulumi/bin (scripts/up.sh does the same; or https://www.pulumi.com/docs/install/); "
            f"`tpuserve check --stack {stack}` checks the stack's file without it")


def require_project(config: Mapping[str, Any], stack: str) -> str:
    """The stack's `project`, or the usage error that says how to set it."""
    project = str(config.get("project") or "")
    if not project:
        raise click.UsageError(f"project: not set in stack {stack}; pulumi config set project <gcp-project-id> "
                               f"--stack {stack}")
    return project


def open_stack(stack: str, cwd: Path | None, echo: Callable[[str], None] = lambda line: None
               ) -> tuple[PulumiCli, dict[str, Any]]:
    """The stack's CLI and its config, or a ClickException saying why not."""
    try:
        pulumi = PulumiCli(stack, cwd, echo)
        return pulumi, pulumi.config()
    except PulumiError as err:
        raise click.ClickException(str(err)) from err


def echo_indented(line: str) -> None:
    """Pulumi's own output, streamed on stderr under a deploy command's lines."""
    click.echo(f"  │ {line}", err=True)


class PulumiError(RuntimeError):
    """A pulumi command that is not an update failed (no CLI, no such stack, a bad passphrase...)."""


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str  # stdout and stderr, interleaved as printed
    seconds: float
    interrupted: bool = False  # stopped at the deadline (or by Ctrl-C)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.interrupted


class PulumiCli:
    """The `pulumi` CLI for one stack (≈ 1 s a call): outputs read once until an update, its config sent with it."""

    def __init__(self, stack: str, cwd: Path | None = None, echo: Callable[[str], None] = lambda line: None):
        executable = shutil.which("pulumi")
        if executable is None:
            raise PulumiError(missing_cli(stack))
        self.executable, self.stack, self.cwd, self.echo = executable, stack, cwd, echo
        # DRIVER_ENV: the program's capacity hint stays quiet under tpuserve, which says what it does instead.
        self.env = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true", DRIVER_ENV: "tpuserve"}
        self._outputs: dict[str, Any] | None = None

    def _forget(self) -> None:
        self._outputs = None

    def _argv(self, *args: str) -> list[str]:
        return [self.executable, *args, "--stack", self.stack, "--non-interactive"]

    def run(self, *args: str) -> str:
        result = subprocess.run(self._argv(*args), cwd=self.cwd, env=self.env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
            raise PulumiError(f"`pulumi {' '.join(args)} --stack {self.stack}` failed: "
                              f"{detail[-1] if detail else f'exit {result.returncode}'}")
        return result.stdout

    def config(self) -> dict[str, Any]:
        """The stack's `tpu-serve:` settings: key -> value (lists and objects parsed; secrets stay blinded)."""
        raw = json.loads(self.run("config", "--json") or "{}")
        settings: dict[str, Any] = {}
        for key, entry in raw.items():
            namespace, _, name = key.partition(":")
            if namespace != NAMESPACE:
                continue
            value = entry.get("objectValue", entry.get("value"))
            if isinstance(value, str) and value[:1] in "[{" and not entry.get("secret"):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    pass
            settings[name] = value
        return settings

    def set_config(self, key: str, value: str) -> None:
        self.run("config", "set", key, value)

    def remove_config(self, key: str) -> None:
        self.run("config", "rm", key)

    def outputs(self) -> dict[str, Any]:
        """The stack's outputs; empty for a stack never deployed."""
        if self._outputs is None:
            try:
                self._outputs = dict(json.loads(self.run("stack", "output", "--json") or "{}"))
            except PulumiError:
                return {}
        return dict(self._outputs)

    def output(self, name: str) -> Any:
        """One output, secrets shown (`pulumi stack output NAME --json --show-secrets`)."""
        return json.loads(self.run("stack", "output", name, "--json", "--show-secrets"))

    def export(self) -> dict[str, Any]:
        """`pulumi stack export`: the state, whose resources carry their provider ids."""
        return dict(json.loads(self.run("stack", "export") or "{}"))

    def refresh(self, timeout_s: float) -> Run:
        """Read every resource back from GCP and drop pending creates (a VM they made is the orphan sweep's)."""
        return self.stream(["refresh", "--yes", "--skip-preview", "--clear-pending-creates"], timeout_s)

    def up(self, extra: Sequence[str], timeout_s: float, config: Mapping[str, str] | None = None,
           env: Mapping[str, str] | None = None) -> Run:
        """`pulumi up`: `config` saved first, `env` for this run's program only (docs/design/capacity.md#the-sweep)."""
        return self.stream(["up", "--yes", "--skip-preview", "--refresh", *config_args(config), *extra], timeout_s, env)

    def preview(self, extra: Sequence[str], timeout_s: float, config: Mapping[str, str] | None = None) -> Run:
        """`pulumi preview --json --show-replacement-steps`: its plan is `output`, stderr echoed; config saved first."""
        self._forget()
        started = time.monotonic()
        try:
            result = subprocess.run(self._argv("preview", "--json", "--show-replacement-steps", "--refresh",
                                               *config_args(config), *extra),
                                    cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                                    text=True, timeout=max(timeout_s, 1.0), check=False)
        except subprocess.TimeoutExpired:
            return Run(255, "", time.monotonic() - started, interrupted=True)
        for line in result.stderr.splitlines():
            self.echo(line)
        return Run(result.returncode, result.stdout, time.monotonic() - started)

    def stream(self, args: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Run:
        """Run a command, echoing each line; at `timeout_s` interrupt it as Ctrl-C would, then kill it if it lingers."""
        self._forget()  # an update, destroy or refresh may change the outputs
        started, lines, interrupted = time.monotonic(), [], False
        with subprocess.Popen(self._argv(*args), cwd=self.cwd, env={**self.env, **(env or {})},
                              stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as process:

            def pump() -> None:
                assert process.stdout is not None
                for line in process.stdout:
                    lines.append(line)
                    self.echo(line.rstrip("\n"))

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            try:
                process.wait(timeout=max(timeout_s, 0.0))
            except subprocess.TimeoutExpired:
                interrupted = True
                stop(process)
            except KeyboardInterrupt:  # the terminal sent Ctrl-C to pulumi too: let it save the state
                stop(process, already_interrupted=True)
                raise
            reader.join(timeout=KILL_GRACE_S)
        return Run(process.returncode, "".join(lines), time.monotonic() - started, interrupted)


def config_args(config: Mapping[str, str] | None) -> list[str]:
    return [arg for key, value in (config or {}).items() for arg in ("--config", f"{key}={value}")]


def stop(process: subprocess.Popen, already_interrupted: bool = False) -> None:
    if not already_interrupted:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=KILL_GRACE_S)
