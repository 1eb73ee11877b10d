"""Stack config: Pulumi.yaml matches the typed settings, and every bad value is refused before any resource exists."""

import json

import pytest

from components.config import ConfigError, build_stack_config, parse_duration, pulumi_yaml_config, render_pulumi_yaml
from tests.pulumi_harness import ROOT, RecordingMocks, run_stack, stack_file_config

VALID = {"project": "proj-1", "hfTokenSecretId": "hf-token"}


def test_pulumi_yaml_is_generated_from_the_settings():
    assert (ROOT / "Pulumi.yaml").read_text() == render_pulumi_yaml(), \
        "Pulumi.yaml is stale: run `python -m components.config > Pulumi.yaml`"


def test_pulumi_yaml_declares_only_types_pulumi_knows_with_matching_defaults():
    python_types = {"string": str, "integer": int, "boolean": bool, "array": list}
    for key, entry in pulumi_yaml_config().items():
        assert entry["type"] in python_types, key
        assert entry["description"], key
        if "default" in entry:
            assert type(entry["default"]) is python_types[entry["type"]], key


def test_declared_defaults_build_the_same_config_as_no_config():
    """What the Pulumi CLI injects from Pulumi.yaml must mean exactly what the Python defaults mean."""
    declared = {k: (json.dumps(e["default"]) if e["type"] == "array"  # the CLI hands arrays to the program as JSON
                    else str(e["default"]).lower() if e["type"] == "boolean" else str(e["default"]))
                for k, e in pulumi_yaml_config().items() if "default" in e}
    assert build_stack_config({**declared, **VALID}) == build_stack_config(VALID)


def test_stack_files_are_valid_configs():
    for stack in ("dev", "prod"):
        cfg = build_stack_config(stack_file_config(stack))
        assert cfg.labels["env"] == stack
    assert build_stack_config(stack_file_config("dev")).serving.mm_limits is None
    assert build_stack_config(stack_file_config("prod")).serving.mm_limits == {"image": 4, "audio": 1}


@pytest.mark.parametrize("text, seconds", [("4h", 14400), ("90m", 5400), ("1d12h", 129600), ("3600s", 3600)])
def test_durations(text, seconds):
    assert parse_duration("maxRunDuration", text) == seconds


BAD = [
    ({"zone": "us-east5"}, "zone"),
    ({"zone": "Europe-West4-A"}, "zone"),
    ({"zones": "[]"}, "zones"),
    ({"zones": '["europe-west4-a", "us-east5"]'}, "zones"),
    ({"zones": '["europe-west4-a", "us-east1-d", "europe-west4-a"]'}, "zones"),
    ({"zones": '"europe-west4-a"'}, "zones"),
    ({"zones": "[4]"}, "zones"),
    ({"region": "us-east1"}, "region"),
    ({"project": ""}, "project"),
    ({"target": "aws"}, "target"),
    ({"machineType": "n2-standard-8"}, "machineType"),
    ({"bootDiskSizeGb": "100"}, "bootDiskSizeGb"),
    ({"bootDiskSizeGb": "lots"}, "bootDiskSizeGb"),
    ({"bootDiskType": "pd-balanced"}, "bootDiskType"),
    ({"bootDiskType": "hyperdisk-ml"}, "bootDiskType"),  # v6e takes it, but not as a boot disk
    ({"bootDiskType": "hyperdisk-extreme"}, "bootDiskType"),
    ({"maxRunDuration": "8d"}, "maxRunDuration"),
    ({"maxRunDuration": "9m"}, "maxRunDuration"),
    ({"extraArgs": '["--tensor-parallel-size", "8"]'}, "extraArgs"),
    ({"maxRunDuration": "forever"}, "maxRunDuration"),
    ({"readinessTimeout": "soon"}, "readinessTimeout"),
    ({"hfTokenSecretId": ""}, "hfTokenSecretId"),
    ({"hfToken": "hf_both"}, "hfTokenSecretId"),
    ({"hfTokenSecretId": "projects/p/secrets/"}, "hfTokenSecretId"),
    ({"labels": '{"Team": "ml"}'}, "labels"),
    ({"labels": '["env"]'}, "labels"),
    ({"pricePerChipHour": "cheap"}, "pricePerChipHour"),
    ({"externalIp": "yes"}, "externalIp"),
    ({"maxModelLen": "big"}, "maxModelLen"),
    ({"gpuMemoryUtilization": "1.5"}, "gpuMemoryUtilization"),
    ({"multimodalLimits": "{not json"}, "multimodalLimits"),
    ({"multimodalLimits": '{"image": -1}'}, "multimodalLimits"),
    ({"kvCacheDtype": "fp4"}, "kvCacheDtype"),
    ({"toolCallParser": ""}, "enableAutoToolChoice"),
    ({"extraArgs": '["--max-model-len=1024"]'}, "extraArgs"),
    ({"extraArgs": '"--seed 1"'}, "extraArgs"),
    ({"model": "google/gemma-4-E2B-it-qat-w4a16-ct"}, "model"),
    ({"maxModelLength": "1024"}, "maxModelLength"),
    # Issue #11, item 12: values that used to reach an output or a VM broken.
    ({"extraArgs": '["--hf-token", "hf_abc"]'}, "extraArgs"),
    ({"extraArgs": '["--api-key=sk-123"]'}, "extraArgs"),
    ({"extraArgs": '["--served-model-name", "gemma"]'}, "extraArgs"),
    ({"containerImage": ""}, "containerImage"),
    ({"containerImage": "  "}, "containerImage"),
    ({"zone": ""}, "zone"),
    ({"pricePerChipHour": "nan"}, "pricePerChipHour"),
    ({"pricePerChipHour": "inf"}, "pricePerChipHour"),
    ({"gpuMemoryUtilization": "NaN"}, "gpuMemoryUtilization"),
    ({"project": "My Project"}, "project"),
    ({"project": "123456789012"}, "project"),
    ({"project": "ab-1"}, "project"),
    ({"project": "project-ending-"}, "project"),
]


