"""Unit tests of the HBM/KV planner: hand-checked numbers, no server (the preset and small made-up configs), and the
preset's public v6e-1 allocator measurements, each with its source (tpuserve/data/model-presets.json)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpuserve.measure.plan import GIB, Budget, KvLayer, default_max_num_seqs, kv_layers, make_plan, plan, tpu_block_size
from tpuserve.serving import ConfigError, model_presets

E2B = model_presets()["google/gemma-4-E2B-it"]
WEIGHTS_GIB = 5.1e9 * 2 / GIB
DEFAULT_BUDGET = Budget(hbm_gib=31.24, utilization=0.9, weights_gib=WEIGHTS_GIB, kv_dtype="auto",
                        max_model_len=65536, block_size=128, max_num_batched_tokens=4096)
GPU_BUDGET = dataclasses.replace(DEFAULT_BUDGET, backend="gpu")


def test_e2b_kv_layers_are_the_first_15_with_full_layers_at_double_head_dim():
    layers = kv_layers(E2B["config"])
    # 35 layers, the last 20 reuse KV: layers 0-14 hold it. Every 5th (4, 9, 14) is full attention, which uses
    # global_head_dim 512; the other 12 are sliding with head_dim 256 and a 512-token window.
    assert [layer.index for layer in layers] == list(range(15))
    assert [layer.index for layer in layers if layer.kind == "full_attention"] == [4, 9, 14]
    assert {(layer.kind, layer.kv_heads, layer.head_dim, layer.window) for layer in layers} == {
        ("full_attention", 1, 512, None), ("sliding_attention", 1, 256, 512)}


def test_e2b_plan_on_one_v6e_chip_is_what_tpu_inference_allocates():
    result = make_plan(E2B["config"], DEFAULT_BUDGET)
    assert result.kv_dtype == "bfloat16"  # auto = the model's dtype
    # Per token: 12 sliding × 2 (K, V) × 1 head × 256 × 2 B = 12,288 B; 3 full × 2 × 1 × 512 × 2 B = 6,144 B.
    assert result.kv_bytes_per_token == 18_432  # 18 KiB
    # Budget: 31.24 × 0.9 = 28.116 GiB − 9.4995 GiB (5.1e9 params × 2 B) = 18.6165 GiB = 19,989,325,123 B.
    assert result.budget.kv_bytes == 19_989_325_123
    # Blocks of 128 tokens × 18,432 B = 2,359,296 B: 19,989,325,123 // 2,359,296 = 8,472 (× 128 = 1,084,416).
    assert (result.blocks, result.resident_tokens) == (8_472, 1_084_416)
    # tpu-inference keeps every token in every KV layer: one 65,536-token context is 65,536 × 18,432 B = 1,152 MiB,
    # and 19,989,325,123 // 1,207,959,552 = 16 of them fit.
    assert result.context_bytes == 1_207_959_552
    assert result.contexts == result.contexts_if_windows_kept_all == 16
    # Were the sliding windows honoured (as on GPU), 43 would fit.
    assert result.contexts_if_windows_honoured == 43


@pytest.mark.parametrize("max_model_len, max_num_seqs, block", [
    (32_768, 256, 64), (2_048, 16, 128),  # the public v6e-1 boot logs of the preset's measurements
    (16_384, 256, 32), (65_536, 256, 128),  # xbill9/gemma4-dev gce-vllm-v6e8-2b/SERVING-PARAMS.md §2, at 256 seqs
    (8_192, 256, 256), (1_024, 256, 64),  # up to 8,192 tokens: 16 pages of at most 256
    (131_072, 256, 256), (65_536, 1, 16),  # SMEM: 256 seqs × 512 pages × 4 B fill half of 1 MiB; one seq: 131,072
])
def test_the_tpu_block_size_follows_max_model_len_and_max_num_seqs(max_model_len, max_num_seqs, block):
    assert tpu_block_size(max_model_len, max_num_seqs) == block


def test_vllms_default_max_num_seqs_is_256_or_the_batched_tokens():
    assert (default_max_num_seqs(4096), default_max_num_seqs(128)) == (256, 128)


@pytest.mark.parametrize("measured", E2B["measured"], ids=[m["vllm"] for m in E2B["measured"]])
def test_e2b_resident_tokens_are_within_4_percent_of_each_public_measurement(measured):
    """The planner against each allocator it cites (max_model_len 65,536, 32,768 and 2,048; vLLM 0.26.1 and the
    pinned image's 0.29.1): the block size tpu-inference picked, and the resident tokens (in fact within 0.02%)."""
    block = tpu_block_size(measured["max_model_len"], measured["max_num_seqs"])
    assert block == measured["block_size"]
    budget = Budget(31.24, measured["utilization"], E2B["hbm_gib"], "auto", measured["max_model_len"], block, 4096,
                    "tpu", measured["chips"], measured["max_num_seqs"])
    result = make_plan(E2B["config"], budget)
    tokens = measured["blocks"] * measured["block_size"]
    assert measured.get("tokens", tokens) == tokens
    assert abs(result.resident_tokens / tokens - 1) < 0.04
    assert result.kv_dtype == measured["kv_dtype"] == "bfloat16"  # auto is 16-bit on v6e, whatever the log says


def test_the_public_logs_share_one_pool_whatever_max_model_len():
    # 1,151,744 tokens at 32,768 (blocks of 64) and at 2,048 (blocks of 128): the pool does not follow the context.
    public = [m for m in E2B["measured"] if "tokens" in m]
    assert {m["tokens"] for m in public} == {1_151_744} and {m["block_size"] for m in public} == {64, 128}


def test_fp8_saves_nothing_on_tpu_for_one_kv_head():
    # The kernel packs K and V into 32-bit words: 4 fp8 slots per word, of which one head's K and V fill 2, so
    # align(2, 4) = 4 slots × 256 × 1 B = 1,024 B per sliding layer, as many as bf16's 2 slots × 256 × 2 B.
    bf16 = make_plan(E2B["config"], DEFAULT_BUDGET)
    fp8 = make_plan(E2B["config"], dataclasses.replace(DEFAULT_BUDGET, kv_dtype="fp8"))
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token == 18_432
    assert (fp8.blocks, fp8.contexts, fp8.fp8_saves) == (8_472, 16, False)


def test_the_gpu_backend_keeps_upstream_vllms_arithmetic():
    result = make_plan(E2B["config"], GPU_BUDGET)
    assert result.kv_bytes_per_token == 18_432
    # One 65,536-token request: full layers keep all of it, 3 × 2,048 B × 65,536 = 402,653,184 B. Sliding layers
    # keep min(512 − 1 + 4096, 65536) = 4,607 tokens → 36 blocks + 1 = 37 blocks = 4,736 tokens:
    # 12 × 1,024 B × 4,736 = 58,195,968 B. Sum 460,849,152 B = 439.5 MiB.
    assert result.context_bytes == 460_849_152
    # 19,989,325,123 // 460,849,152 = 43 (44 × 460,849,152 = 20,277,362,688 is over budget).
    assert result.contexts == 43
    # Were every token kept in every layer: 65,536 × 18,432 = 1,207,959,552 B each → 16 fit.
    assert result.contexts_if_windows_kept_all == 16


def test_fp8_halves_kv_per_token_on_gpu():
    result = make_plan(E2B["config"], dataclasses.replace(GPU_BUDGET, kv_dtype="fp8"))
    assert result.kv_bytes_per_token == 9_216 and result.fp8_saves
    # 460,849,152 / 2 = 230,424,576 B per context → 19,989,325,123 // 230,424,576 = 86.
    assert result.contexts == 86


def test_four_chips_replicate_one_kv_head_and_split_the_weights():
    result = make_plan(E2B["config"], dataclasses.replace(DEFAULT_BUDGET, chips=4))
    # One KV head is padded to 4 (one per chip): each chip still holds 18 KiB per token.
    assert result.kv_bytes_per_token == 18_432
    # Per chip: 31.24 × 0.9 GiB = 30,189,325,123.6 B − 10.2e9 B / 4 = 27,639,325,123 B.
    assert result.budget.kv_bytes == 27_639_325_123
    # // 2,359,296 = 11,715 blocks; // 1,207,959,552 = 22 contexts.
    assert (result.blocks, result.contexts) == (11_715, 22)


LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}


