"""A small Compute Engine API client: what the readiness gate reads about one VM.

Three calls: the guest attributes the VM's startup script writes (its boot stage), the instance resource (whether it
still exists and runs; for `tpuserve status` also its timestamps and flex-start run limit), and the serial console
(the last lines explain a failed boot). The base URL is
a parameter so tests point it at a fake on 127.0.0.1; the session is too, so tests pass a plain `requests.Session`
where real runs use application-default credentials.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests

from tpuserve.client import error_message

COMPUTE_URL = "https://compute.googleapis.com"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
DEFAULT_TIMEOUT_S = 30.0


class ComputeApiError(RuntimeError):
    """The Compute API answered with an HTTP error other than 'no guest attributes yet'."""

    def __init__(self, status: int, message: str):
        super().__init__(f"Compute API HTTP {status}: {message}")
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


class ComputeClient:
    def __init__(self, session: requests.Session, base_url: str = COMPUTE_URL,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, instance: Instance, method: str = "", params: dict[str, str] | None = None) -> requests.Response:
        path = f"{instance.path}/{method}" if method else instance.path
        return self.session.get(f"{self.base_url}{path}", params=params, timeout=self.timeout_s)

    def instance(self, instance: Instance) -> dict[str, Any]:
        """The instance resource (compute#instance: status, creationTimestamp, lastStartTimestamp, machineType,
        scheduling.maxRunDuration, ...); a deleted VM raises with status 404."""
        return ok(self._get(instance)).json()

    def instance_status(self, instance: Instance) -> str:
        """The VM's lifecycle status (PROVISIONING, RUNNING, TERMINATED, ...); a deleted VM raises with status 404."""
        return str(self.instance(instance).get("status", ""))

    def guest_attributes(self, instance: Instance, namespace: str) -> dict[str, str]:
        """key -> value of the instance's guest attributes in `namespace`; empty while there are none (the API
        answers 404 until the VM writes the first one, and again once the VM is gone)."""
        response = self._get(instance, "getGuestAttributes", {"queryPath": f"{namespace}/"})
        if response.status_code == 404:
            return {}
        items = ok(response).json().get("queryValue", {}).get("items", [])
        return {item["key"]: item.get("value", "") for item in items if item.get("namespace") == namespace}

    def serial_output(self, instance: Instance, port: int = 1) -> str:
        """Everything the serial port still buffers (the API keeps the last ~1 MB)."""
        return str(ok(self._get(instance, "serialPort", {"port": str(port)})).json().get("contents", ""))


def ok(response: requests.Response) -> requests.Response:
    """The response, or ComputeApiError with the API's own message when it is an HTTP error."""
    if not response.ok:
        raise ComputeApiError(response.status_code, error_message(response))
    return response