@pytest.mark.parametrize("override, message", [
    ({"extraArgs": '["--hf-token", "hf_abc"]'}, "extraArgs: --hf-token takes a secret, which would sit in plain text "
                                                 "in the startup script, the instance metadata and the vllmArgs output; "
                                                 "the Hugging Face token reaches the container through its environment "
                                                 "only: set hfTokenSecretId"),
    ({"extraArgs": '["--api_key", "sk-1"]'}, "extraArgs: --api-key takes a secret"),
    ({"extraArgs": '["--served-model-name=gemma"]'}, "extraArgs: --served-model-name would rename the served model"),
    ({"containerImage": ""}, "containerImage: must not be empty (default: vllm/vllm-tpu:nightly)"),
    ({"pricePerChipHour": "inf"}, "pricePerChipHour: expected a finite number, got 'inf'"),
    ({"project": "My Project"}, "project: 'My Project' is not a GCP project id"),
])
def test_bad_stack_input_says_what_to_do_instead(override, message):
    with pytest.raises(ConfigError) as err:
        build_stack_config({**VALID, **override})
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("override", [{"toolCallParser": "", "enableAutoToolChoice": "false"},
                                      {"reasoningParser": ""}, {"project": "example.com:my-project"},
                                      {"project": "a23456"}, {"extraArgs": '["--ssl-keyfile", "/k.pem"]'}])
def test_empty_where_documented_and_valid_ids_pass(override):
    build_stack_config({**VALID, **override})


@pytest.mark.parametrize("override, key", BAD, ids=[f"{k}-{i}" for i, (_, k) in enumerate(BAD)])
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        build_stack_config({**VALID, **override})
    assert err.value.key == key
    assert str(err.value).startswith(f"{key}: ")


def test_a_misspelt_key_in_the_stack_config_is_an_error_not_a_silent_default():
    """Goes through the program's real config reader (Pulumi's runtime config), not build_stack_config alone."""
    mocks = RecordingMocks()
    with pytest.raises(ConfigError, match="^maxModelLength: unknown setting"):
        run_stack({**VALID, "maxModelLength": "1024"}, mocks=mocks)
    assert mocks.resources == []


def test_local_target_refuses_a_secret_manager_token():
    with pytest.raises(ConfigError) as err:
        build_stack_config({"target": "local", "containerImage": "vllm/vllm-openai:v0.32.0",
                            "hfTokenSecretId": "hf-token"})
    assert err.value.key == "hfTokenSecretId"


