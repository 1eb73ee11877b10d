"""The policy pack's rules on the resources the real program declares under Pulumi mocks (dev and prod stacks, and
a token-secret variant), and on unsafe variants made by mutating those captured inputs. No Pulumi engine: each
rule's `validate` is called the way the analyzer calls it, with the stack's policy config file.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulumi_gcp
import pytest
from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)

from tpuserve.names import stack_labels
from policy import rules
from tests.fakes.pulumi_harness import ROOT, PROJECT, Resource, run_stack, stack_file_config, stack_file_run

POLICY_CONFIG_DIR = ROOT / "policy" / "config"
STACKS = ("dev", "prod")
DEFAULT_SA = "123456789012-compute@developer.gserviceaccount.com"


@dataclasses.dataclass(frozen=True)
class Captured:
    stack: str
    resources: tuple[Resource, ...]

    def one(self, type_token: str, name_part: str = "") -> Resource:
        found = [r for r in self.resources if r.type == type_token and name_part in r.name]
        assert len(found) == 1, f"expected one {type_token} {name_part!r}, found {[r.name for r in found]}"
        return found[0]


@functools.cache
def capture(stack: str, **overrides: str) -> Captured:
    """What the program declares for `stack`, made once per process: it does not depend on the rules, and under
    mutation testing (mutmut forks each mutant's test run from the process that collected its stats) every mutant
    of the rules reuses it. Callers copy inputs before changing them."""
    run = run_stack({**stack_file_config(stack), **overrides}, stack) if overrides else stack_file_run(stack)
    return Captured(stack, tuple(r for r in run.resources if r.custom))


@pytest.fixture(scope="module")
def captured() -> dict[str, Captured]:
    """dev and prod as declared, plus dev with an `hfToken` so the stack also creates its Secret."""
    return {**{stack: capture(stack) for stack in STACKS},
            "dev+token": capture("dev", hfTokenSecretId="", hfToken="hf_policy_test")}


def policy_config(stack: str) -> dict[str, Any]:
    return json.loads((POLICY_CONFIG_DIR / f"{stack}.json").read_text())


def violations(resource: Resource, stack: str, config: dict[str, Any] | None = None,
               props: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """Every rule's messages for one resource, keyed by policy name (rules with no findings are left out)."""
    config = policy_config(stack) if config is None else config
    found: dict[str, list[str]] = {}
    opts = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
    for policy in rules.POLICIES:
        args = ResourceValidationArgs(resource.type, resource.inputs if props is None else props,
                                      f"urn:pulumi:{stack}::{PROJECT}::{resource.type}::{resource.name}",
                                      resource.name, opts, None, config.get(policy.name, {}))
        policy.validate(args, lambda message, urn=None, name=policy.name: found.setdefault(name, []).append(message))
    return found


@pytest.mark.parametrize("run_name", ["dev", "prod", "dev+token"])
def test_declared_stacks_pass_every_rule(captured: dict[str, Captured], run_name: str) -> None:
    run = captured[run_name]
    assert {r.name: violations(r, run.stack) for r in run.resources} == {r.name: {} for r in run.resources}


def test_every_rule_is_mandatory_and_uniquely_named() -> None:
    assert all(isinstance(p, ResourceValidationPolicy) for p in rules.POLICIES)
    assert {p.enforcement_level for p in rules.POLICIES} == {EnforcementLevel.MANDATORY}
    assert len({p.name for p in rules.POLICIES}) == len(rules.POLICIES)


def test_policy_configs_only_configure_known_settings() -> None:
    schemas = {p.name: set(p.config_schema.properties) if p.config_schema else set() for p in rules.POLICIES}
    for path in sorted(POLICY_CONFIG_DIR.glob("*.json")):
        for policy, settings in json.loads(path.read_text()).items():
            assert set(settings) <= schemas[policy], f"{path.name}: {policy}"


Mutation = Callable[[dict[str, Any]], None]


def set_path(path: str, value: Any) -> Mutation:
    """A mutation that sets a dotted path ('scheduling.maxRunDuration.seconds', 'networkInterfaces.0.x')."""
    def mutate(props: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node: Any = props
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[int(leaf) if isinstance(node, list) else leaf] = value
    return mutate


def delete_path(path: str) -> Mutation:
    def mutate(props: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node: Any = props
        for part in parents:
            node = node[part]
        del node[leaf]
    return mutate


INSTANCE, FIREWALL, IAM_MEMBER = rules.INSTANCE, rules.FIREWALL, rules.PROJECT_IAM_MEMBER
UNSAFE = {
    "firewall open to the internet": (FIREWALL, "", set_path("sourceRanges", ["0.0.0.0/0"]),
                                      "firewall-iap-sources-only"),
    "firewall adds a wider range": (FIREWALL, "", set_path("sourceRanges", ["35.235.240.0/20", "10.0.0.0/8"]),
                                    "firewall-iap-sources-only"),
    "firewall without sources": (FIREWALL, "", delete_path("sourceRanges"), "firewall-iap-sources-only"),
    "firewall admits tagged VMs": (FIREWALL, "", set_path("sourceTags", ["bastion"]), "firewall-iap-sources-only"),
    "ephemeral external IP": (INSTANCE, "", set_path("networkInterfaces.0.accessConfigs", [{}]), "no-external-ip"),
    "external IPv6": (INSTANCE, "", set_path("networkInterfaces.0.ipv6AccessConfigs", [{"networkTier": "PREMIUM"}]),
                      "no-external-ip"),
    "run limit above 7 days": (INSTANCE, "", set_path("scheduling.maxRunDuration.seconds", 8 * 86400.0),
                               "flex-start-run-limits"),
    "no run limit": (INSTANCE, "", delete_path("scheduling.maxRunDuration"), "flex-start-run-limits"),
    "STOP at the end": (INSTANCE, "", set_path("scheduling.instanceTerminationAction", "STOP"),
                        "flex-start-run-limits"),
    "automatic restart": (INSTANCE, "", set_path("scheduling.automaticRestart", True), "flex-start-run-limits"),
    "automatic restart left to GCE's default": (INSTANCE, "", delete_path("scheduling.automaticRestart"),
                                                "flex-start-run-limits"),
    "100 GB boot disk": (INSTANCE, "", set_path("bootDisk.initializeParams.size", 100.0), "boot-disk-min-size"),
    "boot disk size left to the image": (INSTANCE, "", delete_path("bootDisk.initializeParams.size"),
                                         "boot-disk-min-size"),
    "default compute SA": (INSTANCE, "", set_path("serviceAccount.email", DEFAULT_SA),
                           "dedicated-vm-service-account"),
    "SA email left to GCE's default": (INSTANCE, "", delete_path("serviceAccount.email"),
                                       "dedicated-vm-service-account"),
    "project editor": (IAM_MEMBER, "logWriter", set_path("role", "roles/editor"), "no-broad-project-iam"),
    "project owner": (IAM_MEMBER, "metricWriter", set_path("role", "roles/owner"), "no-broad-project-iam"),
    "project-wide secret access": (IAM_MEMBER, "logWriter", set_path("role", "roles/secretmanager.secretAccessor"),
                                   "no-broad-project-iam"),
    "VM without labels": (INSTANCE, "", delete_path("labels"), "stack-labels"),
    "VM labelled for another stack": (INSTANCE, "", set_path("labels.stack", "prod-copy"), "stack-labels"),
    "boot disk without managed-by": (INSTANCE, "", delete_path("bootDisk.initializeParams.labels.managed-by"),
                                     "stack-labels"),
}


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("variant", sorted(UNSAFE))
def test_unsafe_variant_is_reported(captured: dict[str, Captured], stack: str, variant: str) -> None:
    type_token, name_part, mutate, policy = UNSAFE[variant]
    resource = captured[stack].one(type_token, name_part)
    props = copy.deepcopy(resource.inputs)
    mutate(props)
    assert policy in violations(resource, stack, props=props)
    assert policy not in violations(resource, stack)  # the rule fires on the mutation, not on the original


def test_secret_without_stack_labels_is_reported(captured: dict[str, Captured]) -> None:
    secret = captured["dev+token"].one("gcp:secretmanager/secret:Secret")
    props = copy.deepcopy(secret.inputs)
    props["labels"] = {"env": "dev"}
    messages = violations(secret, "dev", props=props)["stack-labels"]
    assert messages == ["labels lacks the stack labels app=tpu-serve, stack=dev, managed-by=pulumi"]


@pytest.mark.parametrize("policy_data", [
    {"bindings": [{"role": "roles/owner", "members": ["serviceAccount:x@p.iam.gserviceaccount.com"]}]},
    {"bindings": [{"role": "roles/viewer", "members": ["group:ml@example.com"]},
                  {"role": "roles/secretmanager.admin", "members": ["serviceAccount:x@p.iam.gserviceaccount.com"]}]},
])
def test_project_iam_policy_and_binding_are_checked(policy_data: dict[str, Any]) -> None:
    broad = policy_data["bindings"][-1]
    policy = Resource(rules.PROJECT_IAM_POLICY, "policy", {"project": "p", "policyData": json.dumps(policy_data)}, True)
    binding = Resource(rules.PROJECT_IAM_BINDING, "binding", {"project": "p", **broad}, True)
    assert "no-broad-project-iam" in violations(policy, "dev")
    assert "no-broad-project-iam" in violations(binding, "dev")


def test_policy_config_is_the_only_way_to_loosen(captured: dict[str, Captured]) -> None:
    """An external IP or an extra source range passes only when the stack's policy config lists it."""
    vm, firewall = captured["dev"].one(INSTANCE), captured["dev"].one(FIREWALL)
    vm_props, fw_props = copy.deepcopy(vm.inputs), copy.deepcopy(firewall.inputs)
    set_path("networkInterfaces.0.accessConfigs", [{}])(vm_props)
    set_path("sourceRanges", ["35.235.240.0/20", "203.0.113.0/24"])(fw_props)
    opted_in = {"no-external-ip": {"allowExternalIp": True},
                "firewall-iap-sources-only": {"allowedSourceRanges": ["35.235.240.0/20", "203.0.113.0/24"]}}
    assert violations(vm, "dev", opted_in, vm_props) == {}
    assert violations(firewall, "dev", opted_in, fw_props) == {}
    assert "firewall-iap-sources-only" in violations(firewall, "dev", {}, fw_props)  # defaults: IAP only


def test_external_ip_stack_setting_alone_is_rejected() -> None:
    """externalIp in stack config is not an opt-in for the policy: the VM it declares is still reported."""
    vm = capture("dev", externalIp="true").one(INSTANCE)
    assert "no-external-ip" in violations(vm, "dev")


@pytest.mark.parametrize("stack", ["dev", "prod", "Feature/Long_Branch.Name"])
def test_expected_labels_match_what_the_program_sets(stack: str) -> None:
    assert rules.expected_labels(stack) == stack_labels(stack, {})
    assert rules.stack_of(f"urn:pulumi:{stack}::{PROJECT}::gcp:compute/instance:Instance::vm") == stack


def pulumi_gcp_class(type_token: str) -> type:
    """'gcp:compute/instance:Instance' -> pulumi_gcp.compute.Instance."""
    module, name = type_token.split(":")[1].split("/")[0], type_token.split(":")[2]
    return getattr(getattr(pulumi_gcp, module), name)


def takes_labels(type_token: str) -> bool:
    return "labels" in inspect.signature(pulumi_gcp_class(type_token)._internal_init).parameters


def test_labelled_types_table_matches_pulumi_gcp(captured: dict[str, Captured]) -> None:
    declared = {r.type for run in captured.values() for r in run.resources if r.type.startswith("gcp:")}
    assert {t for t in declared if takes_labels(t)} <= rules.LABELLED_TYPES
    assert all(takes_labels(t) for t in rules.LABELLED_TYPES)


def test_pack_entry_point_is_the_only_policy_pack_construction() -> None:
    sources = {path.name: path.read_text() for path in Path(rules.__file__).parent.glob("*.py")}
    assert [name for name, text in sources.items() if "PolicyPack(" in text] == ["__main__.py"]


@pytest.fixture(scope="module")
def analyzer() -> Iterator[Any]:
    """The pack started as the engine starts it (its __main__.py prints the gRPC port), with a client stub."""
    import grpc
    from pulumi.runtime.proto import analyzer_pb2_grpc

    with subprocess.Popen([sys.executable, "-u", "__main__.py"], cwd=ROOT / "policy",
                          stdout=subprocess.PIPE) as pack:
        try:
            port = int(pack.stdout.readline())
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                yield analyzer_pb2_grpc.AnalyzerStub(channel)
        finally:
            pack.terminate()


def test_pack_serves_the_rules_over_the_analyzer_protocol(captured: dict[str, Captured], analyzer: Any) -> None:
    """Real gRPC round trips into the pack: the engine's view of the same rules and of the stack's policy config."""
    from google.protobuf import empty_pb2, json_format, struct_pb2
    from pulumi.runtime.proto import analyzer_pb2

    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert {p.name for p in info.policies} == {p.name for p in rules.POLICIES}
    assert {p.enforcementLevel for p in info.policies} == {analyzer_pb2.MANDATORY}

    def diagnostics(resource: Resource, props: dict[str, Any]) -> set[str]:
        request = analyzer_pb2.AnalyzeRequest(
            type=resource.type, urn=f"urn:pulumi:dev::{PROJECT}::{resource.type}::{resource.name}",
            name=resource.name, properties=json_format.ParseDict(props, struct_pb2.Struct()))
        return {d.policyName for d in analyzer.Analyze(request).diagnostics}

    vm = captured["dev"].one(INSTANCE)
    unsafe = copy.deepcopy(vm.inputs)
    set_path("networkInterfaces.0.accessConfigs", [{}])(unsafe)
    set_path("scheduling.automaticRestart", True)(unsafe)
    assert diagnostics(vm, vm.inputs) == set()
    assert diagnostics(vm, unsafe) == {"no-external-ip", "flex-start-run-limits"}

    opt_in = {"no-external-ip": analyzer_pb2.PolicyConfig(
        enforcementLevel=analyzer_pb2.MANDATORY,
        properties=json_format.ParseDict({"allowExternalIp": True}, struct_pb2.Struct()))}
    analyzer.Configure(analyzer_pb2.ConfigureAnalyzerRequest(policyConfig=opt_in))
    assert diagnostics(vm, unsafe) == {"flex-start-run-limits"}


def test_policy_limits_are_the_stacks_own():
    """The pack runs in its own venv and cannot import the program: its copies of the limits must stay equal."""
    from components import config, network
    from tpuserve import flex_start

    assert rules.IAP_SOURCE_RANGE == network.IAP_SOURCE_RANGE
    assert rules.MIN_BOOT_DISK_GB == config.MIN_BOOT_DISK_GB
    assert rules.MAX_FLEX_START_RUN_SECONDS == flex_start.MAX_RUN_S
