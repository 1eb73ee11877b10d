"""Unit tests of `tpuserve cost`: hand-checked numbers, operating points from recorded sweep files (no server)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tpuserve.cli import main
from tpuserve.measure.cost import breakeven_output_tok_s, cold_start_usd, cost, session


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Text is wrapped to the terminal; the tests that read whole lines read them unwrapped."""
    monkeypatch.setenv("COLUMNS", "200")


def test_breakeven_against_the_default_api_price():
    # $1.35/h = $0.000375/s; at $0.40 per million tokens that buys 0.000375 / 0.40 × 1e6 = 937.5 tokens/s.
    assert breakeven_output_tok_s(1.35, 0.40) == pytest.approx(937.5)
    # A 4× cheaper API needs 4× the throughput to match.
    assert breakeven_output_tok_s(1.35, 0.10) == pytest.approx(3750.0)


def test_cold_start_costs_its_billed_minutes():
    assert cold_start_usd(1.35, 10) == pytest.approx(0.225)  # 1.35 × 10 / 60


def test_session_yield_and_cost():
    result = session(price_per_hour=1.35, api_usd_per_m=0.40, hours=4, cold_start_min=10, output_tok_s=1500)
    # 4 h billed = $5.40; 3 h 50 min serving × 1,500 tok/s × 3,600 s/h = 20,700,000 tokens.
    assert result.usd == pytest.approx(5.40)
    assert result.serving_hours == pytest.approx(4 - 1 / 6)
    assert result.output_tokens == pytest.approx(20_700_000)
    # $5.40 / 20.7 M = $0.26087 / M; the API would charge 20.7 × 0.40 = $8.28, a $2.88 saving.
    assert result.usd_per_m_output == pytest.approx(5.40 / 20.7)
    assert result.api_usd == pytest.approx(8.28)
    assert result.saving_usd == pytest.approx(2.88)


def test_session_shorter_than_the_cold_start_yields_nothing():
    result = session(1.35, 0.40, hours=0.1, cold_start_min=10, output_tok_s=1000)
    assert result.output_tokens == 0 and result.usd_per_m_output == float("inf")


def write_result(directory: Path, concurrency: int, output_tok_s: float) -> None:
    directory.mkdir(exist_ok=True)
    (directory / f"c{concurrency}.json").write_text(json.dumps({
        "max_concurrency": concurrency, "completed": 100, "failed": 0, "request_throughput": 1.0,
        "output_throughput": output_tok_s,
        "total_token_throughput": output_tok_s * 2, "median_ttft_ms": 100.0, "p99_ttft_ms": 200.0,
        "median_tpot_ms": 10.0}))


