"""`tpuserve bench sweep` + `report` against the real CPU vLLM server (tiny random-weight Gemma 4 from
tests/e2e/conftest.py): small lengths (64 in / 16 out), one level of 8 prompts at concurrency 4. Each level is a
`vllm bench serve` whose imports cost ≈13 s of CPU, which benchmarks/sweep_overhead.py runs three times (warm-up,
direct, sweep); several levels in one sweep run in test_engines_e2e.py and test_readme_laptop_e2e.py."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks.sweep_overhead import describe, measure
from tpuserve.measure.bench import bench
from tpuserve.measure.benchreport import report_rows
from tpuserve.measure.plan import kv_layers
from tpuserve.serving import model_presets

pytestmark = pytest.mark.e2e

LEVELS = "4"


def test_sweep_report_and_overhead(vllm_server, vllm_bin: Path, tmp_path: Path) -> None:
    rounds = measure(["--url", vllm_server.url, "--model", vllm_server.model, "--tokenizer",
                      str(vllm_server.model_dir), "--vllm-bin", str(vllm_bin), "--concurrency", LEVELS,
                      "--input-len", "64", "--output-len", "16", "--num-prompts", "8"], tmp_path, rounds=1)
    for number, result in enumerate(rounds, start=1):
        print(f"\nround {number} ({'direct' if number % 2 else 'sweep'} first): {describe(result)}")
    ratio = sum(r.sweep_s for r in rounds) / sum(r.direct_s for r in rounds)
    # One round keeps CI short; benchmarks/sweep_overhead.py runs alternating rounds for the overhead figure.
    print(f"sweep / direct = {ratio:.3f} (one round; see benchmarks/sweep_overhead.py)")
    first = rounds[0]

    manifest = json.loads((first.sweep_dir / "sweep.json").read_text())
    assert manifest["vllm_version"].startswith("0.32.0")  # from the server's GET /version
    assert [run["concurrency"] for run in manifest["runs"]] == [4]

    # The report's numbers are the saved JSON's fields (derived columns from them).
    rows = report_rows(first.sweep_dir, price_per_hour=1.35)
    assert [row.concurrency for row in rows] == [4]
    for row in rows:
        saved = json.loads((first.sweep_dir / row.source).read_text())
        assert saved["completed"] == 8 and saved["failed"] == 0
        assert saved["total_output_tokens"] == 8 * 16  # --ignore-eos: every request gives all 16 tokens
        assert row.concurrency == saved["max_concurrency"]
        assert (row.requests_per_s, row.output_tok_s, row.total_tok_s) == (
            saved["request_throughput"], saved["output_throughput"], saved["total_token_throughput"])
        assert (row.ttft_median_ms, row.ttft_p99_ms, row.tpot_median_ms) == (
            saved["median_ttft_ms"], saved["p99_ttft_ms"], saved["median_tpot_ms"])
        assert row.per_stream_tok_s == 1000 / saved["median_tpot_ms"]
        assert row.usd_per_m_output == 1.35 / (saved["output_throughput"] * 3600) * 1e6

    runner = CliRunner()
    table = runner.invoke(bench, ["report", str(first.sweep_dir)], env={"COLUMNS": "160"})
    print(table.stdout)
    markdown = runner.invoke(bench, ["report", str(first.sweep_dir), "--format", "markdown"])
    print(markdown.stdout)
    png = tmp_path / "sweep.png"
    compared = runner.invoke(bench, ["report", str(first.direct_dir), str(first.sweep_dir), "--plot", str(png)],
                             env={"COLUMNS": "160"})
    print(compared.stdout)
    assert table.exit_code == markdown.exit_code == compared.exit_code == 0
    width, height = struct.unpack(">II", png.read_bytes()[16:24])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (width, height) == (800, 900)


# Which layers hold KV and their (KV heads, head dim), as transformers itself resolves each config directory given.
TRANSFORMERS_LAYERS = """
import json, sys
from transformers import AutoConfig
def layers(directory):
    text = AutoConfig.from_pretrained(directory).get_text_config()
    holding = text.num_hidden_layers - (getattr(text, "num_kv_shared_layers", 0) or 0)
    return [[text.layer_types[i], text.per_layer_config[i].num_key_value_heads, text.per_layer_config[i].head_dim]
            for i in range(holding)]
print(json.dumps([layers(directory) for directory in sys.argv[1:]]))
"""


def planned_layers(config: dict) -> list[list]:
    return [[layer.kind, layer.kv_heads, layer.head_dim] for layer in kv_layers(config)]


@pytest.fixture(scope="module")
def transformers_layers(vllm_python: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                        ) -> dict[str, list[list]]:
    """What transformers reads from the tiny model's config and from the E2B preset's, in one process (its import
    is the cost)."""
    preset = tmp_path_factory.mktemp("e2b-preset")
    (preset / "config.json").write_text(json.dumps(model_presets()["google/gemma-4-E2B-it"]["config"]))
    completed = subprocess.run([str(vllm_python), "-c", TRANSFORMERS_LAYERS, str(tiny_model_dir), str(preset)],
                               check=True, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return dict(zip(("tiny", "e2b"), json.loads(completed.stdout), strict=True))


def test_plan_agrees_with_transformers_on_the_tiny_model(transformers_layers, tiny_model_dir: Path) -> None:
    """The served model's config as transformers 5 saved it (flat, per_layer_config)."""
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert planned_layers(config) == transformers_layers["tiny"]


def test_plan_agrees_with_transformers_on_the_e2b_preset(transformers_layers) -> None:
    """The preset (nested text_config, global_head_dim) loaded by transformers' Gemma4Config."""
    expected = transformers_layers["e2b"]
    assert len(expected) == 15
    assert planned_layers(model_presets()["google/gemma-4-E2B-it"]["config"]) == expected