def test_known_broken_model_deploys_with_the_explicit_override():
    cfg = build_stack_config({**VALID, "model": "google/gemma-4-E2B-it-qat-w4a16-ct", "allowKnownBrokenModel": "true"})
    assert cfg.serving.model.endswith("-qat-w4a16-ct")


def test_bad_config_creates_nothing():
    mocks = RecordingMocks()
    with pytest.raises(ConfigError, match="^bootDiskSizeGb"):
        run_stack({**VALID, "bootDiskSizeGb": "100"}, mocks=mocks)
    assert mocks.resources == []
    run_stack(VALID, mocks=mocks)  # the same harness does record a valid stack
    assert mocks.resources


@pytest.mark.parametrize("duration", ["10m", "7d"])
def test_flex_start_run_limits_are_inclusive(duration):
    assert build_stack_config({**VALID, "maxRunDuration": duration}).max_run_duration == duration


@pytest.mark.parametrize("machine_type, chips", [("ct6e-standard-1t", 1), ("ct6e-standard-4t", 4),
                                                 ("ct6e-standard-8t", 8)])
def test_the_served_tensor_parallel_size_is_the_machines_chip_count(machine_type, chips):
    serving = build_stack_config({**VALID, "machineType": machine_type}).serving
    assert (serving.backend, serving.tensor_parallel_size) == ("tpu", chips)


@pytest.mark.parametrize("gpus, size", [("all", 1), ("", 1), ("2", 2), ("device=0,1,3", 3)])
def test_the_local_target_shards_over_the_gpus_it_names(gpus, size):
    serving = build_stack_config({"target": "local", "containerImage": "vllm/vllm-openai:v0.32.0",
                                  "localGpus": gpus}).serving
    assert (serving.backend, serving.tensor_parallel_size) == ("gpu", size)


def test_costs_and_limits_derive_from_the_settings():
    cfg = build_stack_config({**VALID, "machineType": "ct6e-standard-4t", "maxRunDuration": "1d",
                              "pricePerChipHour": "2.0"})
    assert cfg.chips == 4 and cfg.max_run_seconds == 86400
    assert cfg.worst_case_cost_usd == 24 * 4 * 2.0
    assert cfg.effective_region == "europe-west4"


def test_zones_default_to_the_evidence_order_and_the_zone_to_its_first():
    cfg = build_stack_config(VALID)
    assert cfg.zone == "europe-west4-a"
    assert cfg.zones == ("europe-west4-a", "us-east1-d", "us-central1-b", "asia-northeast1-b", "us-east5-a",
                         "us-east5-b", "us-central1-ai1a", "us-south1-ai1b")
    assert cfg.warnings() == []
    listed = build_stack_config({**VALID, "zones": '["us-east5-b", "europe-west4-a"]'})
    assert listed.zones == ("us-east5-b", "europe-west4-a")


def test_a_zone_missing_from_the_offline_list_is_a_warning_not_an_error(caplog):
    """Which zones offer ct6e is Compute Engine's to say (preflight asks it live): a new zone must still deploy."""
    cfg = build_stack_config({**VALID, "zone": "us-west2-a", "zones": '["us-west2-a", "europe-west4-a", "me-west1-b"]'})
    assert cfg.zone == "us-west2-a"
    assert cfg.warnings() == [
        "zone/zones: us-west2-a, me-west1-b not among the zones known to offer TPU v6e (europe-west4-a, us-east1-d, "
        "us-central1-b, asia-northeast1-b, us-east5-a, us-east5-b, us-central1-ai1a, us-south1-ai1b); "
        "`tpuserve preflight` checks them live"]
    with caplog.at_level("WARNING"):
        run = run_stack({**VALID, "zone": "us-west2-a"})
    assert run.one("gcp:compute/instance:Instance").inputs["zone"] == "us-west2-a"
    assert [r.getMessage() for r in caplog.records if "us-west2-a" in r.getMessage()] == [
        "zone/zones: us-west2-a not among the zones known to offer TPU v6e (europe-west4-a, us-east1-d, "
        "us-central1-b, asia-northeast1-b, us-east5-a, us-east5-b, us-central1-ai1a, us-south1-ai1b); "
        "`tpuserve preflight` checks them live"]
