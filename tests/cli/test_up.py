"""`tpuserve up` end to end through its real code path: a fake `pulumi` first on PATH (tests/fakes/fake_pulumi.py) plays the
provider's recorded error texts per zone (tests/fakes/provider_errors.py), and fake Google APIs on 127.0.0.1
(tests/fakes/google_fakes.py) answer preflight and the orphan sweep. No network beyond loopback, no credentials."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from tests.fakes import provider_errors as errors
from tests.fakes.fake_pulumi import FakePulumi, install, preview_step, replacement
from tests.fakes.google_fakes import PROJECT, GoogleFake, labelled_instance, state_with_instance
from tpuserve import gce
from tpuserve.ops import up as up_module

ZONES = "us-east5-a,us-central1-ai1a,europe-west4-a,us-central1-b"


@pytest.fixture
def pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakePulumi:
    fake = install(tmp_path / "bin", tmp_path / "pulumi-home")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_PULUMI_HOME", str(fake.home))
    monkeypatch.setattr(gce, "adc_session", requests.Session)  # the fakes need no credentials
    fake.set_config(project=PROJECT, zone="us-east5-a", hfTokenSecretId="hf-token")
    return fake


def failed(message: str) -> dict:
    return {"output": errors.pulumi_failed(message), "rc": 255}


def run_up(google: GoogleFake, *args: str) -> tuple[int, dict, str]:
    with google.start() as fake:
        result = CliRunner().invoke(up_module.up, ["--stack", "dev", "--json", *google.endpoint_options(fake.url),
                                                   *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stdout.strip().splitlines()
    return result.exit_code, json.loads(lines[-1]) if lines else {}, result.stderr


def test_stockout_then_regional_quota_then_capacity_in_the_third_zone(pulumi: FakePulumi):
    """The first zone is out of capacity and suggests us-central1-b, which is tried next and lacks quota, so
    us-central1-ai1a, listed second, is skipped (the fake would let it succeed); europe-west4-a works. The chosen zone
    lands in the stack config, the stockout zone's leftover VM is deleted (--yes), and every pulumi up got the extra
    flags."""
    pulumi.scenario({
        "us-east5-a": failed(errors.STOCKOUT_WITH_SUGGESTION.replace("us-east5-b", "us-east5-a")
                             .replace("europe-west4-a, us-central1-b", "us-central1-b")),
        "us-central1-b": failed(errors.TPU_FAMILY_QUOTA.replace("us-east5", "us-central1")),
        "europe-west4-a": {"rc": 0, "creates": True},
    })
    google = GoogleFake(instances={"us-east5-a": [labelled_instance("us-east5-a", status="STAGING")]})
    code, verdict, stderr = run_up(google, "--zones", ZONES, "--yes", "--", "--policy-pack", "policy")

    assert code == 0, stderr
    assert verdict["ok"] is True and verdict["zone"] == "europe-west4-a"
    assert [(a["zone"], a["outcome"], a["class"]) for a in verdict["attempts"]] == [
        ("us-east5-a", "failed", "capacity"), ("us-central1-b", "failed", "quota"), ("europe-west4-a", "ok", "created")]
    assert verdict["attempts"][1]["reason"] == ("Error waiting for instance to create: Quota 'TPUS_PER_TPU_FAMILY' "
                                                "exceeded. Limit: 0.0 in region us-central1.")
    assert pulumi.config()["tpu-serve:zone"]["value"] == "europe-west4-a"
    assert google.deleted == ["us-east5-a/instances/tpu-serve-dev"]
    assert verdict["orphans"] == [{"kind": "instance", "zone": "us-east5-a", "name": "tpu-serve-dev",
                                   "status": "STAGING", "deleted": True}]

    ups = [call for call in pulumi.calls() if call[0] == "up"]
    assert len(ups) == 3
    assert all(call[:4] == ["up", "--yes", "--skip-preview", "--refresh"] and "--policy-pack" in call for call in ups)
    # Each `pulumi up` saves its zone in the stack config itself (`--config`): no `pulumi config set` of its own.
    assert [call[4:6] for call in ups] == [["--config", "zone=us-east5-a"], ["--config", "zone=us-central1-b"],
                                          ["--config", "zone=europe-west4-a"]]
    assert ups[0] == ["up", "--yes", "--skip-preview", "--refresh", "--config", "zone=us-east5-a", "--policy-pack",
                      "policy", "--stack", "dev", "--non-interactive"]
    assert not any(call[:2] == ["config", "set"] for call in pulumi.calls())
    assert sum(call[0] == "refresh" for call in pulumi.calls()) == 2 + 1  # after each failure, then the final sweep

    assert "attempt 1: us-east5-a" in stderr and "[suggests us-central1-b]" in stderr
    rows = [[cell.strip() for cell in line.split("│")[1:-1]]
            for line in stderr.splitlines() if line.startswith("│")]
    assert [row[:5] for row in rows if row[0]] == [["1", "1", "us-east5-a", "failed", "capacity"],
                                                   ["2", "1", "us-central1-b", "failed", "quota"],
                                                   ["3", "1", "europe-west4-a", "ok", "created"]]  # the attempts table
    assert "up in europe-west4-a (the stack's `zone` is now europe-west4-a)" in stderr
    assert "│ Updating (dev):" in stderr  # pulumi's own output streams through


def test_a_permission_error_stops_at_once_and_restores_the_zone(pulumi: FakePulumi):
    pulumi.scenario({"*": failed(errors.PERMISSION_DENIED)})
    code, verdict, stderr = run_up(GoogleFake(), "--zones", ZONES)
    assert code == 1
    assert [a["zone"] for a in verdict["attempts"]] == ["us-east5-a"]
    assert verdict["attempts"][0]["class"] == "permission"
    assert "2-7 minutes" in verdict["hint"]
    assert [call[0] for call in pulumi.calls()].count("up") == 1
    assert pulumi.config()["tpu-serve:zone"]["value"] == "us-east5-a"


def test_the_deadline_interrupts_a_running_pulumi_up(pulumi: FakePulumi):
    pulumi.scenario({"*": {"rc": 0, "seconds": 60}})
    began = time.monotonic()
    code, verdict, stderr = run_up(GoogleFake(), "--zones", ZONES, "--deadline", "2s", "--skip-preflight")
    assert time.monotonic() - began < 20
    assert code == 3
    assert [(a["zone"], a["class"]) for a in verdict["attempts"]] == [("us-east5-a", "deadline")]
    assert verdict["attempts"][0]["seconds"] == pytest.approx(2.0, abs=1.5)
    assert "deadline reached after 1 attempt(s)" in stderr
    assert "│ error: update canceled" in stderr  # pulumi got SIGINT (Ctrl-C) and stopped as it does


def test_a_failed_readiness_gate_stops_the_sweep_and_keeps_the_zone_of_its_vm(pulumi: FakePulumi):
    pulumi.scenario({"us-east5-a": failed(errors.STOCKOUT),
                     "europe-west4-a": {"output": errors.gate_failed("boot failed during loading-model: OOM"),
                                        "rc": 255, "creates": True}})
    code, verdict, stderr = run_up(GoogleFake(), "--zones", "us-east5-a,europe-west4-a,us-central1-b")
    assert code == 1
    assert [(a["zone"], a["class"]) for a in verdict["attempts"]] == [("us-east5-a", "capacity"),
                                                                      ("europe-west4-a", "not-ready")]
    assert "tpuserve diagnose --stack dev" in verdict["hint"]
    assert pulumi.config()["tpu-serve:zone"]["value"] == "europe-west4-a"  # where the VM that did not serve runs


def test_without_the_queue_no_capacity_anywhere_exits_3_and_restores_the_zone(pulumi: FakePulumi):
    pulumi.scenario({"*": failed(errors.STOCKOUT)})
    code, verdict, stderr = run_up(GoogleFake(), "--zones", "us-east5-a,europe-west4-a", "--no-queue")
    assert code == 3
    assert [a["zone"] for a in verdict["attempts"]] == ["us-east5-a", "europe-west4-a"]
    assert verdict["reason"] == "no capacity in us-east5-a, europe-west4-a"
    assert pulumi.config()["tpu-serve:zone"]["value"] == "us-east5-a"


def test_preflight_drops_zones_without_the_machine_type_or_quota_and_fails_on_a_disabled_api(pulumi: FakePulumi):
    pulumi.scenario({"*": {"rc": 0, "creates": True}})
    google = GoogleFake(zones_offering={"us-central1-b", "europe-west4-a"}, preemptible={"us-central1": 0})
    code, verdict, stderr = run_up(google, "--zones", ZONES)
    assert code == 0
    assert [a["zone"] for a in verdict["attempts"]] == ["europe-west4-a"]  # us-east5-a, ai1a: no ct6e; us-central1
    assert "zones to try: europe-west4-a" in stderr                       # has no quota of either kind

    disabled = GoogleFake(enabled={"secretmanager.googleapis.com", "iam.googleapis.com"})
    calls_before = len(pulumi.calls())
    code, verdict, stderr = run_up(disabled, "--zones", ZONES)
    assert code == 1 and verdict["reason"] == "preflight failed"
    assert "gcloud services enable compute.googleapis.com" in stderr
    assert all(call[0] != "up" for call in pulumi.calls()[calls_before:])


def test_orphans_are_left_alone_without_yes_when_nobody_can_confirm(pulumi: FakePulumi):
    pulumi.scenario({"us-east5-a": failed(errors.CREATE_TIMEOUT), "*": {"rc": 0, "creates": True}})
    google = GoogleFake(instances={"us-east5-a": [labelled_instance("us-east5-a", status="RUNNING")]})
    code, verdict, stderr = run_up(google, "--zones", "us-east5-a,europe-west4-a")
    assert verdict["zone"] == "europe-west4-a"
    assert code == 5  # deployed, but a VM nobody agreed to delete bills on: not a success
    assert google.deleted == []
    assert [o["deleted"] for o in verdict["orphans"]] == [False]  # reported once, though seen again at the end
    assert "run `tpuserve up` again with --yes" in stderr
    assert "remove it: gcloud compute instances delete tpu-serve-dev --zone us-east5-a" in " ".join(stderr.split())
    assert verdict["inventory"]["billingOrphans"] == 1


def test_the_vm_in_the_state_is_never_an_orphan(pulumi: FakePulumi):
    """A later `tpuserve up` starts where the stack's VM is (its outputs), and that VM is not swept away."""
    pulumi.state(state_with_instance("us-central1-b"))
    (pulumi.home / "outputs.json").write_text(json.dumps({"zone": "us-central1-b"}))
    pulumi.scenario({"us-central1-b": failed(errors.RATE_EXCEEDED), "*": {"rc": 0}})
    google = GoogleFake(instances={"us-central1-b": [labelled_instance("us-central1-b", status="RUNNING")]})
    code, verdict, stderr = run_up(google, "--yes", "--skip-preflight")
    assert [a["zone"] for a in verdict["attempts"]][:2] == ["us-central1-b", "us-east5-a"]
    assert google.deleted == [] and verdict["orphans"] == []


