"""Stack config: Pulumi.yaml matches the typed settings, and every bad value is refused before any resource exists."""

import json

import pytest

from components.config import ConfigError, build_stack_config, parse_duration
from scripts.config_docs import pulumi_yaml_config, render_pulumi_yaml
from tests.fakes.pulumi_harness import ROOT, RecordingMocks, run_stack, stack_file_config

VALID = {"project": "proj-1", "hfTokenSecretId": "hf-token"}
GKE = {"target": "gke", "project": "proj-1", "zone": "us-east5-b", "hfTokenSecretId": "hf-token"}
LOCAL = {"target": "local", "containerImage": "vllm/vllm-openai:v0.32.0"}


def test_pulumi_yaml_is_generated_from_the_settings():
    assert (ROOT / "Pulumi.yaml").read_text() == render_pulumi_yaml(), \
        "Pulumi.yaml is stale: run `python scripts/config_docs.py`"


def test_pulumi_yaml_declares_only_types_pulumi_knows_with_matching_defaults():
    python_types = {"string": str, "integer": int, "boolean": bool, "array": list}
    for key, entry in pulumi_yaml_config().items():
        assert entry["type"] in python_types, key
        assert entry["description"], key
        if "default" in entry:
            assert type(entry["default"]) is python_types[entry["type"]], key


@pytest.mark.parametrize("given", [VALID, GKE, LOCAL], ids=["gcp", "gke", "local"])
def test_declared_defaults_build_the_same_config_as_no_config(given):
    """What the Pulumi CLI injects from Pulumi.yaml, every target's keys on every stack, must mean exactly what the
    Python defaults mean."""
    declared = {k: (json.dumps(e["default"]) if e["type"] == "array"  # the CLI hands arrays to the program as JSON
                    else str(e["default"]).lower() if e["type"] == "boolean" else str(e["default"]))
                for k, e in pulumi_yaml_config().items() if "default" in e}
    assert build_stack_config({**declared, **given}) == build_stack_config(given)


def test_stack_files_are_valid_configs():
    for stack in ("dev", "prod"):
        cfg = build_stack_config(stack_file_config(stack))
        assert cfg.labels["env"] == stack
    assert build_stack_config(stack_file_config("dev")).serving.mm_limits is None
    assert build_stack_config(stack_file_config("prod")).serving.mm_limits == {"image": 4, "audio": 0, "video": 0}


@pytest.mark.parametrize("text, seconds", [("4h", 14400), ("90m", 5400), ("1d12h", 129600), ("3600s", 3600),
                                           ("1s", 1), ("0d1s", 1)])
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
    ({"containerImage": ""}, "containerImage: must not be empty (default: vllm/vllm-tpu@sha256:19a1a0526476f902eb83e1057f3d8938f35b457dd7716a30e9ab4f7bee90d507)"),
    # A digest docker cannot pull by is refused here, not minutes into a paid boot (OCI: sha256 is 64 lowercase hex).
    ({"containerImage": "vllm/vllm-tpu@sha256:19a1a0526476f9"}, "containerImage: 'vllm/vllm-tpu@sha256:19a1a0526476f9' "
     "has a malformed digest: sha256 takes 64 hex digits, got 14"),
    ({"containerImage": "vllm/vllm-tpu@sha256:19A1A0526476F902EB83E1057F3D8938F35B457DD7716A30E9AB4F7BEE90D507"},
     "containerImage: 'vllm/vllm-tpu@sha256:19A1A0526476F902EB83E1057F3D8938F35B457DD7716A30E9AB4F7BEE90D507' has a "
     "malformed digest: sha256 digits must be lowercase hex (the OCI image spec forbids A-F)"),
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
def test_a_vm_runs_one_engine_per_chip_of_the_default_model(machine_type, chips):
    """auto: the fewest chips that hold E2B's 9.5 GiB of weights is one (tpuserve/data/model-presets.json)."""
    serving = build_stack_config({**VALID, "machineType": machine_type}).serving
    assert (serving.backend, serving.chips, serving.tensor_parallel_size, serving.engines) == ("tpu", chips, 1, chips)


@pytest.mark.parametrize("setting, engines", [("2", 2), ("4", 1)])
def test_tensor_parallel_size_set_splits_the_chips_into_engines(setting, engines):
    serving = build_stack_config({**VALID, "machineType": "ct6e-standard-4t", "tensorParallelSize": setting}).serving
    assert (serving.tensor_parallel_size, serving.engines) == (int(setting), engines)


