"""vm/supervisor.py's `secret_env` (components/startup_script.py served_config with vllmApiKeySecretId): the secrets
it names are read like the token and handed to `docker run` through its environment only, and vLLM's API key is
presented by the readiness checks, after a boot and after an adoption. Secret Manager and Docker are stand-ins
here (their real paths are tests/vm/test_supervisor.py's, in the sandbox); the request shapes are vm/readycheck.py's
against a fake vLLM that answers /v1 only with the key (tests/vm/test_readycheck.py `keyed`)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from components.startup_script import served_config
from tests.fakes.httpfake import Response
from tests.vm.test_readycheck import keyed
from tpuserve.serving import ServingConfig
from tests.fakes.fake_openai import FAKE_MODEL
from vm import readycheck, supervisor

KEY = "sk-vllm-key-canary-31415926"
SECRET = "projects/p-1/secrets/vllm-api-key"


class FakeMetadata:
    def email(self) -> str:
        return "tpu-serve-dev-r3@p-1.iam.gserviceaccount.com"

    def put_guest(self, key: str, value: str) -> None:
        pass


@pytest.fixture
def config() -> supervisor.ServedConfig:
    text = served_config(ServingConfig(), "projects/p-1/secrets/hf-token", machine_type="ct6e-standard-1t",
                         api_key_secret=SECRET)
    return supervisor.ServedConfig.parse(text)


def make(monkeypatch: pytest.MonkeyPatch) -> tuple[supervisor.Supervisor, list[dict[str, Any]]]:
    read: list[dict[str, Any]] = []

    def read_secret(secret: str, *args: Any, **kwargs: Any) -> str:
        read.append({"secret": secret})
        return {SECRET: KEY, "projects/p-1/secrets/hf-token": "hf_canary"}[secret]

    # The supervisor imports its siblings as top-level modules (as on the VM): patch the one it uses.
    monkeypatch.setattr(supervisor.hf_token, "read_secret", read_secret)
    sup = supervisor.Supervisor.__new__(supervisor.Supervisor)
    sup.settings, sup.metadata, sup.api_key, sup.kv_blocks = supervisor.Settings(), FakeMetadata(), "", None
    sup.report = lambda key, value: None  # type: ignore[method-assign]
    sup.change = lambda fields, new_timeline=False: None  # type: ignore[method-assign]
    return sup, read


def test_the_served_config_names_the_key_by_secret_and_variable(config) -> None:
    assert config.secret_env == (("VLLM_API_KEY", SECRET),) and config.api_key_env == "VLLM_API_KEY"
    assert KEY not in json.dumps(config.engines[0].docker_run_args)
    argv = config.engines[0].docker_run_args
    assert argv[argv.index("HF_TOKEN") + 1:][:2] == ("-e", "VLLM_API_KEY")


def test_the_key_goes_to_docker_run_through_its_environment_only(config, monkeypatch) -> None:
    sup, read = make(monkeypatch)
    runs: list[dict[str, Any]] = []

    def docker(*args: str, env: dict[str, str] | None = None, timeout_s: float = 600) -> subprocess.CompletedProcess:
        runs.append({"args": args, "env": env})
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(supervisor, "docker", docker)
    sup.xla_key = "k"
    secrets = sup.fetch_secret_env(config)
    sup.run_engine(config, config.engines[0], "hf_canary", secrets)

    assert read == [{"secret": SECRET}] and sup.api_key == KEY
    run = runs[-1]
    assert run["args"][0] == "run" and KEY not in json.dumps(run["args"])
    assert run["env"]["VLLM_API_KEY"] == KEY and run["env"]["HF_TOKEN"] == "hf_canary"
    assert all(KEY not in json.dumps(r["args"]) for r in runs)


def refusing_disabled_parts(fake):
    """vLLM's 400 for a part of a modality limited to 0 (the boot's disabled-modality check, vm/readycheck.py
    `refusals`), behind the key check: the refusal checks must present the key too."""
    route = ("POST", "/v1/chat/completions")
    inner = fake.routes[route]

    def chat(request):
        response = inner(request)
        parts = [p for m in request.json()["messages"] if isinstance(m.get("content"), list) for p in m["content"]]
        if response.status == 200 and any(p.get("type") in ("image_url", "input_audio", "video_url") for p in parts):
            return Response(400, {"error": {"message": "At most 0 item(s) of this modality may be provided in one prompt."}})
        return response

    fake.routes[route] = chat
    return fake


def test_the_readiness_checks_present_the_key_after_boot_and_after_adoption(config, monkeypatch) -> None:
    sup, _ = make(monkeypatch)
    with refusing_disabled_parts(keyed(KEY)) as fake:
        engine = supervisor.Engine("vllm", fake.url, config.engines[0].docker_run_args)
        keyed_config = supervisor.ServedConfig(**{**config.__dict__, "server_url": fake.url, "model": FAKE_MODEL,
                                                  "engines": (engine,)})
        assert readycheck.check(fake.url, FAKE_MODEL)[0] is False  # the server refuses a check without the key
        sup.fetch_secret_env(keyed_config)
        sup.wait_until_serving(keyed_config, engine)  # raises supervisor.Failed unless the checks pass
        sup.api_key = ""  # a restarted supervisor knows no key until it adopts the container
        seen: list[str] = []
        monkeypatch.setattr(supervisor.readycheck, "check", lambda url, model, timeout_s=10.0, api_key="": (
            seen.append(api_key) or (True, "ready")))
        sup.state, sup.xla_key = supervisor.State(), "k"
        sup.stage = lambda name: None  # type: ignore[method-assign]
        sup.install_ops_agent = lambda config: None  # type: ignore[method-assign]
        sup.adopt(keyed_config)
        assert seen == [KEY]
