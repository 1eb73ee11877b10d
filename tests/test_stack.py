"""The Pulumi program under mocks: every resource and every security-relevant input, for the dev and prod stacks
(compared with the expected inventories in tests/inventories/) and for the variants a user can configure."""

import json
import shlex

import pulumi
import pytest
import yaml
from pulumi.runtime import rpc

from tests.pulumi_harness import GATE_STDOUT, ROOT, VM_IP, run_stack, stack_file_config
from tpuserve.serving import ServingConfig, config_hash, parse_mm_limits, vllm_serve_args

INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"
NAT = "gcp:compute/routerNat:RouterNat"
ROUTER = "gcp:compute/router:Router"
VALID = {"project": "proj-1", "hfTokenSecretId": "hf-token"}


def assert_subset(expected, actual, path="") -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected a mapping, got {actual!r}"
        for key, value in expected.items():
            assert key in actual, f"{path}.{key} missing"
            assert_subset(value, actual[key], f"{path}.{key}")
    elif isinstance(expected, list) and expected and isinstance(expected[0], dict):
        assert len(actual) == len(expected), f"{path}: {actual!r}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_subset(e, a, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: expected {expected!r}, got {actual!r}"


@pytest.fixture(scope="module", params=["dev", "prod"])
def stack_run(request):
    return request.param, run_stack(stack_file_config(request.param), request.param)


def test_stack_matches_its_inventory(stack_run):
    stack, run = stack_run
    inventory = yaml.safe_load((ROOT / "tests" / "inventories" / f"{stack}.yaml").read_text())
    counts = {}
    for resource in run.resources:
        counts[resource.type] = counts.get(resource.type, 0) + 1
    assert counts == inventory["counts"]
    for type_token, expected in inventory["values"].items():
        assert_subset(expected, run.one(type_token).inputs, type_token)


def test_vm_has_no_external_ip_and_runs_the_rendered_script(stack_run):
    stack, run = stack_run
    vm = run.one(INSTANCE).inputs
    assert "accessConfigs" not in vm["networkInterfaces"][0]
    script = vm["metadataStartupScript"]
    serving = ServingConfig(mm_limits=parse_mm_limits(stack_file_config(stack)["multimodalLimits"]))
    assert "readonly DOCKER_RUN_ARGS=(" in script
    assert " ".join(shlex.quote(a) for a in vllm_serve_args(serving)) in script
    assert shlex.quote(config_hash(serving)) in script
    assert "projects/my-ml-" in script and "/secrets/hf-token" in script


def test_firewall_targets_exactly_the_vm(stack_run):
    _, run = stack_run
    assert run.one(FIREWALL).inputs["targetTags"] == run.one(INSTANCE).inputs["tags"]


def test_only_write_roles_at_project_level(stack_run):
    _, run = stack_run
    roles = sorted(r.inputs["role"] for r in run.of_type("gcp:projects/iAMMember:IAMMember"))
    assert roles == ["roles/logging.logWriter", "roles/monitoring.metricWriter"]
    sa = run.one("gcp:serviceaccount/account:Account").inputs
    assert "compute@developer" not in run.one(INSTANCE).inputs["serviceAccount"]["email"]
    assert run.one(INSTANCE).inputs["serviceAccount"]["email"].startswith(sa["accountId"] + "@")


def test_outputs(stack_run):
    stack, run = stack_run
    out = run.outputs
    project = stack_file_config(stack)["project"]
    assert out["endpoint"] == f"http://{VM_IP}:8000/v1"
    assert out["iapTunnelCommand"] == (f"gcloud compute start-iap-tunnel tpu-serve-{stack} 8000 "
                                       f"--local-host-port=localhost:8000 --zone=europe-west4-a --project={project}")
    assert out["sshCommand"] == f"gcloud compute ssh tpu-serve-{stack} --zone=europe-west4-a --project={project} " \
                                "--tunnel-through-iap"
    assert (out["instanceName"], out["zone"], out["project"], out["internalIp"]) == \
        (f"tpu-serve-{stack}", "europe-west4-a", project, VM_IP)
    assert out["model"] == "google/gemma-4-E2B-it"
    serving = ServingConfig(mm_limits=parse_mm_limits(stack_file_config(stack)["multimodalLimits"]))
    assert out["vllmArgs"] == vllm_serve_args(serving)
    assert out["configHash"] == config_hash(serving)
    assert out["maxRunSeconds"] == 4 * 3600
    assert out["worstCaseCostUsd"] == pytest.approx(4 * 1.35)
    assert out["expectedExpiry"] == "2026-11-29T06:00:00-08:00"  # created 02:00-08:00 + 4 h
    assert out["bootTimeline"] == json.loads(GATE_STDOUT.strip().splitlines()[-1])


