"""Real vLLM: the argv `vllm_serve_args` builds for the dev and prod stacks, and for a 4-chip machine (engine 0 of four,
and one engine over the four chips), is accepted
by `vllm serve`'s own parser and means what we intended, and the parser names and KV cache dtypes we allow exist in
vLLM 0.32. One subprocess of the vLLM venv does every parser check (vllm_argcheck.py). The real CPU servers of the
session run the dev (text-only) and prod (multimodal) flags: the last tests here check they did."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from components.config import build_stack_config
from tests.fakes.pulumi_harness import stack_file_config
from tpuserve.serving import KV_CACHE_DTYPES, TPU_KV_CACHE_DTYPES, ServingConfig, mm_limits_of, vllm_serve_args
from vm import readycheck

pytestmark = pytest.mark.e2e

ARGCHECK = Path(__file__).with_name("vllm_argcheck.py")
STACKS = ("dev", "prod")
FOUR_CHIPS = "dev-ct6e-standard-4t"  # four engines of one chip (tensorParallelSize auto)
FOUR_CHIP_ENGINE = "dev-ct6e-standard-4t-tp4"  # one engine over the four chips
MACHINES = {FOUR_CHIPS: {}, FOUR_CHIP_ENGINE: {"tensorParallelSize": "4"}}
# A control the parser must reject, so a check that accepted everything would fail this module.
BROKEN_ARGV = ["google/gemma-4-E2B-it", "--max-model-len", "lots"]


def stack_serving(stack: str) -> ServingConfig:
    if stack in MACHINES:
        return build_stack_config({**stack_file_config("dev"), "machineType": "ct6e-standard-4t",
                                   **MACHINES[stack]}).serving
    return build_stack_config(stack_file_config(stack)).validate().serving


@pytest.fixture(scope="module")
def vllm_verdict(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    argvs = {stack: vllm_serve_args(stack_serving(stack)) for stack in (*STACKS, *MACHINES)} | {"broken": BROKEN_ARGV}
    # What the VM's supervisor runs once a config's first boot stored its KV block count (vm/supervisor.py).
    argvs["pinned"] = vllm_serve_args(stack_serving("dev")) + ["--num-gpu-blocks-override", "8713"]
    out = tmp_path_factory.mktemp("argcheck") / "verdict.json"
    subprocess.run([str(vllm_python), str(ARGCHECK), str(out)], input=json.dumps({"argvs": argvs}), text=True,
                   check=True, capture_output=True, timeout=180)
    return json.loads(out.read_text())


@pytest.mark.parametrize("stack", (*STACKS, *MACHINES))
def test_vllm_serve_parser_accepts_the_stack_argv_and_reads_it_as_meant(vllm_verdict: dict[str, Any], stack: str):
    cfg = stack_serving(stack)
    checked = vllm_verdict["configs"][stack]
    assert checked["error"] is None, checked["error"]
    parsed = checked["parsed"]
    assert parsed["model_tag"] == cfg.model
    # engine 0 of several listens on loopback behind the front (components/front.py), 8100 up
    assert (parsed["host"], parsed["port"]) == (("127.0.0.1", 8100) if stack == FOUR_CHIPS else (cfg.host, cfg.port))
    assert parsed["max_model_len"] == cfg.max_model_len
    assert parsed["gpu_memory_utilization"] == cfg.gpu_memory_utilization
    assert parsed["max_num_batched_tokens"] == cfg.max_num_batched_tokens
    assert parsed["enable_auto_tool_choice"] is cfg.enable_auto_tool_choice
    assert (parsed["tool_call_parser"], parsed["reasoning_parser"]) == (cfg.tool_call_parser, cfg.reasoning_parser)
    assert parsed["kv_cache_dtype"] == cfg.kv_cache_dtype
    assert parsed["tensor_parallel_size"] == (4 if stack == FOUR_CHIP_ENGINE else 1)
    assert not parsed["language_model_only"]  # text-only is every limit 0, which tpu-inference recognises
    if cfg.mm_limits is None:
        assert parsed["limit_mm_per_prompt"] == {"image": 0, "audio": 0, "video": 0}
        assert parsed["disable_chunked_mm_input"] is False
    else:
        assert parsed["limit_mm_per_prompt"] == mm_limits_of(cfg)  # every modality named: none left at 999
        assert parsed["disable_chunked_mm_input"] is True  # tpu-inference needs it for multimodal input


def test_prod_enables_vision_and_dev_is_text_only():
    assert stack_serving("dev").mm_limits is None
    assert stack_serving("prod").mm_limits == {"image": 4, "audio": 0, "video": 0}


def test_the_parser_check_rejects_a_broken_argv(vllm_verdict: dict[str, Any]):
    assert "--max-model-len" in vllm_verdict["configs"]["broken"]["error"]


@pytest.mark.parametrize("stack", STACKS)
def test_parser_names_exist_in_vllms_registries(vllm_verdict: dict[str, Any], stack: str):
    cfg = stack_serving(stack)
    assert cfg.tool_call_parser in vllm_verdict["tool_call_parsers"]
    assert cfg.reasoning_parser in vllm_verdict["reasoning_parsers"]


def test_allowed_kv_cache_dtypes_are_vllms(vllm_verdict: dict[str, Any]):
    """The data file's copy of vLLM's CacheDType is the installed vLLM's, in full (a vLLM with new names makes this
    fail until the file, and the TPU list derived from tpu-inference's runner, are re-read), and the TPU list is a
    part of it."""
    print(f"{len(TPU_KV_CACHE_DTYPES)} KV cache dtypes allowed on TPU, vLLM 0.32 knows {len(vllm_verdict['cache_dtypes'])}")
    assert list(KV_CACHE_DTYPES) == vllm_verdict["cache_dtypes"]
    assert set(TPU_KV_CACHE_DTYPES) <= set(vllm_verdict["cache_dtypes"])


def test_the_real_cpu_servers_run_the_text_only_and_multimodal_flags(vllm_server, vllm_server_plain):
    """Both session servers came up (their fixtures wait for /health) with the stacks' multimodal flags: the dev
    server text-only, the plain one with prod's limits and --disable-chunked-mm-input (the tiny model is text-only,
    so vLLM accepts the limits and has nothing to apply them to)."""
    def flag_value(argv: list[str], flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert flag_value(vllm_server.argv, "--limit-mm-per-prompt") == '{"image":0,"audio":0,"video":0}'
    assert "--language-model-only" not in vllm_server.argv
    assert flag_value(vllm_server_plain.argv, "--limit-mm-per-prompt") == '{"image":4,"audio":0,"video":0}'
    assert "--disable-chunked-mm-input" in vllm_server_plain.argv
    for server in (vllm_server, vllm_server_plain):
        assert server.process.poll() is None, f"{server.url} exited"
        status, reply = readycheck.request(f"{server.url}/v1/chat/completions", 60, {
            "model": server.model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
            server.api_key or "")
        assert status == 200, reply


def test_the_pinned_block_count_is_an_argument_vllm_reads(vllm_verdict: dict[str, Any]):
    checked = vllm_verdict["configs"]["pinned"]
    assert checked["error"] is None, checked["error"]
    assert checked["parsed"]["num_gpu_blocks_override"] == 8713


def test_the_supervisor_reads_the_block_count_the_real_server_allocated(vllm_server):
    """vLLM exports its cache config as vllm:cache_config_info; the supervisor learns a config's first boot's block
    count from it (with an override, vLLM reports the override: measured)."""
    from vm import supervisor

    text = requests.get(f"{vllm_server.url}/metrics", timeout=30).text
    [line] = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
    reported = int(line.split('num_gpu_blocks="', 1)[1].split('"', 1)[0])
    found = supervisor.CACHE_CONFIG_INFO.search(supervisor.fetch(f"{vllm_server.url}/metrics", 10)[1])
    assert reported > 0 and found is not None and int(found.group(1)) == reported
