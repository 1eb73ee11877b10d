"""Waiting for a flex-start VM in Compute Engine's queue: the facts the program and the toolkit share.

`tpuserve up` inserts the VM itself with a wait time (pulumi-gcp cannot) and the program adopts it; the program
learns which run it is from the environment of that one `pulumi up`, never from saved stack config (a later bare
`pulumi up` then always declares the VM). Why and what it costs: docs/getting-a-tpu.md.
"""

from __future__ import annotations

import json
import os
import re
from importlib import resources

# `params.requestValidForDuration` of instances.insert: "between 90 seconds (90) and two hours (7200)" for a workload
# with strict zonal requirements, 0 = "only allocates resources if they are immediately available" (Google, AI
# Hypercomputer "Create a VM", flex-start tab); from 90 s on the VM waits as PENDING ("Compute Engine instance
# lifecycle", https://cloud.google.com/compute/docs/instances/instance-lifecycle).
QUEUE_MIN_S = 90
QUEUE_MAX_S = 7200

# Set by `tpuserve up` for one `pulumi up` each: "1" declares everything but the VM (and what needs it: the gate,
# the monitoring) and exports the VM's insert body; an instance id declares the VM adopting that instance (import_).
WITHHOLD_VM_ENV = "TPUSERVE_WITHHOLD_VM"
ADOPT_VM_ENV = "TPUSERVE_ADOPT_VM"
# Set by tpuserve for every `pulumi` it runs: the program's capacity hint stays quiet (tpuserve says what it does).
DRIVER_ENV = "TPUSERVE_DRIVER"

# A flex-start VM's max run: tpuserve/data/flex-start.json, with its source (the policy pack reads it too).
RUN_LIMITS = json.loads(resources.files("tpuserve").joinpath("data/flex-start.json").read_text())
MIN_RUN_S, MAX_RUN_S = RUN_LIMITS["minRunSeconds"], RUN_LIMITS["maxRunSeconds"]

ZONE_NAME = r"[a-z]+-[a-z]+[0-9]+-[a-z0-9]+"
# Out of capacity in a zone, in the provider's and Google's words (tests/test_capacity.py: one real text per branch).
CAPACITY = re.compile(rf"ZONE_RESOURCE_POOL_EXHAUSTED|does not have enough resources available to fulfill the "
                      rf"request|\bresource_availability\b|is currently unavailable in the {ZONE_NAME} zone|"
                      rf"There is no more capacity in the zone")


def withheld() -> bool:
    return os.environ.get(WITHHOLD_VM_ENV) == "1"


def adopted_id() -> str:
    return os.environ.get(ADOPT_VM_ENV, "")


def instance_id(project: str, zone: str, name: str) -> str:
    """The provider's id of an instance, which `import_` takes (google_compute_instance's import format
    projects/{{project}}/zones/{{zone}}/instances/{{name}})."""
    return f"projects/{project}/zones/{zone}/instances/{name}"


def queue_hint(stack: str) -> str:
    return (f"no TPU free in this zone now: `tpuserve up --stack {stack}` waits in Compute Engine's queue for a chip "
            f"(up to {QUEUE_MAX_S // 3600} h); a bare `pulumi up` only takes one that is free this moment")