def test_a_model_without_a_preset_gets_every_chip_and_gke_one_engine_per_node():
    """No preset: its weights are unknown, so one engine on every chip (as before engines). gke: a pod per node."""
    other = build_stack_config({**VALID, "machineType": "ct6e-standard-8t", "model": "org/unknown-27b"}).serving
    assert (other.tensor_parallel_size, other.engines) == (8, 1)
    gke = build_stack_config({**VALID, "target": "gke", "zone": "us-east5-a", "machineType": "ct6e-standard-4t"})
    assert (gke.serving.tensor_parallel_size, gke.serving.engines) == (4, 1)


@pytest.mark.parametrize("raw, message", [
    ({"machineType": "ct6e-standard-4t", "tensorParallelSize": "3"},
     "tensorParallelSize: 3 does not split the machine's 4 chip(s) into whole engines; use one of 1, 2, 4"),
    ({"machineType": "ct6e-standard-4t", "tensorParallelSize": "8"},
     "tensorParallelSize: 8 does not split the machine's 4 chip(s) into whole engines; use one of 1, 2, 4"),
    ({"machineType": "ct6e-standard-1t", "tensorParallelSize": "-1"},
     "tensorParallelSize: must be 0 (auto) or a positive integer, got -1"),
    ({"target": "gke", "zone": "us-east5-a", "machineType": "ct6e-standard-4t", "tensorParallelSize": "1"},
     "tensorParallelSize: 1 would split the chips into 4 engines; a gke pod is one engine on its node's 4 chip(s): "
     "leave it 0, or use machineType ct6e-standard-1t for one chip per replica"),
], ids=["not-a-divisor", "more-than-the-chips", "negative", "gke"])
def test_a_tensor_parallel_size_the_machine_cannot_run_is_refused_naming_the_key(raw, message):
    with pytest.raises(ConfigError) as err:
        build_stack_config({**VALID, **raw})
    assert str(err.value) == message


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_refused_with_vllms_reason():
    """E2B has 8 attention heads: 3 local GPUs would be refused by vLLM at boot (verify_with_parallel_config)."""
    with pytest.raises(ConfigError) as err:
        build_stack_config({"target": "local", "containerImage": "vllm/vllm-openai:v0.32.0",
                            "localGpus": "device=0,1,3"})
    assert str(err.value) == ("tensorParallelSize: 3 does not divide google/gemma-4-E2B-it's 8 attention heads, which "
                              "vLLM refuses at boot (vllm/config/model.py verify_with_parallel_config); use one of 1")


@pytest.mark.parametrize("gpus, size", [("all", 1), ("", 1), ("2", 2), ("device=0,1,3,4", 4)])
def test_the_local_target_shards_over_the_gpus_it_names(gpus, size):
    serving = build_stack_config({"target": "local", "containerImage": "vllm/vllm-openai:v0.32.0",
                                  "localGpus": gpus}).serving
    assert (serving.backend, serving.tensor_parallel_size, serving.engines) == ("gpu", size, 1)


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


def test_a_zone_missing_from_the_offline_list_is_a_warning_not_an_error():
    """Which zones offer ct6e is Compute Engine's to say (preflight asks it live): a new zone must still deploy."""
    cfg = build_stack_config({**VALID, "zone": "us-west2-a", "zones": '["us-west2-a", "europe-west4-a", "me-west1-b"]'})
    assert cfg.zone == "us-west2-a"
    assert cfg.warnings() == [
        "zone/zones: us-west2-a, me-west1-b not among the zones known to offer TPU v6e (europe-west4-a, us-east1-d, "
        "us-central1-b, asia-northeast1-b, us-east5-a, us-east5-b, us-central1-ai1a, us-south1-ai1b); "
        "`tpuserve preflight` checks them live"]


def test_the_zone_warning_reaches_pulumis_log_and_the_stack_deploys(caplog):
    with caplog.at_level("WARNING"):
        run = run_stack({**VALID, "zone": "us-west2-a"})
    assert run.one("gcp:compute/instance:Instance").inputs["zone"] == "us-west2-a"
    assert [r.getMessage() for r in caplog.records if "us-west2-a" in r.getMessage()] == [
        "zone/zones: us-west2-a not among the zones known to offer TPU v6e (europe-west4-a, us-east1-d, "
        "us-central1-b, asia-northeast1-b, us-east5-a, us-east5-b, us-central1-ai1a, us-south1-ai1b); "
        "`tpuserve preflight` checks them live"]


# --- every target's limits, from both sides, with the line the user reads -------------------------------------------



