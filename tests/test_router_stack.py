"""The fleet's router stack (target router, components/router.py) under Pulumi mocks, with the settings `tpuserve
fleet` gives it: dev's own (`pulumi stack init --copy-config-from dev`) plus target, master key and two replicas.
Compared with tests/inventories/router.yaml, then the generated proxy config, the in-place metadata, the gate and
the policy pack (dev's policy config admits the router's tag, nothing else does)."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from components.deployment import fleet_tag
from components.router import config_digest, render_router_script
from tests.pulumi_harness import ROOT, VM_IP, Resource, run_stack, stack_file_config
from tests.test_policy import policy_config, violations
from tests.test_stack import assert_subset
from vm import router_agent

INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"
NAT = "gcp:compute/routerNat:RouterNat"
COMMAND = "command:local:Command"
REPLICAS = ["dev-r1=http://10.164.0.11:8000/v1", "dev-r2=http://10.132.0.12:8000/v1"]


def router_config(**overrides: str) -> dict[str, str]:
    return {**stack_file_config("dev"), "target": "router", "routerMasterKeySecretId": "litellm-master-key",
            "vllmApiKeySecretId": "vllm-api-key", "routerReplicas": json.dumps(REPLICAS), **overrides}


@pytest.fixture(scope="module")
def router_run():
    return run_stack(router_config(), "dev-router")


def test_router_stack_matches_its_inventory(router_run) -> None:
    inventory = yaml.safe_load((ROOT / "tests" / "inventories" / "router.yaml").read_text())
    counts: dict[str, int] = {}
    for resource in router_run.resources:
        counts[resource.type] = counts.get(resource.type, 0) + 1
    assert counts == inventory["counts"]
    for type_token, expected in inventory["values"].items():
        assert_subset(expected, router_run.one(type_token).inputs, type_token)
    for name, expected in inventory["named"].items():
        found = [r for r in router_run.resources if r.name == name]
        assert len(found) == 1, name
        assert_subset(expected, found[0].inputs, name)


def test_the_router_makes_nat_only_where_no_other_stacks_nat_serves() -> None:
    """`tpuserve fleet` lists the regions another stack's NAT serves (dev's own in europe-west4): the router stack
    makes NAT in the others and says which in `natRegions`; each Router names the stack that owns its NAT."""
    run = run_stack(router_config(cloudNatSkipRegions='["europe-west4"]'), "dev-router")
    regions = sorted(r.inputs["region"] for r in run.of_type(NAT))
    assert regions == ["asia-northeast1", "us-central1", "us-east1", "us-east5", "us-south1"]
    assert sorted(run.outputs["natRegions"]) == regions
    assert {r.inputs["description"].split(":")[0] for r in run.of_type("gcp:compute/router:Router")} == {
        "tpu-serve stack dev-router"}


def test_the_proxy_config_routes_least_busy_over_one_entry_per_replica(router_run) -> None:
    vm = router_run.one(INSTANCE).inputs
    config = json.loads(vm["metadata"]["litellm-config"])
    assert config["model_list"] == [
        {"model_name": "google/gemma-4-E2B-it",
         "litellm_params": {"model": "hosted_vllm/google/gemma-4-E2B-it", "api_base": "http://10.164.0.11:8000/v1",
                            "api_key": "os.environ/TPUSERVE_API_KEY"}, "model_info": {"id": "dev-r1"}},
        {"model_name": "google/gemma-4-E2B-it",
         "litellm_params": {"model": "hosted_vllm/google/gemma-4-E2B-it", "api_base": "http://10.132.0.12:8000/v1",
                            "api_key": "os.environ/TPUSERVE_API_KEY"}, "model_info": {"id": "dev-r2"}}]
    assert config["router_settings"] == {"routing_strategy": "least-busy", "num_retries": 2, "allowed_fails": 1,
                                         "cooldown_time": 30}
    assert config["general_settings"] == {"master_key": "os.environ/LITELLM_MASTER_KEY"}
    text = vm["metadata"]["litellm-config"]
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    assert router_run.outputs["routerConfigHash"] == digest == router_agent.digest(text) == config_digest(text)
    assert router_agent.deployment_ids(text) == ["dev-r1", "dev-r2"]
    assert router_run.outputs["replicas"] == ["dev-r1", "dev-r2"]
    assert router_run.outputs["endpoint"] == f"http://{VM_IP}:4000/v1"


def test_a_new_replica_set_changes_only_metadata_and_reruns_the_gate(router_run) -> None:
    """Adding a replica must not replace the router VM (in-flight requests would drop): the startup script, which
    forces a replacement, stays byte for byte; only the `litellm-config` metadata and the gate's trigger change."""
    grown = run_stack(router_config(routerReplicas=json.dumps([*REPLICAS, "dev-r3=http://10.142.0.9:8000/v1"])),
                      "dev-router")
    before, after = router_run.one(INSTANCE).inputs, grown.one(INSTANCE).inputs
    assert before["metadataStartupScript"] == after["metadataStartupScript"]
    assert {k: v for k, v in before.items() if k != "metadata"} == {k: v for k, v in after.items() if k != "metadata"}
    assert before["metadata"]["litellm-config"] != after["metadata"]["litellm-config"]
    gate_before, gate_after = router_run.one(COMMAND).inputs, grown.one(COMMAND).inputs
    new_digest = grown.outputs["routerConfigHash"]
    assert f"--config-hash {new_digest}" in gate_after["create"]
    assert new_digest in gate_after["triggers"] and new_digest not in gate_before["triggers"]
    # The fleet's firewall targets the tag every replica carries: a new replica set leaves it exactly as it was.
    assert [(r.name, r.inputs) for r in grown.of_type(FIREWALL)] == [(r.name, r.inputs)
                                                                     for r in router_run.of_type(FIREWALL)]