def test_bad_usage_is_one_line_and_exit_2(pulumi: FakePulumi):
    result = CliRunner().invoke(up_module.up, ["--stack", "dev", "--deadline", "soon"])
    assert result.exit_code == 2 and "--deadline" in result.output and "Traceback" not in result.output
    pulumi.set_config(project=PROJECT, region="us-east5", hfTokenSecretId="hf-token")
    result = CliRunner().invoke(up_module.up, ["--stack", "dev", "--zones", "us-east5-a,europe-west4-a"])
    assert result.exit_code == 2 and "region: the stack pins Cloud NAT to us-east5" in result.output


@pytest.mark.parametrize("text, seconds", [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("600", 600)])
def test_deadlines(text, seconds):
    assert up_module.parse_deadline(text) == seconds


def test_a_local_stack_is_one_pulumi_up_without_zones_or_preflight(pulumi: FakePulumi):
    pulumi.set_config(target="local")
    pulumi.scenario({"*": {"rc": 0}})
    code, verdict, stderr = run_up(GoogleFake(), "--retry-until-up")
    assert code == 0 and verdict["zone"] == "local"
    assert [call[0] for call in pulumi.calls()] == ["config", "stack", "up"]
    assert "tpu-serve:zone" not in pulumi.config()


def test_a_gke_stack_is_one_pulumi_up_in_its_zone_after_preflight(pulumi: FakePulumi):
    """GKE queues flex-start capacity for the node pool: no zone sweep, no retry rounds, the zone stays."""
    pulumi.set_config(project=PROJECT, target="gke", zone="europe-west4-a", hfTokenSecretId="hf-token")
    pulumi.scenario({"europe-west4-a": failed(errors.STOCKOUT), "*": {"rc": 0}})
    code, verdict, stderr = run_up(GoogleFake(), "--retry-until-up")
    assert code != 0
    assert [attempt["zone"] for attempt in verdict["attempts"]] == ["europe-west4-a"]
    assert [call[0] for call in pulumi.calls()].count("up") == 1
    assert pulumi.config()["tpu-serve:zone"]["value"] == "europe-west4-a"


