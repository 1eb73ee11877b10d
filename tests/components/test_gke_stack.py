"""The `gke` stack under Pulumi mocks: the real `__main__.py` with Pulumi.gke.yaml (compared with
tests/components/inventories/gke.yaml) and the variants a user can configure. Mocked: no Pulumi engine, no GCP, no cluster;
the GKE cluster's endpoint/CA and an existing cluster's getCluster answer come from tests/fakes/pulumi_harness.py."""

from __future__ import annotations

import json

import pytest
import yaml
from pulumi.runtime import rpc

from components.config import build_stack_config
from tests.fakes.pulumi_harness import CLUSTER_CA, CLUSTER_ENDPOINT, ROOT, RecordingMocks, StackRun, run_stack, \
    stack_file_config
from tests.components.test_stack import assert_subset
from tpuserve.facts import VLLM_TPU_IMAGE
from components.k8s_serving import REQUEST_TIMEOUT_S, TERMINATION_GRACE_S, pod_serve_args
from tpuserve.serving import ConfigError, config_hash, vllm_serve_args

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
HPA = "kubernetes:autoscaling/v2:HorizontalPodAutoscaler"
K8S_PROVIDER = "pulumi:providers:kubernetes"
# An existing cluster as getCluster describes it (pulumi-gcp 10.2 GetClusterResult: list-valued blocks).
EXISTING = {"name": "ml-shared", "location": "us-east5", "endpoint": "203.0.113.20",
            "masterAuths": [{"clusterCaCertificate": "Q0EtZXhpc3Rpbmc="}],
            "workloadIdentityConfigs": [{"workloadPool": "my-ml-sandbox.svc.id.goog"}],
            "addonsConfigs": [{"gcsFuseCsiDriverConfigs": [{"enabled": True}]}],
            "gatewayApiConfigs": []}


def gke_config(**overrides: str) -> dict[str, str]:
    return {**stack_file_config("gke"), **overrides}


@pytest.fixture(scope="module")
def gke_run() -> StackRun:
    return run_stack(gke_config(), "gke")


def tpu_pool(run: StackRun) -> dict:
    pools = [r for r in run.of_type(NODE_POOL) if r.name.endswith("-tpu")]
    assert len(pools) == 1
    return pools[0].inputs


def pod_spec(run: StackRun) -> dict:
    return k8s_object(run, "Deployment", "vllm")["spec"]["template"]["spec"]


def k8s_object(run: StackRun, kind: str, name: str) -> dict:
    """The Kubernetes object of this kind and metadata.name, as declared."""
    (found,) = [r.inputs for r in run.resources if r.type.startswith("kubernetes:") and r.type.endswith(f":{kind}")
                and r.inputs["metadata"]["name"] == name]
    return found


def vllm_container(run: StackRun) -> dict:
    (container,) = pod_spec(run)["containers"]
    return container


def test_stack_matches_its_inventory(gke_run: StackRun) -> None:
    inventory = yaml.safe_load((ROOT / "tests" / "components" / "inventories" / "gke.yaml").read_text())
    counts: dict[str, int] = {}
    for resource in gke_run.resources:
        counts[resource.type] = counts.get(resource.type, 0) + 1
    assert counts == inventory["counts"]
    for key, expected in inventory["values"].items():
        type_token, _, name = key.partition(" ")  # "<type> <name>" where a type has several resources
        found = [r for r in gke_run.of_type(type_token) if r.name == name] if name else [gke_run.one(type_token)]
        assert len(found) == 1, key
        assert_subset(expected, found[0].inputs, key)


