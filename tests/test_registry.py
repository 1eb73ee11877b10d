"""A tag pinned to its digest (tpuserve/registry.py) against a fake registry on 127.0.0.1, and `tpuserve up` pinning a
stack's tag before its first `pulumi up` (the fake `pulumi` of tests/fake_pulumi.py records what it was given).

The fake registry is built from the Docker Registry HTTP API v2 (distribution/distribution docs/spec/api.md: `HEAD`
and `GET /v2/<name>/manifests/<reference>`, the `Docker-Content-Digest` header, the content type of the manifest it
chose from the `Accept` list, errors as {"errors": [{"code", "message", "detail"}]} with MANIFEST_UNKNOWN and
NAME_UNKNOWN) and its token authentication (docs/spec/auth/token.md: a 401 with `WWW-Authenticate: Bearer
realm=...,service=...,scope=repository:<name>:pull`; the realm answers {"token", "access_token", "expires_in",
"issued_at"}). Like Docker Hub, it serves a multi-arch index only to a client that accepts one; otherwise the
linux/amd64 manifest, whose digest is another.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from tests.fake_pulumi import FakePulumi, install
from tests.google_fakes import PROJECT, GoogleFake
from tests.httpfake import FakeServer, Request, Response
from tpuserve.deploy import gce
from tpuserve.facts import VLLM_TPU_IMAGE
from tpuserve.ops import up as up_module
from tpuserve.registry import MANIFEST_TYPES, Reference, RegistryError, pin_for_deploy, resolve

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
TOKEN = "registry-token-7f2c"


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


class FakeRegistry(FakeServer):
    def __init__(self, tags: dict[str, list[str]], anonymous_pull: bool = True, send_digest: bool = True):
        super().__init__(fallback=self.route)
        self.tags, self.anonymous_pull, self.send_digest = tags, anonymous_pull, send_digest

    def digest_of(self, repository: str, tag: str, accept: str = INDEX) -> str:
        index, manifest = manifest_bytes(f"{repository}:{tag}")
        return "sha256:" + hashlib.sha256(index if INDEX in accept else manifest).hexdigest()

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
        repository, _, tag = request.path[len("/v2/"):].partition("/manifests/")
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            challenge = (f'Bearer realm="{self.url}/token",service="registry.fake",'
                         f'scope="repository:{repository}:pull"')
            return Response(401, {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]},
                            {"WWW-Authenticate": challenge})
        if repository not in self.tags:
            return Response(404, {"errors": [{"code": "NAME_UNKNOWN", "message": "repository name not known to "
                                              "registry", "detail": {"name": repository}}]})
        if tag not in self.tags[repository]:
            return Response(404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown",
                                              "detail": {"Tag": tag}}]})
        accept = request.headers.get("Accept", "")
        index, manifest = manifest_bytes(f"{repository}:{tag}")
        body, kind = (index, INDEX) if INDEX in accept else (manifest, MANIFEST)
        headers = {"Content-Type": kind, **({"Docker-Content-Digest": self.digest_of(repository, tag, accept)}
                                            if self.send_digest else {})}
        return Response(200, body if request.method == "GET" else b"", headers)


@pytest.fixture
def registry():
    with FakeRegistry({"vllm/vllm-tpu": ["nightly", "nightly-20260822-b8692ff"], "library/ubuntu": ["22.04"]}) as fake:
        yield fake


def test_a_tag_is_pinned_to_the_index_digest_through_an_anonymous_token(registry):
    pinned = resolve("vllm/vllm-tpu:nightly", registry.url)
    assert pinned == f"vllm/vllm-tpu:nightly@{registry.digest_of('vllm/vllm-tpu', 'nightly')}"
    heads = [r for r in registry.requests if r.method == "HEAD"]
    assert len(heads) == 2 and "Authorization" not in heads[0].headers  # the 401, then with the token
    assert heads[1].headers["Authorization"] == f"Bearer {TOKEN}"
    assert heads[1].headers["Accept"] == ", ".join(MANIFEST_TYPES) and MANIFEST_TYPES[0] == INDEX
    # The multi-arch index's digest (what docker pull resolves too), not the amd64 manifest's.
    assert registry.digest_of("vllm/vllm-tpu", "nightly", accept=MANIFEST) not in pinned


def test_a_registry_that_sends_no_digest_header_gets_the_digest_of_the_manifest(tmp_path):
    with FakeRegistry({"vllm/vllm-tpu": ["nightly"]}, send_digest=False) as fake:
        pinned = resolve("vllm/vllm-tpu:nightly", fake.url)
    assert pinned.endswith("@" + fake.digest_of("vllm/vllm-tpu", "nightly"))


@pytest.mark.parametrize("image, message", [
    ("vllm/vllm-tpu:nightlyy", "vllm/vllm-tpu:nightlyy: no such tag or repository on registry-1.docker.io; check "
                               "containerImage"),
    ("vllm/vllm-gpu:nightly", "vllm/vllm-gpu:nightly: no such tag or repository on registry-1.docker.io; check "
                              "containerImage"),
])
def test_an_unknown_tag_or_repository_is_one_line(registry, image, message):
    with pytest.raises(RegistryError) as err:
        resolve(image, registry.url)
    assert str(err.value) == message


def test_a_private_image_says_to_pin_it_by_hand():
    with FakeRegistry({"acme/vllm-tpu": ["v1"]}, anonymous_pull=False) as fake:
        with pytest.raises(RegistryError, match=r"answered HTTP 401: a private image needs credentials; pin "
                                                r"containerImage to a digest yourself \(image@sha256:\.\.\.\)$"):
            resolve("acme/vllm-tpu:v1", fake.url)


def test_an_unreachable_registry_is_one_line():
    with pytest.raises(RegistryError, match=r"^could not reach registry-1\.docker\.io to pin vllm/vllm-tpu:nightly "
                                            r"\(ConnectionError\); retry"):
        resolve("vllm/vllm-tpu:nightly", "http://127.0.0.1:9")


@pytest.mark.parametrize("text, parsed", [
    ("vllm/vllm-tpu:nightly", Reference("registry-1.docker.io", "vllm/vllm-tpu", "nightly")),
    ("ubuntu", Reference("registry-1.docker.io", "library/ubuntu", "latest")),
    ("us-docker.pkg.dev/p/r/vllm-tpu:v1", Reference("us-docker.pkg.dev", "p/r/vllm-tpu", "v1")),
    ("localhost:5000/vllm", Reference("localhost:5000", "vllm", "latest")),
    (VLLM_TPU_IMAGE, Reference("registry-1.docker.io", "vllm/vllm-tpu", "", VLLM_TPU_IMAGE.partition("@")[2])),
])
def test_references_are_normalised_like_dockers(text, parsed):
    assert Reference.parse(text) == parsed


def test_the_default_and_images_given_with_a_digest_are_not_looked_up():
    assert pin_for_deploy("", "http://127.0.0.1:9") is None  # the default: the reviewed digest
    assert pin_for_deploy(VLLM_TPU_IMAGE, "http://127.0.0.1:9") is None
    assert pin_for_deploy("vllm/vllm-tpu:nightly@" + VLLM_TPU_IMAGE.partition("@")[2], "http://127.0.0.1:9") is None
    assert resolve(VLLM_TPU_IMAGE, "http://127.0.0.1:9") == VLLM_TPU_IMAGE
    with pytest.raises(RegistryError, match="is not an image reference"):
        resolve("vllm/vllm-tpu@sha256:short")


# --- `tpuserve up` ---------------------------------------------------------------------------------------------------

@pytest.fixture
def pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakePulumi:
    fake = install(tmp_path / "bin", tmp_path / "pulumi-home")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_PULUMI_HOME", str(fake.home))
    monkeypatch.setattr(gce, "adc_session", requests.Session)
    fake.set_config(project=PROJECT, zone="europe-west4-a", hfTokenSecretId="hf-token")
    return fake


def run_up(registry: FakeRegistry) -> tuple[int, dict, str]:
    google = GoogleFake()
    with google.start() as fake:
        result = CliRunner().invoke(up_module.up, ["--stack", "dev", "--json", "--zones", "europe-west4-a",
                                                   *google.endpoint_options(fake.url),
                                                   "--endpoint", f"registry={registry.url}"])
    lines = result.stdout.strip().splitlines()
    return result.exit_code, json.loads(lines[-1]) if lines else {}, result.stderr


def test_up_deploys_the_digest_a_named_tag_points_to_and_saves_it(pulumi: FakePulumi, registry):
    pulumi.set_config(project=PROJECT, zone="europe-west4-a", hfTokenSecretId="hf-token",
                      containerImage="vllm/vllm-tpu:nightly")
    pulumi.scenario({"europe-west4-a": {"rc": 0, "creates": True}})
    code, verdict, stderr = run_up(registry)
    assert code == 0, stderr
    digest = registry.digest_of("vllm/vllm-tpu", "nightly")
    [up] = [call for call in pulumi.calls() if call[0] == "up"]
    assert f"containerImage=vllm/vllm-tpu:nightly@{digest}" in up
    assert pulumi.config()["tpu-serve:containerImage"]["value"] == f"vllm/vllm-tpu:nightly@{digest}"
    assert f"containerImage vllm/vllm-tpu:nightly is a tag: deploying the digest it names now, {digest}" in stderr


def test_up_with_a_tag_the_registry_does_not_know_stops_before_any_pulumi_up(pulumi: FakePulumi, registry):
    pulumi.set_config(project=PROJECT, zone="europe-west4-a", hfTokenSecretId="hf-token",
                      containerImage="vllm/vllm-tpu:nightlyy")
    code, verdict, stderr = run_up(registry)
    assert code == 1 and verdict["ok"] is False
    assert verdict["reason"] == ("containerImage: vllm/vllm-tpu:nightlyy: no such tag or repository on "
                                 "registry-1.docker.io; check containerImage")
    assert [call for call in pulumi.calls() if call[0] == "up"] == []  # nothing created
    assert "Traceback" not in stderr


def test_up_with_the_default_image_asks_no_registry(pulumi: FakePulumi, registry):
    pulumi.scenario({"europe-west4-a": {"rc": 0, "creates": True}})
    code, _, stderr = run_up(registry)
    assert code == 0, stderr
    assert registry.requests == []
    [up] = [call for call in pulumi.calls() if call[0] == "up"]
    assert not any(arg.startswith("containerImage=") for arg in up)
