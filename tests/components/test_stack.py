"""The Pulumi program under mocks: every resource and every security-relevant input, for the dev and prod stacks
(compared with the expected inventories in tests/components/inventories/) and for the variants a user can configure."""

import functools
import json
import sys

import pulumi
import pytest
import yaml
from pulumi.runtime import rpc

from tests.fakes.pulumi_harness import GATE_STDOUT, ROOT, VM_IP, StackRun, run_stack, stack_file_config, stack_file_run
from components.front import front_config
from components.startup_script import render_startup_script
from tpuserve.serving import ServingConfig, config_hash, parse_mm_limits, tpu_container_run_args, vllm_serve_args

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
    return request.param, stack_file_run(request.param)


def test_stack_matches_its_inventory(stack_run):
    stack, run = stack_run
    inventory = yaml.safe_load((ROOT / "tests" / "components" / "inventories" / f"{stack}.yaml").read_text())
    counts = {}
    for resource in run.resources:
        counts[resource.type] = counts.get(resource.type, 0) + 1
    assert counts == inventory["counts"]
    for type_token, expected in inventory["values"].items():
        assert_subset(expected, run.one(type_token).inputs, type_token)


def served(run) -> dict:
    return json.loads(run.one(INSTANCE).inputs["metadata"]["tpu-serve-config"])


def test_vm_has_no_external_ip_and_carries_boot_logic_served_config_and_supervisor_in_metadata(stack_run):
    stack, run = stack_run
    vm = run.one(INSTANCE).inputs
    assert "accessConfigs" not in vm["networkInterfaces"][0]
    assert "metadataStartupScript" not in vm  # ForceNew in pulumi-gcp: a serving change would replace the VM
    assert sorted(vm["metadata"]) == ["enable-guest-attributes", "enable-oslogin", "startup-script",
                                      "tpu-serve-boot-image", "tpu-serve-config", "tpu-serve-supervisor"]
    assert vm["metadata"]["tpu-serve-boot-image"] == vm["bootDisk"]["initializeParams"]["image"]
    assert vm["metadata"]["startup-script"] == render_startup_script(cache_disk=True)
    serving = ServingConfig(mm_limits=parse_mm_limits(stack_file_config(stack)["multimodalLimits"]))
    config = served(run)
    digest = config_hash(serving)
    assert config["config_hash"] == digest == run.outputs["configHash"]
    [engine] = config["engines"]
    assert engine == {"name": "vllm", "url": "http://127.0.0.1:8000",
                      "docker_run_args": tpu_container_run_args(serving, digest)}
    assert engine["docker_run_args"][-len(vllm_serve_args(serving)):] == vllm_serve_args(serving)
    assert "front" not in config  # one engine takes the port itself
    assert config["hf_token_secret"].startswith("projects/my-ml-") and config["hf_token_secret"].endswith(
        "/secrets/hf-token")
    assert config["machine_type"] == "ct6e-standard-1t"
    assert config["compile_cache_bucket"] == f"{stack_file_config(stack)['project']}-tpu-serve-{stack}-cache"
    bundle = json.loads(vm["metadata"]["tpu-serve-supervisor"])
    assert sorted(bundle["files"]) == ["cache_disk.py", "compile_cache.py", "facts.json", "guest_state.py",
                                      "hf_token.py", "ops-agent-install.sh", "ops-agent.yaml", "readycheck.py", "supervisor.py"]
    # Compute Engine's metadata limits: 256 KB a value, 512 KB in all.
    sizes = [len(value.encode()) for value in vm["metadata"].values()]
    assert max(sizes) < 256 * 1024 and sum(sizes) < 512 * 1024


@functools.cache
def valid_run(*changes: tuple[str, str]) -> StackRun:
    """VALID with `changes`, run once per process (the tests below compare the same baseline, and only read)."""
    return run_stack({**VALID, **dict(changes)})


def instance_inputs_for(config: dict) -> dict:
    return valid_run(*sorted(config.items())).one(INSTANCE).inputs


@pytest.mark.parametrize("change", [
    {"maxModelLen": "32768"},
    {"multimodalLimits": '{"image":4}'},
    {"model": "google/gemma-4-E4B-it"},
    {"containerImage": "vllm/vllm-tpu@sha256:" + "0" * 64},
    {"extraArgs": '["--max-num-seqs","64"]', "reasoningParser": ""},
], ids=["flag", "modalities", "model", "image", "extra-args"])
def test_a_serving_change_touches_only_the_served_config_key(change):
    """Everything else equal, the Instance's inputs differ in metadata.tpu-serve-config alone: pulumi-gcp updates
    metadata in place (setMetadata), so the VM, its flex-start grant and its max-run clock are kept."""
    before, after = instance_inputs_for({}), instance_inputs_for(change)
    assert {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} == {"metadata"}
    differing = {k for k in before["metadata"] if before["metadata"][k] != after["metadata"].get(k)}
    assert differing == {"tpu-serve-config"}
    assert "metadataStartupScript" not in after


