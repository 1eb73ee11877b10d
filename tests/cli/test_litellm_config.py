"""`tpuserve litellm`: the generated proxy config. The real `litellm` library routing through it (importing it takes
≈ 10 s) is in the e2e tier: tests/e2e/test_router_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.fakes.fake_openai import FAKE_MODEL, FakeOpenAI
from tpuserve.cli import main
from tpuserve.deploy.litellm_config import litellm_config
from tpuserve.serving import ConfigError


def generate(*args: str) -> dict:
    result = CliRunner().invoke(main, ["litellm", *args])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.output)


def test_every_alias_maps_to_the_served_model_with_keys_by_reference_only() -> None:
    config = generate("--url", "http://10.0.0.5:8000", "--model", "google/gemma-4-E2B-it",
                      "--alias", "gemini-2.0-flash", "--alias", "gpt-4o-mini", "--offline")
    assert [entry["model_name"] for entry in config["model_list"]] == ["gemini-2.0-flash", "gpt-4o-mini"]
    for entry in config["model_list"]:
        assert entry["litellm_params"] == {"model": "openai/google/gemma-4-E2B-it",
                                           "api_base": "http://10.0.0.5:8000/v1",
                                           "api_key": "os.environ/TPUSERVE_API_KEY"}
    assert config["general_settings"] == {"master_key": "os.environ/LITELLM_MASTER_KEY"}


def test_endpoint_and_model_come_from_saved_stack_outputs(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"endpoint": "http://10.1.2.3:8000/v1", "model": "google/gemma-4-E2B-it",
                                   "zone": "us-east5-b"}))
    config = generate("--stack-outputs", str(outputs), "--alias", "gemini-2.0-flash")
    assert config["model_list"][0]["litellm_params"]["api_base"] == "http://10.1.2.3:8000/v1"
    assert config["model_list"][0]["litellm_params"]["model"] == "openai/google/gemma-4-E2B-it"


@pytest.mark.parametrize("kwargs, key, message", [
    ({"aliases": []}, "--alias", "at least one"),
    ({"aliases": ["a", "b", "a"]}, "--alias", "repeated: a"),
    ({"api_key_env": "my-key"}, "--api-key-env", "not an environment variable name"),
    ({"master_key_env": "sk-1234"}, "--master-key-env", "not an environment variable name"),
    ({"served_model": ""}, "--model", "must name"),
])
def test_bad_input_names_the_option(kwargs: dict, key: str, message: str) -> None:
    arguments = {"url": "http://h:8000", "served_model": "m", "aliases": ["gemini-2.0-flash"], **kwargs}
    with pytest.raises(ConfigError, match=message) as caught:
        litellm_config(**arguments)
    assert caught.value.key == key


def test_without_url_or_stack_the_command_says_what_to_give() -> None:
    result = CliRunner().invoke(main, ["litellm", "--alias", "gemini-2.0-flash"])
    assert result.exit_code == 2 and "give --url (and --model), or --stack" in result.output


def test_a_host_port_url_becomes_a_usable_api_base_and_the_model_defaults_to_the_first_served() -> None:
    """Issue #11, items 6 and 9: `--url 127.0.0.1:8011` used to give `api_base: 127.0.0.1:8011/v1`; `--model` was
    required here while probe took the first served model."""
    with FakeOpenAI() as fake:
        config = generate("--url", fake.url.removeprefix("http://"), "--alias", "gemini-2.0-flash")
    assert config["model_list"][0]["litellm_params"]["api_base"] == f"{fake.url}/v1"
    assert config["model_list"][0]["litellm_params"]["model"] == f"openai/{FAKE_MODEL}"


def test_json_is_the_same_config() -> None:
    args = ["--url", "10.0.0.5:8000", "--model", "m", "--alias", "gemini-2.0-flash", "--offline"]
    result = CliRunner().invoke(main, ["litellm", *args, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == generate(*args)


# --- a model the server does not serve is refused ---------------------------------------------------------------

def test_a_model_the_server_does_not_serve_is_refused_with_what_it_serves():
    with FakeOpenAI() as fake:
        result = CliRunner().invoke(main, ["litellm", "--url", fake.url, "--model", "nosuch", "--alias", "a"])
    assert result.exit_code == 2 and result.stdout == ""  # no config for a model nobody serves
    assert result.stderr.splitlines()[-1] == (f"Error: Invalid value for --model: 'nosuch' is not served by "
                                              f"{fake.url}/v1/models, which serves {FAKE_MODEL}")


def test_a_served_model_is_checked_and_written():
    with FakeOpenAI() as fake:
        config = generate("--url", fake.url, "--model", FAKE_MODEL, "--alias", "a")
        asked = [request.path for request in fake.requests]
    assert config["model_list"][0]["litellm_params"]["model"] == f"openai/{FAKE_MODEL}" and asked == ["/v1/models"]


def test_a_server_not_reachable_from_here_is_not_asked_and_says_so():
    from tests.fakes.httpfake import idle_port

    address = f"127.0.0.1:{idle_port()}"
    result = CliRunner().invoke(main, ["litellm", "--url", address, "--model", "m", "--alias", "a"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["model_list"][0]["litellm_params"]["api_base"] == f"http://{address}/v1"
    assert result.stderr.splitlines() == [f"note: http://{address}/v1/models did not answer (Connection refused): "
                                          "--model m is written unchecked"]
    offline = CliRunner().invoke(main, ["litellm", "--url", address, "--model", "m", "--alias", "a", "--offline"])
    assert offline.exit_code == 0 and offline.stderr == ""


def test_offline_without_a_model_asks_the_server_nothing():
    """Issue 34 item 9: --offline used to ask the server for its first model when --model was missing."""
    from tests.fakes.fake_openai import FakeOpenAI

    with FakeOpenAI() as server:
        result = CliRunner().invoke(main, ["litellm", "--url", server.url, "--alias", "a", "--offline"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == "Error: --offline asks the server nothing, so it needs --model (or --stack)"
    assert server.requests == []