EDGES = [
    (VALID, {"bootDiskSizeGb": "200"}),
    (VALID, {"cacheDiskSizeGb": "0"}),  # no cache disk
    (VALID, {"cacheDiskSizeGb": "50"}),
    (VALID, {"maxRunDuration": "600s"}),  # flex-start's limits are inclusive: 10 min ...
    (VALID, {"maxRunDuration": "604800s"}),  # ... to 7 days
    (VALID, {"pricePerChipHour": "0"}),
    (VALID, {"alertDownAfter": "2m"}),
    (VALID, {"alertDownAfter": "120s"}),
    (VALID, {"alertTtftP99Seconds": "0.01"}),
    (VALID, {"alertQueueDepth": "1"}),
    (VALID, {"alertNotificationChannels": '["projects/proj-1/notificationChannels/123"]'}),
    (VALID, {"labels": json.dumps({"a" + "b" * 62: "c" * 63, "team": ""})}),  # 63 characters; an empty value
    (VALID, {"project": "a" + "b" * 28 + "c"}),  # 30 characters
    (VALID, {"region": "europe-west4"}),
    (VALID, {"zones": '["europe-west4-a"]'}),
    (VALID, {"hfTokenSecretId": "", "hfToken": "hf_x"}),
    (VALID, {"hfTokenSecretId": "projects/proj-1/secrets/hf-token"}),
    (VALID, {"externalIp": "True", "createCloudNat": "FALSE"}),
    (GKE, {}),  # readinessTimeout's default, 25m, is the least gke takes
    (GKE, {"readinessTimeout": "1500s"}),
    (GKE, {"gkeMaxNodes": "1", "gkeMinReplicas": "0"}),
    (GKE, {"gkeMaxNodes": "64", "gkeMinReplicas": "64"}),
    (GKE, {"gkeMaxNodes": "2", "gkeMinReplicas": "2"}),
    (GKE, {"gkeCluster": "ml", "gkeClusterLocation": "us-east5"}),  # regional in the zone's region
    (GKE, {"gkeCluster": "ml", "gkeClusterLocation": "us-east5-b"}),  # zonal in the zone
    (GKE, {"gkeCluster": "a" + "b" * 39}),  # 40 characters
    (GKE, {"gkeNamespace": "a" * 63}),
    (LOCAL, {"localPort": "1"}),
    (LOCAL, {"localPort": "65535"}),
    (LOCAL, {"localGpus": ""}),
    (LOCAL, {"localGpus": "device=0,1"}),
    (LOCAL, {"localModelCache": "/srv/huggingface"}),
    (LOCAL, {"readinessTimeout": "1m"}),  # the gke minimum is gke's
]


@pytest.mark.parametrize("base, override", EDGES,
                         ids=[f"{i}-{base.get('target', 'gcp')}-{next(iter(o), 'defaults')}"
                              for i, (base, o) in enumerate(EDGES)])
def test_values_at_the_edge_of_what_is_allowed_pass(base, override):
    cfg = build_stack_config({**base, **override})
    assert cfg.target == base.get("target", "gcp")