@pytest.mark.parametrize("change, replaced_by", [
    ({"machineType": "ct6e-standard-4t"}, "machineType"),
    ({"zone": "us-east1-d"}, "zone"),
    ({"bootDiskSizeGb": "300"}, "bootDisk"),
])
def test_machine_changes_still_change_inputs_that_replace_the_vm(change, replaced_by):
    before, after = instance_inputs_for({}), instance_inputs_for(change)
    assert before[replaced_by] != after[replaced_by]
    assert before["metadata"]["startup-script"] == after["metadata"]["startup-script"]


def test_the_cache_disk_and_bucket_are_kept_adopted_caches_in_the_vms_zone():
    run = valid_run()
    bucket, disk = sorted((r for r in run.of_type("pulumi-python:dynamic:Resource") if "-cache-" in r.name),
                          key=lambda r: r.name)
    assert disk.name == "tpu-serve-dev-cache-disk" and bucket.name == "tpu-serve-dev-cache-bucket"
    assert {k: disk.inputs[k] for k in ("project", "zone", "name", "sizeGb", "type")} == {
        "project": "proj-1", "zone": "europe-west4-a", "name": "tpu-serve-dev-cache", "sizeGb": 100.0,
        "type": "hyperdisk-balanced"}
    assert disk.inputs["labels"] == {"app": "tpu-serve", "stack": "dev", "managed-by": "pulumi",
                                     "tpu-serve-cache": "dev"}
    assert {k: bucket.inputs[k] for k in ("project", "name", "location")} == {
        "project": "proj-1", "name": "proj-1-tpu-serve-dev-cache", "location": "europe-west4"}
    assert run.one(INSTANCE).inputs["attachedDisks"] == [{
        "source": "projects/proj-1/zones/europe-west4-a/disks/tpu-serve-dev-cache", "deviceName": "tpu-serve-cache",
        "mode": "READ_WRITE"}]
    grant = run.one("gcp:storage/bucketIAMMember:BucketIAMMember").inputs
    assert grant == {"bucket": "proj-1-tpu-serve-dev-cache", "role": "roles/storage.objectUser",
                     "member": "serviceAccount:tpu-serve-dev@proj-1.iam.gserviceaccount.com"}
    assert run.outputs["cacheDisk"] == "projects/proj-1/zones/europe-west4-a/disks/tpu-serve-dev-cache"
    assert run.outputs["cacheBucket"] == "proj-1-tpu-serve-dev-cache"
    assert run.outputs["cacheMonthlyCostUsd"] == pytest.approx(8.0)  # 100 GB x $0.08, at the free performance
    assert (disk.inputs["provisionedThroughput"], disk.inputs["provisionedIops"]) == (140, 3000)


def test_no_cache_disk_and_no_bucket_when_turned_off():
    run = run_stack({**VALID, "cacheDiskSizeGb": "0", "compileCacheBucket": "false"})
    assert [r.name for r in run.of_type("pulumi-python:dynamic:Resource")] == ["tpu-serve-dev-metrics"]
    assert "attachedDisks" not in run.one(INSTANCE).inputs
    assert "readonly EXPECT_CACHE_DISK=false" in run.one(INSTANCE).inputs["metadata"]["startup-script"]
    assert served(run)["compile_cache_bucket"] == ""
    assert run.outputs["cacheMonthlyCostUsd"] == 0


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
    # The Router names its stack: other stacks in the region say whose NAT serves them (tpuserve/deploy/nat.py).
    assert run.one(ROUTER).inputs["description"].startswith("tpu-serve stack dev: Cloud NAT")


def test_no_nat_where_another_stacks_nat_serves_the_region():
    """`tpuserve up` lists the regions another stack's NAT serves (cloudNatSkipRegions): none is made there, while a
    listed region the VM is not in changes nothing."""
    run = run_stack({**VALID, "zone": "us-east1-d", "cloudNatSkipRegions": '["us-east1"]'})
    assert run.of_type(NAT) == [] and run.of_type(ROUTER) == []
    run = run_stack({**VALID, "zone": "us-east1-d", "cloudNatSkipRegions": '["europe-west4"]'})
    assert run.one(NAT).inputs["region"] == "us-east1"


