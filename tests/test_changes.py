"""tpuserve/deploy/changes.py (what a change of inputs does to a resource, from tpuserve/data/provider-facts.json)
and the facts file itself: its shape, and that it covers every resource type the stacks declare."""

from __future__ import annotations

import json
from functools import cache

from tests.pulumi_harness import run_stack, stack_file_config

# Every stack the project ships, plus the settings that add resource types of their own (an hfToken makes the
# Secret and its version; the router target is what `tpuserve fleet` deploys).
ROUTER_REPLICAS = ["dev-r1=http://10.164.0.11:8000/v1"]
STACK_VARIANTS = {
    "dev": ("dev", {}),
    "prod": ("prod", {}),
    "gke": ("gke", {}),
    "local": ("local", {}),
    "dev-router": ("dev", {"target": "router", "routerMasterKeySecretId": "litellm-master-key",
                           "routerReplicas": json.dumps(ROUTER_REPLICAS)}),
    "dev-token": ("dev", {"hfTokenSecretId": "", "hfToken": "hf_not_a_real_token"}),
}


@cache
def declared_resource_types() -> frozenset[str]:
    """Custom resource types (components excluded) of every variant, run under mocks."""
    types: set[str] = set()
    for stack, (file, overrides) in STACK_VARIANTS.items():
        config = {**stack_file_config(file), **overrides}
        config = {k: v for k, v in config.items() if v != ""}
        types |= {r.type for r in run_stack(config, stack).resources if r.custom}
    return frozenset(types)