def test_replicas_take_vllm_requests_from_the_router_and_iap_only(router_run) -> None:
    """Allow the router's tag and IAP to the fleet tag, deny every other source there at a priority that beats the
    default network's default-allow-internal (65534) and a custom allow at GCP's default 1000; the allows beat the
    deny (a deny wins a tie). The replicas of the fleet carry that tag (tests/test_stack.py)."""
    rules = {r.name.removeprefix("tpu-serve-dev-router-"): r.inputs for r in router_run.of_type(FIREWALL)}
    fleet = {name: rule for name, rule in rules.items() if rule["targetTags"] == [fleet_tag("dev")]}
    assert fleet_tag("dev") == router_run.outputs["fleetTag"] == "tpu-serve-dev-fleet"
    assert set(fleet) == {"to-replicas", "iap-to-replicas", "deny-replicas"}
    allow_router, allow_iap, deny = fleet["to-replicas"], fleet["iap-to-replicas"], fleet["deny-replicas"]
    assert allow_router["sourceTags"] == ["tpu-serve-dev-router"] and "sourceRanges" not in allow_router
    assert allow_iap["sourceRanges"] == ["35.235.240.0/20"]
    assert deny["sourceRanges"] == ["0.0.0.0/0"] and "allows" not in deny
    for rule in (allow_router, allow_iap):
        assert rule["allows"] == [{"protocol": "tcp", "ports": ["8000"]}]
    assert deny["denies"] == [{"protocol": "tcp", "ports": ["8000"]}]
    assert allow_router["priority"] == allow_iap["priority"] < deny["priority"] < 1000 < 65534
    assert router_run.one(INSTANCE).inputs["tags"] == ["tpu-serve-dev-router"]  # the router's own tag is the source


def test_the_gate_waits_for_the_router_to_serve_this_config(router_run) -> None:
    command = shlex.split(router_run.one(COMMAND).inputs["create"].split(" -m tpuserve ", 1)[1])
    digest = router_run.outputs["routerConfigHash"]
    assert command == ["gate", "--instance", "tpu-serve-dev-router", "--zone", "europe-west4-a", "--project",
                       "my-ml-sandbox", "--config-hash", digest, "--timeout", "1500"]


def test_the_router_stack_passes_the_policy_pack_only_with_its_tag_listed(router_run) -> None:
    """`tpuserve fleet` passes the fleet's pulumi flags to every stack of it, so the router stack is checked with
    dev's policy config."""
    dev_policy = policy_config("dev")
    for resource in router_run.resources:
        if resource.custom:
            assert violations(resource, "dev-router", dev_policy) == {}, resource.name
    to_replicas = next(r for r in router_run.of_type(FIREWALL) if r.name.endswith("-router-to-replicas"))
    assert "firewall-iap-sources-only" in violations(to_replicas, "dev-router", {})  # without the opt-in: refused
    other = Resource(FIREWALL, "x", {**to_replicas.inputs, "sourceTags": ["some-other-vm"]}, True)
    assert "firewall-iap-sources-only" in violations(other, "dev-router", dev_policy)
    # A deny admits nothing, whatever its sources; the same sources on an allow are refused.
    deny = next(r for r in router_run.of_type(FIREWALL) if r.name.endswith("-deny-replicas"))
    assert violations(deny, "dev-router", {}) == {}
    opened = Resource(FIREWALL, "x", {**deny.inputs, "allows": deny.inputs["denies"]}, True)
    assert "firewall-iap-sources-only" in violations(opened, "dev-router", dev_policy)
    flipped = Resource(FIREWALL, "x", {k: v for k, v in deny.inputs.items() if k != "denies"}
                       | {"allows": deny.inputs["denies"]}, True)
    assert "firewall-iap-sources-only" in violations(flipped, "dev-router", dev_policy)
    # The 200 GB floor is for TPU VMs: the router's 20 GB disk passes, the same disk on a TPU machine does not.
    vm = router_run.one(INSTANCE)
    assert "boot-disk-min-size" in violations(
        Resource(INSTANCE, vm.name, {**vm.inputs, "machineType": "ct6e-standard-1t"}, True), "dev-router", dev_policy)