def test_cli_takes_the_best_level_of_a_sweep(tmp_path: Path):
    write_result(tmp_path, 8, 400.0)
    write_result(tmp_path, 64, 2000.0)
    result = CliRunner().invoke(cost, ["--report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # Best level is 64 at 2,000 tok/s: 2,000 × 3,600 × (4 − 1/6) h = 27.6 M tokens for $5.40 → $0.196 / M;
    # the API would charge 27.6 × 0.40 = $11.04, a $5.64 saving.
    assert "concurrency 64" in result.output
    assert "27.60 M output tokens = $0.196 / M" in result.output
    assert "saving $5.64" in result.output


def test_cli_named_level_must_have_been_measured(tmp_path: Path):
    write_result(tmp_path, 8, 400.0)
    result = CliRunner().invoke(cost, ["--report", str(tmp_path), "--concurrency", "16"])
    assert result.exit_code == 2
    assert "--concurrency" in result.output and "measured: 8" in result.output
    assert "Breakeven" not in result.output  # nothing printed before the error


def test_cli_says_when_the_session_loses_to_the_api(tmp_path: Path):
    write_result(tmp_path, 8, 400.0)
    result = CliRunner().invoke(cost, ["--report", str(tmp_path)])
    # 400 × 3,600 × 3.8333 h = 5.52 M tokens; the API charges 5.52 × 0.40 = $2.208 against $5.40: $3.19 more.
    assert "below breakeven" in result.output
    assert "$3.19 more than the API" in result.output


def test_cli_without_operating_point_prints_breakeven_and_cold_start_only():
    result = CliRunner().invoke(cost, ["--api-price-per-m", "0.10", "--cold-start-min", "20"])
    assert result.exit_code == 0, result.output
    assert "3,750.0 output tok/s" in result.output
    assert "$0.450" in result.output  # 1.35 × 20 / 60
    assert "Session" not in result.output


def test_cli_bills_every_chip_of_the_machine():
    result = CliRunner().invoke(cost, ["--chips", "4", "--cold-start-min", "10"])
    assert result.exit_code == 0, result.output
    assert "at $5.4/h" in result.output  # 4 × 1.35
    assert "$0.900" in result.output  # 5.40 × 10 / 60
    machine = CliRunner().invoke(cost, ["--chips", "4", "--price-per-hour", "2"])
    assert "at $2/h" in machine.output  # a whole-machine price wins


def test_engines_scale_one_engines_operating_point_to_the_machine():
    """ct6e-standard-4t with four engines of E2B: four chips bill, four engines each serve the one-chip point."""
    result = CliRunner().invoke(cost, ["--chips", "4", "--engines", "4", "--output-tok-s", "2140", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["price_per_hour"] == pytest.approx(5.4)
    assert document["engines"] == {"count": 4, "engine_output_tok_s": 2140.0}
    assert document["session"]["output_tok_s"] == 8560.0
    assert document["session"]["operating_point"] == "4 engines × --output-tok-s 2140"
    text = CliRunner().invoke(cost, ["--chips", "4", "--engines", "4", "--output-tok-s", "2140"]).output
    assert "4 engines × 2,140.0 output tok/s = 8,560.0 for the machine" in " ".join(text.split())
    # a machine-wide point (a sweep through the front) is priced as it is
    whole = json.loads(CliRunner().invoke(cost, ["--chips", "4", "--output-tok-s", "8560", "--json"]).output)
    assert whole["session"]["usd_per_m_output"] == document["session"]["usd_per_m_output"]


def test_more_engines_than_chips_is_refused_naming_the_option():
    result = CliRunner().invoke(cost, ["--chips", "1", "--engines", "4", "--output-tok-s", "100"])
    assert result.exit_code == 2 and "--engines" in result.output and "4 engines need at least 4 chips" in result.output


PRICE_CHANGED = """
import json
import tpuserve.facts
tpuserve.facts.PRICE_PER_CHIP_HOUR = 2.5
from tpuserve.measure.bench import report
from tpuserve.measure.cost import cost
print(json.dumps([next(p.default for p in command.params if p.name == name)
                  for command, name in ((cost, "price_per_chip_hour"), (report, "price_per_hour"))]))
"""


def test_cost_and_bench_report_price_a_chip_hour_from_tpuserve_facts():
    """Changed in tpuserve.facts, both price defaults change with it."""
    completed = subprocess.run([sys.executable, "-c", PRICE_CHANGED], capture_output=True, text=True, check=True)
    assert json.loads(completed.stdout) == [2.5, 2.5]


def test_a_report_where_every_level_failed_is_an_error_not_a_missing_line(tmp_path: Path):
    """Issue #11, item 1: `cost --report` silently dropped its session line for an all-failed sweep."""
    (tmp_path / "c8.json").write_text(json.dumps({
        "max_concurrency": 8, "completed": 0, "failed": 100, "request_throughput": 0.0, "output_throughput": 0.0,
        "total_token_throughput": 0.0, "median_ttft_ms": 0.0, "p99_ttft_ms": 0.0, "median_tpot_ms": 0.0}))
    result = CliRunner().invoke(main, ["cost", "--report", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output == ("Error: no level of the report completed a request: nothing to price (see `tpuserve "
                             "bench report`)\n")
    named = CliRunner().invoke(main, ["cost", "--report", str(tmp_path), "--concurrency", "8"])
    assert named.exit_code == 2 and "all 100 requests failed" in named.output


def test_json_has_the_same_numbers_as_the_text(tmp_path: Path):
    write_result(tmp_path, 8, 400.0)
    result = CliRunner().invoke(main, ["cost", "--report", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["breakeven_output_tok_s"] == pytest.approx(937.5)  # 1.35 / 3600 / 0.40 × 1e6
    assert document["cold_start_usd"] == pytest.approx(0.225)
    assert document["session"]["usd"] == pytest.approx(5.40) and document["session"]["above_breakeven"] is False
    assert document["session"]["operating_point"] == f"concurrency 8 of {tmp_path}"
    bare = json.loads(CliRunner().invoke(main, ["cost", "--json"]).output)
    assert bare["session"] is None
    # 100 GB × $0.08 at the free 140 MiB/s and 3,000 IOPS (facts.py's Hyperdisk prices)
    assert bare["cache_disk"] == {"size_gb": 100, "throughput_mibps": 140, "iops": 3000,
                                  "usd_per_month": pytest.approx(8.0)}
    assert json.loads(CliRunner().invoke(main, ["cost", "--json", "--cache-disk-gb", "0"]).output)["cache_disk"] is None


def test_the_cache_disk_bills_by_the_month_and_is_printed():
    result = CliRunner().invoke(cost, [])
    assert result.exit_code == 0
    assert ("Cache disk (100 GB Hyperdisk Balanced, 140 MiB/s, 3,000 IOPS): $8.00 / month while it exists, VM or not"
            in result.output)  # 100 GB x $0.08 at the free throughput and IOPS
    faster = CliRunner().invoke(cost, ["--cache-disk-throughput", "400"])
    assert "(100 GB Hyperdisk Balanced, 400 MiB/s, 3,000 IOPS): $28.80 / month" in faster.output  # + 260 × $0.08
    bigger = CliRunner().invoke(cost, ["--cache-disk-gb", "250", "--disk-price-per-gb-month", "0.1",
                                       "--cache-disk-throughput", "140", "--cache-disk-iops", "4000"])
    assert "Cache disk (250 GB Hyperdisk Balanced, 140 MiB/s, 4,000 IOPS): $45.00 / month" in bigger.output
    assert "Cache disk" not in CliRunner().invoke(cost, ["--cache-disk-gb", "0"]).output


# --- issue #12: boundaries from the valid side, exact numbers, whole messages --------------------------------------

def exactly(value: float) -> object:
    """A float compared to 1e-12 (pytest.approx's default 1e-6 would let 1e6 become 1000001)."""
    return pytest.approx(value, rel=1e-12)


def test_the_arithmetic_to_the_last_digit():
    assert breakeven_output_tok_s(3.6, 1.0) == exactly(1000.0)
    result = session(price_per_hour=0.9, api_usd_per_m=1.0, hours=1, cold_start_min=0, output_tok_s=250)
    assert (result.serving_hours, result.output_tokens, result.usd) == (1.0, 900_000.0, 0.9)
    assert result.usd_per_m_output == exactly(1.0) and result.api_usd == exactly(0.9)
    assert session(1.35, 0.40, hours=4, cold_start_min=10, output_tok_s=400).usd_per_m_output == exactly(5.4 / 5.52)


def test_a_session_exactly_as_long_as_the_cold_start_serves_nothing():
    result = session(1.2, 0.40, hours=0.5, cold_start_min=30, output_tok_s=1000)
    assert (result.serving_hours, result.output_tokens, result.usd) == (0.0, 0.0, 0.6)
    assert result.usd_per_m_output == float("inf") and result.api_usd == 0.0


def test_breakeven_itself_is_below_and_an_even_session_is_a_saving_of_nothing(tmp_path: Path):
    """Exactly at breakeven the machine does not beat the API; a session that costs what the API would is even."""
    result = CliRunner().invoke(cost, ["--price-per-hour", "3.6", "--api-price-per-m", "1", "--output-tok-s", "1000",
                                       "--session-h", "1", "--cold-start-min", "0"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "Breakeven vs $1/M: 1,000.0 output tok/s sustained at $3.6/h",
        "One cold start (0 min): $0.000",
        "Cache disk (100 GB Hyperdisk Balanced, 140 MiB/s, 3,000 IOPS): $8.00 / month while it exists, VM or not "
        "(`tpuserve cache ls` lists them, `cache rm` removes them)",
        "Its throughput sets how fast a warm boot reads the weights: `tpuserve plan` shows what it buys",
        "Session of 1 h at 1,000.0 output tok/s (--output-tok-s 1000, below breakeven):",
        "  cost $3.60; 1.00 h serving after the cold start yields 3.60 M output tokens = $1.000 / M",
        "  the API would charge $3.60 for them: saving $0.00"]
    above = CliRunner().invoke(cost, ["--price-per-hour", "0.9", "--api-price-per-m", "1", "--output-tok-s", "500",
                                      "--session-h", "1", "--cold-start-min", "0"])
    assert "(--output-tok-s 500, above breakeven):" in above.output
    assert above.output.splitlines()[-1] == "  the API would charge $1.80 for them: saving $0.90"


def test_the_json_document_in_full(tmp_path: Path):
    result = CliRunner().invoke(cost, ["--output-tok-s", "400", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    session_part = document.pop("session")
    assert document == {"price_per_hour": 1.35, "api_price_per_m": 0.4, "breakeven_output_tok_s": exactly(937.5),
                        "cold_start_min": 10.0, "cold_start_usd": exactly(0.225),
                        "cache_disk": {"size_gb": 100, "throughput_mibps": 140, "iops": 3000,
                                       "usd_per_month": exactly(8.0)}, "notes": []}
    assert session_part == {"hours": 4.0, "serving_hours": exactly(23 / 6), "output_tok_s": 400.0,
                            "output_tokens": exactly(5_520_000), "usd": exactly(5.4),
                            "usd_per_m_output": exactly(5.4 / 5.52), "api_usd": exactly(2.208),
                            "saving_usd": exactly(-3.192), "operating_point": "--output-tok-s 400",
                            "above_breakeven": False}
    assert json.loads(CliRunner().invoke(cost, ["--output-tok-s", "1000", "--json"]).output)["session"][
        "above_breakeven"] is True


def write_level(directory: Path, concurrency: int, completed: int, output_tok_s: float, failed: int = 0) -> None:
    (directory / f"c{concurrency}.json").write_text(json.dumps({
        "max_concurrency": concurrency, "completed": completed, "failed": failed, "request_throughput": 1.0,
        "output_throughput": output_tok_s, "total_token_throughput": 2 * output_tok_s, "median_ttft_ms": 100.0,
        "p99_ttft_ms": 200.0, "median_tpot_ms": 0.0}))


def test_a_level_with_any_output_is_an_operating_point_and_one_without_is_not(tmp_path: Path):
    write_level(tmp_path, 8, completed=10, output_tok_s=0.5)  # slow, but it served
    write_level(tmp_path, 16, completed=10, output_tok_s=0.0)  # completed requests of no output tokens
    best = CliRunner().invoke(cost, ["--report", str(tmp_path), "--json"])
    assert json.loads(best.output)["session"]["operating_point"] == f"concurrency 8 of {tmp_path}"
    zero = CliRunner().invoke(cost, ["--report", str(tmp_path), "--concurrency", "16"])
    assert zero.exit_code == 2
    assert zero.output.splitlines()[-1] == ("Error: Invalid value for --concurrency: 16: median TPOT is 0: no "
                                            "per-stream rate (outputs of one token, or a buffered stream)")
    (tmp_path / "c8.json").unlink()
    alone = CliRunner().invoke(cost, ["--report", str(tmp_path)])
    assert alone.exit_code == 1 and alone.output.startswith("Error: no level of the report completed a request")


def test_a_named_level_lists_every_reason_it_cannot_be_priced(tmp_path: Path):
    write_level(tmp_path, 8, completed=0, output_tok_s=0.0, failed=3)
    write_level(tmp_path, 64, completed=5, output_tok_s=900.0)
    failed = CliRunner().invoke(cost, ["--report", str(tmp_path), "--concurrency", "8"])
    assert failed.output.splitlines()[-1] == ("Error: Invalid value for --concurrency: 8: all 3 requests failed: "
                                              "nothing was measured (see the level's .log)")
    unmeasured = CliRunner().invoke(cost, ["--report", str(tmp_path), "--concurrency", "16"])
    assert unmeasured.output.splitlines()[-1] == ("Error: Invalid value for --concurrency: 16 was not measured "
                                                  "(measured: 8, 64)")


def test_a_row_without_notes_or_output_says_no_output_measured():
    from tpuserve.measure.benchreport import BenchRow
    from tpuserve.measure.cost import operating_point

    row = BenchRow(4, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, "c4.json", completed=3)
    with pytest.raises(click.BadParameter) as refused:
        operating_point([row], 4)
    assert refused.value.format_message() == "Invalid value for --concurrency: 4: no output measured"
    two_notes = BenchRow(4, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, "c4.json", completed=3, notes=("a", "b"))
    with pytest.raises(click.BadParameter, match="4: a; b$"):
        operating_point([two_notes], 4)


def test_a_huge_session_counts_its_millions_to_the_cent():
    result = CliRunner().invoke(cost, ["--output-tok-s", "1000000", "--session-h", "3", "--cold-start-min", "0"])
    assert "yields 10,800.00 M output tokens = $0.000 / M" in result.output  # 1e6 tok/s × 10,800 s


def test_the_json_verdict_at_breakeven_itself_is_not_above():
    at = CliRunner().invoke(cost, ["--price-per-hour", "3.6", "--api-price-per-m", "1", "--output-tok-s", "1000",
                                   "--json"])
    assert json.loads(at.output)["session"]["above_breakeven"] is False


def test_report_and_a_direct_rate_together_are_refused_before_anything_is_priced(tmp_path: Path):
    write_result(tmp_path, 8, 400.0)
    both = CliRunner().invoke(cost, ["--report", str(tmp_path), "--output-tok-s", "100"])
    assert both.exit_code == 2 and "Breakeven" not in both.output
    assert both.output.splitlines()[-1] == "Error: Invalid value for --output-tok-s: give --report or --output-tok-s, " \
                                           "not both"
    alone = CliRunner().invoke(cost, ["--concurrency", "8"])
    assert (alone.exit_code, alone.output.splitlines()[-1]) == (2, "Error: Invalid value for --concurrency: needs "
                                                                   "--report")


# --- issue #27, item 6: a level where most requests failed is flagged, by bench report's rule ------------------

def test_an_operating_point_where_most_requests_failed_is_flagged_as_bench_report_flags_it(tmp_path: Path):
    from tpuserve.measure.benchreport import report_notes, report_rows

    write_result(tmp_path, 1, 100.0)
    (tmp_path / "c8.json").write_text(json.dumps({
        "max_concurrency": 8, "completed": 11, "failed": 189, "request_throughput": 0.2, "output_throughput": 900.0,
        "total_token_throughput": 1800.0, "median_ttft_ms": 100.0, "p99_ttft_ms": 200.0, "median_tpot_ms": 10.0}))
    flagged = report_notes([row for row in report_rows(tmp_path, 1.35) if row.concurrency == 8])
    assert flagged == ["concurrency 8: 189 of 200 requests failed: the numbers cover the 11 that completed"]

    text = CliRunner().invoke(cost, ["--report", str(tmp_path)], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    assert f"⚠ {flagged[0]}" in text.output.splitlines()
    document = json.loads(CliRunner().invoke(cost, ["--report", str(tmp_path), "--json"]).output)
    assert document["session"]["operating_point"] == f"concurrency 8 of {tmp_path}"
    assert document["notes"] == flagged
    clean = json.loads(CliRunner().invoke(cost, ["--report", str(tmp_path), "--concurrency", "1", "--json"]).output)
    assert clean["notes"] == []


def test_at_80_columns_every_line_fits_and_says_the_same(tmp_path: Path):
    """Issue #27, item 7: the cache-disk line was 138 characters."""
    write_result(tmp_path, 64, 2000.0)
    wide = CliRunner().invoke(cost, ["--report", str(tmp_path)], env={"COLUMNS": "200"}).output
    narrow = CliRunner().invoke(cost, ["--report", str(tmp_path)], env={"COLUMNS": "80"}).output
    assert max(len(line) for line in narrow.splitlines()) <= 80, narrow
    assert " ".join(narrow.split()) == " ".join(wide.split())  # the same words, only the line breaks differ
    assert len(narrow.splitlines()) > len(wide.splitlines())
