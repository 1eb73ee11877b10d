"""Every Kubernetes object the gke stack declares, validated with real validators: the built-in kinds against the
Kubernetes OpenAPI schemas that `kubernetes-validate` ships (strict: unknown fields are errors), for every minor
version from GKE_MIN_VERSION (the new cluster's floor, flex-start TPUs' minimum) to the newest the package knows,
since a release channel upgrades the cluster under the stack; the custom resources against their published CRDs
(tests/components/data/crds/, each file's source and commit in its header): PodMonitoring (GoogleCloudPlatform/prometheus-engine),
InferencePool (kubernetes-sigs/gateway-api-inference-extension v1.6.0), Gateway and HTTPRoute (kubernetes-sigs/
gateway-api v1.5.1), GKE's HealthCheckPolicy and GCPBackendPolicy (GoogleCloudPlatform/gke-gateway-api). CRD schemas
are made strict the way kubernetes-validate's strict schemas are: an object schema that lists its properties takes
no others (the API server drops or, with strict field validation, rejects unknown fields). Not checked: the CRDs' CEL
rules (x-kubernetes-validations).

The objects are taken from what the engine received under mocks, so what is validated is what `pulumi up` sends.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
from kubernetes_validate.utils import all_versions, major_minor
import pytest
import yaml
from packaging.version import Version

from components.gke import GKE_MIN_VERSION
from tests.fakes.pulumi_harness import StackRun, run_stack, stack_file_config

CRD_DIR = Path(__file__).resolve().parent / "data" / "crds"
# One schema set per minor version (the package ships a plain and a strict directory for each).
VERSIONS = sorted({major_minor(v) for v in all_versions() if Version(major_minor(v)) >= Version(GKE_MIN_VERSION)},
                  key=Version)


def as_integers(value: Any) -> Any:
    """The engine sends every number as a float (8000.0); Kubernetes receives them as JSON integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: as_integers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_integers(v) for v in value]
    return value


def declared_objects(run: StackRun) -> list[dict[str, Any]]:
    objects = []
    for resource in run.resources:
        if resource.type.startswith("kubernetes:") and resource.custom:
            obj = as_integers(resource.inputs)
            assert {"apiVersion", "kind", "metadata"} <= set(obj), resource.type
            objects.append(obj)
    return objects