@pytest.mark.parametrize("backend, kv_dtype, chips, per_token", [
    # 8 KV heads × 128 fill whole words: 32 layers × align(16, 2) × 128 × 2 B = 131,072 B, fp8 half of it.
    ("tpu", "bf16", 1, 131_072), ("tpu", "fp8", 1, 65_536),
    # Over 4 chips, 2 heads each: 32 × align(4, 2) × 128 × 2 B = 32,768 B; fp8 32 × align(4, 4) × 128 = 16,384 B.
    ("tpu", "bf16", 4, 32_768), ("tpu", "fp8", 4, 16_384),
    ("gpu", "bf16", 4, 32_768),
])
def test_kv_heads_are_split_over_chips_and_packed_into_words(backend, kv_dtype, chips, per_token):
    budget = Budget(31.24, 0.9, 15.0, kv_dtype, 8192, 16, 4096, backend, chips)
    assert make_plan(LLAMA_8B, budget).kv_bytes_per_token == per_token


def test_kv_heads_that_cannot_be_split_over_the_chips_name_the_option():
    with pytest.raises(ConfigError) as raised:
        make_plan(LLAMA_8B, Budget(31.24, 0.9, 15.0, "bf16", 8192, 16, 4096, "tpu", 3))
    assert raised.value.key == "--chips"