def test_readiness_gate_watches_this_vm_and_reruns_on_change(stack_run):
    stack, run = stack_run
    gate = run.one("command:local:Command").inputs
    project = stack_file_config(stack)["project"]
    assert gate["create"].endswith(f"-m tpuserve gate --instance tpu-serve-{stack} --zone europe-west4-a --project "
                                   f"{project} --config-hash {run.outputs['configHash']} --timeout 3600")
    assert gate["triggers"] == ["4242424242", run.outputs["configHash"]]


def test_nat_follows_the_zones_region_and_a_region_change_replaces_it_old_one_first():
    """The sweep may move the VM to another region: Router and NAT go with it, and the old ones are deleted before the
    new ones are created, so a failed create in the new region leaves no NAT behind in the old one."""
    options = {}

    def record(args: pulumi.ResourceTransformationArgs) -> None:
        options[args.type_] = args.opts

    run = run_stack({**VALID, "zone": "us-east1-d"}, transformation=record)
    assert run.one(INSTANCE).inputs["zone"] == "us-east1-d"
    for type_token in (ROUTER, NAT):
        assert run.one(type_token).inputs["region"] == "us-east1"
        assert options[type_token].replace_on_changes == ["region"]
        assert options[type_token].delete_before_replace is True


def test_the_gate_outlasts_the_vms_own_deadline(stack_run):
    """Issue #11, item 13: the VM's clock (readinessTimeout 25m = 1500 s) starts when vLLM starts loading, after
    guest boot (180 s), a Docker install (300 s), the image pull (900 s) and the token fetch with a fresh IAM
    grant (600 s); with 120 s to read the VM's report the gate waits 3600 s, so the VM fails first, with its
    reason, and the gate prints it."""
    _, run = stack_run
    script = run.one(INSTANCE).inputs["metadataStartupScript"]
    assert "readonly READY_TIMEOUT_S=1500\n" in script
    command = run.one("command:local:Command")
    assert command.inputs["create"].endswith("--timeout 3600")


def test_external_ip_opt_in_adds_an_access_config_and_drops_nat():
    run = run_stack({**VALID, "externalIp": "true"})
    assert run.one(INSTANCE).inputs["networkInterfaces"][0]["accessConfigs"] == [{}]
    assert run.of_type(NAT) == [] and run.of_type("gcp:compute/router:Router") == []


def test_existing_nat_can_be_reused():
    run = run_stack({**VALID, "createCloudNat": "false"})
    assert run.of_type(NAT) == []
    assert "accessConfigs" not in run.one(INSTANCE).inputs["networkInterfaces"][0]


def test_token_from_config_becomes_a_secret_the_vm_alone_can_read():
    canary = "hf_CANARYtoken0123456789"
    run = run_stack({"project": "proj-1", "hfToken": canary})
    secret = run.one("gcp:secretmanager/secret:Secret").inputs
    assert secret["secretId"] == "tpu-serve-dev-hf-token" and secret["replication"] == {"auto": {}}
    assert secret["labels"]["app"] == "tpu-serve"
    version = run.one("gcp:secretmanager/secretVersion:SecretVersion").inputs
    # The engine receives it wrapped as a Pulumi secret: encrypted in state, masked in previews.
    assert version["secretData"] == {rpc._special_sig_key: rpc._special_secret_sig, "value": canary}
    grant = run.one("gcp:secretmanager/secretIamMember:SecretIamMember").inputs
    assert grant["secretId"] == "projects/proj-1/secrets/tpu-serve-dev-hf-token"
    assert canary not in run.one(INSTANCE).inputs["metadataStartupScript"]
    assert canary not in json.dumps(run.outputs)


def test_disk_and_run_limit_follow_config():
    run = run_stack({**VALID, "bootDiskSizeGb": "500", "maxRunDuration": "2d"})
    vm = run.one(INSTANCE).inputs
    assert vm["bootDisk"]["initializeParams"]["size"] == 500.0
    assert vm["bootDisk"]["initializeParams"]["type"] == "hyperdisk-balanced"
    assert vm["scheduling"]["maxRunDuration"] == {"seconds": 172800.0}
    assert run.outputs["worstCaseCostUsd"] == pytest.approx(48 * 1.35)


def test_a_four_chip_vm_serves_on_four_chips():
    run = run_stack({**VALID, "machineType": "ct6e-standard-4t"})
    args = run.outputs["vllmArgs"]
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert "--tensor-parallel-size 4 " in run.one(INSTANCE).inputs["metadataStartupScript"]
    assert run.outputs["worstCaseCostUsd"] == pytest.approx(4 * 4 * 1.35)
