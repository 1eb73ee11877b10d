"""Runs the real `__main__.py` under Pulumi mocks and returns every resource's inputs and the stack outputs.

Mocks are process-global, so each run installs its own fresh mocks (never at import time). Inputs arrive with
the engine's camelCase names and integers as floats; outputs a real provider computes are filled in below,
or inputs derived from them would silently be dropped.
"""

from __future__ import annotations

import contextlib
import functools
import json
import runpy
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "tpu-serve"
VM_IP = "10.150.0.7"
VM_CREATED = "2026-11-29T02:00:00.000-08:00"
LOCAL_IMAGE_ID = "sha256:5e1f0c0ffee"
# A GKE control plane as the provider reports it (documentation address range; nothing is ever contacted).
CLUSTER_ENDPOINT = "203.0.113.10"
CLUSTER_CA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCmZha2UKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo="
# `tpuserve gate` prints exactly one JSON line on stdout; stages map to seconds since the VM's first stage.
GATE_STDOUT = ('{"ready": true, "elapsed_s": 650.4, "stages": {"installing-docker": 0, "pulling-image": 21, '
               '"fetching-token": 318, "starting-server": 319, "loading-model": 321, "serving": 650}, '
               '"reason": null}\n')


@dataclass
class Resource:
    type: str
    name: str
    inputs: dict[str, Any]
    custom: bool


@dataclass
class StackRun:
    resources: list[Resource]
    outputs: dict[str, Any] = field(default_factory=dict)

    def of_type(self, type_token: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_token]

    def one(self, type_token: str) -> Resource:
        found = self.of_type(type_token)
        assert len(found) == 1, f"expected one {type_token}, found {[r.name for r in found]}"
        return found[0]


class RecordingMocks(pulumi.runtime.Mocks):
    def __init__(self, clusters: dict[str, dict[str, Any]] | None = None) -> None:
        self.resources: list[Resource] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        # Existing GKE clusters the getCluster invoke finds, by name (the shape of container.GetClusterResult).
        self.clusters = clusters or {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(Resource(args.typ, args.name, dict(args.inputs), args.custom))
        outputs = dict(args.inputs)
        if args.typ == "gcp:serviceaccount/account:Account":
            outputs["email"] = f"{args.inputs['accountId']}@{args.inputs['project']}.iam.gserviceaccount.com"
        elif args.typ == "gcp:compute/instance:Instance":
            outputs["networkInterfaces"] = [{**args.inputs["networkInterfaces"][0], "networkIp": VM_IP}]
            outputs["creationTimestamp"] = VM_CREATED
            outputs["instanceId"] = "4242424242"
        elif args.typ == "docker:index/remoteImage:RemoteImage":
            outputs["imageId"] = LOCAL_IMAGE_ID
        elif args.typ == "command:local:Command":
            outputs["stdout"] = GATE_STDOUT
        elif args.typ == "gcp:container/cluster:Cluster":
            outputs.update(endpoint=CLUSTER_ENDPOINT, masterAuth={"clusterCaCertificate": CLUSTER_CA})
        elif "metricTypes" in args.inputs:  # components/monitoring.py's MetricsWritten: every metric written
            outputs.update(ready=args.inputs["metricTypes"], reason="")
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        self.calls.append((args.token, dict(args.args)))
        if args.token == "gcp:container/getCluster:getCluster":
            return self.clusters.get(args.args["name"], {})
        return {}


def run_stack(config: dict[str, Any], stack: str = "dev", mocks: RecordingMocks | None = None,
              transformation: pulumi.ResourceTransformation | None = None) -> StackRun:
    """Run __main__.py with `config` (keys without the `tpu-serve:` prefix; objects as JSON) as stack `stack`.
    `transformation` sees every resource's options (mocks see only inputs), e.g. to check replacement options."""
    mocks = mocks or RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False)
    pulumi.runtime.set_all_config(
        {f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in config.items()},
        [f"{PROJECT}:hfToken"])
    run = StackRun(mocks.resources)

    @pulumi.runtime.test
    def program() -> pulumi.Output:
        if transformation is not None:
            pulumi.runtime.register_stack_transformation(transformation)
        deployment = runpy.run_path(str(ROOT / "__main__.py"))["deployment"]
        keys = list(deployment.outputs)
        return pulumi.Output.all(*deployment.outputs.values()).apply(
            lambda values: run.outputs.update(zip(keys, values)))

    # The SDK records the Python stack of every resource it registers (its source position, for the engine); under
    # pytest that stack is ~60 frames deep and reading it was a fifth of each run. Mocks never look at it.
    with _no_stack_traces():
        program()
    return run


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    from pulumi.runtime import resource
    from pulumi.runtime.proto import source_pb2

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(resource, "_get_stack_trace", source_pb2.StackTrace)
        yield


@functools.cache
def stack_file_run(stack: str) -> StackRun:
    """Pulumi.<stack>.yaml's run, made once per process (the Pulumi files share one, tests/conftest.py): for tests
    that only read it. A test that needs the program itself to run (what it imports) calls run_stack."""
    return run_stack(stack_file_config(stack), stack)


def stack_file_config(stack: str) -> dict[str, Any]:
    """The `tpu-serve:` settings of Pulumi.<stack>.yaml, as run_stack takes them."""
    import yaml

    data = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    prefix = f"{PROJECT}:"
    return {k[len(prefix):]: v if isinstance(v, str) else json.dumps(v)
            for k, v in data["config"].items() if k.startswith(prefix)}
