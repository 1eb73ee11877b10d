"""`pulumi up` succeeds only when the model really answers: the readiness gate runs after the VM is created."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi_command import local

# The interpreter Pulumi itself uses for this project (Pulumi.yaml: virtualenv .venv), relative to the project
# directory so the command, and therefore the preview, is the same on every machine; TPUSERVE_PYTHON overrides it.
GATE_PYTHON = '"${TPUSERVE_PYTHON:-.venv/bin/python}"'


@dataclass(frozen=True)
class ReadinessGateArgs:
    instance_name: pulumi.Input[str]
    instance_id: pulumi.Input[str]
    zone: str
    project: str
    timeout_s: int
    config_hash: str


def gate_command(instance: str, zone: str, project: str, timeout_s: int) -> str:
    args = ["gate", "--instance", instance, "--zone", zone, "--project", project, "--timeout", str(timeout_s)]
    return f"{GATE_PYTHON} -m tpuserve " + " ".join(shlex.quote(a) for a in args)


def last_json_line(stdout: str) -> dict[str, Any]:
    """The gate ends its output with one JSON verdict line; everything before it is for humans."""
    lines = [line for line in stdout.strip().splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


class ReadinessGate(pulumi.ComponentResource):
    """Runs `tpuserve gate --instance ...` (a local command: it polls the VM's guest attributes through the Compute
    API until the VM reports `serving`, or fails at once with the reason). Re-runs when the VM is replaced or the
    serving config changes. A local command rather than a dynamic provider: its progress streams into `pulumi up`,
    and the gate is the same CLI users run by hand."""

    timeline: pulumi.Output[dict[str, Any]]

    def __init__(self, name: str, args: ReadinessGateArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gcp:ReadinessGate", name, None, opts)
        command = local.Command(
            name,
            create=pulumi.Output.from_input(args.instance_name).apply(
                lambda instance: gate_command(instance, args.zone, args.project, args.timeout_s)),
            triggers=[args.instance_id, args.config_hash],
            opts=pulumi.ResourceOptions(parent=self, custom_timeouts=pulumi.CustomTimeouts(
                create=f"{args.timeout_s + 120}s", update=f"{args.timeout_s + 120}s")))
        self.timeline = command.stdout.apply(last_json_line)
        self.register_outputs({"timeline": self.timeline})