def test_flat_config_without_head_dim_or_layer_types_is_all_full_attention():
    # Llama-3-8B shape: head_dim = 4096 / 32 = 128; per token 32 layers × 2 × 8 heads × 128 × 2 B = 131,072 B.
    config = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    layers = kv_layers(config)
    assert len(layers) == 32 and all(layer.window is None and layer.head_dim == 128 for layer in layers)
    budget = Budget(31.24, 0.9, 15.0, "bf16", 8192, 16, 4096, "gpu")
    result = make_plan(config, budget)
    assert result.kv_bytes_per_token == 131_072
    # (28.116 − 15) GiB / (16 × 128 KiB) = 6,715.4 → 6,715 blocks = 107,440 tokens; 8,192 tokens × 128 KiB = 1 GiB
    # per context → 13 fit.
    assert result.resident_tokens == 107_440
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
    result = make_plan(config, Budget(1.0, 1.0, 0.0, "bf16", 1024, 16, 256, "gpu"))
    # bf16: sliding 2 × 1 × 32 × 2 B = 128 B; full 2 × 1 × 64 × 2 B = 256 B; 384 B per token.
    assert result.kv_bytes_per_token == 384
    # 1 GiB / (16 × 384 B) = 174,762 blocks = 2,796,192 tokens. Per 1,024-token context: full 1,024 × 256 B =
    # 262,144 B; sliding keeps min(127 + 256, 1024) = 383 → 24 blocks of 16 + 1 = 25 blocks = 400 tokens × 128 B =
    # 51,200 B; 313,344 B.
    assert result.resident_tokens == 2_796_192
    assert result.context_bytes == 313_344
    assert result.contexts == 2**30 // 313_344  # 3,426


def test_small_heads_are_padded_to_the_tpu_kernels_lanes():
    config = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
              "global_head_dim": 64, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]}
    # head_dim 32 is padded to 128 lanes: align(2, 2) × 128 × 2 B = 512 B; head_dim 64 takes the hd64 kernel, K and
    # V side by side in 128 lanes of align(1, 2) = 2 packed rows: 2 × 128 × 2 B = 512 B. 1,024 B vs 384 B on GPU.
    assert make_plan(config, Budget(1.0, 1.0, 0.0, "bf16", 1024, 16, 256)).kv_bytes_per_token == 1_024


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


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # rich's console width: one table row per line


def test_cli_default_output_for_the_default_model(wide):
    result = CliRunner().invoke(plan, [])
    assert result.exit_code == 0, result.output
    assert "18 KiB (bfloat16 = auto, the model's dtype" in result.stdout
    # 31.24 × 0.9 − 8.97 GiB (the model in HBM, measured) = 20,557,860,962 B // 2,359,296 = 8,713 blocks of 128.
    assert "31.24 GiB × 0.9 − 8.97 GiB weights = 19.15 GiB" in result.stdout
    assert "1,115,264 (8,713 blocks of 128)" in result.stdout
    assert "blocks of tpu-inference's page size for max_model_len 65,536 and max_num_seqs 256" in result.stdout
    assert "Full-length contexts that fit │ 17 (44 if sliding layers kept only their" in result.stdout
    assert "8,713 blocks of 128 (this plan +0.0%): the reference deployment's allocator" in result.stdout