def test_a_gke_stack_refuses_zones(pulumi: FakePulumi):
    pulumi.set_config(project=PROJECT, target="gke", zone="europe-west4-a", hfTokenSecretId="hf-token")
    code, _, stderr = run_up(GoogleFake(), "--zones", "us-east5-a")
    assert code == 2 and "--zones" in stderr


def cache_disk(zone: str, attached: str) -> dict:
    """A Disk resource (https://cloud.google.com/compute/docs/reference/rest/v1/disks) as the stack's cache disk."""
    return {"kind": "compute#disk", "name": "tpu-serve-dev-cache", "sizeGb": "100", "status": "READY",
            "type": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/diskTypes/hyperdisk-balanced",
            "zone": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}",
            "labels": {"app": "tpu-serve", "stack": "dev", "tpu-serve-cache": "dev"}, "lastAttachTimestamp": attached}


def test_zones_holding_a_warm_cache_disk_are_tried_first(pulumi: FakePulumi):
    """us-central1-b is last in the stack's list but holds the stack's cache disk, and the stack has no VM yet: it is
    tried first (the stack's `zone` is only where the last VM was)."""
    pulumi.set_config(project=PROJECT, zone="us-east5-a", hfTokenSecretId="hf-token",
                      zones=["us-east5-a", "europe-west4-a", "us-central1-b"])
    pulumi.scenario({"us-east5-a": failed(errors.STOCKOUT), "*": {"rc": 0}})
    google = GoogleFake(cache_disks={"us-central1-b": [cache_disk("us-central1-b", "2026-11-28T10:00:00.000-08:00")]})
    code, verdict, stderr = run_up(google)
    assert code == 0, stderr
    assert [attempt["zone"] for attempt in verdict["attempts"]] == ["us-central1-b"]
    assert "warm cache disk in us-central1-b: tried first" in stderr
    assert pulumi.config()["tpu-serve:zone"]["value"] == "us-central1-b"


