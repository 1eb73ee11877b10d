"""Fake Google APIs on 127.0.0.1 for preflight and the orphan sweep: one tests/httpfake server, every API's paths.

Response bodies follow the APIs' REST references (field names as the official client types spell them):
Resource Manager v1 `Project`, Service Usage v1 `services.batchGet` -> `{"services": [Service]}` with `state`
ENABLED/DISABLED, Compute v1 `MachineType`, `InstanceList`/`DiskList` (no `items` when empty) and `Operation`, Cloud
Quotas v1 `QuotaInfo` (`dimensionsInfos[].dimensions`, `.details.value` as an int64 string, `.applicableLocations`),
Secret Manager v1 `Secret` and `SecretVersion` (`state` ENABLED/DISABLED/DESTROYED), Resource Manager
`testIamPermissions` -> the granted subset. Errors use Google's JSON error envelope. Beside them, the container
registry preflight asks (tests/fakes/fake_registry.py's shapes): `images` are the pinned references it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from tests.fakes.httpfake import FakeServer, Request, Response
from tpuserve.deploy.preflight import PERMISSIONS
from tpuserve.facts import VLLM_TPU_IMAGE

PROJECT = "my-ml-sandbox"
INDEX = "application/vnd.oci.image.index.v1+json"
NUMBER = "415104041262"


def google_error(code: int, message: str, status: str, reason: str = "") -> Response:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if reason:
        error["errors"] = [{"message": message, "domain": "global", "reason": reason}]
    return Response(code, {"error": error})


def quota_info(quota_id: str, metric: str, infos: list[dict[str, Any]], dimensions: list[str]) -> dict[str, Any]:
    return {"name": f"projects/{NUMBER}/locations/global/services/compute.googleapis.com/quotaInfos/{quota_id}",
            "quotaId": quota_id, "metric": metric, "service": "compute.googleapis.com", "isPrecise": True,
            "containerType": "PROJECT", "dimensions": dimensions, "metricDisplayName": metric.rsplit("/", 1)[-1],
            "quotaDisplayName": quota_id, "metricUnit": "1", "dimensionsInfos": infos}


def dimensions_info(value: int, locations: list[str], **dimensions: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"details": {"value": str(value)}, "applicableLocations": locations}
    if dimensions:
        entry["dimensions"] = dimensions
    return entry


@dataclass
class GoogleFake:
    """What the fake project holds; `routes()` serves it. Change the fields before starting the server."""

    zones_offering: set[str] = field(default_factory=lambda: {"europe-west4-a", "us-east5-a", "us-east5-b",
                                                               "us-east1-d", "us-central1-b", "us-central1-ai1a"})
    enabled: set[str] = field(default_factory=lambda: {
        "compute.googleapis.com", "secretmanager.googleapis.com", "iam.googleapis.com", "cloudquotas.googleapis.com",
        "monitoring.googleapis.com", "logging.googleapis.com", "storage.googleapis.com", "storage-api.googleapis.com"})
    # region -> limit of PREEMPTIBLE-TPU-V6E-per-project-region; regions not listed get the default of 1536
    preemptible: dict[str, int] = field(default_factory=dict)
    # region -> limit of TPUS-PER-TPU-FAMILY-per-project-region for CT6E; unlisted regions inherit 0
    family: dict[str, int] = field(default_factory=dict)
    secret_state: str | None = "ENABLED"  # None: no such secret
    granted: tuple[str, ...] = PERMISSIONS
    instances: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # zone -> labelled instances
    disks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    # zone -> the stack's cache disks there (disks.aggregatedList by the tpu-serve-cache label); None: the list fails
    cache_disks: dict[str, list[dict[str, Any]]] | None = field(default_factory=dict)
    images: tuple[str, ...] = (VLLM_TPU_IMAGE,)  # pinned references the registry holds

    def start(self) -> FakeServer:
        return FakeServer(self.routes())

    def endpoint_options(self, url: str) -> list[str]:
        """Every API root the toolkit knows (preflight.Endpoints) at this fake: nothing may reach out."""
        from tpuserve.deploy.preflight import Endpoints

        return [option for api in Endpoints.__dataclass_fields__ for option in ("--endpoint", f"{api}={url}")]

    def routes(self) -> dict[tuple[str, str], Any]:
        routes: dict[tuple[str, str], Any] = {
            ("GET", f"/v1/projects/{PROJECT}"): lambda r: Response(200, {
                "projectNumber": NUMBER, "projectId": PROJECT, "lifecycleState": "ACTIVE", "name": PROJECT,
                "createTime": "2025-01-09T12:00:00.000Z"}),
            ("GET", f"/v1/projects/{PROJECT}/services:batchGet"): self.batch_get,
            ("POST", f"/v1/projects/{PROJECT}:testIamPermissions"): lambda r: Response(200, {
                "permissions": [p for p in r.json()["permissions"] if p in self.granted]}),
            ("GET", f"/v1/projects/{PROJECT}/secrets/hf-token"): self.secret,
            ("GET", f"/v1/projects/{PROJECT}/secrets/hf-token/versions/latest"): self.secret_version,
            ("GET", self.quota_path("PREEMPTIBLE-TPU-V6E-per-project-region")): self.preemptible_quota,
            ("GET", self.quota_path("TPUS-PER-TPU-FAMILY-per-project-region")): self.family_quota,
        }
        for image in self.images:
            repository, digest = image.split("@")
            path = f"/v2/{repository}/manifests/{digest}"
            routes[("HEAD", path)] = routes[("GET", path)] = lambda r, digest=digest: Response(
                200, {"schemaVersion": 2, "mediaType": INDEX, "manifests": []} if r.method == "GET" else b"",
                {"Content-Type": INDEX, "Docker-Content-Digest": digest})
        routes[("GET", f"/compute/v1/projects/{PROJECT}/aggregated/disks")] = self.aggregated_disks
        routes[("GET", f"/compute/v1/projects/{PROJECT}/aggregated/instances")] = self.aggregated_instances
        zones = {"europe-west4-a", "us-east5-a", "us-east5-b", "us-east1-d", "us-central1-b", "us-central1-ai1a",
                 "asia-northeast1-b", "us-south1-ai1b", "europe-west8-a"}
        for zone in zones:
            base = f"/compute/v1/projects/{PROJECT}/zones/{zone}"
            for machine_type in ("ct6e-standard-1t", "ct6e-standard-4t", "ct6e-standard-8t"):
                routes[("GET", f"{base}/machineTypes/{machine_type}")] = self.machine_type(zone, machine_type)
            routes[("GET", f"{base}/instances")] = self.listing(zone, self.instances, "instance")
            routes[("GET", f"{base}/disks")] = self.listing(zone, self.disks, "disk")
            for item in self.instances.get(zone, []):
                routes[("DELETE", f"{base}/instances/{item['name']}")] = self.delete(zone, "instances", item["name"])
            for item in self.disks.get(zone, []):
                routes[("DELETE", f"{base}/disks/{item['name']}")] = self.delete(zone, "disks", item["name"])
        return routes

    def aggregated_disks(self, request: Request) -> Response:
        """disks.aggregatedList (https://cloud.google.com/compute/docs/reference/rest/v1/disks/aggregatedList): items
        keyed by `zones/ZONE`, a zone without matches carrying a `warning` instead of `disks`."""
        if self.cache_disks is None:
            return google_error(403, "Required 'compute.disks.list' permission for 'projects/" + PROJECT + "'",
                                "PERMISSION_DENIED", "forbidden")
        wanted = parse_qs(request.query).get("filter", [""])[0]
        if wanted == "labels.tpu-serve-cache=dev":
            items = {f"zones/{zone}": {"disks": disks} for zone, disks in self.cache_disks.items()}
        else:  # every labelled disk (the inventory): the stack's other disks and its cache disks
            zones = set(self.cache_disks) | set(self.disks)
            items = {f"zones/{zone}": {"disks": [*self.disks.get(zone, []), *self.cache_disks.get(zone, [])]}
                     for zone in zones}
        items["zones/us-west1-a"] = {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no results for "
                                                 "scope 'zones/us-west1-a' on this page."}}
        return Response(200, {"kind": "compute#diskAggregatedList", "items": items})

    def aggregated_instances(self, request: Request) -> Response:
        """instances.aggregatedList (https://cloud.google.com/compute/docs/reference/rest/v1/instances/aggregatedList),
        every instance the fake holds."""
        items = {f"zones/{zone}": {"instances": held} for zone, held in self.instances.items() if held}
        return Response(200, {"kind": "compute#instanceAggregatedList", "items": items})

    @staticmethod
    def quota_path(quota_id: str) -> str:
        return f"/v1/projects/{PROJECT}/locations/global/services/compute.googleapis.com/quotaInfos/{quota_id}"

    def batch_get(self, request: Request) -> Response:
        names = parse_qs(request.query)["names"]
        return Response(200, {"services": [
            {"name": f"projects/{NUMBER}/services/{name.rsplit('/', 1)[-1]}", "parent": f"projects/{NUMBER}",
             "config": {"name": name.rsplit("/", 1)[-1]},
             "state": "ENABLED" if name.rsplit("/", 1)[-1] in self.enabled else "DISABLED"} for name in names]})

    def machine_type(self, zone: str, name: str) -> Any:
        def serve(request: Request) -> Response:
            if zone not in self.zones_offering:
                message = f"The resource 'projects/{PROJECT}/zones/{zone}/machineTypes/{name}' was not found"
                return google_error(404, message, "NOT_FOUND", "notFound")
            return Response(200, {"kind": "compute#machineType", "name": name, "zone": zone, "isSharedCpu": False,
                                  "selfLink": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/"
                                              f"machineTypes/{name}"})
        return serve

    def quota_disabled(self) -> Response | None:
        if "cloudquotas.googleapis.com" in self.enabled:
            return None
        return google_error(403, f"Cloud Quotas API has not been used in project {NUMBER} before or it is "
                                 "disabled.", "PERMISSION_DENIED")

    def preemptible_quota(self, request: Request) -> Response:
        regions = sorted({"europe-west4", "us-east5", "us-east1", "us-central1", "asia-northeast1"}
                         - set(self.preemptible))
        infos = [dimensions_info(limit, [region], region=region) for region, limit in self.preemptible.items()]
        infos.append(dimensions_info(1536, regions))  # the default every other region inherits
        return self.quota_disabled() or Response(200, quota_info(
            "PREEMPTIBLE-TPU-V6E-per-project-region", "compute.googleapis.com/preemptible_tpu_v6e", infos, ["region"]))

    def family_quota(self, request: Request) -> Response:
        infos = [dimensions_info(limit, [region], region=region, tpu_family="CT6E")
                 for region, limit in self.family.items()]
        infos.append(dimensions_info(0, ["global"]))  # unset regions and families: zero
        return self.quota_disabled() or Response(200, quota_info(
            "TPUS-PER-TPU-FAMILY-per-project-region", "compute.googleapis.com/tpus_per_tpu_family", infos,
            ["region", "tpu_family"]))

    def secret(self, request: Request) -> Response:
        if self.secret_state is None:
            return google_error(404, f"Secret [projects/{NUMBER}/secrets/hf-token] not found or has no versions.",
                                "NOT_FOUND")
        return Response(200, {"name": f"projects/{NUMBER}/secrets/hf-token", "replication": {"automatic": {}},
                              "createTime": "2025-01-09T12:00:00.000000Z", "etag": '"16280f2c1b4f28"'})

    def secret_version(self, request: Request) -> Response:
        if self.secret_state is None:
            return self.secret(request)
        return Response(200, {"name": f"projects/{NUMBER}/secrets/hf-token/versions/3", "state": self.secret_state,
                              "createTime": "2025-01-09T12:00:00.000000Z", "etag": '"16280f2c1b4f28"',
                              "replicationStatus": {"automatic": {}}})

    def listing(self, zone: str, held: dict[str, list[dict[str, Any]]], kind: str) -> Any:
        def serve(request: Request) -> Response:
            body: dict[str, Any] = {"kind": f"compute#{kind}List", "id": f"projects/{PROJECT}/zones/{zone}/{kind}s",
                                    "selfLink": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/"
                                                f"{zone}/{kind}s"}
            wanted = parse_qs(request.query).get("filter", [""])[0]
            items = [item for item in held.get(zone, []) if all(f'(labels.{k} = "{v}")' in wanted
                                                               for k, v in item.get("labels", {}).items()
                                                               if k in ("app", "stack"))]
            if items:
                body["items"] = items
            return Response(200, body)
        return serve

    def delete(self, zone: str, collection: str, name: str) -> Any:
        def serve(request: Request) -> Response:
            self.deleted.append(f"{zone}/{collection}/{name}")
            held = self.instances if collection == "instances" else self.disks
            held[zone] = [item for item in held.get(zone, []) if item["name"] != name]  # gone once deleted
            return Response(200, {"kind": "compute#operation", "name": f"operation-1764410400000-{len(self.deleted)}",
                                  "operationType": "delete", "status": "RUNNING",
                                  "targetLink": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/"
                                                f"{zone}/{collection}/{name}"})
        return serve


def labelled_instance(zone: str, name: str = "tpu-serve-dev", status: str = "TERMINATED",
                      stack: str = "dev", machine_type: str = "ct6e-standard-1t") -> dict[str, Any]:
    return {"kind": "compute#instance", "name": name, "status": status, "id": "8167227395441398722",
            "machineType": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/machineTypes/"
                           f"{machine_type}",
            "zone": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}",
            "creationTimestamp": "2026-11-29T01:58:00.000-08:00",
            "labels": {"app": "tpu-serve", "stack": stack, "managed-by": "pulumi", "env": stack}}


def state_with_instance(zone: str, name: str = "tpu-serve-dev") -> dict[str, Any]:
    """`pulumi stack export` of a stack holding its VM (the provider id is projects/P/zones/Z/instances/N)."""
    return {"version": 3, "deployment": {"manifest": {"time": "2026-11-29T02:00:00Z"}, "resources": [
        {"urn": "urn:pulumi:dev::tpu-serve::pulumi:pulumi:Stack::tpu-serve-dev", "type": "pulumi:pulumi:Stack"},
        {"urn": f"urn:pulumi:dev::tpu-serve::tpuserve:index:Deployment$tpuserve:gcp:FlexStartTpuVm$"
                f"gcp:compute/instance:Instance::{name}", "type": "gcp:compute/instance:Instance", "custom": True,
         "id": f"projects/{PROJECT}/zones/{zone}/instances/{name}", "outputs": {"name": name, "zone": zone}}]}}
