"""A small Cloud Storage JSON API client: the compile-cache bucket's lifecycle (tpuserve.deploy.cache).

Shapes: https://cloud.google.com/storage/docs/json_api/v1/buckets and .../objects. The base URL and session are
parameters, so tests use a fake on 127.0.0.1.
"""

from __future__ import annotations

from urllib.parse import quote

import requests

from tpuserve.gce import DEFAULT_TIMEOUT_S, ok

STORAGE_URL = "https://storage.googleapis.com"


class Buckets:
    def __init__(self, session: requests.Session, base_url: str = STORAGE_URL, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def get(self, name: str) -> dict | None:
        response = self.session.get(f"{self.base_url}/storage/v1/b/{quote(name)}", timeout=self.timeout_s)
        if response.status_code == 404:
            return None
        return ok(response).json()

    def list(self, project: str) -> list[dict]:
        items, page = [], ""
        while True:
            params = {"project": project, **({"pageToken": page} if page else {})}
            body = ok(self.session.get(f"{self.base_url}/storage/v1/b", params=params, timeout=self.timeout_s)).json()
            items += body.get("items", [])
            page = body.get("nextPageToken", "")
            if not page:
                return items

    def insert(self, project: str, body: dict) -> dict:
        return ok(self.session.post(f"{self.base_url}/storage/v1/b", params={"project": project}, json=body,
                                    timeout=self.timeout_s)).json()

    def objects(self, name: str, prefix: str = "") -> list[dict]:
        items, page = [], ""
        while True:
            params = {"prefix": prefix, **({"pageToken": page} if page else {})}
            body = ok(self.session.get(f"{self.base_url}/storage/v1/b/{quote(name)}/o", params=params,
                                       timeout=self.timeout_s)).json()
            items += body.get("items", [])
            page = body.get("nextPageToken", "")
            if not page:
                return items

    def delete(self, name: str) -> None:
        """Delete every object, then the bucket (a bucket must be empty to be deleted)."""
        for item in self.objects(name):
            response = self.session.delete(f"{self.base_url}/storage/v1/b/{quote(name)}/o/{quote(item['name'], safe='')}",
                                           timeout=self.timeout_s)
            if response.status_code != 404:
                ok(response)
        response = self.session.delete(f"{self.base_url}/storage/v1/b/{quote(name)}", timeout=self.timeout_s)
        if response.status_code != 404:
            ok(response)