def test_a_failed_cache_listing_keeps_the_configured_order(pulumi: FakePulumi):
    pulumi.set_config(project=PROJECT, zone="us-east5-a", hfTokenSecretId="hf-token",
                      zones=["us-east5-a", "europe-west4-a", "us-central1-b"])
    pulumi.scenario({"us-east5-a": failed(errors.STOCKOUT), "*": {"rc": 0}})
    code, verdict, stderr = run_up(GoogleFake(cache_disks=None))
    assert code == 0, stderr
    assert [attempt["zone"] for attempt in verdict["attempts"]] == ["us-east5-a", "europe-west4-a"]
    assert "could not list the stack's cache disks" in " ".join(stderr.split())


def test_an_error_line_says_error_as_every_command_does(pulumi: FakePulumi, monkeypatch: pytest.MonkeyPatch):
    """Issue #27, item 8: `up` printed `error:` where click and every other command print `Error:`."""
    def no_login() -> None:
        raise gce.MissingCredentials("no Google application-default credentials; run `gcloud auth "
                                     "application-default login`")

    monkeypatch.setattr(gce, "adc_session", no_login)
    code, verdict, stderr = run_up(GoogleFake())
    assert code == 1 and verdict["ok"] is False
    assert stderr.splitlines()[-1] == ("Error: no Google application-default credentials; run `gcloud auth "
                                       "application-default login`")


