"""`tpuserve plan` for a machine of several chips: the stack's engines (tensorParallelSize), the counts per engine
and for the machine. (tests/cli/test_plan.py checks the per-chip KV arithmetic itself.)"""

from __future__ import annotations

import json

from click.testing import CliRunner

from tpuserve.measure.plan import plan


def planned(*args: str) -> dict:
    result = CliRunner().invoke(plan, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_four_chips_of_the_default_model_are_four_engines_of_one_chip():
    """What a ct6e-standard-4t stack runs (tensorParallelSize auto = 1): each engine holds what one chip does."""
    one, four = planned(), planned("--chips", "4")
    assert (four["machine_chips"], four["tensor_parallel_size"], four["engines"], four["chips"]) == (4, 1, 4, 1)
    # per engine, one chip's: the reference deployment's 8,713 blocks of 128 (tests/cli/test_plan.py's measurements)
    assert four["resident_tokens"] == one["resident_tokens"] == 8_713 * 128
    assert (four["machine_resident_tokens"], four["machine_contexts"]) == (4 * 8_713 * 128, 4 * one["contexts"])


def test_one_engine_over_four_chips_is_the_tensor_parallel_plan():
    """--tensor-parallel-size 4: one engine, the weights split over four chips, one KV head replicated on each:
    (31.24 GiB × 0.9 − 8.97 GiB loaded / 4) per chip // 2,359,296 B a block of 128 = 11,775 blocks, 22 contexts."""
    data = planned("--chips", "4", "--tensor-parallel-size", "4")
    assert (data["engines"], data["chips"], data["blocks"], data["contexts"]) == (1, 4, 11_775, 22)
    assert data["machine_contexts"] == 22  # the replicated head: four chips hold what one does, plus the weights' room


def test_the_table_says_how_the_chips_are_split():
    table = " ".join(CliRunner().invoke(plan, ["--chips", "8"], env={"COLUMNS": "250"}).stdout.split())
    assert "8 × 1 chip on 8 chips (tensorParallelSize 1, auto: the fewest chips that hold the weights)" in table
    assert f"{8 * 8_713 * 128:,} resident KV tokens and {8 * 17} full-length contexts" in table
    assert "Engines" not in CliRunner().invoke(plan, []).stdout


def test_a_tensor_parallel_size_that_does_not_split_the_chips_names_the_option():
    result = CliRunner().invoke(plan, ["--chips", "4", "--tensor-parallel-size", "3"])
    assert result.exit_code == 1
    assert "--tensor-parallel-size: 3 does not split 4 chip(s) into whole engines; use one of 1, 2, 4" in result.output
