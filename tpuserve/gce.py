"""A small Compute Engine API client: one VM for the gate and `status`, zones for `up` and `preflight`, disks for
the caches. The base URL and session are parameters, so tests use a fake on 127.0.0.1 and a plain session."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import requests

from tpuserve.client import error_message
from tpuserve.guest_state import expand

COMPUTE_URL = "https://compute.googleapis.com"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
DEFAULT_TIMEOUT_S = 30.0


class ComputeApiError(RuntimeError):
    """A Google API answered with an HTTP error: "Compute API HTTP 403: ..." (`api` names another, or none)."""

    def __init__(self, status: int, message: str, api: str = "Compute API"):
        super().__init__(f"{api} HTTP {status}: {message}".lstrip())
        self.status = status


@dataclass(frozen=True)
class Instance:
    project: str
    zone: str
    name: str

    @property
    def path(self) -> str:
        return f"/compute/v1/projects/{self.project}/zones/{self.zone}/instances/{self.name}"


class MissingCredentials(RuntimeError):
    """No application-default credentials; the message says how to get them."""


def adc_session() -> requests.Session:
    """A session authorized with application-default credentials."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    from google.auth.transport.requests import AuthorizedSession

    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except DefaultCredentialsError as err:
        raise MissingCredentials(f"no Google application-default credentials ({err}); run "
                                 "`gcloud auth application-default login`") from err
    return AuthorizedSession(credentials)