# --- look before leaping: the preview of a stack that has a VM ----------------------------------------------------

VM_1T = {"name": "tpu-serve-dev", "zone": "us-east5-a", "machineType": "ct6e-standard-1t",
         "scheduling": {"provisioningModel": "FLEX_START", "maxRunDuration": {"seconds": 14400}},
         "metadata": {"tpu-serve-config": '{"argv": ["--tensor-parallel-size", "1"]}'}}


def deployed(pulumi: FakePulumi, zone: str = "us-east5-a") -> None:
    pulumi.state(state_with_instance(zone))
    (pulumi.home / "outputs.json").write_text(json.dumps({"zone": zone, "instanceName": "tpu-serve-dev",
                                                          "maxRunSeconds": 14400, "vmSlot": "a"}))


def test_a_change_that_replaces_the_vm_stops_before_pulumi_up_and_names_the_keys(pulumi: FakePulumi):
    """machineType -1t -> -4t (the facts say the provider would resize a running VM only stopped, and the stack
    replaces it instead): nothing runs without --replace-vm, and the user reads what it costs."""
    deployed(pulumi)
    new = {**VM_1T, "machineType": "ct6e-standard-4t", "metadata": {"tpu-serve-config": '{"argv": ["4"]}'}}
    pulumi.preview(replacement(VM_1T, new, {"machineType": "update-replace", 'metadata["tpu-serve-config"]': "update"},
                               ("machineType",)))
    pulumi.scenario({"*": {"rc": 0, "creates": True}})
    code, verdict, stderr = run_up(GoogleFake(), "--skip-preflight")
    assert code == 4
    assert not any(call[0] == "up" for call in pulumi.calls())
    assert verdict["replace"]["keys"] == ["machineType"]
    assert verdict["replace"]["changes"] == ["machineType: ct6e-standard-1t -> ct6e-standard-4t"]
    assert "--replace-vm" in verdict["reason"]
    text = " ".join(stderr.split())
    assert "the TPU VM would be REPLACED by this change (machineType)" in text
    assert "flex-start grant and its max-run clock are lost" in text
    assert "up to 4 h x 4 chip(s) x $1.35 = $21.60" in text
    assert "the old VM keeps serving until the new one is created and ready" in text


def test_with_replace_vm_the_successor_takes_the_other_name_in_the_same_zone(pulumi: FakePulumi):
    deployed(pulumi)
    new = {**VM_1T, "machineType": "ct6e-standard-4t"}
    pulumi.preview(replacement(VM_1T, new, {"machineType": "update-replace"}, ("machineType",)))
    pulumi.scenario({"*": {"rc": 0, "creates": True}})
    code, verdict, stderr = run_up(GoogleFake(), "--skip-preflight", "--replace-vm")
    assert code == 0, stderr
    ups = [call for call in pulumi.calls() if call[0] == "up"]
    assert len(ups) == 1 and "vmSlot=b" in ups[0] and "zone=us-east5-a" in ups[0]
    previews = [call for call in pulumi.calls() if call[0] == "preview"]
    assert previews and previews[0][:4] == ["preview", "--json", "--show-replacement-steps", "--refresh"]


def test_an_in_place_change_says_so_and_goes_ahead(pulumi: FakePulumi):
    deployed(pulumi)
    new = {**VM_1T, "metadata": {"tpu-serve-config": '{"argv": ["--max-model-len", "32768"]}'}}
    pulumi.preview([preview_step("update", VM_1T, new, diff={'metadata["tpu-serve-config"]': "update"})])
    pulumi.scenario({"*": {"rc": 0}})
    code, verdict, stderr = run_up(GoogleFake(), "--skip-preflight")
    assert code == 0, stderr
    assert "in place: the VM keeps serving, the supervisor restarts vLLM with the new config" in stderr
    ups = [call for call in pulumi.calls() if call[0] == "up"]
    assert len(ups) == 1 and not any("vmSlot" in arg or "replaceOrder" in arg for arg in ups[0])