@pytest.mark.parametrize("key", ["routerMasterKeySecretId", "vllmApiKeySecretId"])
def test_without_a_master_key_or_replica_key_secret_the_stack_stops_naming_the_key(key: str) -> None:
    config = router_config()
    del config[key]
    with pytest.raises(Exception, match=f"{key}: is required"):
        run_stack(config, "dev-router")


def test_the_router_reads_the_replicas_key_from_secret_manager_and_never_holds_it(router_run) -> None:
    members = [r.inputs for r in router_run.of_type("gcp:secretmanager/secretIamMember:SecretIamMember")]
    assert sorted(m["secretId"] for m in members) == ["projects/my-ml-sandbox/secrets/litellm-master-key",
                                                      "projects/my-ml-sandbox/secrets/vllm-api-key"]
    assert {m["member"] for m in members} == {"serviceAccount:tpu-serve-dev-router@my-ml-sandbox.iam.gserviceaccount.com"}
    script = router_run.one(INSTANCE).inputs["metadataStartupScript"]
    assert "readonly REPLICA_KEY_SECRET=projects/my-ml-sandbox/secrets/vllm-api-key" in script
    assert "--replica-key-file $RUN_DIR/replica-api-key" in script
    assert json.loads(router_run.one(INSTANCE).inputs["metadata"]["litellm-config"])["model_list"][0][
        "litellm_params"]["api_key"] == "os.environ/TPUSERVE_API_KEY"  # a reference, resolved in the container


def test_the_rendered_router_script_is_valid_shell_and_embeds_the_agent(tmp_path: Path) -> None:
    script = render_router_script("ghcr.io/berriai/litellm:v1.108.7", "projects/p/secrets/litellm-master-key",
                                  "projects/p/secrets/vllm-api-key")
    (tmp_path / "router.sh").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "router.sh")], check=True)
    assert (ROOT / "vm" / "router_agent.py").read_text().rstrip("\n") in script
    assert "readonly IMAGE=ghcr.io/berriai/litellm:v1.108.7" in script
    # One container (one worker) per vCPU behind HAProxy, sharing the Redis the agent names in their config.
    assert 'PROXIES="$(nproc)"' in script and "--proxies $PROXIES --redis-port $REDIS_PORT" in script
    assert f"readonly REDIS_PORT={router_agent.REDIS_PORT}" in script
    assert "router_agent.py\" --print-haproxy-config --port \"$PORT\" --proxies \"$PROXIES\"" in script


def test_a_fleet_replica_carries_the_fleet_tag_and_serves_with_the_api_key() -> None:
    """A replica stack as `tpuserve fleet` makes it (dev's settings plus createCloudNat false and fleet dev, with
    dev's vllmApiKeySecretId): its VM carries the fleet's tag beside its own, its account may read the key, and the
    served config names the key's secret and variable only (never its value: it is in no input at all)."""
    run = run_stack({**stack_file_config("dev"), "createCloudNat": "false", "fleet": "dev",
                     "vllmApiKeySecretId": "vllm-api-key"}, "dev-r3")
    vm = run.one(INSTANCE).inputs
    assert vm["tags"] == ["tpu-serve-dev-r3", fleet_tag("dev")]
    served = json.loads(vm["metadata"]["tpu-serve-config"])
    assert served["secret_env"] == {"VLLM_API_KEY": "projects/my-ml-sandbox/secrets/vllm-api-key"}
    assert served["api_key_env"] == "VLLM_API_KEY"
    args = served["docker_run_args"]
    assert args[args.index("HF_TOKEN") + 1:args.index("HF_TOKEN") + 3] == ["-e", "VLLM_API_KEY"]
    assert not any("api-key" in arg for arg in args[args.index("serve"):])  # no --api-key in vLLM's argv
    readers = {r.inputs["secretId"] for r in run.of_type("gcp:secretmanager/secretIamMember:SecretIamMember")}
    assert "projects/my-ml-sandbox/secrets/vllm-api-key" in readers
    plain = run_stack({**stack_file_config("dev"), "createCloudNat": "false"}, "dev-r3")
    # The key is part of what is served: adding it changes the hash the VM reports, so the supervisor restarts vLLM.
    assert run.outputs["configHash"] == served["config_hash"] != plain.outputs["configHash"]
    assert plain.one(INSTANCE).inputs["tags"] == ["tpu-serve-dev-r3"]
    assert "secret_env" not in json.loads(plain.one(INSTANCE).inputs["metadata"]["tpu-serve-config"])