def test_cli_picks_the_block_size_and_the_measurement_of_the_public_logs(wide):
    data = json.loads(CliRunner().invoke(plan, ["--max-model-len", "32768", "--utilization", "0.92",
                                                "--json"]).stdout)
    assert (data["budget"]["block_size"], data["blocks"], data["measured_blocks"]) == (64, 17_995, 17_996)
    data = json.loads(CliRunner().invoke(plan, ["--max-model-len", "2048", "--max-num-seqs", "16", "--utilization",
                                                "0.92", "--json"]).stdout)
    assert (data["budget"]["block_size"], data["blocks"], data["measured_blocks"]) == (128, 8_997, 8_998)
    given = CliRunner().invoke(plan, ["--block-size", "32"]).stdout
    assert "1,115,328 (34,854 blocks of 32)" in given and "blocks of --block-size" in given and "Measured" not in given


def test_cli_says_the_fp8_e5m2_log_line_is_not_an_fp8_cache(wide):
    table = " ".join(CliRunner().invoke(plan, []).stdout.replace("│", " ").split())
    assert ('"fp8_e5m2" in the log v6e servers log "Automatically using fp8_e5m2 for FP8 KV cache on TPU v6e." at boot '
            "whatever --kv-cache-dtype is: it says which fp8 type would be used, not that the cache is fp8") in table
    assert "regular_attn_dtype=bfloat16" in table
    fp8 = CliRunner().invoke(plan, ["--kv-dtype", "fp8"]).stdout
    assert "fp8_e5m2" not in fp8


def test_cli_fp8_on_tpu_prints_the_same_18_kib_and_says_why():
    result = CliRunner().invoke(plan, ["--kv-dtype", "fp8", "--format", "json"])
    data = json.loads(result.stdout)
    assert (data["kv_bytes_per_token"], data["contexts"], data["fp8_saves"]) == (18_432, 17, False)
    table = CliRunner().invoke(plan, ["--kv-dtype", "fp8"], terminal_width=200).stdout
    assert "18 KiB (fp8: no smaller than bf16 on TPU" in table


def test_cli_gpu_backend_keeps_the_windowed_numbers():
    data = json.loads(CliRunner().invoke(plan, ["--backend", "gpu", "--format", "json"]).stdout)
    # vLLM's blocks of 16: a sliding layer keeps ceil(4,607 / 16) + 1 = 289 blocks = 4,624 tokens × 12 × 1,024 B =
    # 56,819,712 B, plus the full layers' 402,653,184 B: 459,472,896 B; 20,557,860,962 // that = 44.
    assert data["budget"]["block_size"] == 16
    assert (data["kv_bytes_per_token"], data["context_bytes"], data["contexts"]) == (18_432, 459_472_896, 44)
    assert data["measured_blocks"] is None  # the measurements were tpu-inference's


def test_cli_warns_when_one_context_does_not_fit_and_names_only_fixes_that_help():
    # 10.0 × 0.9 − 8.97 = 0.03 GiB left for KV: less than one 1,152 MiB context.
    result = CliRunner().invoke(plan, ["--hbm-gib", "10.0"])
    assert result.exit_code == 0, result.output
    assert "warning: not even one 65,536-token context fits" in result.stderr
    # 32,212,254 B // 2,359,296 → 13 blocks of 128 = 1,664 tokens.
    assert "lower --max-model-len (at most 1,664 tokens fit)" in result.stderr
    assert "fp8" not in result.stderr  # it would save nothing on TPU for this model