BAD_WITH_MESSAGE = [
    (VALID, {"project": ""}, "project: is required: pulumi config set project <gcp-project-id>"),
    (VALID, {"cloudNatSkipRegions": '["europe-west4-a"]'},
     "cloudNatSkipRegions: 'europe-west4-a' is not a region name like europe-west4 (it is written by `tpuserve up`; "
     "pulumi config rm cloudNatSkipRegions to start over)"),
    (VALID, {'cacheDiskSizeGb': '49'},
     'cacheDiskSizeGb: must be 0 (no cache disk) or at least 50, got 49'),
    (VALID, {'cacheDiskSizeGb': '-1'},
     'cacheDiskSizeGb: must be 0 (no cache disk) or at least 50, got -1'),
    (VALID, {'bootDiskSizeGb': '199'},
     'bootDiskSizeGb: must be at least 200, got 199'),
    (VALID, {'maxRunDuration': '599s'},
     "maxRunDuration: '599s' is outside flex-start's limits: from 10m to 7d"),
    (VALID, {'maxRunDuration': '604801s'},
     "maxRunDuration: '604801s' is outside flex-start's limits: from 10m to 7d"),
    (VALID, {'maxRunDuration': '0s'},
     "maxRunDuration: '0s' must be longer than zero"),
    (VALID, {'maxRunDuration': '0d0h'},
     "maxRunDuration: '0d0h' must be longer than zero"),
    (VALID, {'maxRunDuration': '4h '},
     "maxRunDuration: '4h ' is not a duration like 4h, 90m or 1d12h"),
    (VALID, {'maxRunDuration': 'h'},
     "maxRunDuration: 'h' is not a duration like 4h, 90m or 1d12h"),
    (VALID, {'maxRunDuration': ''},
     'maxRunDuration: must not be empty (default: 4h)'),
    (VALID, {'pricePerChipHour': '-0.01'},
     'pricePerChipHour: must not be negative, got -0.01'),
    (VALID, {'alertDownAfter': '119s'},
     "alertDownAfter: '119s' is shorter than 2m: metrics arrive every 15 s and a short gap is not an outage"),
    (VALID, {'alertTtftP99Seconds': '0'},
     'alertTtftP99Seconds: must be above zero, got 0.0'),
    (VALID, {'alertTtftP99Seconds': '-1'},
     'alertTtftP99Seconds: must be above zero, got -1.0'),
    (VALID, {'alertQueueDepth': '0'},
     'alertQueueDepth: must be at least 1, got 0'),
    (VALID, {'alertNotificationChannels': '["my-pager"]'},
     "alertNotificationChannels: 'my-pager' is not a notification channel name like "
     'projects/my-project/notificationChannels/1234567890 (gcloud beta monitoring channels list '
     "--format='value(name)')"),
    (VALID, {'labels': '{"abbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb": "x"}'},
     "labels: abbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb='x': keys and values must be "
     'lowercase letters, digits, _ or -, at most 63 chars (keys start with a letter)'),
    (VALID, {'labels': '{"team": "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"}'},
     "labels: team='cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc': keys and values must be "
     'lowercase letters, digits, _ or -, at most 63 chars (keys start with a letter)'),
    (VALID, {'labels': '{"1team": "x"}'},
     "labels: 1team='x': keys and values must be lowercase letters, digits, _ or -, at most 63 chars (keys start "
     'with a letter)'),
    (VALID, {'project': 'abbbbbbbbbbbbbbbbbbbbbbbbbbbbbc'},
     "project: 'abbbbbbbbbbbbbbbbbbbbbbbbbbbbbc' is not a GCP project id (6-30 lowercase letters, digits or "
     "hyphens, starting with a letter, not ending with a hyphen); use the id, not the project's name or number"),
    (VALID, {'zones': '["europe-west4-a", "europe-west4-a"]'},
     "zones: 'europe-west4-a' is listed twice"),
    (VALID, {'zones': '[]'},
     'zones: must list at least one zone (or leave it unset for the default order)'),
    (VALID, {'zones': '["europe-west4"]'},
     "zones: 'europe-west4' is not a zone name like europe-west4-a"),
    (VALID, {'region': 'us-east1'},
     "region: 'us-east1' does not contain zone 'europe-west4-a'"),
    (VALID, {'machineType': 'ct6e-standard-2t'},
     "machineType: 'ct6e-standard-2t' is not a TPU v6e machine type (ct6e-standard-1t, -4t or -8t)"),
    (VALID, {'bootDiskType': 'hyperdisk-ml'},
     "bootDiskType: 'hyperdisk-ml': a TPU v6e boot disk must be hyperdisk-balanced (v6e takes only Hyperdisk "
     'Balanced and Hyperdisk ML, and Hyperdisk ML cannot boot)'),
    (VALID, {'hfTokenSecretId': ''},
     'hfTokenSecretId: set exactly one of hfTokenSecretId (an existing secret) or hfToken (pulumi config set '
     '--secret hfToken ...)'),
    (VALID, {'hfToken': 'hf_x'},
     'hfTokenSecretId: set exactly one of hfTokenSecretId (an existing secret) or hfToken (pulumi config set '
     '--secret hfToken ...)'),
    (VALID, {'hfTokenSecretId': 'bad id!'},
     "hfTokenSecretId: 'bad id!' is not a secret id or projects/P/secrets/S"),
    (VALID, {'target': 'aws'},
     "target: 'aws' is not one of gcp, local, gke"),
    (VALID, {'zone': 'europe-west4'},
     "zone: 'europe-west4' is not a zone name like europe-west4-a"),
    (VALID, {'externalIp': 'yes'},
     "externalIp: expected true or false, got 'yes'"),
    (VALID, {'bootDiskSizeGb': '1.5'},
     "bootDiskSizeGb: expected an integer, got '1.5'"),
    (VALID, {'pricePerChipHour': 'cheap'},
     "pricePerChipHour: expected a number, got 'cheap'"),
    (VALID, {'pricePerChipHour': 'nan'},
     "pricePerChipHour: expected a finite number, got 'nan'"),
    (VALID, {'zones': '"europe-west4-a"'},
     "zones: expected a list, got 'europe-west4-a'"),
    (VALID, {'labels': '[1]'},
     'labels: expected a dict, got [1]'),
    (VALID, {'labels': '{x'},
     "labels: expected a JSON dict, got '{x'"),
    (VALID, {'containerImage': ' '},
     'containerImage: must not be empty (default: vllm/vllm-tpu@sha256:19a1a0526476f902eb83e1057f3d8938f35b457dd7716a30e9ab4f7bee90d507)'),
    (VALID, {'maxModelLength': '1'},
     'maxModelLength: unknown setting (did you mean maxModelLen?); Pulumi.yaml lists every setting with its '
     'description'),
    (VALID, {'readinessTimeout': 'soon'},
     "readinessTimeout: 'soon' is not a duration like 4h, 90m or 1d12h"),
    (GKE, {'gkeMaxNodes': '0'},
     'gkeMaxNodes: must be between 1 and 64, got 0'),
    (GKE, {'gkeMaxNodes': '65'},
     'gkeMaxNodes: must be between 1 and 64, got 65'),
    (GKE, {'gkeMinReplicas': '3'},
     'gkeMinReplicas: must be between 0 and gkeMaxNodes (2), got 3'),
    (GKE, {'gkeMinReplicas': '-1'},
     'gkeMinReplicas: must be between 0 and gkeMaxNodes (2), got -1'),
    (GKE, {'readinessTimeout': '1499s'},
     "readinessTimeout: '1499s': on gke it is the pods' startup probe budget and must cover a cold compile: at "
     'least 25m'),
    (GKE, {'gkeClusterLocation': 'us-east5'},
     'gkeClusterLocation: applies to an existing cluster only; set gkeCluster too, or leave it empty (a new '
     "cluster is zonal, in the zone)"),
    (GKE, {'gkeCluster': 'ml', 'gkeClusterLocation': 'us-east1'},
     "gkeClusterLocation: 'us-east1': the TPU nodes run in zone 'us-east5-b', so the cluster must be regional in "
     'us-east5 or zonal in us-east5-b'),
    (GKE, {'gkeCluster': 'abbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb'},
     "gkeCluster: 'abbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb' is not a GKE cluster name (lowercase letters, digits "
     'and -, at most 40 characters, starting with a letter)'),
    (GKE, {'gkeNamespace': 'Serving'},
     "gkeNamespace: 'Serving' is not a Kubernetes namespace name (lowercase letters, digits and -, at most 63 "
     'characters)'),
    (GKE, {'alertQueueDepth': '0'},
     'alertQueueDepth: applies to target gcp, not gke'),  # gke stacks have no alert policies
    (GKE, {'zones': '["us-east5-a"]'},
     'zones: applies to target gcp, not gke'),
    (GKE, {'vllmApiKeySecretId': 'vllm-key'},
     'vllmApiKeySecretId: applies to target gcp, not gke'),
    (GKE, {'maxRunDuration': '8d'},
     "maxRunDuration: '8d' is outside flex-start's limits: from 10m to 7d"),
    (LOCAL, {'localPort': '0'},
     'localPort: must be a TCP port (1-65535), got 0'),
    (LOCAL, {'localPort': '65536'},
     'localPort: must be a TCP port (1-65535), got 65536'),
    (LOCAL, {'localGpus': '0'},
     "localGpus: '0' is not a docker --gpus value (all, 2, device=0,1) or empty"),
    (LOCAL, {'localModelCache': 'rel'},
     "localModelCache: 'rel' must be an absolute path or start with ~"),
    (LOCAL, {'hfTokenSecretId': 'x'},
     'hfTokenSecretId: applies to targets gcp and gke, not local; target local cannot read Secret Manager: set '
     'hfToken (pulumi config set --secret hfToken ...), or nothing for a public model'),
    (LOCAL, {'zone': 'us-west2-a'},
     'zone: applies to targets gcp and gke, not local'),
    (LOCAL, {'bootDiskSizeGb': 'lots'},
     'bootDiskSizeGb: applies to targets gcp and gke, not local'),
    (VALID, {'localPort': '8001'},
     'localPort: applies to target local, not gcp'),
    (VALID, {'gkeMaxNodes': '4'},
     'gkeMaxNodes: applies to target gke, not gcp'),
    (LOCAL, {'containerImage': 'vllm/vllm-tpu:nightly'},
     "containerImage: 'vllm/vllm-tpu:nightly' needs a TPU host; target local runs the vLLM OpenAI image, e.g. "
     'vllm/vllm-openai:v0.32.0'),
    (LOCAL, {'labels': '{"Team": "x"}'},
     "labels: Team='x': keys and values must be lowercase letters, digits, _ or -, at most 63 chars (keys start "
     'with a letter)'),
    (LOCAL, {'readinessTimeout': 'soon'},
     "readinessTimeout: 'soon' is not a duration like 4h, 90m or 1d12h"),
    (LOCAL, {'pricePerChipHour': '-1'},
     'pricePerChipHour: applies to targets gcp and gke, not local'),
    (GKE, {'pricePerChipHour': '-1'},
     'pricePerChipHour: must not be negative, got -1.0'),
]


