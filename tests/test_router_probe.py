"""tpuserve/deploy/router_probe.py reading what the router's agent wrote (vm/router_agent.py `answered`, the same
JSON the agent's own tests check it writes), through a Compute API stand-in holding the router VM's guest
attributes (the shape of `getGuestAttributes`, as tpuserve.deploy.gce.ComputeClient returns it: key -> value)."""

from __future__ import annotations

import json

import pytest
import requests

from tpuserve.deploy.gce import ComputeApiError, Instance
from tpuserve.deploy.router_probe import ANSWERED, answered_through_router
from vm import router_agent

ROUTER = {"instanceName": "tpu-serve-dev-router", "zone": "europe-west4-a", "project": "my-ml-sandbox",
          "routerConfigHash": "c0ffee0123456789"}


class Attributes:
    def __init__(self, values: dict[str, str] | Exception) -> None:
        self.values, self.asked = values, []

    def guest_attributes(self, instance: Instance, namespace: str) -> dict[str, str]:
        self.asked.append((instance, namespace))
        if isinstance(self.values, Exception):
            raise self.values
        return self.values


def answered(config: str, **deployments: str) -> dict[str, str]:
    return {router_agent.ANSWERED: json.dumps({"config": config, "deployments": deployments}), "stage": "serving"}


@pytest.mark.parametrize(("values", "expected"), [
    (answered("c0ffee0123456789", **{"dev-r1": "ok", "dev-r3": "ok"}),
     (True, "answered a completion through the router")),
    (answered("c0ffee0123456789", **{"dev-r3": "HTTP 401: Unauthorized"}), (False, "HTTP 401: Unauthorized")),
    (answered("0000000000000000", **{"dev-r3": "ok"}),  # written for the config before: says nothing of this one
     (False, "the router's answers are for config 0000000000000000, not c0ffee0123456789")),
    (answered("c0ffee0123456789", **{"dev-r1": "ok"}),
     (False, "the router did not ask dev-r3 (it routes to dev-r1)")),
    ({"stage": "serving"}, (False, "the router reports no answers (its agent predates the check, or never served "
                                   "this config)")),
])
def test_the_successor_counts_as_answered_only_for_the_config_the_router_stack_serves(values, expected) -> None:
    compute = Attributes(values)
    assert answered_through_router(compute, ROUTER, "dev-r3") == expected  # type: ignore[arg-type]
    assert compute.asked == [(Instance("my-ml-sandbox", "europe-west4-a", "tpu-serve-dev-router"), "tpu-serve")]


def test_an_unreadable_router_or_no_router_vm_is_not_an_answer() -> None:
    for error in (ComputeApiError(403, "Required 'compute.instances.getGuestAttributes' permission"),
                  requests.ConnectionError("refused")):
        ok, why = answered_through_router(Attributes(error), ROUTER, "dev-r3")  # type: ignore[arg-type]
        assert not ok and why.startswith("could not read the router's guest attributes")
    assert answered_through_router(Attributes({}), {}, "dev-r3") == (False, "the router stack has no VM")  # type: ignore[arg-type]
    assert ANSWERED == router_agent.ANSWERED  # the key both sides name (tpuserve cannot import vm/)
