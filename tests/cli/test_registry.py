"""A tag pinned to its digest (tpuserve/registry.py) and a pinned image located on its registry, against the fake
registry of tests/fakes/fake_registry.py on 127.0.0.1; `tpuserve up` pinning a stack's tag before its first `pulumi up` (the
fake `pulumi` of tests/fakes/fake_pulumi.py records what it was given); `tpuserve images check`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from tests.fakes.fake_pulumi import FakePulumi, install
from tests.fakes.fake_registry import INDEX, MANIFEST, TOKEN, FakeRegistry
from tests.fakes.google_fakes import PROJECT, GoogleFake
from tpuserve.cli import main
from tpuserve import gce
from tpuserve.facts import VLLM_TPU_IMAGE, VLLM_TPU_IMAGE_EVIDENCE
from tpuserve.ops import up as up_module
from tpuserve.registry import (ABSENT, MANIFEST_TYPES, OK, UNKNOWN, Reference, RegistryError, locate, pin_for_deploy,
                               resolve)

PINNED_REPO, PINNED_DIGEST = VLLM_TPU_IMAGE.split("@")


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
    with pytest.raises(RegistryError, match="has a malformed digest: sha256 takes 64 hex digits, got 5"):
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


def test_up_with_the_default_image_resolves_no_tag_but_checks_the_pin_is_still_there(pulumi: FakePulumi, registry):
    registry.held[PINNED_REPO] = {PINNED_DIGEST}  # an older build the registry keeps by digest
    pulumi.scenario({"europe-west4-a": {"rc": 0, "creates": True}})
    code, _, stderr = run_up(registry)
    assert code == 0, stderr
    manifests = [(r.method, r.path) for r in registry.requests if "/manifests/" in r.path]
    assert set(manifests) == {("HEAD", f"/v2/{PINNED_REPO}/manifests/{PINNED_DIGEST}")}  # no tag looked up
    assert "ok       container image" in stderr
    [up] = [call for call in pulumi.calls() if call[0] == "up"]
    assert not any(arg.startswith("containerImage=") for arg in up)


def test_up_stops_in_preflight_when_the_pinned_default_is_gone_from_the_registry(pulumi: FakePulumi, registry):
    registry.held[PINNED_REPO] = {PINNED_DIGEST}
    registry.deleted.add(PINNED_DIGEST)
    code, verdict, stderr = run_up(registry)
    assert code == 1 and verdict["reason"] == "preflight failed"
    [check] = [c for c in verdict["preflight"]["checks"] if c["check"] == "container image"]
    assert check["status"] == "fail"
    assert check["detail"] == (f"{VLLM_TPU_IMAGE}: registry-1.docker.io has no such digest or repository "
                               "(MANIFEST_UNKNOWN: manifest unknown): a pull cannot succeed")
    assert check["fix"].startswith("the pinned default is gone: update facts.VLLM_TPU_IMAGE")
    assert [call for call in pulumi.calls() if call[0] == "up"] == []  # nothing created, nothing bills


# --- locating a pinned image, and the digest grammar --------------------------------------------------------------

def test_a_pinned_digest_the_registry_holds_is_ok_and_one_it_dropped_is_absent(registry):
    pinned = registry.pinned("vllm/vllm-tpu", "nightly")
    found = locate(pinned, registry.url)
    assert (found.status, found.digest) == (OK, pinned.partition("@")[2])
    assert found.detail == "resolves on registry-1.docker.io"
    registry.deleted.add(pinned.partition("@")[2])
    registry.requests.clear()
    gone = locate(pinned, registry.url)
    assert gone.status == ABSENT and "MANIFEST_UNKNOWN" in gone.detail
    # The HEAD's 404 has no body; the GET reads the registry's error code.
    assert [r.method for r in registry.requests if "/manifests/" in r.path] == ["HEAD", "HEAD", "GET"]


def test_a_tag_is_located_with_the_digest_it_names_now(registry):
    found = locate("vllm/vllm-tpu:nightly", registry.url)
    assert found.status == OK and found.digest == registry.digest_of("vllm/vllm-tpu", "nightly")
    assert found.detail.endswith(f"(the tag names {found.digest} now)")
    assert locate("vllm/vllm-gpu:nightly", registry.url).status == ABSENT  # NAME_UNKNOWN


@pytest.mark.parametrize("setup, words", [
    # A HEAD answer has no body: the 429's words are its reason (a GET would count against Docker Hub's pull limit).
    (lambda fake: setattr(fake, "rate_limited", True), "registry-1.docker.io answered HTTP 429 (Too Many Requests)"),
    (lambda fake: setattr(fake, "anonymous_pull", False), "could not check on registry-1.docker.io: the token service"),
])
def test_a_registry_that_cannot_say_is_unknown_not_absent(setup, words):
    with FakeRegistry({"vllm/vllm-tpu": ["nightly"]}) as fake:
        setup(fake)
        found = locate(fake.pinned("vllm/vllm-tpu", "nightly"), fake.url)
    assert found.status == UNKNOWN and words in found.detail


def test_an_unreachable_registry_or_one_outside_the_spec_is_unknown():
    assert locate(VLLM_TPU_IMAGE, "http://127.0.0.1:9").status == UNKNOWN
    google = GoogleFake(images=())  # a 404 without the registry's error body: not a registry that said "absent"
    with google.start() as fake:
        found = locate(VLLM_TPU_IMAGE, fake.url)
    assert found.status == UNKNOWN and found.detail.startswith("registry-1.docker.io answered HTTP 404")


@pytest.mark.parametrize("digest, problem", [
    ("sha256:" + "a" * 63, "sha256 takes 64 hex digits, got 63"),
    ("sha256:" + "A" * 64, "sha256 digits must be lowercase hex (the OCI image spec forbids A-F)"),
    ("sha256:" + "g" * 64, "sha256 takes hex digits (0-9, a-f) only"),
    ("md5:" + "a" * 32, "'md5:" + "a" * 32 + "' is not sha256:<64 hex digits> (or sha512:<128>)"),
    ("sha256", "'sha256' is not sha256:<64 hex digits> (or sha512:<128>)"),
])
def test_a_malformed_digest_is_refused_with_what_is_wrong(digest, problem):
    with pytest.raises(RegistryError) as err:
        Reference.parse(f"vllm/vllm-tpu@{digest}")
    assert str(err.value) == (f"'vllm/vllm-tpu@{digest}' has a malformed digest: {problem}; use the digest as the "
                              "registry prints it (`docker buildx imagetools inspect IMAGE`)")


def test_sha512_digests_are_references_too():
    digest = "sha512:" + "0" * 128
    assert Reference.parse(f"vllm/vllm-tpu@{digest}").digest == digest


# --- `tpuserve images check` ---------------------------------------------------------------------------------------

def images_check(registry: FakeRegistry, *args: str):
    result = CliRunner().invoke(main, ["images", "check", *args, "--endpoint", f"registry={registry.url}"])
    return result, (json.loads(result.stdout.strip().splitlines()[-1]) if "--json" in args else None)


def test_images_check_says_the_pin_resolves_and_what_it_rests_on(registry):
    registry.held[PINNED_REPO] = {PINNED_DIGEST}
    result, _ = images_check(registry)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"ok       {VLLM_TPU_IMAGE}: resolves on registry-1.docker.io\n")
    assert ("pinned for: stock google/gemma-4-E2B-it (bf16), TP 1, --max-model-len 2048 --max-num-seqs 16, every "
            "modality 0 served on one ct6e-standard-1t (europe-west4-a, on demand), ready after 346 s, 2026-09-24, "
            "vLLM 0.29.1rc1.dev468+g0b7f11a1e") in result.stdout
    _, document = images_check(registry, "--json")
    assert (document["ok"], document["status"], document["digest"]) == (True, "ok", PINNED_DIGEST)
    assert document["evidence"]["source"] == VLLM_TPU_IMAGE_EVIDENCE["source"]
    assert document["evidence"]["machine_type"] == "ct6e-standard-1t" and document["evidence"]["ready_s"] == 346


def test_images_check_fails_in_seconds_when_the_image_is_gone(registry):
    pinned = registry.pinned("vllm/vllm-tpu", "nightly-20260822-b8692ff")
    registry.deleted.add(pinned.partition("@")[2])
    result, document = images_check(registry, "--image", pinned, "--json")
    assert result.exit_code == 1
    assert (document["ok"], document["status"], document["evidence"]) == (False, "absent", None)
    assert document["error"] == (f"{pinned}: registry-1.docker.io has no such digest or repository (MANIFEST_UNKNOWN: "
                                 "manifest unknown): a pull cannot succeed")
    assert f"Error: {document['error']}" in result.stderr


def test_images_check_warns_but_passes_when_the_registry_cannot_say(registry):
    registry.rate_limited = True
    result, _ = images_check(registry, "--image", registry.pinned("vllm/vllm-tpu", "nightly"))
    assert result.exit_code == 0 and result.stdout.startswith("warning  vllm/vllm-tpu@sha256:")
    assert "could not tell whether a pull would succeed" in result.stdout


def test_images_check_reads_the_stacks_image_and_refuses_a_malformed_one(pulumi: FakePulumi, registry):
    pulumi.set_config(project=PROJECT, containerImage="vllm/vllm-tpu:nightly")
    result, document = images_check(registry, "--stack", "dev", "--json")
    assert result.exit_code == 0, result.output
    assert document["image"] == "vllm/vllm-tpu:nightly" and document["digest"] == registry.digest_of(
        "vllm/vllm-tpu", "nightly")
    result, _ = images_check(registry, "--image", "vllm/vllm-tpu@sha256:ABC")
    assert result.exit_code == 2 and "--image: 'vllm/vllm-tpu@sha256:ABC' has a malformed digest" in result.stderr
    assert not [r for r in registry.requests if "sha256:ABC" in r.path]  # refused before asking