@pytest.mark.parametrize("base, override, message", BAD_WITH_MESSAGE,
                         ids=[f"{i}-{next(iter(o))}" for i, (_, o, _) in enumerate(BAD_WITH_MESSAGE)])
def test_each_bad_value_is_one_line_naming_the_key(base, override, message):
    with pytest.raises(ConfigError) as err:
        build_stack_config({**base, **override})
    assert str(err.value) == message
    assert err.value.key == message.split(":", 1)[0]


def test_a_key_of_another_target_holding_its_default_is_no_concern():
    """Pulumi hands the program every key Pulumi.yaml declares with a default, whatever the target."""
    cfg = build_stack_config({**LOCAL, "zone": "europe-west4-a", "hfTokenSecretId": "", "gkeMaxNodes": "2"})
    assert (cfg.target, cfg.warnings()) == ("local", [])
    assert not hasattr(cfg, "zone")  # a local stack has no zone to read by mistake


def test_settings_are_parsed_by_the_type_of_their_default():
    cfg = build_stack_config({**VALID, "zones": '["us-east5-b", "europe-west4-a"]', "labels": '{"team": "ml"}',
                              "bootDiskSizeGb": "300", "pricePerChipHour": "1.5", "externalIp": "true",
                              "keepCaches": "false", "multimodalLimits": '{"image": 2}'})
    assert cfg.zones == ("us-east5-b", "europe-west4-a")  # a tuple, like the default
    assert dict(cfg.labels) == {"team": "ml"}
    assert (cfg.boot_disk_gb, cfg.price_per_chip_hour) == (300, 1.5)
    assert (cfg.external_ip, cfg.keep_caches) == (True, False)
    assert cfg.serving.mm_limits == {"image": 2}