def test_tpu_node_pool_is_flex_start_from_zero_without_repair_or_reservation(gke_run: StackRun) -> None:
    pool = tpu_pool(gke_run)
    node = pool["nodeConfig"]
    assert node["flexStart"] is True
    assert node["maxRunDuration"] == "86400s"  # Pulumi.gke.yaml: maxRunDuration 1d
    assert node["machineType"] == "ct6e-standard-1t"
    assert node["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert pool["autoscaling"] == {"totalMinNodeCount": 0, "totalMaxNodeCount": 3, "locationPolicy": "ANY"}
    assert pool["initialNodeCount"] == 0
    assert pool["management"]["autoRepair"] is False
    assert pool["nodeLocations"] == ["us-east5-a", "us-east5-b"]  # GKE's flex-start v6e zones of us-east5
    assert pool["networkConfig"] == {"enablePrivateNodes": True}
    assert node["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    assert (node["diskType"], node["diskSizeGb"]) == ("hyperdisk-balanced", 200.0)


def test_nodes_run_as_their_own_least_privilege_account(gke_run: StackRun) -> None:
    node_sa = next(r.inputs for r in gke_run.of_type("gcp:serviceaccount/account:Account")
                   if r.name.endswith("-nodes"))
    email = f"{node_sa['accountId']}@my-ml-sandbox.iam.gserviceaccount.com"
    for pool in gke_run.of_type(NODE_POOL):
        assert pool.inputs["nodeConfig"]["serviceAccount"] == email
    assert gke_run.one(CLUSTER).inputs["nodeConfig"]["serviceAccount"] == email
    grants = [(r.inputs["role"], r.inputs["member"]) for r in gke_run.of_type("gcp:projects/iAMMember:IAMMember")]
    # GKE's node role, and what image streaming asks of a custom node account (Service Usage Consumer)
    assert grants == [("roles/container.defaultNodeServiceAccount", f"serviceAccount:{email}"),
                      ("roles/serviceusage.serviceUsageConsumer", f"serviceAccount:{email}")]


def test_deployment_runs_the_shared_argv_builder_on_every_chip_of_a_flex_start_v6e_node(gke_run: StackRun) -> None:
    cfg = build_stack_config(gke_config())
    container = vllm_container(gke_run)
    assert container["image"] == cfg.serving.image == VLLM_TPU_IMAGE
    assert container["command"] == ["vllm", "serve"]
    # the shared argv, then vLLM's drain on SIGTERM (last, so extraArgs cannot undo it)
    assert container["args"] == vllm_serve_args(cfg.serving) + ["--shutdown-timeout", "30"] == \
        pod_serve_args(cfg.serving)
    assert container["resources"] == {"requests": {"google.com/tpu": "1"}, "limits": {"google.com/tpu": "1"}}
    spec = pod_spec(gke_run)
    assert spec["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                    "cloud.google.com/gke-tpu-topology": "1x1",
                                    "cloud.google.com/gke-flex-start": "true",
                                    "cloud.google.com/gke-nodepool": tpu_pool(gke_run)["name"]}
    assert spec["tolerations"] == [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert gke_run.one(DEPLOYMENT).inputs["spec"]["template"]["metadata"]["annotations"][
        "tpu-serve/config-hash"] == config_hash(cfg.serving)


@pytest.mark.parametrize(("machine_type", "chips", "topology"), [("ct6e-standard-4t", "4", "2x2"),
                                                                 ("ct6e-standard-8t", "8", "2x4")])
def test_bigger_machines_take_all_their_chips_and_topology(machine_type: str, chips: str, topology: str) -> None:
    run = run_stack(gke_config(machineType=machine_type), "gke")
    assert tpu_pool(run)["nodeConfig"]["machineType"] == machine_type
    assert vllm_container(run)["resources"]["limits"] == {"google.com/tpu": chips}
    assert pod_spec(run)["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == topology
    args = vllm_container(run)["args"]
    # vLLM shards the model over every chip, with the TPU backend's flags (text-only: every limit 0)
    assert args[args.index("--tensor-parallel-size") + 1] == chips
    assert args[args.index("--limit-mm-per-prompt") + 1] == '{"image":0,"audio":0,"video":0}'
    assert run.outputs["maxTpuCostPerHourUsd"] == pytest.approx(2 * int(chips) * 1.35)


def test_probes_cover_a_cold_start_and_use_the_gate_rules(gke_run: StackRun) -> None:
    container = vllm_container(gke_run)
    startup = container["startupProbe"]
    assert startup["exec"]["command"] == ["python3", "/opt/tpu-serve/pod_boot.py", "--url", "http://127.0.0.1:8000",
                                          "--model", "google/gemma-4-E2B-it", "--state", "/tmp/tpu-serve-boot.json"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 25 * 60
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    command = container["readinessProbe"]["exec"]["command"]
    assert command == ["python3", "/opt/tpu-serve/readycheck.py", "--url", "http://127.0.0.1:8000",
                       "--model", "google/gemma-4-E2B-it", "--timeout", "15"]
    assert container["readinessProbe"]["timeoutSeconds"] > 3 * 15  # three requests, each up to --timeout
    scripts = k8s_object(gke_run, "ConfigMap", "vllm-scripts")
    assert scripts["data"]["readycheck.py"] == (ROOT / "vm" / "readycheck.py").read_text()
    assert scripts["data"]["hf_token.py"] == (ROOT / "vm" / "hf_token.py").read_text()
    assert scripts["data"]["pod_boot.py"] == (ROOT / "vm" / "pod_boot.py").read_text()
    assert scripts["data"]["compile_cache.py"] == (ROOT / "vm" / "compile_cache.py").read_text()  # pod_boot's import
    assert {"name": "scripts", "configMap": {"name": scripts["metadata"]["name"]}} in pod_spec(gke_run)["volumes"]


def test_longer_readiness_timeout_lengthens_the_startup_probe() -> None:
    startup = vllm_container(run_stack(gke_config(readinessTimeout="40m"), "gke"))["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 40 * 60


def test_token_reaches_the_pod_through_workload_identity_only(gke_run: StackRun) -> None:
    spec = pod_spec(gke_run)
    (init,) = spec["initContainers"]
    assert init["command"] == ["python3", "/opt/tpu-serve/hf_token.py", "--secret",
                               "projects/my-ml-sandbox/secrets/hf-token", "--out", "/var/run/tpu-serve/hf/token"]
    assert {"name": "hf-token", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}} in spec["volumes"]
    assert {"name": "HF_TOKEN_PATH", "value": "/var/run/tpu-serve/hf/token"} in vllm_container(gke_run)["env"]
    assert not any("HF_TOKEN" == e["name"] for e in vllm_container(gke_run)["env"])
    assert "envFrom" not in vllm_container(gke_run) and "env" not in init
    ksa = k8s_object(gke_run, "ServiceAccount", "vllm")
    binding = gke_run.one("gcp:serviceaccount/iAMMember:IAMMember").inputs
    assert spec["serviceAccountName"] == ksa["metadata"]["name"]
    assert binding["member"] == f"serviceAccount:my-ml-sandbox.svc.id.goog[{ksa['metadata']['namespace']}/" \
                                f"{ksa['metadata']['name']}]"
    gsa = ksa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"]
    assert binding["serviceAccountId"] == f"projects/my-ml-sandbox/serviceAccounts/{gsa}"
    reader = gke_run.one("gcp:secretmanager/secretIamMember:SecretIamMember").inputs
    assert reader["member"] == f"serviceAccount:{gsa}"


def test_a_token_from_config_stays_a_pulumi_secret_and_out_of_kubernetes() -> None:
    canary = "hf_CANARYgkeStack0123456789"
    run = run_stack(gke_config(hfTokenSecretId="", hfToken=canary), "gke")
    version = run.one("gcp:secretmanager/secretVersion:SecretVersion").inputs
    assert version["secretData"] == {rpc._special_sig_key: rpc._special_secret_sig, "value": canary}
    kubernetes = [r for r in run.resources if r.type.startswith("kubernetes:")]
    assert not [r for r in kubernetes if r.type == "kubernetes:core/v1:Secret"]
    assert canary not in json.dumps([r.inputs for r in kubernetes]) + json.dumps(run.outputs)
    (init,) = pod_spec(run)["initContainers"]
    assert init["command"][3] == "projects/my-ml-sandbox/secrets/tpu-serve-gke-hf-token"


def test_kubernetes_provider_reaches_the_new_cluster_with_the_auth_plugin(gke_run: StackRun) -> None:
    config = json.loads(gke_run.one(K8S_PROVIDER).inputs["kubeconfig"])
    assert config["clusters"][0]["cluster"] == {"server": f"https://{CLUSTER_ENDPOINT}",
                                                "certificate-authority-data": CLUSTER_CA}
    assert config["users"][0]["user"]["exec"]["command"] == "gke-gcloud-auth-plugin"


def test_existing_cluster_gets_only_the_node_pool() -> None:
    mocks = RecordingMocks(clusters={"ml-shared": EXISTING})
    run = run_stack(gke_config(gkeCluster="ml-shared"), "gke", mocks)
    assert run.of_type(CLUSTER) == [] and run.of_type("gcp:compute/routerNat:RouterNat") == []
    assert [r.name for r in run.of_type(NODE_POOL)] == ["tpu-serve-gke-tpu"]
    assert (tpu_pool(run)["cluster"], tpu_pool(run)["location"]) == ("ml-shared", "us-east5")
    lookups = [args for token, args in mocks.calls if token == "gcp:container/getCluster:getCluster"]
    assert lookups == [{"name": "ml-shared", "location": "us-east5", "project": "my-ml-sandbox"}]
    assert json.loads(run.one(K8S_PROVIDER).inputs["kubeconfig"])["clusters"][0]["cluster"]["server"] == \
        "https://203.0.113.20"
    assert run.outputs["cluster"] == "ml-shared"


def test_existing_zonal_cluster_location_is_passed_through() -> None:
    mocks = RecordingMocks(clusters={"ml-shared": {**EXISTING, "location": "us-east5-b"}})
    run = run_stack(gke_config(gkeCluster="ml-shared", gkeClusterLocation="us-east5-b"), "gke", mocks)
    assert tpu_pool(run)["location"] == "us-east5-b"
    assert run.outputs["getCredentialsCommand"] == ("gcloud container clusters get-credentials ml-shared "
                                                   "--location us-east5-b --project my-ml-sandbox")


def test_existing_cluster_without_workload_identity_is_refused() -> None:
    mocks = RecordingMocks(clusters={"ml-shared": {**EXISTING, "workloadIdentityConfigs": []}})
    with pytest.raises(Exception, match="gkeCluster: cluster 'ml-shared' has no Workload Identity pool"):
        run_stack(gke_config(gkeCluster="ml-shared"), "gke", mocks)


def test_parked_deployment_has_no_pods_and_no_autoscaler() -> None:
    run = run_stack(gke_config(gkeMinReplicas="0"), "gke")
    assert run.one(DEPLOYMENT).inputs["spec"]["replicas"] == 0
    assert run.of_type(HPA) == []
    assert tpu_pool(run)["autoscaling"]["totalMinNodeCount"] == 0


def test_autoscaler_owns_replicas_when_serving(gke_run: StackRun) -> None:
    assert "replicas" not in gke_run.one(DEPLOYMENT).inputs["spec"]
    hpa = gke_run.one(HPA).inputs["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 2)


def test_outputs(gke_run: StackRun) -> None:
    cfg = build_stack_config(gke_config())
    assert gke_run.outputs == {
        "target": "gke", "project": "my-ml-sandbox", "cluster": "tpu-serve-gke", "clusterLocation": "us-east5-b",
        "zone": "us-east5-b", "nodePool": "tpu-serve-gke-tpu", "nodePoolZones": ["us-east5-a", "us-east5-b"],
        "maxReplicas": 2, "nodePoolMaxNodes": 3, "deployment": "vllm",
        "cacheBucket": "my-ml-sandbox-tpu-serve-gke-cache", "router": "service",
        "namespace": "tpu-serve", "service": "vllm",
        "port": 8000, "endpoint": "http://vllm.tpu-serve.svc.cluster.local:8000/v1",
        "getCredentialsCommand": "gcloud container clusters get-credentials tpu-serve-gke --location us-east5-b "
                                 "--project my-ml-sandbox",
        "portForwardCommand": "kubectl port-forward --namespace tpu-serve service/vllm 8000:8000",
        "model": "google/gemma-4-E2B-it", "vllmArgs": pod_serve_args(cfg.serving),
        "configHash": config_hash(cfg.serving), "maxRunSeconds": 86400, "maxTpuCostPerHourUsd": 2.7,
        "renewalCronJob": "vllm-renewer",
    }


@pytest.mark.parametrize(("overrides", "key"), [
    ({"gkeMaxNodes": "0"}, "gkeMaxNodes"),
    ({"gkeMaxNodes": "65"}, "gkeMaxNodes"),
    ({"gkeMinReplicas": "3"}, "gkeMinReplicas"),
    ({"gkeMinReplicas": "-1"}, "gkeMinReplicas"),
    ({"gkeNamespace": "Serving_NS"}, "gkeNamespace"),
    ({"gkeCluster": "My_Cluster"}, "gkeCluster"),
    ({"gkeCluster": "ml", "gkeClusterLocation": "europe-west4"}, "gkeClusterLocation"),
    ({"gkeClusterLocation": "us-east5"}, "gkeClusterLocation"),
    ({"readinessTimeout": "10m"}, "readinessTimeout"),
    ({"machineType": "ct5lp-hightpu-4t"}, "machineType"),
    ({"maxRunDuration": "8d"}, "maxRunDuration"),
    ({"project": ""}, "project"),
    ({"hfTokenSecretId": ""}, "hfTokenSecretId"),
    ({"containerImage": "vllm/vllm-tpu:nightly", "model": "google/gemma-4-E2B-it-qat-w4a16-ct"}, "model"),
])
def test_bad_gke_settings_name_their_key(overrides: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_stack_config(gke_config(**overrides))
    assert err.value.key == key


# --- rollouts that fit, a regional pool ---------------------------------------------------------------------------

def rollout_room(run: StackRun) -> tuple[int, int, dict, dict]:
    """(the pool's maximum, the replicas the HPA may ask for, the rolling update, the disruption budget)."""
    hpas = run.of_type(HPA)
    replicas = int(hpas[0].inputs["spec"]["maxReplicas"]) if hpas else 0
    budget = run.one("kubernetes:policy/v1:PodDisruptionBudget").inputs["spec"]
    return (int(tpu_pool(run)["autoscaling"]["totalMaxNodeCount"]), replicas,
            run.one(DEPLOYMENT).inputs["spec"]["strategy"]["rollingUpdate"], budget)


@pytest.mark.parametrize("overrides", [{}, {"gkeMaxNodes": "1"}, {"gkeMaxNodes": "1", "gkeSurgeNode": "false"},
                                       {"gkeMaxNodes": "5", "gkeMinReplicas": "5"},
                                       {"gkeMaxNodes": "3", "gkeSurgeNode": "false"}])
def test_a_rollout_at_full_scale_always_has_a_node_for_its_new_pod(overrides: dict[str, str]) -> None:
    """At the HPA's maximum, a rolling update holds replicas + maxSurge pods, one per node (each takes every chip):
    the pool must reach that, or the new pod waits Pending for a node and `pulumi up` for its whole timeout."""
    pool_max, replicas, rolling, budget = rollout_room(run_stack(gke_config(**overrides), "gke"))
    assert replicas == int(overrides.get("gkeMaxNodes", "2"))
    assert replicas + rolling["maxSurge"] <= pool_max
    assert rolling["maxSurge"] + rolling["maxUnavailable"] == 1  # one pod at a time, either way
    # The budget promises what the rollout does: nothing serving is evicted while a spare node can take its
    # successor first; one at a time without one.
    assert budget["maxUnavailable"] == rolling["maxUnavailable"]


def test_the_surge_node_is_the_pools_only_extra_node() -> None:
    with_surge = rollout_room(run_stack(gke_config(gkeMaxNodes="1"), "gke"))
    without = rollout_room(run_stack(gke_config(gkeMaxNodes="1", gkeSurgeNode="false"), "gke"))
    assert (with_surge[0], with_surge[2]) == (2, {"maxSurge": 1, "maxUnavailable": 0})
    assert (without[0], without[2]) == (1, {"maxSurge": 0, "maxUnavailable": 1})
    assert build_stack_config(gke_config(gkeSurgeNode="false")).warnings()[0].startswith(
        "gkeSurgeNode: false with gkeMinReplicas 1: every rollout and every node renewal stops the only replica")


def test_the_pool_spans_gkes_flex_start_zones_of_the_region_and_only_those() -> None:
    listed = json.loads((ROOT / "tpuserve" / "data" / "gke-flex-start-tpu.json").read_text())
    assert listed["source"].startswith("https://cloud.google.com/kubernetes-engine/docs/concepts/dws")
    assert listed["zones"]["v6e"] == ["asia-northeast1-b", "us-east5-a", "us-east5-b"]
    tokyo = run_stack(gke_config(zone="asia-northeast1-b"), "gke")
    assert tpu_pool(tokyo)["nodeLocations"] == ["asia-northeast1-b"]
    assert tokyo.one(CLUSTER).inputs["location"] == "asia-northeast1-b"
    one_zone = run_stack(gke_config(gkeZones='["us-east5-a"]'), "gke")
    assert tpu_pool(one_zone)["nodeLocations"] == ["us-east5-a"]
    system = next(r.inputs for r in one_zone.of_type(NODE_POOL) if r.name.endswith("-system"))
    assert system["nodeLocations"] == ["us-east5-b"]  # the system node stays in the stack's zone


@pytest.mark.parametrize(("overrides", "key", "says"), [
    ({"zone": "europe-west4-a"}, "zone", "GKE offers flex-start TPU v6e only in asia-northeast1-b, us-east5-a, "
                                         "us-east5-b"),
    ({"zone": "us-central1-b"}, "zone", "pulumi config set zone us-east5-b"),
    ({"gkeZones": '["us-east5-c"]'}, "gkeZones", "GKE offers flex-start TPU v6e only in"),
    ({"gkeZones": '["asia-northeast1-b"]'}, "gkeZones", "not in us-east5, the region of zone 'us-east5-b'"),
    ({"gkeZones": '["us-east5-a", "us-east5-a"]'}, "gkeZones", "listed twice"),
    ({"gkeZones": '["east"]'}, "gkeZones", "not a zone name"),
    ({"gkeRouter": "istio"}, "gkeRouter", "not one of service, inference-gateway"),
    ({"gkeRouter": "inference-gateway", "gkeProxySubnetRange": "10.129.0.0/28"}, "gkeProxySubnetRange", "/26 or"),
    ({"gkeRouter": "inference-gateway", "gkeProxySubnetRange": "10.129.0/23"}, "gkeProxySubnetRange", "IPv4 CIDR"),
    ({"maxRunDuration": "20m"}, "maxRunDuration", "not longer than readinessTimeout (25m)"),
])
def test_settings_that_cannot_roll_out_are_refused_with_the_fix(overrides: dict[str, str], key: str,
                                                                  says: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_stack_config(gke_config(**overrides))
    assert err.value.key == key and says in str(err.value) and "\n" not in str(err.value)


def test_the_proxy_subnet_range_is_checked_only_for_the_gateway() -> None:
    assert build_stack_config(gke_config(gkeProxySubnetRange="nonsense")).gke_router == "service"
    assert build_stack_config(gke_config(gkeRouter="inference-gateway", gkeProxySubnetRange="")).gke_router


# --- warm pods ----------------------------------------------------------------------------------------------------

def volumes(run: StackRun) -> dict[str, dict]:
    return {v["name"]: v for v in pod_spec(run)["volumes"]}


def test_weights_and_compile_cache_live_in_the_stacks_bucket_through_gcs_fuse(gke_run: StackRun) -> None:
    bucket = gke_run.outputs["cacheBucket"]
    assert bucket == "my-ml-sandbox-tpu-serve-gke-cache"
    found = volumes(gke_run)
    weights, compiled = found["weights"]["csi"], found["compile-cache"]["csi"]
    assert weights["driver"] == compiled["driver"] == "gcsfuse.csi.storage.gke.io"
    assert weights["volumeAttributes"]["bucketName"] == compiled["volumeAttributes"]["bucketName"] == bucket
    # Google's recipe (kubernetes-engine-samples ai-ml/vllm-tpu): the file cache, with parallel downloads
    assert weights["volumeAttributes"]["mountOptions"].split(",") == [
        "implicit-dirs", "file-cache:enable-parallel-downloads:true", "file-cache:parallel-downloads-per-file:100",
        "file-cache:max-parallel-downloads:-1", "file-cache:download-chunk-size-mb:10", "file-cache:max-size-mb:-1",
        "only-dir=huggingface"]
    assert found["gke-gcsfuse-cache"] == {"name": "gke-gcsfuse-cache", "emptyDir": {"medium": "Memory"}}
    annotations = gke_run.one(DEPLOYMENT).inputs["spec"]["template"]["metadata"]["annotations"]
    assert annotations["gke-gcsfuse/volumes"] == "true" and annotations["gke-gcsfuse/memory-limit"] == "0"
    mounts = {m["name"]: m["mountPath"] for m in vllm_container(gke_run)["volumeMounts"]}
    assert (mounts["weights"], mounts["compile-cache"]) == ("/cache/huggingface", "/cache/xla")
    grant = gke_run.one("gcp:storage/bucketIAMMember:BucketIAMMember").inputs
    ksa_gsa = k8s_object(gke_run, "ServiceAccount", "vllm")["metadata"]["annotations"][
        "iam.gke.io/gcp-service-account"]
    assert (grant["bucket"], grant["member"]) == (bucket, f"serviceAccount:{ksa_gsa}")  # the pods' own account


def test_the_pod_has_the_vm_containers_cache_variables(gke_run: StackRun) -> None:
    from tpuserve.serving import tpu_container_run_args

    cfg = build_stack_config(gke_config())
    run = tpu_container_run_args(cfg.serving, config_hash(cfg.serving))
    vm_env = dict(run[i + 1].split("=", 1) for i, arg in enumerate(run) if arg == "-e" and "=" in run[i + 1])
    pod_env = {e["name"]: e["value"] for e in vllm_container(gke_run)["env"]}
    assert vm_env == {"HF_HOME": "/cache/huggingface", "VLLM_XLA_CACHE_PATH": "/cache/xla",
                      "JAX_COMPILATION_CACHE_DIR": "/cache/xla", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    assert {k: pod_env[k] for k in vm_env} == vm_env
    assert set(pod_env) - set(vm_env) == {"HF_TOKEN_PATH", "HF_XET_CACHE"}


def test_the_compile_cache_folder_is_the_vms_key(gke_run: StackRun) -> None:
    from vm import compile_cache

    digest = "sha256:" + "ab12" * 16
    pinned = run_stack(gke_config(containerImage=f"vllm/vllm-tpu@{digest}", machineType="ct6e-standard-4t"), "gke")
    options = volumes(pinned)["compile-cache"]["csi"]["volumeAttributes"]["mountOptions"]
    # the one key (vm/compile_cache.py), which the VM's supervisor names its folder with too
    key = compile_cache.xla_cache_key(f"vllm/vllm-tpu@{digest}", "ct6e-standard-4t")
    assert options == f"implicit-dirs,only-dir=xla/{key}"
    assert options.endswith("only-dir=xla/ab12ab12ab12ab12-ct6e-standard-4t")
    tagged = volumes(gke_run)["compile-cache"]["csi"]["volumeAttributes"]["mountOptions"]
    assert tagged.startswith("implicit-dirs,only-dir=xla/") and tagged.endswith("-ct6e-standard-1t")
    assert tagged != options # one folder per image and machine type


def test_without_the_bucket_every_pod_starts_cold() -> None:
    run = run_stack(gke_config(compileCacheBucket="false"), "gke")
    assert volumes(run)["weights"] == {"name": "weights", "emptyDir": {}}
    assert "gke-gcsfuse/volumes" not in run.one(DEPLOYMENT).inputs["spec"]["template"]["metadata"]["annotations"]
    assert run.of_type("gcp:storage/bucketIAMMember:BucketIAMMember") == []


def test_an_existing_cluster_without_the_gcs_fuse_driver_is_refused() -> None:
    mocks = RecordingMocks(clusters={"ml-shared": {**EXISTING, "addonsConfigs": [
        {"gcsFuseCsiDriverConfigs": [{"enabled": False}]}]}})
    with pytest.raises(Exception, match="no Cloud Storage FUSE CSI driver.*--update-addons GcsFuseCsiDriver=ENABLED"):
        run_stack(gke_config(gkeCluster="ml-shared"), "gke", mocks)


# --- the inference gateway ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gateway_run() -> StackRun:
    return run_stack(gke_config(gkeRouter="inference-gateway"), "gke")


def custom(run: StackRun, kind: str) -> dict:
    (found,) = [r.inputs for r in run.resources if r.type.endswith(f":{kind}") and r.custom]
    return found


def test_the_gateway_routes_every_path_to_the_pool_of_the_vllm_pods(gateway_run: StackRun) -> None:
    pool = custom(gateway_run, "InferencePool")["spec"]
    vllm = next(r.inputs for r in gateway_run.of_type(DEPLOYMENT) if r.inputs["metadata"]["name"] == "vllm")
    assert pool["selector"]["matchLabels"] == vllm["spec"]["selector"]["matchLabels"]
    assert pool["targetPorts"] == [{"number": 8000.0}]
    assert pool["endpointPickerRef"] == {"name": "vllm-epp", "port": {"number": 9002.0}, "failureMode": "FailOpen"}
    route = custom(gateway_run, "HTTPRoute")["spec"]
    assert route["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "vllm"}]
    assert route["rules"][0]["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                                 "name": "vllm"}]
    assert custom(gateway_run, "Gateway")["spec"]["gatewayClassName"] == "gke-l7-rilb"
    assert gateway_run.outputs["gateway"] == "vllm" and gateway_run.outputs["router"] == "inference-gateway"


def test_the_endpoint_picker_reads_metrics_vllm_serves(gateway_run: StackRun) -> None:
    from components import inference_gateway

    epp = next(r.inputs for r in gateway_run.of_type(DEPLOYMENT) if r.inputs["metadata"]["name"] == "vllm-epp")
    (container,) = epp["spec"]["template"]["spec"]["containers"]
    # llm-d's router, as GKE's "Inference Gateway powered by llm-d" guide installs it (chart and image v0.10.0)
    assert container["image"] == "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"
    assert container["args"] == ["--pool-name", "vllm", "--pool-namespace", "tpu-serve", "--pool-group",
                                 "inference.networking.k8s.io", "--zap-encoder", "json", "--config-file",
                                 "/config/default-plugins.yaml", "--grpc-health-port", "9003", "--tracing=false"]
    # sized as the chart sizes it, on a system node that can give it that (GKE keeps part of a node for itself)
    assert container["resources"] == {"requests": {"cpu": "8", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}
    system = next(r.inputs for r in gateway_run.of_type(NODE_POOL) if r.name.endswith("-system"))
    vcpus = int(system["nodeConfig"]["machineType"].rsplit("-", 1)[1])
    assert vcpus > float(container["resources"]["requests"]["cpu"]) and vcpus == 16
    assert "nodeSelector" not in epp["spec"]["template"]["spec"]  # the system node: it tolerates no TPU taint
    # the chart: the picker's grace "should mirror the longest grace period of the pods within the pool"
    assert epp["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == pod_spec(gateway_run)[
        "terminationGracePeriodSeconds"]
    config = next(r.inputs for r in gateway_run.of_type("kubernetes:core/v1:ConfigMap")
                  if r.inputs["metadata"]["name"] == "vllm-epp")
    assert yaml.safe_load(config["data"]["default-plugins.yaml"]) == inference_gateway.PLUGINS_CONFIG
    # The vLLM metrics the picker's vLLM extractor reads (llm-d-router v0.10.0 factories.go), each in a real
    # vLLM 0.32 scrape.
    scrape = (ROOT / "tests" / "data" / "vllm-0.32.0-metrics.prom").read_text()
    for metric in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                   "vllm:cache_config_info"):
        assert f"\n{metric}{{" in scrape, metric
    role = k8s_object(gateway_run, "Role", "vllm-epp-sa")
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]} in role["rules"]


def test_the_gateways_request_timeout_and_the_pods_grace_period_are_one_fact(gateway_run: StackRun) -> None:
    """A request the load balancer lets run REQUEST_TIMEOUT_S is not cut when its pod goes: the preStop waits that
    long (after the endpoint's removal) and the grace period covers both waits and vLLM's own drain."""
    policy = custom(gateway_run, "GCPBackendPolicy")["spec"]["default"]
    assert policy["timeoutSec"] == policy["connectionDraining"]["drainingTimeoutSec"] == REQUEST_TIMEOUT_S
    container = vllm_container(gateway_run)
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python3", "/opt/tpu-serve/drain.py"]
    settle, timeout = float(command[command.index("--settle") + 1]), float(command[command.index("--timeout") + 1])
    assert timeout == policy["timeoutSec"]
    args = container["args"]
    drain = int(args[args.index("--shutdown-timeout") + 1])
    grace = pod_spec(gateway_run)["terminationGracePeriodSeconds"]
    assert grace == TERMINATION_GRACE_S > settle + timeout + drain
    assert pod_spec(run_stack(gke_config(), "gke"))["terminationGracePeriodSeconds"] == grace  # either router


def test_the_gateway_gets_the_cluster_features_and_the_proxy_only_subnet_it_needs(gateway_run: StackRun) -> None:
    assert gateway_run.one(CLUSTER).inputs["gatewayApiConfig"] == {"channel": "CHANNEL_STANDARD"}
    subnet = gateway_run.one("gcp:compute/subnetwork:Subnetwork").inputs
    assert (subnet["purpose"], subnet["role"], subnet["ipCidrRange"], subnet["region"]) == (
        "REGIONAL_MANAGED_PROXY", "ACTIVE", "10.129.0.0/23", "us-east5")
    mocks = RecordingMocks(clusters={"ml-shared": EXISTING})
    with pytest.raises(Exception, match="inference-gateway needs the Gateway API.*--gateway-api=standard"):
        run_stack(gke_config(gkeRouter="inference-gateway", gkeCluster="ml-shared"), "gke", mocks)
    ready = RecordingMocks(clusters={"ml-shared": {**EXISTING, "gatewayApiConfigs": [{"channel": "CHANNEL_STANDARD"}]}})
    existing = run_stack(gke_config(gkeRouter="inference-gateway", gkeCluster="ml-shared", gkeProxySubnetRange=""),
                         "gke", ready)
    assert existing.of_type("gcp:compute/subnetwork:Subnetwork") == []  # the network has its own
    assert custom(existing, "Gateway")


def test_the_service_router_declares_no_gateway(gke_run: StackRun) -> None:
    assert not [r for r in gke_run.resources if "gateway" in r.type.lower() or "inference" in r.type.lower()]
    assert "gatewayApiConfig" not in gke_run.one(CLUSTER).inputs


# --- a zonal cluster, an image that streams -----------------------------------------------------------------------

def test_a_new_cluster_is_zonal_in_the_stacks_zone_and_its_tpu_pool_spans_the_region(gke_run: StackRun) -> None:
    """GKE's free tier covers one zonal cluster's fee, never a regional one's; the TPU pool keeps both flex-start
    zones of the region (a multi-zonal cluster)."""
    cluster = gke_run.one(CLUSTER).inputs
    assert cluster["location"] == "us-east5-b" and "nodeLocations" not in cluster
    pool = tpu_pool(gke_run)
    assert pool["location"] == "us-east5-b" and pool["nodeLocations"] == ["us-east5-a", "us-east5-b"]
    assert gke_run.outputs["clusterLocation"] == "us-east5-b"
    # The region still places what is regional: the NAT, and the gateway's proxy-only subnet.
    assert gke_run.one("gcp:compute/routerNat:RouterNat").inputs["region"] == "us-east5"


def test_the_tpu_pool_streams_the_image(gke_run: StackRun) -> None:
    node = tpu_pool(gke_run)["nodeConfig"]
    assert node["gcfsConfig"] == {"enabled": True} and node["imageType"] == "COS_CONTAINERD"
    # The default image is on Docker Hub, public: a registry image streaming serves.
    assert vllm_container(gke_run)["image"].startswith("vllm/vllm-tpu@sha256:")


def test_an_image_from_a_registry_image_streaming_cannot_serve_is_a_warning_not_an_error() -> None:
    digest = "@sha256:" + "ab12" * 16
    for streams in (f"vllm/vllm-tpu{digest}", f"docker.io/vllm/vllm-tpu{digest}",
                    f"us-east5-docker.pkg.dev/my-ml-sandbox/vllm/vllm-tpu{digest}"):
        assert not [w for w in build_stack_config(gke_config(containerImage=streams)).warnings()
                    if "image streaming" in w], streams
    (warning,) = [w for w in build_stack_config(gke_config(containerImage=f"ghcr.io/me/vllm-tpu{digest}")).warnings()
                  if "image streaming" in w]
    assert warning.startswith("containerImage: ghcr.io is not Artifact Registry or Docker Hub")


# --- renewal in the cluster ---------------------------------------------------------------------------------------

def test_the_renewal_cronjob_renews_this_stacks_pool_every_15_minutes(gke_run: StackRun) -> None:
    from tpuserve import durations
    from tpuserve.gke_renewer import DEFAULT_TIMEOUT

    cron = k8s_object(gke_run, "CronJob", "vllm-renewer")["spec"]
    assert (cron["schedule"], cron["concurrencyPolicy"]) == ("*/15 * * * *", "Forbid")
    job = cron["jobTemplate"]["spec"]
    spec = job["template"]["spec"]
    (container,) = spec["containers"]
    assert container["command"] == ["python3", "-m", "tpuserve.gke_renewer"]
    assert container["image"].startswith("python:3.12-slim@sha256:")  # pinned: nothing installed at run time
    args = dict(zip(container["args"][::2], container["args"][1::2]))
    assert args == {"--namespace": "tpu-serve", "--deployment": "vllm", "--pool": tpu_pool(gke_run)["name"],
                    "--pool-max-nodes": "3", "--max-run-seconds": "86400", "--lead": "45m", "--timeout": "70m"}
    # a stuck run cannot hold back the next ones for ever, and a slow one is not cut short
    assert job["activeDeadlineSeconds"] >= durations.parse(DEFAULT_TIMEOUT) + TERMINATION_GRACE_S
    # the renewer's own service account, and its files as the `tpuserve` package it imports
    assert spec["serviceAccountName"] == "vllm-renewer"
    files = k8s_object(gke_run, "ConfigMap", "vllm-renewer")["data"]
    assert files == {name: (ROOT / "tpuserve" / name).read_text() for name in
                     ("__init__.py", "durations.py", "exits.py", "gke_renewer.py")}
    mount = container["volumeMounts"][0]
    assert mount["mountPath"] == f"{container['workingDir']}/tpuserve"
    # its pods are not replicas: nothing that selects the vLLM pods selects them
    labels = job["template"]["metadata"]["labels"]
    selector = k8s_object(gke_run, "Deployment", "vllm")["spec"]["selector"]["matchLabels"]
    assert not all(labels.get(k) == v for k, v in selector.items())


def test_a_parked_stack_has_no_renewal() -> None:
    run = run_stack(gke_config(gkeMinReplicas="0"), "gke")
    assert not [r for r in run.resources if "renewer" in r.name]
    assert "renewalCronJob" not in run.outputs
