"""Preflight against fake Compute, Service Usage, Resource Manager, Secret Manager and Cloud Quotas APIs on 127.0.0.1
(tests/google_fakes.py: the APIs' recorded JSON shapes), and the `tpuserve preflight` command over a fake pulumi."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import requests
from click.testing import CliRunner

from tests.fake_pulumi import install
from tests.google_fakes import PROJECT, GoogleFake, dimensions_info
from tpuserve.deploy import gce
from tpuserve.deploy.preflight import (FAIL, OK, PERMISSIONS, WARNING, Endpoints, Target, preflight,
                                       preflight_command, quota_limit)

ZONES = ("europe-west4-a", "us-east5-a", "us-east5-b", "us-east1-d")


def run(google: GoogleFake, **target: object):
    with google.start() as fake, requests.Session() as session:
        endpoints = Endpoints(**{api: fake.url for api in Endpoints.__dataclass_fields__})
        report = preflight(session, Target(**{"project": PROJECT, "zones": ZONES, "secret": "hf-token", **target}),
                           endpoints)
    return report, {check.name: check for check in report.checks}, fake.requests


def test_a_ready_project_passes_every_check_and_keeps_every_zone():
    report, checks, requests_made = run(GoogleFake())
    assert not report.failed
    assert [(name, check.status) for name, check in checks.items()] == [
        ("project", OK), ("APIs", OK), ("ct6e-standard-1t offered", OK), ("TPU v6e quota", OK), ("token secret", OK),
        ("permissions", OK)]
    assert report.usable_zones == list(ZONES)
    assert checks["TPU v6e quota"].detail.startswith("europe-west4 (preemptible 1536, standard 0)")
    quota_calls = [r for r in requests_made if "quotaInfos" in r.path]
    assert {r.headers.get("x-goog-user-project") for r in quota_calls} == {PROJECT}  # billed to the stack's project
    batch = next(r for r in requests_made if r.path.endswith("services:batchGet"))
    assert parse_qs(batch.query)["names"] == [f"projects/{PROJECT}/services/{api}" for api in (
        "compute.googleapis.com", "secretmanager.googleapis.com", "iam.googleapis.com", "cloudquotas.googleapis.com")]


def test_a_disabled_api_fails_with_the_command_that_enables_it():
    report, checks, _ = run(GoogleFake(enabled={"compute.googleapis.com", "cloudquotas.googleapis.com"}))
    assert report.failed
    assert checks["APIs"].status == FAIL
    assert checks["APIs"].detail == "not enabled: secretmanager.googleapis.com, iam.googleapis.com"
    assert checks["APIs"].fix == (f"gcloud services enable secretmanager.googleapis.com iam.googleapis.com "
                                  f"--project {PROJECT}")


def test_a_region_without_either_quota_is_skipped_and_none_at_all_fails():
    """us-east5: the preemptible quota is 0 and the family quota unset (0), as the reference deployment found it."""
    report, checks, _ = run(GoogleFake(preemptible={"us-east5": 0}))
    assert checks["TPU v6e quota"].status == WARNING
    assert report.skipped == {"us-east5-a": "no TPU v6e quota in us-east5 (preemptible 0, standard 0)",
                              "us-east5-b": "no TPU v6e quota in us-east5 (preemptible 0, standard 0)"}
    assert report.usable_zones == ["europe-west4-a", "us-east1-d"]

    report, checks, _ = run(GoogleFake(preemptible={"europe-west4": 0, "us-east5": 0, "us-east1": 0}))
    assert report.failed and checks["TPU v6e quota"].status == FAIL
    assert "PREEMPTIBLE-TPU-V6E-per-project-region" in checks["TPU v6e quota"].fix


def test_standard_quota_stands_in_for_a_missing_preemptible_one():
    report, checks, _ = run(GoogleFake(preemptible={"europe-west4": 0}, family={"europe-west4": 8}))
    assert "europe-west4-a" in report.usable_zones
    assert "europe-west4 (preemptible 0, standard 8)" in checks["TPU v6e quota"].detail


def test_a_four_chip_vm_needs_four_chips_of_quota():
    report, checks, _ = run(GoogleFake(preemptible={"europe-west4": 2}), machine_type="ct6e-standard-4t",
                            zones=("europe-west4-a",))
    assert report.failed and checks["TPU v6e quota"].detail == "no region has 4 chip(s): europe-west4"


def test_zones_without_the_machine_type_are_skipped_and_none_fails():
    report, checks, requests_made = run(GoogleFake(zones_offering={"europe-west4-a"}))
    assert checks["ct6e-standard-1t offered"].status == WARNING
    assert report.usable_zones == ["europe-west4-a"]
    assert sorted(r.path for r in requests_made if "machineTypes" in r.path) == sorted(
        f"/compute/v1/projects/{PROJECT}/zones/{zone}/machineTypes/ct6e-standard-1t" for zone in ZONES)
    report, checks, _ = run(GoogleFake(zones_offering=set()))
    assert report.failed and checks["ct6e-standard-1t offered"].status == FAIL
    assert "gcloud compute machine-types list --filter=name=ct6e-standard-1t" in checks["ct6e-standard-1t offered"].fix


def test_quota_is_a_warning_when_the_cloud_quotas_api_is_off():
    report, checks, _ = run(GoogleFake(enabled={"compute.googleapis.com", "secretmanager.googleapis.com",
                                                "iam.googleapis.com"}))
    assert not report.failed
    assert checks["TPU v6e quota"].status == WARNING
    assert checks["TPU v6e quota"].fix == f"gcloud services enable cloudquotas.googleapis.com --project {PROJECT}"


@pytest.mark.parametrize("state, expected", [(None, "not found or has no versions"), ("DISABLED", "is DISABLED")])
def test_a_missing_secret_or_a_disabled_version_fails(state, expected):
    report, checks, _ = run(GoogleFake(secret_state=state))
    assert report.failed and checks["token secret"].status == FAIL
    assert expected in checks["token secret"].detail


def test_a_stack_that_creates_its_secret_needs_none_but_may_create_one():
    report, checks, requests_made = run(GoogleFake(granted=PERMISSIONS), secret="", creates_secret=True)
    assert checks["token secret"].status == OK
    assert checks["permissions"].status == FAIL
    assert checks["permissions"].detail.endswith("secretmanager.secrets.create, secretmanager.secrets.delete, "
                                                 "secretmanager.versions.add")
    assert not any("/secrets/" in r.path for r in requests_made)


def test_missing_permissions_are_listed_with_the_propagation_delay():
    report, checks, requests_made = run(GoogleFake(granted=tuple(p for p in PERMISSIONS
                                                                 if p != "iam.serviceAccounts.actAs")))
    assert checks["permissions"].detail == f"missing 1 of {len(PERMISSIONS)}: iam.serviceAccounts.actAs"
    assert "2-7 minutes" in checks["permissions"].fix
    asked = next(r for r in requests_made if r.path.endswith(":testIamPermissions")).json()
    assert asked == {"permissions": list(PERMISSIONS)}


def test_quota_limit_takes_the_most_specific_entry():
    info = {"dimensionsInfos": [
        dimensions_info(0, ["global"]),
        dimensions_info(16, ["us-east1"], region="us-east1"),
        dimensions_info(64, ["us-east1"], region="us-east1", tpu_family="CT6E"),
        dimensions_info(32, ["us-east1"], region="us-east1", tpu_family="CT5LP"),
        dimensions_info(-1, ["europe-west4"], region="europe-west4")]}
    assert quota_limit(info, "us-east1", {"tpu_family": "CT6E"}) == 64
    assert quota_limit(info, "us-east1", {}) == 16
    assert quota_limit(info, "us-central1", {"tpu_family": "CT6E"}) == 0
    assert quota_limit(info, "europe-west4", {}) == -1
    assert quota_limit({}, "us-east1", {}) is None


def test_the_command_reads_the_stack_and_prints_a_json_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pulumi = install(tmp_path / "bin", tmp_path / "home")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_PULUMI_HOME", str(pulumi.home))
    monkeypatch.setattr(gce, "adc_session", requests.Session)
    pulumi.set_config(project=PROJECT, zone="us-east1-d", zones=["europe-west4-a", "us-east5-b"],
                      hfTokenSecretId="hf-token", machineType="ct6e-standard-1t")
    google = GoogleFake(preemptible={"us-east5": 0})
    with google.start() as fake:
        result = CliRunner().invoke(preflight_command, ["--stack", "dev", "--json", *google.endpoint_options(fake.url)])
    assert result.exit_code == 0, result.stderr
    verdict = json.loads(result.stdout.strip().splitlines()[-1])
    assert verdict["zones"] == ["us-east1-d", "europe-west4-a"]  # the stack's zone first, then its `zones`
    assert verdict["skipped"] == {"us-east5-b": "no TPU v6e quota in us-east5 (preemptible 0, standard 0)"}
    assert "warning  TPU v6e quota" in result.stderr

    google = GoogleFake(secret_state=None)
    with google.start() as fake:
        result = CliRunner().invoke(preflight_command, ["--stack", "dev", *google.endpoint_options(fake.url)])
    assert result.exit_code == 1 and "fail     token secret" in result.stderr