def test_the_gate_outlasts_the_vms_own_deadline(stack_run):
    """Issue #11, item 13: the VM's clock (readinessTimeout 25m = 1500 s) starts when vLLM starts loading, after
    guest boot (180 s), a Docker install (300 s), the image pull (900 s) and the token fetch with a fresh IAM
    grant (600 s); with 120 s to read the VM's report the gate waits 3600 s, so the VM fails first, with its
    reason, and the gate prints it."""
    _, run = stack_run
    served = json.loads(run.one(INSTANCE).inputs["metadata"]["tpu-serve-config"])
    assert served["ready_timeout_s"] == 1500  # the supervisor's own deadline, from the container's start
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
    assert canary not in json.dumps(run.one(INSTANCE).inputs["metadata"])
    assert canary not in json.dumps(run.outputs)


def test_disk_and_run_limit_follow_config():
    run = run_stack({**VALID, "bootDiskSizeGb": "500", "maxRunDuration": "2d"})
    vm = run.one(INSTANCE).inputs
    assert vm["bootDisk"]["initializeParams"]["size"] == 500.0
    assert vm["bootDisk"]["initializeParams"]["type"] == "hyperdisk-balanced"
    assert vm["scheduling"]["maxRunDuration"] == {"seconds": 172800.0}
    assert run.outputs["worstCaseCostUsd"] == pytest.approx(48 * 1.35)


def test_a_four_chip_vm_serves_four_engines_of_the_default_model_behind_one_port():
    """E2B fits one chip (tensorParallelSize auto = 1): four engines, one per chip, HAProxy on 8000 in front."""
    run = run_stack({**VALID, "machineType": "ct6e-standard-4t"})
    serving = ServingConfig(chips=4, tensor_parallel_size=1)
    assert (run.outputs["engines"], run.outputs["tensorParallelSize"]) == (4, 1)
    assert run.outputs["vllmArgs"] == vllm_serve_args(serving)  # engine 0's
    assert run.outputs["endpoint"] == f"http://{VM_IP}:8000/v1"
    config = served(run)
    assert [(e["name"], e["url"]) for e in config["engines"]] == [(f"vllm-{i}", f"http://127.0.0.1:{8100 + i}")
                                                                  for i in range(4)]
    for index, engine in enumerate(config["engines"]):
        argv = engine["docker_run_args"]
        assert argv == tpu_container_run_args(serving, config["config_hash"], engine=index)
        assert argv[argv.index("--tensor-parallel-size") + 1] == "1" and f"TPU_VISIBLE_CHIPS={index}" in argv
    assert config["server_url"] == "http://127.0.0.1:8000"
    assert front_config(serving) == config["front"] and "bind :8000" in config["front"]
    agent = yaml.safe_load(json.loads(run.one(INSTANCE).inputs["metadata"]["tpu-serve-supervisor"])["files"][
        "ops-agent.yaml"])
    [scrape] = agent["metrics"]["receivers"]["vllm"]["config"]["scrape_configs"]
    assert scrape["static_configs"] == [{"targets": [f"localhost:{8100 + i}"], "labels": {"engine": f"vllm-{i}"}}
                                        for i in range(4)]
    assert run.outputs["worstCaseCostUsd"] == pytest.approx(4 * 4 * 1.35)


def test_a_four_chip_vm_with_tensor_parallel_size_four_runs_one_engine_on_the_port():
    run = run_stack({**VALID, "machineType": "ct6e-standard-4t", "tensorParallelSize": "4"})
    assert (run.outputs["engines"], run.outputs["tensorParallelSize"]) == (1, 4)
    [engine] = served(run)["engines"]
    assert engine["name"] == "vllm" and "front" not in served(run)
    assert engine["docker_run_args"][engine["docker_run_args"].index("--tensor-parallel-size") + 1] == "4"


def test_a_gcp_stack_loads_no_other_targets_components(monkeypatch: pytest.MonkeyPatch) -> None:
    """__main__.py imports the chosen target's component only: the others bring SDKs a gcp stack never uses
    (pulumi_kubernetes, pulumi_docker), and every `pulumi preview` would import them."""
    others = ("components.gke_deployment", "components.k8s_serving", "components.local")
    for name in others:
        monkeypatch.delitem(sys.modules, name, raising=False)  # put back after the test
    run = run_stack(stack_file_config("dev"), "dev")
    assert run.outputs and [name for name in others if name in sys.modules] == []
