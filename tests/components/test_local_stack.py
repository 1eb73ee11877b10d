"""The `local` stack (Docker) under Pulumi mocks: the real `__main__.py` runs with Pulumi.local.yaml and variants.

Mocked: no Docker daemon and no Pulumi engine; the readiness gate's stdout is the harness's recorded GATE_STDOUT.
"""

from __future__ import annotations

import os
import shlex

import pytest
from pulumi.runtime.rpc import _special_secret_sig, _special_sig_key

from components.config import build_stack_config
from components.readiness import last_json_line
from tests.fakes.pulumi_harness import GATE_STDOUT, LOCAL_IMAGE_ID, StackRun, run_stack, stack_file_config
from tpuserve.serving import ConfigError, config_hash, vllm_serve_args

CONTAINER = "docker:index/container:Container"
IMAGE = "docker:index/remoteImage:RemoteImage"
GATE = "command:local:Command"


def local_config(**overrides: str) -> dict[str, str]:
    return {**stack_file_config("local"), **overrides}


@pytest.fixture(scope="module")
def local_run() -> StackRun:
    return run_stack(local_config(), "local")


def gate_argv(run: StackRun) -> list[str]:
    """The `tpuserve gate ...` arguments of the readiness command (after `python -m tpuserve`)."""
    argv = shlex.split(run.one(GATE).inputs["create"])
    return argv[argv.index("tpuserve") + 1:]


def test_local_stack_declares_only_docker_and_the_gate(local_run: StackRun) -> None:
    custom_types = sorted(r.type for r in local_run.resources if r.custom)
    assert custom_types == sorted([IMAGE, CONTAINER, GATE])


def test_container_runs_the_shared_argv_builder_on_the_pulled_image(local_run: StackRun) -> None:
    cfg = build_stack_config(local_config())
    container = local_run.one(CONTAINER).inputs
    assert local_run.one(IMAGE).inputs["name"] == cfg.serving.image
    assert "vllm-openai" in cfg.serving.image
    assert container["image"] == LOCAL_IMAGE_ID
    assert container["command"] == vllm_serve_args(cfg.serving)
    assert "entrypoints" not in container  # the image's own `vllm serve` entrypoint runs the argv


def test_port_is_published_on_loopback_only() -> None:
    run = run_stack(local_config(localPort="9011"), "local")
    ports = run.one(CONTAINER).inputs["ports"]
    assert ports == [{"ip": "127.0.0.1", "internal": 8000, "external": 9011}]
    assert run.outputs["endpoint"] == "http://127.0.0.1:9011/v1"
    assert gate_argv(run)[gate_argv(run).index("--url") + 1] == "http://127.0.0.1:9011"


@pytest.mark.parametrize(("gpus", "expected"), [("all", "all"), ("device=0,1", "device=0,1"), ("", None)])
def test_gpus_are_requested_only_when_configured(gpus: str, expected: str | None) -> None:
    run = run_stack(local_config(localGpus=gpus), "local")
    assert run.one(CONTAINER).inputs.get("gpus") == expected


@pytest.mark.parametrize("cache", ["~/.cache/huggingface", "/srv/hf-cache"])
def test_model_cache_is_mounted_from_the_host(cache: str) -> None:
    run = run_stack(local_config(localModelCache=cache), "local")
    assert run.one(CONTAINER).inputs["volumes"] == [
        {"hostPath": os.path.expanduser(cache), "containerPath": "/root/.cache/huggingface"}]


def test_hf_token_is_passed_as_env_only_when_set(local_run: StackRun) -> None:
    assert local_run.one(CONTAINER).inputs.get("envs", []) == []
    with_token = run_stack(local_config(hfToken="hf_local_secret"), "local")
    envs = with_token.one(CONTAINER).inputs["envs"]
    # The env list stays a Pulumi secret, like the token it carries.
    assert envs == {_special_sig_key: _special_secret_sig, "value": ["HF_TOKEN=hf_local_secret"]}
    assert "hf_local_secret" not in with_token.one(CONTAINER).inputs["command"]


def test_container_carries_stack_labels_and_config_hash(local_run: StackRun) -> None:
    labels = {item["label"]: item["value"] for item in local_run.one(CONTAINER).inputs["labels"]}
    cfg = build_stack_config(local_config())
    assert labels == {"app": "tpu-serve", "stack": "local", "managed-by": "pulumi", "env": "local",
                      "tpu-serve.config-hash": config_hash(cfg.serving)}


def test_readiness_gate_polls_the_published_url(local_run: StackRun) -> None:
    cfg = build_stack_config(local_config())
    assert gate_argv(local_run) == ["gate", "--url", f"http://127.0.0.1:{cfg.local_port}",
                                    "--model", cfg.serving.model, "--timeout", str(cfg.readiness_timeout_seconds),
                                    "--connect-timeout", str(cfg.readiness_timeout_seconds)]
    assert local_run.one(GATE).inputs["triggers"] == [f"{local_run.one(CONTAINER).name}-id",
                                                      config_hash(cfg.serving)]


def test_outputs(local_run: StackRun) -> None:
    cfg = build_stack_config(local_config())
    assert local_run.outputs == {
        "target": "local",
        "endpoint": f"http://127.0.0.1:{cfg.local_port}/v1",
        "model": cfg.serving.model,
        "vllmArgs": vllm_serve_args(cfg.serving),
        "configHash": config_hash(cfg.serving),
        "bootTimeline": last_json_line(GATE_STDOUT),
    }


@pytest.mark.parametrize(("key", "value"), [
    ("localGpus", "everything"),
    ("localPort", "70000"),
    ("localModelCache", "relative/cache"),
    ("containerImage", "vllm/vllm-tpu:nightly"),
])
def test_bad_local_settings_name_their_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_stack_config(local_config(**{key: value}))
    assert err.value.key == key
