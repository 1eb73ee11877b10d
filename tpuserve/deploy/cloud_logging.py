"""The vLLM container's logs, read back from Cloud Logging where the VM's Ops Agent ships them (no ssh needed):
Logging API `entries.list` (https://cloud.google.com/logging/docs/reference/v2/rest/v2/entries/list) filtered by
the VM's numeric `instance_id`, so a VM recreated under the same name is not mixed in."""

from __future__ import annotations

import json
from typing import Any

from tpuserve.client import error_message
from tpuserve.facts import CONTAINER_LOG_NAME
from tpuserve.gce import JsonApi

LOGGING_URL = "https://logging.googleapis.com"
MAX_PAGE_SIZE = 1000  # entries.list's own cap on pageSize


class LoggingApiError(RuntimeError):
    """The Logging API answered with an HTTP error; the message is the API's own."""

    def __init__(self, status: int, message: str):
        super().__init__(f"Cloud Logging API HTTP {status}: {message}")
        self.status = status


def container_log_filter(project: str, instance_id: str) -> str:
    """The Logging query language filter for one VM's container log."""
    return (f'logName="projects/{project}/logs/{CONTAINER_LOG_NAME}" AND resource.type="gce_instance" AND '
            f'resource.labels.instance_id="{instance_id}"')


def entry_text(entry: dict[str, Any]) -> str:
    """One entry as the line the container printed: Docker's `log` field (its trailing newline dropped), else a
    text payload, else the JSON payload as it came."""
    if "textPayload" in entry:
        return str(entry["textPayload"]).rstrip("\n")
    payload = entry.get("jsonPayload")
    if isinstance(payload, dict):
        for key in ("log", "message"):
            if isinstance(payload.get(key), str):
                return payload[key].rstrip("\n")
        return json.dumps(payload, sort_keys=True)
    return ""


class LoggingClient(JsonApi):
    def latest_entries(self, project: str, log_filter: str, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` entries matching `log_filter`, oldest first (as a log reads)."""
        entries: list[dict[str, Any]] = []
        token = None
        while len(entries) < limit:
            body: dict[str, Any] = {"resourceNames": [f"projects/{project}"], "filter": log_filter,
                                    "orderBy": "timestamp desc", "pageSize": min(limit - len(entries), MAX_PAGE_SIZE)}
            if token:
                body["pageToken"] = token
            response = self.session.post(f"{self.base_url}/v2/entries:list", json=body, timeout=self.timeout_s)
            if not response.ok:
                raise LoggingApiError(response.status_code, error_message(response))
            page = response.json()
            entries += page.get("entries", [])
            token = page.get("nextPageToken")
            if not token:
                break
        return list(reversed(entries[:limit]))

    def container_log(self, project: str, instance_id: str, lines: int) -> str:
        """The last `lines` lines the VM's vLLM container printed, as text ('' when none were shipped)."""
        entries = self.latest_entries(project, container_log_filter(project, instance_id), lines)
        return "\n".join(entry_text(entry) for entry in entries)
