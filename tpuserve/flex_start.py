"""Waiting for a flex-start VM in Compute Engine's queue: the facts the program and the toolkit share. `tpuserve up`
inserts the VM itself (pulumi-gcp cannot wait) and one `pulumi up` adopts it (docs/getting-a-tpu.md)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any

from tpuserve.durations import timestamp

from tpuserve.zones import ZONE_NAME

# instances.insert `params.requestValidForDuration`: "between 90 seconds (90) and two hours (7200)" (AI Hypercomputer
# "Create a VM", flex-start tab); the VM waits as PENDING meanwhile (docs/design/core.md#flex-start).
QUEUE_MIN_S = 90
QUEUE_MAX_S = 7200

# Set by `tpuserve up` for one `pulumi up` each, never saved in stack config: "1" declares everything but the VM and
# what needs it (exporting its insert body); an instance id declares the VM adopting that instance (import_).
WITHHOLD_VM_ENV = "TPUSERVE_WITHHOLD_VM"
ADOPT_VM_ENV = "TPUSERVE_ADOPT_VM"
# Set by tpuserve for every `pulumi` it runs: the program's capacity hint stays quiet (tpuserve says what it does).
DRIVER_ENV = "TPUSERVE_DRIVER"

# A flex-start VM's max run: tpuserve/data/flex-start.json, with its source (the policy pack reads it too).
RUN_LIMITS = json.loads(resources.files("tpuserve").joinpath("data/flex-start.json").read_text())
MIN_RUN_S, MAX_RUN_S = RUN_LIMITS["minRunSeconds"], RUN_LIMITS["maxRunSeconds"]

# Out of capacity in a zone, in the provider's and Google's words (tests/cli/test_capacity.py: one real text per branch).
CAPACITY = re.compile(rf"ZONE_RESOURCE_POOL_EXHAUSTED|does not have enough resources available to fulfill the "
                      rf"request|\bresource_availability\b|is currently unavailable in the {ZONE_NAME} zone|"
                      rf"There is no more capacity in the zone")


def withheld() -> bool:
    return os.environ.get(WITHHOLD_VM_ENV) == "1"


def adopted_id() -> str:
    return os.environ.get(ADOPT_VM_ENV, "")


def instance_id(project: str, zone: str, name: str) -> str:
    """The id `import_` takes: google_compute_instance's import format."""
    return f"projects/{project}/zones/{zone}/instances/{name}"


def queue_hint(stack: str) -> str:
    return (f"no TPU free in this zone now: `tpuserve up --stack {stack}` waits in Compute Engine's queue for a chip "
            f"(up to {QUEUE_MAX_S // 3600} h); a bare `pulumi up` only takes one that is free this moment")


def started_at(instance: Mapping[str, Any]) -> datetime | None:
    return timestamp(instance.get("lastStartTimestamp") or instance.get("creationTimestamp"))


def deletion_at(instance: Mapping[str, Any]) -> datetime | None:
    """When the run limit deletes the VM: scheduling.terminationTime, else the last start + maxRunDuration."""
    scheduling = instance.get("scheduling") or {}
    limit, start = scheduling.get("maxRunDuration"), started_at(instance)
    if scheduling.get("terminationTime") or not limit or start is None:
        return timestamp(scheduling.get("terminationTime"))
    return start + timedelta(seconds=int(limit.get("seconds", 0)), microseconds=int(limit.get("nanos", 0)) // 1000)


def clock(moment: datetime | str | None) -> str:
    """A moment (or its RFC 3339 text) as every command prints it: '2026-11-29 06:00 UTC'."""
    moment = timestamp(moment) if isinstance(moment, str) else moment
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if moment else "?"