def test_cli_weights_that_alone_exceed_hbm_get_only_advice_that_can_help(tmp_path: Path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_8B))
    result = CliRunner().invoke(plan, ["--config", str(config), "--weights-gib", "140"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("warning: the weights alone (140.00 GiB per chip) do not fit in the 28.12 GiB")
    assert "shard them over 8 chips (--chips 8: ct6e-standard-8t)" in result.stderr  # 140 / 4 = 35 > 28.12
    assert "--max-model-len" not in result.stderr and "fp8" not in result.stderr


def test_cli_config_without_model_is_named_by_the_config_and_borrows_no_preset_weights(tmp_path: Path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_8B, "_name_or_path": "meta-llama/Llama-3.1-8B"}))
    result = CliRunner().invoke(plan, ["--config", str(config), "--weights-gib", "15", "--format", "json"])
    assert json.loads(result.stdout)["model"] == "meta-llama/Llama-3.1-8B"
    unnamed = tmp_path / "unnamed.json"
    unnamed.write_text(json.dumps(LLAMA_8B))
    result = CliRunner().invoke(plan, ["--config", str(unnamed), "--weights-gib", "15", "--format", "json"])
    assert json.loads(result.stdout)["model"] == str(unnamed)
    # Without --weights-gib and no safetensors beside it, the default model's preset weights are not used.
    result = CliRunner().invoke(plan, ["--config", str(unnamed)])
    assert result.exit_code == 1 and "--weights-gib" in result.output and "9.50" not in result.output


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
    kv_cache_dtype: str = "fp8"

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
    assert (budget["max_model_len"], budget["utilization"], budget["max_num_batched_tokens"], budget["hbm_gib"],
            budget["kv_dtype"]) == (8192, 0.8, 2048, 16.0, "fp8")


# --- the cache disk: the throughput's boot-time effect and monthly cost ---------------------------------------------

def test_the_cache_disks_throughput_is_shown_with_the_warm_boot_estimate_and_its_cost():
    result = CliRunner().invoke(plan, ["--json", "--cache-disk-throughput", "400"])
    assert result.exit_code == 0, result.output
    disk = json.loads(result.output)["cache_disk"]
    # 9.4995 GiB of weights × 1024 / 400 MiB/s = 24.3 s; at the free 140 MiB/s 69.5 s (the reference boot's model load
    # spent 75 s outside XLA).
    assert (disk["weights_read_s"], disk["weights_read_s_at_free_throughput"]) == (24.3, 69.5)
    assert disk["warm_boot_estimate_s"] == 164 <= disk["warm_boot_target_s"] == 180
    # 100 GB × $0.08 + (400 − 140) MiB/s × $0.08 + no IOPS above the free 3,000.
    assert disk["usd_per_month"] == {"capacity": 8.0, "throughput": 20.8, "iops": 0.0, "total": 28.8}
    assert disk["prices_as_of"] == "2026-04-15"
    default = json.loads(CliRunner().invoke(plan, ["--json"]).output)["cache_disk"]  # the free throughput
    assert default["throughput_mibps"] == 140
    assert default["warm_boot_estimate_s"] == 209 > 180 and default["usd_per_month"]["total"] == 8.0
    assert json.loads(CliRunner().invoke(plan, ["--json", "--cache-disk-gb", "0"]).output)["cache_disk"] is None


def test_the_table_says_it_in_words():
    result = CliRunner().invoke(plan, ["--cache-disk-throughput", "140", "--cache-disk-iops", "6000"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert "140 MiB/s: the weights (9.50 GiB) in 69 s (at the free 140 MiB/s: 69 s)" in text
    assert "209 s, over the 180 s target" in text
    assert "$68.00 / month while it exists: 100 GB $8.00 + throughput $0.00 + IOPS $60.00" in text  # 3,000 × $0.02
    bad = CliRunner().invoke(plan, ["--cache-disk-throughput", "100"])
    assert bad.exit_code == 2 and "--cache-disk-throughput" in bad.output


@pytest.mark.parametrize("text, why", [("{bad", "not valid JSON (Expecting property name enclosed in double quotes"),
                                       ("[1, 2]", "not a JSON object")])
def test_a_config_file_that_is_no_config_is_a_usage_error(tmp_path, text: str, why: str):
    """Issue 34 item 9: exit 2, as every other bad file; it was 1."""
    from click.testing import CliRunner

    from tpuserve.cli import main

    path = tmp_path / "config.json"
    path.write_text(text)
    result = CliRunner().invoke(main, ["plan", "--config", str(path)])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1].startswith(f"Error: Invalid value for --config: {path}: {why}")
