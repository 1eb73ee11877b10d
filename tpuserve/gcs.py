"""A small Cloud Storage JSON API client for the compile-cache bucket: https://cloud.google.com/storage/docs/json_api/v1
(buckets, objects). The base URL and session are parameters, so tests use a fake on 127.0.0.1."""

from __future__ import annotations

from urllib.parse import quote

import requests

from tpuserve.gce import DEFAULT_TIMEOUT_S, JsonApi, ok, ok_or_gone

STORAGE_URL = "https://storage.googleapis.com"


class Buckets(JsonApi):
    def __init__(self, session: requests.Session, base_url: str = STORAGE_URL, timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__(session, base_url, timeout_s)

    def url(self, name: str = "", path: str = "") -> str:
        return f"{self.base_url}/storage/v1/b" + (f"/{quote(name)}{path}" if name else "")

    def get(self, name: str) -> dict | None:
        return self.get_or_none(self.url(name))

    def list(self, project: str) -> list[dict]:
        return self.items(self.url(), {"project": project})

    def insert(self, project: str, body: dict) -> dict:
        return ok(self.session.post(self.url(), params={"project": project}, json=body, timeout=self.timeout_s)).json()

    def objects(self, name: str, prefix: str = "") -> list[dict]:
        return self.items(self.url(name, "/o"), {"prefix": prefix})

    def delete(self, name: str) -> None:
        """Delete every object, then the bucket (a bucket must be empty to be deleted)."""
        for item in self.objects(name):
            ok_or_gone(self.session.delete(self.url(name, f"/o/{quote(item['name'], safe='')}"),
                                           timeout=self.timeout_s))
        ok_or_gone(self.session.delete(self.url(name), timeout=self.timeout_s))
