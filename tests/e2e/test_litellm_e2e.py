"""The generated LiteLLM config, loaded by the real `litellm` library, routes a chat to the real CPU vLLM server
(tiny random-weight Gemma 4; fixtures in tests/e2e/conftest.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tpuserve.cli import main

pytestmark = pytest.mark.e2e


def test_a_router_from_the_generated_file_completes_through_the_gemini_alias(
        vllm_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price map from the internet
    monkeypatch.setenv("TPUSERVE_API_KEY", "none")  # the CPU server has no key; LiteLLM needs a value
    result = CliRunner().invoke(main, ["litellm", "--url", vllm_server.url, "--model", vllm_server.model,
                                       "--alias", "gemini-2.0-flash", "--alias", "gpt-4o-mini"])
    assert result.exit_code == 0, result.output
    config_file = tmp_path / "litellm_config.yaml"
    config_file.write_text(result.output)

    started = time.monotonic()
    import litellm

    router = litellm.Router(model_list=yaml.safe_load(config_file.read_text())["model_list"])
    response = router.completion(model="gemini-2.0-flash", messages=[{"role": "user", "content": "Hello!"}],
                                 max_tokens=16, temperature=0)
    print(f"litellm import + Router + completion: {time.monotonic() - started:.1f} s; "
          f"reply {response.choices[0].message.content!r}")
    assert response.usage.completion_tokens > 0
    assert isinstance(response.choices[0].message.content, str)
    assert response.model.endswith(vllm_server.model)
