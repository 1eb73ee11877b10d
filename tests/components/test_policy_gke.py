"""The policy pack's GKE rules on what the gke stack declares under Pulumi mocks (new cluster, and an existing one),
and on unsafe variants made by mutating those captured inputs; called the way the analyzer calls them, with
policy/config/gke.json. Same harness as tests/components/test_policy.py."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest

from policy import rules
from tests.fakes.pulumi_harness import RecordingMocks, run_stack, stack_file_config
from tests.components.test_gke_stack import EXISTING
from tests.components.test_policy import Captured, delete_path, set_path, takes_labels, violations

CLUSTER, NODE_POOL = rules.GKE_CLUSTER, rules.GKE_NODE_POOL
DEFAULT_SA = "123456789012-compute@developer.gserviceaccount.com"


@functools.cache
def capture(existing: bool = False, **overrides: str) -> Captured:
    """Made once per process, like tests/components/test_policy.py's."""
    config = {**stack_file_config("gke"), **overrides}
    if existing:
        config["gkeCluster"] = "ml-shared"
    run = run_stack(config, "gke", RecordingMocks(clusters={"ml-shared": EXISTING}))
    return Captured("gke", tuple(r for r in run.resources if r.custom))


@pytest.fixture(scope="module")
def captured() -> dict[str, Captured]:
    return {"new cluster": capture(), "existing cluster": capture(existing=True),
            "token from config": capture(hfTokenSecretId="", hfToken="hf_policy_gke"),
            "inference gateway, one zone": capture(gkeRouter="inference-gateway", gkeZones='["us-east5-a"]')}


@pytest.mark.parametrize("run_name", ["new cluster", "existing cluster", "token from config",
                                      "inference gateway, one zone"])
def test_declared_gke_stacks_pass_every_rule(captured: dict[str, Captured], run_name: str) -> None:
    run = captured[run_name]
    assert {r.name: violations(r, "gke") for r in run.resources} == {r.name: {} for r in run.resources}


def test_the_gke_rules_see_the_cluster_and_both_pools(captured: dict[str, Captured]) -> None:
    types = [r.type for r in captured["new cluster"].resources]
    assert types.count(CLUSTER) == 1 and types.count(NODE_POOL) == 2


UNSAFE: dict[str, tuple[str, str, Any, str]] = {
    "public cluster nodes": (CLUSTER, "", set_path("privateClusterConfig.enablePrivateNodes", False),
                             "gke-private-nodes"),
    "no private cluster config": (CLUSTER, "", delete_path("privateClusterConfig"), "gke-private-nodes"),
    "TPU pool with public nodes": (NODE_POOL, "-tpu", delete_path("networkConfig.enablePrivateNodes"),
                                   "gke-private-nodes"),
    "system pool with public nodes": (NODE_POOL, "-system", set_path("networkConfig.enablePrivateNodes", False),
                                      "gke-private-nodes"),
    "cluster default pool as the default SA": (CLUSTER, "", delete_path("nodeConfig.serviceAccount"),
                                               "gke-dedicated-node-service-account"),
    "TPU pool as the compute SA": (NODE_POOL, "-tpu", set_path("nodeConfig.serviceAccount", DEFAULT_SA),
                                   "gke-dedicated-node-service-account"),
    "system pool as 'default'": (NODE_POOL, "-system", set_path("nodeConfig.serviceAccount", "default"),
                                 "gke-dedicated-node-service-account"),
    "no workload pool": (CLUSTER, "", delete_path("workloadIdentityConfig"), "gke-workload-identity"),
    "another project's workload pool": (CLUSTER, "", set_path("workloadIdentityConfig.workloadPool",
                                                              "other.svc.id.goog"), "gke-workload-identity"),
    "TPU pool exposes the node identity": (NODE_POOL, "-tpu", set_path("nodeConfig.workloadMetadataConfig.mode",
                                                                       "GCE_METADATA"), "gke-workload-identity"),
    "flex-start without a run limit": (NODE_POOL, "-tpu", delete_path("nodeConfig.maxRunDuration"),
                                       "gke-flex-start-node-pool"),
    "flex-start run limit above 7 days": (NODE_POOL, "-tpu", set_path("nodeConfig.maxRunDuration", "691200s"),
                                          "gke-flex-start-node-pool"),
    "flex-start with auto-repair": (NODE_POOL, "-tpu", set_path("management.autoRepair", True),
                                    "gke-flex-start-node-pool"),
    "flex-start auto-repair left to GKE": (NODE_POOL, "-tpu", delete_path("management"), "gke-flex-start-node-pool"),
    "flex-start on a reservation": (NODE_POOL, "-tpu", set_path(
        "nodeConfig.reservationAffinity.consumeReservationType", "ANY_RESERVATION"), "gke-flex-start-node-pool"),
    "TPU pool outside GKE's flex-start zones": (NODE_POOL, "-tpu", set_path("nodeLocations", ["us-east5-b",
                                                                                                 "us-east5-c"]),
                                                "gke-flex-start-zones"),
    "TPU pool in the cluster's zones": (NODE_POOL, "-tpu", delete_path("nodeLocations"), "gke-flex-start-zones"),
    "TPU pool with per-zone limits": (NODE_POOL, "-tpu", set_path("autoscaling.maxNodeCount", 2),
                                      "gke-flex-start-zones"),
    "TPU pool without a total maximum": (NODE_POOL, "-tpu", delete_path("autoscaling.totalMaxNodeCount"),
                                         "gke-flex-start-zones"),
    "TPU pool balancing zones": (NODE_POOL, "-tpu", set_path("autoscaling.locationPolicy", "BALANCED"),
                                 "gke-flex-start-zones"),
    "TPU pool pulling its whole image": (NODE_POOL, "-tpu", delete_path("nodeConfig.gcfsConfig"),
                                         "gke-image-streaming"),
    "TPU pool with streaming off": (NODE_POOL, "-tpu", set_path("nodeConfig.gcfsConfig.enabled", False),
                                    "gke-image-streaming"),
    "TPU pool on Ubuntu": (NODE_POOL, "-tpu", set_path("nodeConfig.imageType", "UBUNTU_CONTAINERD"),
                           "gke-image-streaming"),
    "regional cluster": (CLUSTER, "", set_path("location", "us-east5"), "gke-zonal-cluster"),
    "cluster without labels": (CLUSTER, "", delete_path("resourceLabels"), "stack-labels"),
    "TPU nodes labelled for another stack": (NODE_POOL, "-tpu", set_path("nodeConfig.resourceLabels.stack", "dev"),
                                             "stack-labels"),
}