class JsonApi:
    """A Google JSON API at `base_url` through `session` (application-default credentials, or plain for a fake)."""

    def __init__(self, session: requests.Session, base_url: str = COMPUTE_URL, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def zonal(self, project: str, zone: str, path: str) -> str:
        return f"{self.base_url}/compute/v1/projects/{project}/zones/{zone}/{path}"

    def get_or_none(self, url: str) -> dict[str, Any] | None:
        """The resource, or None when there is none (404)."""
        response = self.session.get(url, timeout=self.timeout_s)
        return None if response.status_code == 404 else ok(response).json()

    def pages(self, url: str, params: Mapping[str, str] | None = None) -> Iterator[dict[str, Any]]:
        """Every page of a list, following its nextPageToken."""
        params = dict(params or {})
        while True:
            body = ok(self.session.get(url, params=params, timeout=self.timeout_s)).json()
            yield body
            if not body.get("nextPageToken"):
                return
            params["pageToken"] = body["nextPageToken"]

    def items(self, url: str, params: Mapping[str, str], scoped: str = "") -> list[dict[str, Any]]:
        """Every item across pages; `scoped` reads an aggregated list (`items` map each zone to {scoped: [...]})."""
        return [item for body in self.pages(url, params) for item in (
            [i for zone in body.get("items", {}).values() for i in zone.get(scoped, [])] if scoped
            else body.get("items", []))]


class ComputeClient(JsonApi):
    def _get(self, instance: Instance, method: str = "", params: dict[str, str] | None = None) -> requests.Response:
        path = f"{instance.path}/{method}" if method else instance.path
        return self.session.get(f"{self.base_url}{path}", params=params, timeout=self.timeout_s)

    def instance(self, instance: Instance) -> dict[str, Any]:
        """The instance resource (status, timestamps, scheduling, ...); a deleted VM raises with status 404."""
        return ok(self._get(instance)).json()

    def guest_attributes(self, instance: Instance, namespace: str) -> dict[str, str]:
        """The guest attributes in `namespace`; none (a 404) until the VM writes the first, and once it is gone."""
        response = self._get(instance, "getGuestAttributes", {"queryPath": f"{namespace}/"})
        if response.status_code == 404:
            return {}
        items = ok(response).json().get("queryValue", {}).get("items", [])
        # The VM's boot state is one JSON attribute: readers get its fields as keys (tpuserve/guest_state.py).
        return expand({item["key"]: item.get("value", "") for item in items if item.get("namespace") == namespace})

    def serial_output(self, instance: Instance, port: int = 1) -> str:
        """Everything the serial port still buffers (the API keeps the last ~1 MB)."""
        return str(ok(self._get(instance, "serialPort", {"port": str(port)})).json().get("contents", ""))

    def machine_type(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        """The machine type as the zone offers it, or None when it does not (404, or 400 for no such zone)."""
        response = self.session.get(self.zonal(project, zone, f"machineTypes/{name}"), timeout=self.timeout_s)
        if response.status_code in (400, 404):
            return None
        return dict(ok(response).json())

    def labelled(self, project: str, zone: str, collection: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """The zone's instances or disks (`collection`) that carry every label."""
        return self.items(self.zonal(project, zone, collection), {"filter": label_filter(labels), "maxResults": "500"})

    def aggregated_instances(self, project: str, list_filter: str = "") -> list[dict[str, Any]]:
        """Every instance of the project in every zone, matching `list_filter` if given."""
        params = {"maxResults": "500", **({"filter": list_filter} if list_filter else {})}
        return self.items(f"{self.base_url}/compute/v1/projects/{project}/aggregated/instances", params, "instances")

    def delete(self, project: str, zone: str, collection: str, name: str) -> str:
        """Start deleting an instance or disk; returns the zonal operation's name (a 404 means already gone)."""
        response = self.session.delete(self.zonal(project, zone, f"{collection}/{name}"), timeout=self.timeout_s)
        if response.status_code == 404:
            return ""
        return str(ok(response).json().get("name", ""))


def label_filter(labels: Mapping[str, str]) -> str:
    """A list filter matching every label: `(labels.app = "tpu-serve") (labels.stack = "dev")` (the API ANDs them)."""
    return " ".join(f'(labels.{key} = "{value}")' for key, value in sorted(labels.items()))


def ok(response: requests.Response) -> requests.Response:
    """The response, or ComputeApiError with the API's own message when it is an HTTP error."""
    if not response.ok:
        raise ComputeApiError(response.status_code, error_message(response))
    return response


def ok_or_gone(response: requests.Response) -> None:
    """A deletion's answer: done, or already gone (404)."""
    if response.status_code != 404:
        ok(response)


class ZonalDisks(JsonApi):
    """Zonal disks, each change waiting for its operation (cloud.google.com/compute/docs/reference/rest/v1/disks)."""

    def __init__(self, session: requests.Session, base_url: str = COMPUTE_URL, timeout_s: float = DEFAULT_TIMEOUT_S,
                 poll_s: float = 2.0):
        super().__init__(session, base_url, timeout_s)
        self.poll_s = poll_s

    def get(self, project: str, zone: str, name: str) -> dict | None:
        return self.get_or_none(self.zonal(project, zone, f"disks/{name}"))

    def insert(self, project: str, zone: str, body: dict) -> dict:
        self.call("post", project, zone, "disks", json=body)
        return self.get(project, zone, body["name"]) or {}

    def resize(self, project: str, zone: str, name: str, size_gb: int) -> None:
        self.call("post", project, zone, f"disks/{name}/resize", json={"sizeGb": str(size_gb)})

    def update_performance(self, project: str, zone: str, name: str, fields: Mapping[str, str]) -> None:
        """Provisioned IOPS/throughput in place, as terraform-provider-google's "Performance (PATCH)" (4 h apart)."""
        query = "&".join(f"paths={key}" for key in fields)
        self.call("patch", project, zone, f"disks/{name}?{query}", json={"name": name, **fields})

    def delete(self, project: str, zone: str, name: str) -> None:
        response = self.session.delete(self.zonal(project, zone, f"disks/{name}"), timeout=self.timeout_s)
        if response.status_code != 404:
            self.wait(project, zone, ok(response).json())

    def call(self, method: str, project: str, zone: str, path: str, **kwargs: Any) -> None:
        """A mutating call, then its zonal operation until DONE."""
        response = self.session.request(method, self.zonal(project, zone, path), timeout=self.timeout_s, **kwargs)
        self.wait(project, zone, ok(response).json())

    def aggregated(self, project: str, label_filter: str) -> list[dict]:
        """Every disk in every zone matching `label_filter` (e.g. `labels.tpu-serve-cache=dev`)."""
        return self.items(f"{self.base_url}/compute/v1/projects/{project}/aggregated/disks", {"filter": label_filter},
                          "disks")

    def wait_operation(self, response: requests.Response) -> None:
        """Wait for the operation a call answered, in any scope (its selfLink); a 404 (already gone) is done."""
        if response.status_code == 404:
            return
        operation = ok(response).json()
        link = str(operation.get("selfLink", ""))
        path = link.split("/compute/", 1)[1] if "/compute/" in link else ""
        self.until_done(operation, f"{self.base_url}/compute/{path}" if path else "")

    def wait(self, project: str, zone: str, operation: dict) -> None:
        self.until_done(operation, self.zonal(project, zone, f"operations/{operation['name']}"))

    def until_done(self, operation: dict, url: str) -> None:
        """Poll the operation at `url` until DONE (no url: as it is); its `error` becomes a ComputeApiError."""
        while operation.get("status") != "DONE" and url:
            time.sleep(self.poll_s)
            operation = ok(self.session.get(url, timeout=self.timeout_s)).json()
        errors = operation.get("error", {}).get("errors", [])
        if errors:
            raise ComputeApiError(int(operation.get("httpErrorStatusCode") or 400),
                                  "; ".join(str(e.get("message", e)) for e in errors))
