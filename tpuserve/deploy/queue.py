"""A flex-start VM in Compute Engine's queue: inserted with `params.requestValidForDuration`, then the instance (not
the operation: docs/design/capacity.md#the-queue) followed until it runs, or a wait ends with nothing left."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import requests

from tpuserve import durations
from tpuserve.gce import ComputeApiError, ComputeClient, Instance, ok
from tpuserve.flex_start import CAPACITY, QUEUE_MAX_S, QUEUE_MIN_S

POLL_S = 30.0  # one progress line per poll; a GET every 30 s is far below Compute's read quota
RUNNING, NO_CAPACITY, FAILED = "running", "no-capacity", "failed"
GRANTED = ("PROVISIONING", "STAGING")


@dataclass(frozen=True)
class Queued:
    """How a queued VM ended: RUNNING (with its `instance`), NO_CAPACITY (no chip in time, the VM gone) or FAILED."""

    outcome: str
    zone: str
    name: str
    waited_s: float
    reason: str = ""
    instance: Mapping[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"zone": self.zone, "name": self.name, "outcome": self.outcome, "waitedSeconds": round(self.waited_s),
                "reason": self.reason or None}


def with_wait(body: Mapping[str, Any], seconds: int) -> dict[str, Any]:
    """The insert body asking Compute Engine to hold the request `seconds` (InstanceParams.requestValidForDuration)."""
    params = {**(body.get("params") or {}), "requestValidForDuration": {"seconds": str(int(seconds))}}
    return {**body, "params": params}


def wait_for(seconds_left: float) -> int:
    """The wait to ask for: what is left of ours, at most Google's 2 h; 0 when less than Google's 90 s is left."""
    wait = int(min(seconds_left, QUEUE_MAX_S))
    return wait if wait >= QUEUE_MIN_S else 0


def queue_vm(compute: ComputeClient, project: str, zone: str, body: Mapping[str, Any], wait_s: int,
             say: Callable[[str], None], poll_s: float = POLL_S) -> Queued:
    """Insert `body` in `zone` to wait up to `wait_s` (see wait_for) and follow it, a line per poll."""
    name = str(body["name"])
    target = Instance(project, zone, name)
    try:
        operation = ok(compute.session.post(compute.zonal(project, zone, "instances"), json=with_wait(body, wait_s),
                                            timeout=compute.timeout_s)).json()
    except (ComputeApiError, requests.RequestException) as err:
        return Queued(FAILED, zone, name, 0.0, f"the queued create was refused: {err}")
    started = time.time()
    say(f"queued {name} in {zone}: Compute Engine holds the request for up to {durations.human(wait_s)}")
    status = "PENDING"
    try:
        while True:
            waited = time.time() - started
            try:
                instance = compute.instance(target)
            except ComputeApiError as err:
                if err.status != 404:
                    raise
                reason = operation_error(compute, project, zone, operation) or "the request ended without a VM"
                ended = waited >= wait_s - poll_s or bool(CAPACITY.search(reason))
                return Queued(NO_CAPACITY if ended else FAILED, zone, name, waited, reason)
            status = str(instance.get("status", ""))
            if status == "RUNNING":
                say(f"granted in {zone} after {durations.human(waited)}: {name} runs")
                return Queued(RUNNING, zone, name, waited, instance=instance)
            if status == "PENDING" and waited >= wait_s + poll_s:
                # Compute Engine should have ended it by now: end it ourselves, so it can never start unwatched.
                compute.delete(project, zone, "instances", name)
                return Queued(NO_CAPACITY, zone, name, waited, f"no chip in {zone} within {durations.human(wait_s)}; "
                                                                 "the queued VM was deleted")
            if status == "PENDING":
                say(f"queued in {zone} for {durations.human(waited)}, "
                    f"{durations.human(max(wait_s - waited, 0))} left")
            elif status in GRANTED:
                say(f"granted in {zone} after {durations.human(waited)}: {status.lower()}")
            else:
                return Queued(FAILED, zone, name, waited, f"the queued VM is {status}, not starting")
            time.sleep(poll_s)
    except (KeyboardInterrupt, ComputeApiError, requests.RequestException) as err:
        if status == "PENDING":  # nobody would follow it: a VM granted later would bill unseen
            try:
                compute.delete(project, zone, "instances", name)
                say(f"deleted the queued {name} in {zone}")
            except (ComputeApiError, requests.RequestException) as failed:
                say(f"warning: could not delete the queued {name} in {zone} ({failed}): delete it by hand: "
                    f"gcloud compute instances delete {name} --zone {zone} --project {project}")
        if isinstance(err, KeyboardInterrupt):
            raise
        return Queued(FAILED, zone, name, time.time() - started, f"lost track of the queued VM: {err}")


def operation_error(compute: ComputeClient, project: str, zone: str, operation: Mapping[str, Any]) -> str:
    """The insert operation's error messages, '' when it has none (yet) or cannot be read."""
    try:
        found = compute.get_or_none(compute.zonal(project, zone, f"operations/{operation.get('name', '')}")) or {}
    except (ComputeApiError, requests.RequestException):
        return ""
    return "; ".join(str(error.get("message", "")) for error in (found.get("error") or {}).get("errors", []))