@pytest.mark.parametrize("variant", sorted(UNSAFE))
def test_unsafe_gke_variant_is_reported(captured: dict[str, Captured], variant: str) -> None:
    type_token, name_part, mutate, policy = UNSAFE[variant]
    resource = captured["new cluster"].one(type_token, name_part)
    props = copy.deepcopy(resource.inputs)
    mutate(props)
    assert policy in violations(resource, "gke", props=props)
    assert policy not in violations(resource, "gke")


def test_a_pool_that_is_not_flex_start_is_not_held_to_flex_start_limits(captured: dict[str, Captured]) -> None:
    system = captured["new cluster"].one(NODE_POOL, "-system")
    assert system.inputs["management"]["autoRepair"] is True and "flexStart" not in system.inputs["nodeConfig"]
    assert "gke-flex-start-node-pool" not in violations(system, "gke")
    assert system.inputs["nodeLocations"] == ["us-east5-b"] and "autoscaling" not in system.inputs
    assert "gke-flex-start-zones" not in violations(system, "gke")


def test_a_regional_cluster_passes_only_where_the_stacks_policy_config_allows_it(
        captured: dict[str, Captured]) -> None:
    cluster = captured["new cluster"].one(CLUSTER, "")
    regional = {**copy.deepcopy(cluster.inputs), "location": "us-east5"}
    assert "gke-zonal-cluster" in violations(cluster, "gke", props=regional)
    assert "gke-zonal-cluster" not in violations(cluster, "gke", props=regional,
                                                 config={"gke-zonal-cluster": {"allowRegionalCluster": True}})
    assert "gke-image-streaming" not in violations(captured["new cluster"].one(NODE_POOL, "-system"), "gke")


def test_the_policys_zones_are_the_stacks_data() -> None:
    from components.config import GKE_FLEX_START_V6E_ZONES

    assert rules.GKE_FLEX_START_V6E_ZONES == GKE_FLEX_START_V6E_ZONES == ("asia-northeast1-b", "us-east5-a",
                                                                          "us-east5-b")


def test_gke_types_need_no_entry_in_the_labels_table(captured: dict[str, Captured]) -> None:
    """Cluster and NodePool carry GCE labels as resourceLabels, which check_stack_labels reads by type."""
    declared = {r.type for run in captured.values() for r in run.resources if r.type.startswith("gcp:")}
    assert {t for t in declared if takes_labels(t)} <= rules.LABELLED_TYPES
