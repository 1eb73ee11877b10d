"""`pulumi up` succeeds only when the model really answers: the readiness gate runs after the VM is created."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

import pulumi
from pulumi_command import local

from tpuserve.facts import PRE_READINESS_ALLOWANCES_S

# The project's interpreter (Pulumi.yaml's virtualenv), relative so the preview is the same on every machine.
GATE_PYTHON = '"${TPUSERVE_PYTHON:-.venv/bin/python}"'


def instance_target(instance: str, zone: str, project: str, config_hash: str) -> list[str]:
    """Follow a VM's guest attributes through the Compute API; `serving` counts only for this serving config."""
    return ["--instance", instance, "--zone", zone, "--project", project, "--config-hash", config_hash]


def instance_gate_timeout_s(vm_ready_timeout_s: int) -> int:
    """The VM's own deadline (which starts when vLLM loads) plus what comes before it: the gate prints its verdict."""
    return vm_ready_timeout_s + sum(PRE_READINESS_ALLOWANCES_S)


def url_target(url: str, model: str) -> list[str]:
    """Poll an OpenAI-compatible server directly until `model` completes."""
    return ["--url", url, "--model", model]


def gate_command(target: Sequence[str], timeout_s: int) -> str:
    args = ["gate", *target, "--timeout", str(timeout_s)]
    if "--url" in target:  # it watches the boot from the start: vLLM refuses connections until its engine is up
        args += ["--connect-timeout", str(timeout_s)]
    return f"{GATE_PYTHON} -m tpuserve " + " ".join(shlex.quote(a) for a in args)


def last_json_line(stdout: str) -> dict[str, Any]:
    """The gate ends its output with one JSON verdict line; everything before it is for humans."""
    lines = [line for line in stdout.strip().splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


class ReadinessGate(pulumi.ComponentResource):
    """`tpuserve gate` run when a trigger changes (docs/design/why-the-cli.md); `timeline` is its JSON verdict."""

    timeline: pulumi.Output[dict[str, Any]]

    def __init__(self, name: str, target: pulumi.Input[Sequence[str]], timeout_s: int,
                 triggers: Sequence[pulumi.Input[str]], opts: pulumi.ResourceOptions | None = None):
        """`target`: instance_target(...) or url_target(...); `triggers`: the VM or container id, the serving hash."""
        super().__init__("tpuserve:index:ReadinessGate", name, None, opts)
        command = local.Command(
            name, create=pulumi.Output.from_input(target).apply(lambda resolved: gate_command(resolved, timeout_s)),
            triggers=list(triggers), opts=pulumi.ResourceOptions(parent=self, custom_timeouts=pulumi.CustomTimeouts(
                create=f"{timeout_s + 120}s", update=f"{timeout_s + 120}s")))
        self.timeline = command.stdout.apply(last_json_line)
        self.register_outputs({"timeline": self.timeline})
