"""A fake container registry on 127.0.0.1 holding tags and the manifests they name (tests of tpuserve/registry.py,
preflight and `tpuserve images check`).

Built from the Docker Registry HTTP API v2 / OCI distribution-spec (spec.md "Pulling manifests", "Checking if
content exists in the registry", "Error Codes"; distribution/distribution docs/spec/api.md): `HEAD` and
`GET /v2/<name>/manifests/<tag or digest>`, the `Docker-Content-Digest` header, the content type of the manifest it
chose from the `Accept` list, 404 with {"errors": [{"code", "message", "detail"}]} and MANIFEST_UNKNOWN /
NAME_UNKNOWN (a HEAD answer carries no body); and its token authentication (docs/spec/auth/token.md: a 401 with
`WWW-Authenticate: Bearer realm=...,service=...,scope=repository:<name>:pull`; the realm answers {"token",
"access_token", "expires_in", "issued_at"}). Like Docker Hub, it serves a multi-arch index only to a client that
accepts one; otherwise the linux/amd64 manifest, whose digest is another. Docker Hub's pull limit answers 429
TOOMANYREQUESTS (https://docs.docker.com/docker-hub/usage/pulls/), which `rate_limited` turns on.

State: `tags` (repository -> tags); `held` (repository -> digests the registry keeps beyond those its tags name now:
older builds a moving tag once named, such as a pin of last month); `deleted`, digests removed since (a pin that went
away).
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse

from tests.fakes.httpfake import FakeServer, Request, Response

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
TOKEN = "registry-token-7f2c"
RATE_LIMIT = {"errors": [{"code": "TOOMANYREQUESTS", "message": "You have reached your pull rate limit. You may "
                          "increase the limit by authenticating and upgrading: https://www.docker.com/increase-rate-limit"}]}


def manifest_bytes(tag: str) -> tuple[bytes, bytes]:
    """(index, amd64 manifest) of a tag: real JSON shapes (OCI image-spec image-index.md, manifest.md)."""
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 7023,
                                      "digest": "sha256:" + hashlib.sha256(tag.encode()).hexdigest()},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                       "size": 9_871_234_567, "digest": "sha256:" + "1" * 64}]}).encode()
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": [
        {"mediaType": MANIFEST, "size": len(manifest), "digest": "sha256:" + hashlib.sha256(manifest).hexdigest(),
         "platform": {"architecture": "amd64", "os": "linux"}}]}).encode()
    return index, manifest


def digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class FakeRegistry(FakeServer):
    def __init__(self, tags: dict[str, list[str]], anonymous_pull: bool = True, send_digest: bool = True):
        super().__init__(fallback=self.route)
        self.tags, self.anonymous_pull, self.send_digest = tags, anonymous_pull, send_digest
        self.held: dict[str, set[str]] = {}
        self.deleted: set[str] = set()
        self.rate_limited = False

    def digest_of(self, repository: str, tag: str, accept: str = INDEX) -> str:
        index, manifest = manifest_bytes(f"{repository}:{tag}")
        return digest(index if INDEX in accept else manifest)

    def pinned(self, repository: str, tag: str) -> str:
        """`repository@<index digest>`, as `tpuserve up` pins a tag."""
        return f"{repository}@{self.digest_of(repository, tag)}"

    def by_digest(self, repository: str, wanted: str) -> tuple[bytes, str] | None:
        if wanted in self.deleted:
            return None
        if wanted in self.held.get(repository, set()):  # an older build: a stand-in body (no client hashes it)
            return manifest_bytes(f"{repository}@{wanted}")[0], INDEX
        for tag in self.tags.get(repository, []):
            index, manifest = manifest_bytes(f"{repository}:{tag}")
            for body, kind in ((index, INDEX), (manifest, MANIFEST)):
                if digest(body) == wanted:
                    return body, kind
        return None

    def route(self, request: Request) -> Response:
        if request.path == "/token":
            query = urllib.parse.parse_qs(request.query)
            if not self.anonymous_pull:
                return Response(401, {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]})
            assert query["service"] == ["registry.fake"] and query["scope"][0].endswith(":pull"), query
            return Response(200, {"token": TOKEN, "access_token": TOKEN, "expires_in": 300,
                                  "issued_at": "2026-08-22T10:00:00Z"})
        if not request.path.startswith("/v2/") or "/manifests/" not in request.path:
            return Response(404, {"errors": [{"code": "UNSUPPORTED", "message": "unknown route"}]})
        repository, _, reference = request.path[len("/v2/"):].partition("/manifests/")
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            challenge = (f'Bearer realm="{self.url}/token",service="registry.fake",'
                         f'scope="repository:{repository}:pull"')
            return Response(401, {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]},
                            {"WWW-Authenticate": challenge})
        if self.rate_limited:
            return Response(429, RATE_LIMIT)
        if repository not in self.tags and repository not in self.held:
            return Response(404, {"errors": [{"code": "NAME_UNKNOWN", "message": "repository name not known to "
                                              "registry", "detail": {"name": repository}}]})
        accept = request.headers.get("Accept", "")
        if reference.startswith("sha256:"):
            found = self.by_digest(repository, reference)
            if found is None:
                return Response(404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown",
                                                  "detail": {"Digest": reference}}]})
            body, kind = found
        elif reference not in self.tags.get(repository, []):
            return Response(404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown",
                                              "detail": {"Tag": reference}}]})
        else:
            index, manifest = manifest_bytes(f"{repository}:{reference}")
            body, kind = (index, INDEX) if INDEX in accept else (manifest, MANIFEST)
        named = reference if reference.startswith("sha256:") else digest(body)
        headers = {"Content-Type": kind, **({"Docker-Content-Digest": named} if self.send_digest else {})}
        return Response(200, body if request.method == "GET" else b"", headers)
