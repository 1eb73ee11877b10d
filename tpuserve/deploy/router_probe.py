"""Did a replica answer a real completion through the fleet's router? Read from the router VM's guest attributes.

Whenever the router's agent (vm/router_agent.py) has its proxies serving a config, it sends one chat completion
through a proxy pinned to each deployment of that config (LiteLLM routes a request whose model is a deployment id to
that deployment alone) and writes what each answered as the guest attribute `answered`:
`{"config": <config digest>, "deployments": {<replica stack>: "ok" | <why not>}}`, before it reports `config-hash`.
So once the router stack's `pulumi up` (whose gate waits for that hash) returned, the answer of every replica it
routes to is there to read, under the digest the stack exported as `routerConfigHash`. `tpuserve fleet renew`
reads it for a successor before it drains the replica the successor replaces: the router reaches the new replica
with its address and key, not only the replica's own readiness check. It is read through the Compute API, as `fleet
status` reads the router, so it needs no tunnel and no master key on the machine that runs the fleet.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import requests

from tpuserve.deploy.gce import ComputeApiError, ComputeClient, Instance
from tpuserve.facts import GUEST_ATTRIBUTE_NAMESPACE

ANSWERED = "answered"  # vm/router_agent.py ANSWERED
OK = "ok"


def answered_through_router(compute: ComputeClient, router: Mapping[str, Any], replica: str,
                            project: str = "") -> tuple[bool, str]:
    """(whether `replica` answered a completion through the router serving the config of the router stack's
    outputs `router`, what was found)."""
    if not router.get("instanceName"):
        return False, "the router stack has no VM"
    instance = Instance(str(router.get("project") or project), str(router.get("zone")), str(router["instanceName"]))
    try:
        attributes = compute.guest_attributes(instance, GUEST_ATTRIBUTE_NAMESPACE)
    except (ComputeApiError, requests.RequestException) as err:
        return False, f"could not read the router's guest attributes ({err})"
    try:
        answered = json.loads(attributes.get(ANSWERED) or "null")
        config, deployments = answered["config"], answered["deployments"]
    except (ValueError, KeyError, TypeError):
        return False, "the router reports no answers (its agent predates the check, or never served this config)"
    expected = router.get("routerConfigHash")
    if config != expected:
        return False, f"the router's answers are for config {config}, not {expected}"
    result = deployments.get(replica) if isinstance(deployments, dict) else None
    if result is None:
        return False, f"the router did not ask {replica} (it routes to {', '.join(deployments or {}) or 'nothing'})"
    return result == OK, "answered a completion through the router" if result == OK else str(result)