def test_the_backend_follows_the_target():
    assert build_stack_config(VALID).serving.backend == "tpu"
    assert build_stack_config(GKE).serving.backend == "tpu"
    assert build_stack_config(LOCAL).serving.backend == "gpu"


def test_the_program_reads_its_namespace_with_the_token_kept_secret(caplog):
    """load_stack_config as __main__.py calls it, without running the program: keys of other namespaces are not
    ours, hfToken arrives as a secret Output, and advice reaches Pulumi's log."""
    import pulumi
    from pulumi.runtime.sync_await import _sync_await

    from components.config import load_stack_config

    pulumi.runtime.set_mocks(RecordingMocks(), project="tpu-serve", stack="dev", preview=False)
    pulumi.runtime.set_all_config({"tpu-serve:project": "proj-1", "tpu-serve:hfToken": "hf_secret_x",
                                   "tpu-serve:zone": "us-west2-a", "tpu-serve:zones": '["us-west2-a"]',
                                   "gcp:project": "someone-else"}, ["tpu-serve:hfToken"])
    with caplog.at_level("WARNING"):
        cfg = load_stack_config()
    assert (cfg.project, cfg.zone, cfg.zones) == ("proj-1", "us-west2-a", ("us-west2-a",))
    assert isinstance(cfg.hf_token, pulumi.Output)
    assert _sync_await(cfg.hf_token.is_secret()) is True
    assert _sync_await(cfg.hf_token.future()) == "hf_secret_x"
    assert [r.getMessage() for r in caplog.records if "us-west2-a" in r.getMessage()] == [
        "zone/zones: us-west2-a not among the zones known to offer TPU v6e (europe-west4-a, us-east1-d, "
        "us-central1-b, asia-northeast1-b, us-east5-a, us-east5-b, us-central1-ai1a, us-south1-ai1b); "
        "`tpuserve preflight` checks them live"]
