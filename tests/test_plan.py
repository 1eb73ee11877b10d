"""Unit tests of the HBM/KV planner: hand-checked numbers, no server (the preset and small made-up configs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpuserve.measure.plan import GIB, Budget, KvLayer, kv_layers, make_plan, plan, presets
from tpuserve.serving import ConfigError

E2B = presets()["google/gemma-4-E2B-it"]
DEFAULT_BUDGET = Budget(hbm_gib=31.24, utilization=0.9, weights_gib=5.1e9 * 2 / GIB, kv_dtype="bf16",
                        max_model_len=65536, block_size=128, max_num_batched_tokens=4096)


def test_e2b_kv_layers_are_the_first_15_with_full_layers_at_double_head_dim():
    layers = kv_layers(E2B["config"])
    # 35 layers, the last 20 reuse KV: layers 0-14 hold it. Every 5th (4, 9, 14) is full attention, which uses
    # global_head_dim 512; the other 12 are sliding with head_dim 256 and a 512-token window.
    assert [layer.index for layer in layers] == list(range(15))
    assert [layer.index for layer in layers if layer.kind == "full_attention"] == [4, 9, 14]
    assert {(layer.kind, layer.kv_heads, layer.head_dim, layer.window) for layer in layers} == {
        ("full_attention", 1, 512, None), ("sliding_attention", 1, 256, 512)}


def test_e2b_plan_on_one_v6e_chip():
    result = make_plan(E2B["config"], DEFAULT_BUDGET)
    # Per token: 12 sliding × 2 (K, V) × 1 head × 256 × 2 B = 12,288 B; 3 full × 2 × 1 × 512 × 2 B = 6,144 B.
    assert result.kv_bytes_per_token == 18_432  # 18 KiB
    # Budget: 31.24 × 0.9 = 28.116 GiB − 9.4995 GiB (5.1e9 params × 2 B) = 18.6165 GiB = 19,989,325,123 B.
    assert result.budget.kv_bytes == 19_989_325_123
    # 19,989,325,123 // 18,432 = 1,084,490 tokens (18,432 × 1,084,490 = 19,989,319,680); // 128 = 8,472 blocks.
    assert (result.resident_tokens, result.blocks) == (1_084_490, 8_472)
    # One 65,536-token request: full layers keep all of it, 3 × 2,048 B × 65,536 = 402,653,184 B. Sliding layers
    # keep min(512 − 1 + 4096, 65536) = 4,607 tokens → 36 blocks + 1 = 37 blocks = 4,736 tokens:
    # 12 × 1,024 B × 4,736 = 58,195,968 B. Sum 460,849,152 B = 439.5 MiB.
    assert result.context_bytes == 460_849_152
    # 19,989,325,123 // 460,849,152 = 43 (44 × 460,849,152 = 20,277,362,688 is over budget).
    assert result.contexts == 43
    # Were every token kept in every layer: 65,536 × 18,432 = 1,207,959,552 B each → 16 fit.
    assert result.contexts_if_windows_kept_all == 16


def test_fp8_halves_kv_per_token():
    result = make_plan(E2B["config"], Budget(**{**DEFAULT_BUDGET.__dict__, "kv_dtype": "fp8"}))
    assert result.kv_bytes_per_token == 9_216
    # 460,849,152 / 2 = 230,424,576 B per context → 19,989,325,123 // 230,424,576 = 86.
    assert result.contexts == 86


def test_flat_config_without_head_dim_or_layer_types_is_all_full_attention():
    # Llama-3-8B shape: head_dim = 4096 / 32 = 128; per token 32 layers × 2 × 8 heads × 128 × 2 B = 131,072 B.
    config = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    layers = kv_layers(config)
    assert len(layers) == 32 and all(layer.window is None and layer.head_dim == 128 for layer in layers)
    budget = Budget(31.24, 0.9, 15.0, "bf16", 8192, 16, 4096)
    result = make_plan(config, budget)
    assert result.kv_bytes_per_token == 131_072
    # (28.116 − 15) GiB / 128 KiB = 13.116 × 8,192 = 107,446.3 → 107,446 tokens; 8,192 tokens × 128 KiB = 1 GiB
    # per context → 13 fit.
    assert result.resident_tokens == 107_446
    assert result.contexts == 13


def test_nested_and_flat_configs_agree():
    text = E2B["config"]["text_config"]
    assert kv_layers({"text_config": text}) == kv_layers(dict(text))


def test_transformers5_per_layer_config_matches_global_head_dim():
    # transformers 5 saves Gemma 4 configs with per_layer_config overrides instead of global_head_dim.
    text = dict(E2B["config"]["text_config"])
    del text["global_head_dim"]
    text["per_layer_config"] = {str(index): {"head_dim": 512} for index in range(4, 35, 5)}
    assert kv_layers(text) == kv_layers(E2B["config"])


def test_tiny_test_model_config():
    # The e2e tier's tiny Gemma 4 as transformers 5.19 saves it (flat, per_layer_config).
    config = {"model_type": "gemma4_text", "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 32, "hidden_size": 64, "sliding_window": 128,
              "num_kv_shared_layers": 0, "layer_types": ["sliding_attention", "full_attention"],
              "per_layer_config": {"1": {"head_dim": 64}}}
    result = make_plan(config, Budget(1.0, 1.0, 0.0, "bf16", 1024, 16, 256))
    # bf16: sliding 2 × 1 × 32 × 2 B = 128 B; full 2 × 1 × 64 × 2 B = 256 B; 384 B per token.
    assert result.kv_bytes_per_token == 384
    # 1 GiB / 384 B = 2,796,202 tokens. Per 1,024-token context: full 1,024 × 256 B = 262,144 B; sliding keeps
    # min(127 + 256, 1024) = 383 → 24 blocks of 16 + 1 = 25 blocks = 400 tokens × 128 B = 51,200 B; 313,344 B.
    assert result.resident_tokens == 2_796_202
    assert result.context_bytes == 313_344
    assert result.contexts == 2**30 // 313_344  # 3,426


def test_k_eq_v_full_layers_use_global_kv_heads():
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
              "global_head_dim": 128, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
              "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]}
    assert kv_layers(config) == [KvLayer(0, "sliding_attention", 2, 64, 16), KvLayer(1, "full_attention", 1, 128, None)]
    # Without k_eq_v the global KV head count is ignored, as in transformers' Gemma4TextConfig.
    assert kv_layers({**config, "attention_k_eq_v": False})[1].kv_heads == 2


def test_sliding_layer_never_holds_more_than_the_context():
    layer = KvLayer(0, "sliding_attention", 1, 256, 512)
    # max_model_len 1,000 < 511 + 4,096: holds ceil(1000 / 128) = 8 blocks, + 1 for the window's ragged start.
    assert layer.tokens_held(1000, 128, 4096) == 9 * 128


@pytest.mark.parametrize(("change", "key"), [
    ({"layer_types": ["full_attention"]}, "--config layer_types"),
    ({"layer_types": ["mamba"] * 35}, "--config layer_types[0]"),
    ({"num_kv_shared_layers": 35}, "--config num_kv_shared_layers"),
    ({"num_attention_heads": 0}, "--config num_attention_heads"),
])
def test_bad_config_names_the_key(change, key):
    with pytest.raises(ConfigError) as raised:
        kv_layers({"text_config": {**E2B["config"]["text_config"], **change}})
    assert raised.value.key == key


def test_cli_warns_when_one_context_does_not_fit():
    # 10.6 × 0.9 − 9.4995 = 0.0405 GiB left for KV: less than one 439.5 MiB context.
    result = CliRunner().invoke(plan, ["--hbm-gib", "10.6"])
    assert result.exit_code == 0, result.output
    assert "warning: not even one 65,536-token context fits" in result.stderr


def test_cli_json_for_a_local_checkpoint_reads_weights_from_safetensors(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": E2B["config"]["text_config"]}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 2**20)  # 1 MiB of "weights"
    result = CliRunner().invoke(plan, ["--model", "local/tiny", "--config", str(tmp_path / "config.json"),
                                       "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["budget"]["weights_gib"] == 1 / 1024
    assert data["kv_bytes_per_token"] == 18_432


def test_cli_unknown_model_without_config_names_the_option():
    result = CliRunner().invoke(plan, ["--model", "someone/else"])
    assert result.exit_code != 0
    assert "--config" in result.output and "someone/else" in result.output


STACK_DEFAULTS_CHANGED = """
import dataclasses, json
from click.testing import CliRunner
import tpuserve.facts, tpuserve.serving

@dataclasses.dataclass(frozen=True)
class Changed(tpuserve.serving.ServingConfig):
    max_model_len: int = 8192
    gpu_memory_utilization: float = 0.8
    max_num_batched_tokens: int = 2048

tpuserve.serving.ServingConfig = Changed
tpuserve.facts.V6E_HBM_GIB = 16.0
from tpuserve.measure.plan import plan
print(json.dumps(json.loads(CliRunner().invoke(plan, ["--format", "json"]).stdout)["budget"]))
"""


def test_defaults_follow_the_stacks_serving_config_and_the_chip_fact():
    """Changed in one place (ServingConfig, tpuserve.facts), the plan's defaults change with them."""
    completed = subprocess.run([sys.executable, "-c", STACK_DEFAULTS_CHANGED], capture_output=True, text=True,
                               check=True)
    budget = json.loads(completed.stdout)
    assert (budget["max_model_len"], budget["utilization"], budget["max_num_batched_tokens"], budget["hbm_gib"]) == (
        8192, 0.8, 2048, 16.0)
