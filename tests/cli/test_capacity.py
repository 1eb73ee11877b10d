"""The classifier: one real error text per rule (sources in tests/fakes/provider_errors.py), as `pulumi up` prints it."""

from __future__ import annotations

import pytest

from tests.fakes import provider_errors as errors
from tests.fakes.provider_errors import pulumi_failed
from tpuserve.deploy.capacity import classify, normalize

ZONE = "us-east5-a"

# (fixture, zone the attempt ran in, kind, block, lasting, region, suggested zones)
CASES = [
    ("STOCKOUT", "us-east5-a", "capacity", "zone", False, None, ()),
    ("STOCKOUT_WITH_SUGGESTION", "us-east5-b", "capacity", "zone", False, None, ("europe-west4-a", "us-central1-b")),
    ("GCLOUD_STOCKOUT", "us-central1-a", "capacity", "zone", False, None, ("us-central1-f",)),
    ("TPU_API_STOCKOUT", "europe-west4-a", "capacity", "zone", False, None, ()),
    ("TPU_FAMILY_QUOTA", "us-east5-a", "quota", "region", True, "us-east5", ()),
    ("PREEMPTIBLE_QUOTA", "us-central1-b", "quota", "region", True, "us-central1", ()),
    ("INSERT_QUOTA", "us-west1-a", "quota", "region", True, "us-west1", ()),
    ("TPU_API_QUOTA", "europe-west4-a", "quota", "region", True, "europe-west4", ()),
    ("GLOBAL_QUOTA", "us-east1-d", "quota", "stop", True, None, ()),
    ("NO_MACHINE_TYPE", "europe-west8-a", "unavailable", "zone", True, None, ()),
    ("LOCATION_UNAUTHORIZED", "us-east1-d", "unavailable", "zone", True, None, ()),
    ("PERMISSION_DENIED", "europe-west4-a", "permission", "stop", False, None, ()),
    ("API_DISABLED", "europe-west4-a", "api-disabled", "stop", False, None, ()),
    ("NO_CREDENTIALS", "europe-west4-a", "credentials", "stop", False, None, ()),
    ("ORG_POLICY", "europe-west4-a", "policy", "stop", False, None, ()),
    ("BAD_PROJECT", "europe-west4-a", "project", "stop", False, None, ()),
    ("INVALID_ARGUMENT", "europe-west4-a", "invalid", "stop", False, None, ()),
    ("RATE_EXCEEDED", "europe-west4-a", "transient", "zone", False, None, ()),
    ("CREATE_TIMEOUT", "europe-west4-a", "timeout", "zone", False, None, ()),
]


@pytest.mark.parametrize("name, zone, kind, block, lasting, region, suggested", CASES, ids=[c[0] for c in CASES])
def test_each_recorded_error_routes_the_sweep(name, zone, kind, block, lasting, region, suggested):
    failure = classify(pulumi_failed(getattr(errors, name)), zone)
    assert (failure.kind, failure.block, failure.lasting, failure.region, failure.suggested) == \
        (kind, block, lasting, region, suggested)


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_the_bare_message_classifies_like_the_pulumi_transcript(name):
    """Whether the text comes wrapped in Pulumi's Diagnostics block or alone (gcloud, the Automation API's error)."""
    message = getattr(errors, name)
    assert classify(message, ZONE) == classify(pulumi_failed(message), ZONE)


def test_the_reason_is_the_providers_sentence_without_pulumis_prefixes():
    failure = classify(pulumi_failed(errors.STOCKOUT), "us-east5-a")
    assert failure.reason == ("Error waiting for instance to create: The zone 'projects/my-ml-sandbox/zones/"
                              "us-east5-a' does not have enough resources available to fulfill the request.")
    assert classify(pulumi_failed(errors.TPU_FAMILY_QUOTA), ZONE).reason == (
        "Error waiting for instance to create: Quota 'TPUS_PER_TPU_FAMILY' exceeded. Limit: 0.0 in region us-east5.")


def test_a_failed_readiness_gate_stops_with_the_gates_own_reason_and_points_to_diagnose():
    """The gate's output may quote anything from the VM (here a permission and a stockout); its failure comes first."""
    reason = "boot failed during fetching-token: secret access denied (403 PERMISSION_DENIED)"
    failure = classify(errors.gate_failed(reason), "europe-west4-a")
    assert (failure.kind, failure.block) == ("not-ready", "stop")
    assert failure.reason == f"the VM never served: {reason}"
    assert "tpuserve diagnose --stack" in failure.hint


def test_policy_and_lock_stop_before_anything_is_created():
    assert classify(errors.POLICY_VIOLATION, ZONE).kind == "policy"
    locked = classify(errors.LOCKED, ZONE)
    assert (locked.kind, locked.block) == ("locked", "stop")
    assert "pulumi cancel" in locked.hint
    assert classify(errors.LOCKED_CLOUD, ZONE).kind == "locked"  # Pulumi Cloud's words for the same


def test_a_disabled_api_names_the_command_that_enables_it():
    failure = classify(pulumi_failed(errors.API_DISABLED), ZONE)
    assert failure.hint.startswith("gcloud services enable compute.googleapis.com,")


def test_a_global_quota_stops_and_a_regional_one_names_its_region():
    assert "GPUS_ALL_REGIONS" in classify(errors.GLOBAL_QUOTA, ZONE).hint
    assert classify(errors.TPU_FAMILY_QUOTA, "europe-west4-a").region == "us-east5"  # the message's, not the zone's


def test_a_quota_code_without_the_message_blocks_the_attempts_region():
    failure = classify("googleapi: Error 403: rate of quota consumption exceeded, quotaExceeded", "asia-northeast1-b")
    assert (failure.kind, failure.block, failure.region) == ("quota", "region", "asia-northeast1")


def test_an_unknown_error_stops_the_sweep_with_its_last_error_line():
    output = pulumi_failed("Error creating instance: something nobody has seen before")
    failure = classify(output, ZONE)
    assert (failure.kind, failure.block) == ("unknown", "stop")
    assert "something nobody has seen before" in failure.reason


def test_normalize_joins_wrapped_lines_and_drops_colour():
    assert normalize("\x1b[31merror:\x1b[0m  a\n    b\tc") == "error: a b c"