@pytest.fixture(scope="module", autouse=True)
def schemas_read_once() -> Iterator[None]:
    """kubernetes-validate reads a kind's schema and its version's _definitions.json (1.4 MB of JSON) from disk on
    every validate() call; the files never change, so they are read once here (the validation itself is untouched)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kubernetes_validate.utils, "schema_contents",
                      functools.cache(kubernetes_validate.utils.schema_contents))
        yield


VARIANTS = {"as-declared": {}, "parked": {"gkeMinReplicas": "0"},
            "4-chip-token-from-config": {"machineType": "ct6e-standard-4t", "hfTokenSecretId": "",
                                         "hfToken": "hf_validate"},
            "inference-gateway-no-surge-no-bucket": {"gkeRouter": "inference-gateway", "gkeSurgeNode": "false",
                                                     "compileCacheBucket": "false"}}
CRD_FILES = {"PodMonitoring": "monitoring.googleapis.com_podmonitorings.yaml",
             "InferencePool": "inference.networking.k8s.io_inferencepools.yaml",
             "Gateway": "gateway.networking.k8s.io_gateways.yaml",
             "HTTPRoute": "gateway.networking.k8s.io_httproutes.yaml",
             "HealthCheckPolicy": "networking.gke.io_healthcheckpolicies.yaml",
             "GCPBackendPolicy": "networking.gke.io_gcpbackendpolicies.yaml"}
GATEWAY_KINDS = {"InferencePool", "Gateway", "HTTPRoute", "HealthCheckPolicy", "GCPBackendPolicy"}


BUILT_IN_GROUPS = {"", "apps", "batch", "policy", "autoscaling", "rbac.authorization.k8s.io"}
GATEWAY_VARIANT = "inference-gateway-no-surge-no-bucket"


@functools.cache
def variant_objects(variant: str) -> list[dict[str, Any]]:
    return declared_objects(run_stack({**stack_file_config("gke"), **VARIANTS[variant]}, "gke"))


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return variant_objects(request.param)


def strict(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object schema that lists its properties and does not
    keep unknown fields (x-kubernetes-preserve-unknown-fields) or say otherwise."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out and \
            not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.cache  # read once: parsing a CRD (up to 6,931 lines of YAML) for each validation was most of the time
def crd_schema(kind: str) -> dict[str, Any]:
    crd = yaml.load((CRD_DIR / CRD_FILES[kind]).read_text(), Loader=yaml.CSafeLoader)
    assert crd["spec"]["names"]["kind"] == kind
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert v1["served"] and v1["storage"]
    return strict(v1["schema"]["openAPIV3Schema"])


def pod_monitoring_schema() -> dict[str, Any]:
    return crd_schema("PodMonitoring")


# The API server checks `format: duration` with Go's time.ParseDuration ("30s", "1m30s"), not ISO 8601.
GO_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checks("duration")(lambda value: not isinstance(value, str) or bool(GO_DURATION.match(value)))


@functools.cache
def crd_validator(kind: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(crd_schema(kind), format_checker=FORMATS)


def validate_crd(obj: dict[str, Any]) -> None:
    crd_validator(obj["kind"]).validate(obj)


def validate(obj: dict[str, Any], version: str) -> None:
    if obj["kind"] in CRD_FILES:
        validate_crd(obj)
    else:
        kubernetes_validate.validate(obj, version, strict=True)


def test_schemas_cover_the_supported_versions() -> None:
    assert VERSIONS[0] == GKE_MIN_VERSION and len(VERSIONS) >= 2


@pytest.mark.parametrize("version", VERSIONS)
def test_every_declared_object_is_valid(objects: list[dict[str, Any]], version: str) -> None:
    kinds = [obj["kind"] for obj in objects]
    assert {"Namespace", "ServiceAccount", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
            "PodMonitoring"} <= set(kinds)
    # the renewal CronJob and its access wherever there is an HPA to renew with
    assert ({"CronJob", "ClusterRole", "ClusterRoleBinding"} <= set(kinds)) == ("HorizontalPodAutoscaler" in kinds)
    for obj in objects:
        validate(obj, version)


def deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return copy.deepcopy(next(obj for obj in objects if obj["kind"] == "Deployment"))


@pytest.mark.parametrize(("mutation", "complaint"), [
    (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(readinesProbe={}), "readinesProbe"),
    (lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("name"), "'name' is a required property"),
    (lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(containerPort="http"), "http"),
    (lambda d: d["spec"].update(replicas="one"), "one"),
])
def test_the_validator_rejects_a_broken_deployment(objects: list[dict[str, Any]], mutation, complaint: str) -> None:
    broken = deployment(objects)
    mutation(broken)
    with pytest.raises(kubernetes_validate.ValidationError, match=complaint):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


@pytest.mark.parametrize(("mutation", "complaint"), [
    (lambda spec: spec["endpoints"][0].pop("port"), "'port' is a required property"),
    (lambda spec: spec.pop("selector"), "'selector' is a required property"),
    (lambda spec: spec["endpoints"][0].update(interval="often"), "often"),
])
def test_the_crd_schema_rejects_a_broken_pod_monitoring(objects: list[dict[str, Any]], mutation,
                                                         complaint: str) -> None:
    broken = copy.deepcopy(next(obj for obj in objects if obj["kind"] == "PodMonitoring"))
    mutation(broken["spec"])
    with pytest.raises(jsonschema.ValidationError, match=complaint):
        validate_crd(broken)


def test_only_the_inference_gateway_router_declares_its_objects(objects) -> None:
    kinds = {obj["kind"] for obj in objects}
    routed = objects is variant_objects(GATEWAY_VARIANT)
    assert (GATEWAY_KINDS <= kinds) == routed
    assert not GATEWAY_KINDS & kinds or routed
    custom = {obj["kind"] for obj in objects if obj["apiVersion"].rpartition("/")[0] not in BUILT_IN_GROUPS}
    assert custom <= set(CRD_FILES)  # every custom kind is validated against its published schema here


@pytest.mark.parametrize(("kind", "mutation", "complaint"), [
    ("InferencePool", lambda spec: spec.pop("targetPorts"), "'targetPorts' is a required property"),
    ("InferencePool", lambda spec: spec["endpointPickerRef"].update(failureMode="Sometimes"), "Sometimes"),
    ("InferencePool", lambda spec: spec.update(selectors={}), "'selectors' was unexpected"),  # strict: a typo
    ("HTTPRoute", lambda spec: spec["rules"][0]["backendRefs"][0].update(weight=-1), "-1"),
    ("HTTPRoute", lambda spec: spec["rules"][0].update(backendRef={}), "'backendRef' was unexpected"),
    ("Gateway", lambda spec: spec.pop("gatewayClassName"), "'gatewayClassName' is a required property"),
    ("Gateway", lambda spec: spec["listeners"][0].update(port=0), "0"),
    ("GCPBackendPolicy", lambda spec: spec["default"]["connectionDraining"].update(drainingTimeoutSec=3601),
     "3601"),  # GKE's maximum is an hour
    ("GCPBackendPolicy", lambda spec: spec["default"].update(timeout=600), "'timeout' was unexpected"),
    ("HealthCheckPolicy", lambda spec: spec.pop("targetRef"), "'targetRef' is a required property"),
])
def test_the_crd_schemas_reject_a_broken_gateway_object(kind: str, mutation, complaint: str) -> None:
    (declared,) = [obj for obj in variant_objects(GATEWAY_VARIANT) if obj["kind"] == kind]
    broken = copy.deepcopy(declared)
    validate_crd(broken)
    mutation(broken["spec"])
    with pytest.raises(jsonschema.ValidationError, match=complaint):
        validate_crd(broken)