def test_without_quota_room_for_two_vms_the_old_one_goes_first_said_plainly(pulumi: FakePulumi):
    """us-east5's preemptible quota is 1 chip and the stack's own VM holds it: create-before-delete cannot fit."""
    deployed(pulumi)
    new = {**VM_1T, "scheduling": {"provisioningModel": "FLEX_START", "maxRunDuration": {"seconds": 86400}}}
    pulumi.preview(replacement(VM_1T, new, {"scheduling.maxRunDuration.seconds": "update-replace"},
                               ("scheduling",), delete_first=False))
    pulumi.scenario({"*": {"rc": 0, "creates": True}})
    google = GoogleFake(preemptible={"us-east5": 1},
                        instances={"us-east5-a": [labelled_instance("us-east5-a", status="RUNNING")]})
    code, verdict, stderr = run_up(google, "--replace-vm", "--zones", "us-east5-a")
    assert code == 0, stderr
    text = " ".join(stderr.split())
    assert "us-east5's TPU v6e quota is 1 chip(s) and 1 are in use" in text
    assert "the old VM is deleted FIRST" in text
    assert "up to 24 h x 1 chip(s)" in text
    ups = [call for call in pulumi.calls() if call[0] == "up"]
    assert "replaceOrder=delete-first" in ups[0] and not any("vmSlot" in arg for arg in ups[0])
    assert "tpu-serve:replaceOrder" not in pulumi.config()  # one run's choice, not the stack's


def test_a_failing_preview_stops_with_its_error(pulumi: FakePulumi):
    deployed(pulumi)
    pulumi.preview([], rc=255, diagnostics=[{"message": "tpu-serve:machineType: 'ct6e' is not a TPU v6e machine "
                                                        "type\n", "severity": "error"}])
    code, verdict, stderr = run_up(GoogleFake(), "--skip-preflight")
    assert code == 1
    assert verdict["reason"].endswith("'ct6e' is not a TPU v6e machine type")
    assert not any(call[0] == "up" for call in pulumi.calls())


def test_a_stack_without_a_vm_is_not_previewed(pulumi: FakePulumi):
    pulumi.scenario({"*": {"rc": 0, "creates": True}})
    code, verdict, stderr = run_up(GoogleFake(), "--skip-preflight", "--zones", "us-east5-a")
    assert code == 0, stderr
    assert not any(call[0] == "preview" for call in pulumi.calls())


def test_the_queue_goes_to_the_first_zone_no_lasting_failure_rules_out():
    """The candidates come ordered (the VM's zone, warm cache disks first): the queue takes the first one that a
    wait could help, skipping a region without quota and a zone without the machine type."""
    from tpuserve.deploy.sweep import Attempt, Failure, SweepResult

    def failed(zone: str, failure: Failure) -> Attempt:
        return Attempt(zone, 1, 3.0, failure)

    stockout = Failure("capacity", "zone", "out of capacity")
    no_quota = Failure("quota", "region", "Quota exceeded", lasting=True, region="us-east5")
    no_type = Failure("unavailable", "zone", "no such machine type", lasting=True)
    candidates = ["us-east5-a", "us-east5-b", "asia-northeast1-b", "europe-west4-a"]
    result = SweepResult([failed("us-east5-a", no_quota), failed("asia-northeast1-b", no_type),
                          failed("europe-west4-a", stockout)])
    assert up_module.queue_zone(candidates, result) == "europe-west4-a"
    assert up_module.queue_zone(candidates, SweepResult([failed("us-east5-a", stockout)])) == "us-east5-a"
    assert up_module.queue_zone(candidates[:1], SweepResult([failed("us-east5-a", no_quota)])) is None
