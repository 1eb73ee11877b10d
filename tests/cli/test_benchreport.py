"""Unit tests of `bench report` on recorded result files shaped like `vllm bench serve --save-result` (no server)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpuserve.cli import main
from tpuserve.measure import benchreport
from tpuserve.measure.bench import bench
from tpuserve.measure.benchreport import ReportError, compare_rows, report_rows


def vllm_result(concurrency: int, output_tok_s: float, median_tpot_ms: float, **overrides: object) -> dict:
    """The fields `vllm bench serve` 0.32 saves (a subset; the report must ignore the others)."""
    return {
        "date": "20261129-104500", "backend": "openai", "model_id": "tiny", "num_prompts": 12,
        "request_rate": "inf", "burstiness": 1.0, "max_concurrency": concurrency, "duration": 3.2, "completed": 12,
        "failed": 0, "total_input_tokens": 768, "total_output_tokens": 192,
        "request_throughput": output_tok_s / 128, "output_throughput": output_tok_s,
        "total_token_throughput": output_tok_s * 9, "median_ttft_ms": 150.0, "p99_ttft_ms": 400.0,
        "mean_ttft_ms": 170.0, "median_tpot_ms": median_tpot_ms, "p99_tpot_ms": median_tpot_ms * 2, **overrides,
    }


def write_sweep(directory: Path, *results: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for result in results:
        (directory / f"c{result['max_concurrency']}.json").write_text(json.dumps(result))
    (directory / "sweep.json").write_text(json.dumps({"tool": "tpuserve bench sweep", "runs": []}))
    return directory


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    return write_sweep(tmp_path / "a", vllm_result(8, 320.0, 20.0), vllm_result(1, 64.0, 12.5))


def test_rows_follow_the_reference_columns(sweep_dir: Path):
    one, eight = report_rows(sweep_dir, price_per_hour=1.35)
    assert (one.concurrency, eight.concurrency) == (1, 8)  # sorted, sweep.json skipped
    # Per-stream = 1000 / median TPOT: 1000 / 12.5 = 80, 1000 / 20 = 50 tok/s.
    assert (one.per_stream_tok_s, eight.per_stream_tok_s) == (80.0, 50.0)
    # $ / M = 1.35 / (tok/s × 3600) × 1e6: 1.35 / 230,400 × 1e6 = 5.859375; 1.35 / 1,152,000 × 1e6 = 1.171875.
    assert one.usd_per_m_output == pytest.approx(5.859375)
    assert eight.usd_per_m_output == pytest.approx(1.171875)
    # The rest are vLLM's own fields, unchanged.
    assert (eight.requests_per_s, eight.output_tok_s, eight.total_tok_s) == (2.5, 320.0, 2880.0)
    assert (eight.ttft_median_ms, eight.ttft_p99_ms, eight.tpot_median_ms) == (150.0, 400.0, 20.0)


def test_duplicate_level_is_an_error_naming_both_files(sweep_dir: Path):
    (sweep_dir / "again.json").write_text(json.dumps(vllm_result(8, 300.0, 21.0)))
    with pytest.raises(ReportError, match="again.json and c8.json both measure concurrency 8"):
        report_rows(sweep_dir, 1.35)


def test_result_without_max_concurrency_names_the_file(tmp_path: Path):
    (tmp_path / "unbounded.json").write_text(json.dumps(vllm_result(4, 100.0, 10.0, max_concurrency=None)))
    with pytest.raises(ReportError, match=r"unbounded.json: missing max_concurrency"):
        report_rows(tmp_path, 1.35)


def test_directory_without_results(tmp_path: Path):
    (tmp_path / "sweep.json").write_text("{}")
    with pytest.raises(ReportError, match="no `vllm bench serve` result JSON"):
        report_rows(tmp_path, 1.35)


def test_comparison_ratios_are_candidate_over_baseline(sweep_dir: Path, tmp_path: Path):
    candidate = write_sweep(tmp_path / "b", vllm_result(8, 480.0, 25.0), vllm_result(64, 900.0, 40.0))
    comparisons = compare_rows(report_rows(sweep_dir, 1.35), report_rows(candidate, 1.35))
    # Issue #11: a level measured on one side only keeps its rows, with no ratio.
    assert {item.concurrency for item in comparisons} == {1, 8, 64}
    one_sided = [item for item in comparisons if item.concurrency != 8]
    assert all(item.ratio is None for item in one_sided)
    assert {(item.concurrency, item.baseline is None, item.candidate is None) for item in one_sided} == {
        (1, False, True), (64, True, False)}
    by_metric = {item.metric: item for item in comparisons if item.concurrency == 8}
    assert by_metric["output_tok_s"].ratio == pytest.approx(480 / 320)  # 1.5
    assert by_metric["tpot_median_ms"].ratio == pytest.approx(25 / 20)  # 1.25
    # 1.35 / (480 × 3600) × 1e6 = 0.78125 vs 1.171875: ratio 2/3, the inverse of the throughput gain.
    assert by_metric["usd_per_m_output"].candidate == pytest.approx(0.78125)
    assert by_metric["usd_per_m_output"].ratio == pytest.approx(2 / 3)
    assert benchreport.comparison_cells(by_metric["output_tok_s"]) == ["8", "Output tok/s", "320.0", "480.0", "1.500"]


def test_comparison_without_common_levels(sweep_dir: Path, tmp_path: Path):
    other = write_sweep(tmp_path / "b", vllm_result(2, 100.0, 10.0))
    with pytest.raises(ReportError, match="share no concurrency level"):
        compare_rows(report_rows(sweep_dir, 1.35), report_rows(other, 1.35))


def test_markdown_table(sweep_dir: Path):
    rows = report_rows(sweep_dir, 1.35)
    headers = [header for header, _, _ in benchreport.COLUMNS.values()]
    text = benchreport.markdown_table(headers, [benchreport.row_cells(row) for row in rows])
    lines = text.splitlines()
    assert lines[0] == ("| Concurrency | Req/s | Output tok/s | Total tok/s | TTFT med (ms) | TTFT p99 (ms) | "
                        "TPOT med (ms) | Per-stream tok/s | $ / M output tokens |")
    assert lines[3] == "| 8 | 2.50 | 320.0 | 2880.0 | 150.0 | 400.0 | 20.00 | 50.0 | 1.172 |"


def test_cli_json_and_table(sweep_dir: Path):
    runner = CliRunner()
    as_json = runner.invoke(bench, ["report", str(sweep_dir), "--format", "json", "--price-per-hour", "2.7"])
    assert as_json.exit_code == 0, as_json.output
    rows = json.loads(as_json.stdout)["rows"]
    # Doubling the price doubles $ / M: 2 × 5.859375.
    assert [row["usd_per_m_output"] for row in rows] == pytest.approx([11.71875, 2.34375])
    table = runner.invoke(bench, ["report", str(sweep_dir)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "Per-stream tok/s" in table.stdout and "5.859" in table.stdout


def strict_json(text: str) -> object:
    """json.loads that refuses Infinity/NaN, as every non-Python JSON parser does."""
    def refuse(constant: str) -> object:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_stays_strict_json_when_tpot_and_throughput_are_zero(sweep_dir: Path, tmp_path: Path):
    stalled = write_sweep(tmp_path / "stalled", vllm_result(1, 0.0, 0.0))
    single = CliRunner().invoke(bench, ["report", str(stalled), "--format", "json"])
    assert single.exit_code == 0, single.output
    (row,) = strict_json(single.stdout)["rows"]
    assert row["per_stream_tok_s"] is None and row["usd_per_m_output"] is None and row["concurrency"] == 1
    compared = CliRunner().invoke(bench, ["report", str(sweep_dir), str(stalled), "--format", "json"])
    assert compared.exit_code == 0, compared.output
    per_stream = next(item for item in strict_json(compared.stdout)["rows"] if item["metric"] == "per_stream_tok_s")
    assert per_stream["baseline"] == pytest.approx(80.0) and per_stream["candidate"] is None
    assert per_stream["ratio"] is None


def test_cli_reports_bad_directory_as_a_usage_error(tmp_path: Path):
    result = CliRunner().invoke(main, ["bench", "report", str(tmp_path)])
    assert result.exit_code == 1
    assert "no `vllm bench serve` result JSON" in result.output


def drawn_figures(monkeypatch: pytest.MonkeyPatch, render: bool) -> list:
    """Every figure saved from now on (rendered to its file too when `render`: drawing is the slow part)."""
    from matplotlib.figure import Figure

    saved: list = []
    original = Figure.savefig

    def savefig(self: Figure, *args: object, **kwargs: object) -> None:
        saved.append(self)
        if render:
            original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def test_plot_is_a_png_of_sensible_size(sweep_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    candidate = write_sweep(tmp_path / "b", vllm_result(8, 480.0, 25.0), vllm_result(1, 70.0, 12.0))
    png = tmp_path / "plot.png"
    figures = drawn_figures(monkeypatch, render=True)
    result = CliRunner().invoke(bench, ["report", str(sweep_dir), str(candidate), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    # The runs' model, lengths, date and price head the figure; each panel keeps its own metric's label (a loop
    # variable once shadowed the title, and every plot was headed "TTFT p99 (ms)").
    (figure,) = figures
    assert figure.get_suptitle() == "tiny · 64 in / 16 out · 2026-11-29 · $1.35/h"
    assert [axis.get_ylabel() for axis in figure.axes] == ["Output tok/s", "Per-stream tok/s", "TTFT p99 (ms)"]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (800, 900)  # 8 × 9 inches at 100 dpi
    assert 10_000 < len(data) < 1_000_000


# --- issue #11, items 1-2: results that lie -------------------------------------------------------------------

# What vLLM 0.32 saves when every request failed: zeros everywhere (vllm/benchmarks/serve.py, calculate_metrics).
ALL_FAILED = {"completed": 0, "failed": 12, "request_throughput": 0.0, "total_token_throughput": 0.0,
              "median_ttft_ms": 0.0, "p99_ttft_ms": 0.0, "total_input_tokens": 0, "total_output_tokens": 0}


def test_a_level_where_every_request_failed_shows_its_failure_not_zeros_and_infinities(tmp_path: Path):
    run = write_sweep(tmp_path / "a", vllm_result(1, 64.0, 12.5), vllm_result(8, 0.0, 0.0, **ALL_FAILED))
    result = CliRunner().invoke(main, ["bench", "report", str(run), "--format", "markdown"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[3] == "| 8 | all 12 failed | — | — | — | — | — | — | — |"
    assert "∞" not in result.output and "0.00" not in lines[3]
    assert "> ⚠ concurrency 8: all 12 requests failed: nothing was measured (see the level's .log)" in lines
    (one, eight) = json.loads(CliRunner().invoke(main, ["bench", "report", str(run), "--json"]).output)["rows"]
    assert (eight["completed"], eight["failed"], eight["output_tok_s"], eight["per_stream_tok_s"]) == (0, 12, None,
                                                                                                       None)
    assert one["notes"] == [] and one["completed"] == 12


def test_partly_failed_levels_and_implausible_rates_are_flagged(tmp_path: Path):
    # 0.004 ms median TPOT = 250,000 tok/s per stream: what the issue saw, tokens that arrived in a burst.
    run = write_sweep(tmp_path / "a", vllm_result(1, 64.0, 0.004), vllm_result(8, 300.0, 20.0, completed=9,
                                                                              failed=3))
    result = CliRunner().invoke(main, ["bench", "report", str(run), "--format", "markdown"])
    assert result.exit_code == 0, result.output
    assert "| 250000.0 ⚠ |" in result.output
    notes = [line for line in result.output.splitlines() if line.startswith("> ⚠")]
    assert notes == [
        "> ⚠ concurrency 1: per-stream 250,000 tok/s (median TPOT 0.0040 ms) is implausible: no decoder streams "
        "over 10,000 tok/s, so tokens arrived in bursts (buffered streaming, or too short outputs)",
        "> ⚠ concurrency 8: 3 of 12 requests failed: the numbers cover the 9 that completed"]


def test_a_comparison_names_the_baseline_and_keeps_one_sided_levels(sweep_dir: Path, tmp_path: Path):
    candidate = write_sweep(tmp_path / "b", vllm_result(8, 480.0, 25.0), vllm_result(64, 900.0, 40.0))
    result = CliRunner().invoke(main, ["bench", "report", str(sweep_dir), str(candidate), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert (document["baseline"], document["candidate"]) == (str(sweep_dir), str(candidate))
    assert document["title"].startswith(f"candidate {candidate} vs baseline {sweep_dir} (ratio = candidate / "
                                        "baseline)")
    assert {row["concurrency"] for row in document["rows"]} == {1, 8, 64}
    assert document["notes"] == ["concurrency 1: measured only by the baseline",
                                 "concurrency 64: measured only by the candidate"]


def test_runs_of_different_lengths_are_not_compared_unless_asked(sweep_dir: Path, tmp_path: Path):
    longer = write_sweep(tmp_path / "b", vllm_result(8, 480.0, 25.0, total_input_tokens=12 * 1024,
                                                     total_output_tokens=12 * 128))
    refused = CliRunner().invoke(main, ["bench", "report", str(sweep_dir), str(longer)])
    assert refused.exit_code == 1
    assert refused.output.strip() == (f"Error: {longer} measured 1024 in / 128 out, its baseline {sweep_dir} 64 in / "
                                      "16 out: levels of different lengths are not comparable (--allow-mismatch "
                                      "compares them anyway)")
    allowed = CliRunner().invoke(main, ["bench", "report", str(sweep_dir), str(longer), "--allow-mismatch"])
    assert allowed.exit_code == 0, allowed.output


def test_runs_of_different_models_are_compared_with_a_note(sweep_dir: Path, tmp_path: Path):
    other = write_sweep(tmp_path / "b", vllm_result(8, 480.0, 25.0, model_id="google/gemma-4-E4B-it"))
    result = CliRunner().invoke(main, ["bench", "report", str(sweep_dir), str(other), "--json"])
    assert json.loads(result.output)["notes"][0] == ("the runs measured different models: baseline tiny, candidate "
                                                     "google/gemma-4-E4B-it")


def at_80_columns(*args: str) -> list[str]:
    result = CliRunner().invoke(main, ["bench", "report", *args], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert "…" not in result.output
    return lines


def row_of(lines: list[str], first: str) -> list[str]:
    """The cells of the table line whose first cell is `first` (columns are separated by spaces)."""
    return next(line.split() for line in lines if line.split()[:1] == [first])


def test_at_80_columns_the_table_fits_without_folding_a_number_or_splitting_a_header(tmp_path: Path):
    """Issue #27, item 7: at 80 columns a number was folded over two lines ("776.97" / "5"), headers split
    mid-word. Numbers of a v6e sweep: every cell is whole on its row, every header word whole in the heading."""
    run = write_sweep(tmp_path / "a", vllm_result(1, 213.4, 4.69), vllm_result(100, 7769.75, 12.87,
                                                                               median_ttft_ms=12345.6,
                                                                               p99_ttft_ms=23456.7))
    lines = at_80_columns(str(run))
    rule = next(i for i, line in enumerate(lines) if line.startswith("───"))
    heading = " ".join(lines[1:rule])
    for word in ("Conc", "Req/s", "Out", "Total", "tok/s", "TTFT", "med", "p99", "TPOT", "Stream", "$/M", "out"):
        assert word in heading.split(), heading
    assert row_of(lines, "1") == ["1", "1.67", "213.4", "1920.6", "150.0", "400.0", "4.69", "213.2", "1.757"]
    assert row_of(lines, "100") == ["100", "60.70", "7769.8", "69927.8", "12345.6", "23456.7", "12.87", "77.7",
                                    "0.048"]


def test_numbers_too_wide_for_the_terminal_are_stacked_one_level_a_block_never_cut(tmp_path: Path):
    run = write_sweep(tmp_path / "a", vllm_result(1, 2356789.5, 0.004), vllm_result(8, 123456.7, 20.0))
    lines = at_80_columns(str(run))
    text = "\n".join(lines)
    assert "Concurrency 1" in lines and "Concurrency 8" in lines
    for pair in ("Req/s 18412.42", "Output tok/s 2356789.5", "Total tok/s 21211105.5", "Per-stream tok/s 250000.0 ⚠",
                 "Total tok/s 1111110.3", "$ / M output tokens 0.003"):
        assert pair in text, text


def test_a_comparison_fits_80_columns(sweep_dir: Path, tmp_path: Path):
    other = write_sweep(tmp_path / "b", vllm_result(8, 480.0, 25.0), vllm_result(1, 70.0, 12.0))
    lines = at_80_columns(str(sweep_dir), str(other))
    assert ["8", "$", "/", "M", "output", "tokens", "1.172", "0.781", "0.667"] in [line.split() for line in lines]


def test_plot_title_names_model_lengths_date_and_price(sweep_dir: Path, tmp_path: Path):
    info = benchreport.run_info(sweep_dir)
    assert benchreport.plot_title([info], 1.35) == "tiny · 64 in / 16 out · 2026-11-29 · $1.35/h"
    other = write_sweep(tmp_path / "b", vllm_result(8, 480.0, 25.0, model_id="big"))
    assert benchreport.plot_title([info, benchreport.run_info(other)], 2.0) == (
        "tiny vs big · 64 in / 16 out · 2026-11-29 · $2/h")


def test_a_replay_without_sweep_json_compares_by_what_the_server_counted(tmp_path: Path):
    """Measured on the real CPU server: 64 requested input tokens are counted as 65 (the tokenizer's BOS). A
    sweep (sweep.json: 64 in) and a direct replay of its commands (no sweep.json) are the same work."""
    sweep = write_sweep(tmp_path / "sweep", vllm_result(8, 320.0, 20.0, total_input_tokens=12 * 65))
    (sweep / "sweep.json").write_text(json.dumps({"model": "tiny", "parameters": {"input_len": 64, "output_len": 16}}))
    direct = write_sweep(tmp_path / "direct", vllm_result(8, 330.0, 19.0, total_input_tokens=12 * 65))
    (direct / "sweep.json").unlink()
    assert benchreport.check_comparable(benchreport.run_info(direct), benchreport.run_info(sweep)) == []
    longer = write_sweep(tmp_path / "longer", vllm_result(8, 330.0, 19.0, total_input_tokens=12 * 80))
    (longer / "sweep.json").unlink()
    with pytest.raises(ReportError, match="measured 80 in / 16 out, its baseline"):
        benchreport.check_comparable(benchreport.run_info(sweep), benchreport.run_info(longer))


# --- issue #12: what a report reads from a sweep's own files, and its cells, pinned at their edges ----------------

from tpuserve.measure.benchreport import (RunInfo, comparison_cells, day, format_cell,  # noqa: E402
                                          markdown_table, plot_title, report_notes, row_notes, run_info, same_lengths,
                                          usd_per_million_output)


def manifest(directory: Path, document: object) -> None:
    (directory / "sweep.json").write_text(json.dumps(document))


def test_run_info_prefers_the_manifest(tmp_path: Path):
    directory = write_sweep(tmp_path / "r", vllm_result(8, 320.0, 20.0))
    manifest(directory, {"model": "google/gemma-4-E2B-it", "started_at": "2026-11-30T08:00:00+00:00",
                         "parameters": {"input_len": 64, "output_len": 16}})
    assert run_info(directory) == RunInfo(str(directory), "google/gemma-4-E2B-it", (64, 16), (64, 16), "2026-11-30")


@pytest.mark.parametrize("document", ["not json {", "[1, 2]", '{"parameters": [64, 16]}'])
def test_a_manifest_that_says_nothing_usable_falls_back_to_the_results(tmp_path: Path, document: str):
    directory = write_sweep(tmp_path / "r", vllm_result(8, 320.0, 20.0))
    (directory / "sweep.json").write_text(document)
    assert run_info(directory) == RunInfo(str(directory), "tiny", None, (64, 16), "2026-11-29")


def test_measured_lengths_are_means_over_completed_requests_only(tmp_path: Path):
    directory = write_sweep(tmp_path / "r",
                            vllm_result(1, 10.0, 5.0, completed=1, total_input_tokens=70, total_output_tokens=20),
                            vllm_result(2, 10.0, 5.0, completed=0, failed=4, total_input_tokens=100,
                                        total_output_tokens=0))
    assert run_info(directory).measured == (70, 20)  # the failed level's tokens are not a request's


def test_a_sweep_where_nothing_completed_measured_no_lengths(tmp_path: Path):
    directory = write_sweep(tmp_path / "r", vllm_result(1, 0.0, 0.0, completed=0, failed=12))
    info = run_info(directory)
    assert (info.measured, info.lengths) == (None, "? in / ? out")


def test_results_without_token_totals_or_dates(tmp_path: Path):
    result = vllm_result(8, 320.0, 20.0)
    for key in ("total_input_tokens", "total_output_tokens", "date"):
        del result[key]
    directory = write_sweep(tmp_path / "r", result)
    assert run_info(directory) == RunInfo(str(directory), "tiny", None, None, None)


@pytest.mark.parametrize("stamp, shown", [("20261129-104500", "2026-11-29"), ("2026-11-29T10:45:00Z", "2026-11-29"),
                                          (None, None), ("", None)])
def test_day(stamp: str | None, shown: str | None):
    assert day(stamp) == shown


def info(requested=None, measured=None) -> RunInfo:
    return RunInfo("d", "m", requested, measured, None)


@pytest.mark.parametrize("a, b, same", [
    (info(requested=(64, 16)), info(requested=(64, 16)), True),
    (info(requested=(64, 16)), info(requested=(64, 17)), False),
    (info(measured=(64, 16)), info(measured=(64, 18)), True),  # two tokens either way: a BOS, an EOS
    (info(measured=(64, 16)), info(measured=(64, 19)), False),
    (info(measured=(1000, 16)), info(measured=(1050, 16)), True),  # 5 % of the longer one
    (info(measured=(1000, 16)), info(measured=(1053, 16)), False),
    (info(measured=(64, 16)), info(), True),  # one side says nothing: nothing to refuse on
    (info(), info(), True),
])
def test_same_lengths(a: RunInfo, b: RunInfo, same: bool):
    assert same_lengths(a, b) is same


def test_runs_that_share_no_level_say_so(sweep_dir: Path):
    rows = report_rows(sweep_dir, 1.35)
    with pytest.raises(ReportError) as refused:
        compare_rows(rows[:1], rows[1:])
    assert str(refused.value) == "the two runs share no concurrency level"


def test_cells_for_missing_infinite_and_ratio_less_values():
    assert (format_cell("output_tok_s", None), format_cell("output_tok_s", float("nan")),
            format_cell("usd_per_m_output", float("inf")), format_cell("tpot_median_ms", 12.345)) == (
        "—", "—", "∞", "12.35")
    item = benchreport.Comparison(8, "output_tok_s", None, 320.0, None)
    assert comparison_cells(item) == ["8", "Output tok/s", "—", "320.0", "n/a"]
    assert markdown_table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---:|---:|\n| 1 | 2 |"


def test_notes_are_labelled_when_asked(tmp_path: Path):
    rows = report_rows(write_sweep(tmp_path / "r", vllm_result(4, 10.0, 5.0, completed=9, failed=3)), 1.35)
    note = "concurrency 4: 3 of 12 requests failed: the numbers cover the 9 that completed"
    assert report_notes(rows) == [note] and report_notes(rows, "candidate") == [f"candidate: {note}"]


def test_a_zero_tpot_is_noted_and_a_slow_level_still_has_a_price():
    assert row_notes(5, 0, 0.0, math.nan) == (
        "median TPOT is 0: no per-stream rate (outputs of one token, or a buffered stream)",)
    assert usd_per_million_output(3.6, 0.5) == pytest.approx(2000.0, rel=1e-12)  # 3.6 / 1800 × 1e6


def test_json_records_turn_tuples_into_lists_and_infinities_into_null(tmp_path: Path):
    directory = write_sweep(tmp_path / "r", vllm_result(4, 0.0, 0.0))
    [record] = json.loads(CliRunner().invoke(main, ["bench", "report", str(directory), "--json"]).output)["rows"]
    assert record["notes"] == ["median TPOT is 0: no per-stream rate (outputs of one token, or a buffered stream)"]
    assert isinstance(record["notes"], list)
    assert (record["per_stream_tok_s"], record["usd_per_m_output"]) == (None, None)


def test_a_plot_title_without_metadata_shows_question_marks():
    assert plot_title([RunInfo("d", None, None, None, None)], 1.35) == "? · ? in / ? out · ? · $1.35/h"


from tpuserve.measure.benchreport import load_results, request_counts, row_from_result  # noqa: E402


@pytest.mark.parametrize("result, num_prompts, counts", [
    ({"completed": 10, "failed": 2}, None, (10, 2)),
    ({"completed": 10, "num_prompts": 12}, None, (10, 2)),  # older results: no `failed`, count from num_prompts
    ({"completed": 10}, 15, (10, 5)),
    ({"completed": 10}, None, (10, 0)),
    ({"completed": 12, "num_prompts": 10}, None, (12, 0)),  # never negative
    ({}, None, (0, 0)),
])
def test_request_counts(result: dict, num_prompts: int | None, counts: tuple[int, int]):
    assert request_counts(result, num_prompts) == counts


def test_a_rate_of_exactly_the_plausible_maximum_is_believed():
    assert row_notes(5, 0, 0.1, 10_000.0) == ()
    assert row_notes(5, 0, 0.09, 10_001.0)[0].startswith("per-stream 10,001 tok/s (median TPOT 0.0900 ms) is "
                                                         "implausible: no decoder streams over 10,000 tok/s")


def test_files_that_are_not_results_are_skipped_wherever_they_sort(tmp_path: Path):
    directory = write_sweep(tmp_path / "r", vllm_result(1, 64.0, 12.5))
    (directory / "z64.json").write_text(json.dumps(vllm_result(64, 900.0, 30.0)))  # sorts after sweep.json
    (directory / "notes.json").write_text(json.dumps({"comment": "not a result"}))
    (directory / "list.json").write_text(json.dumps(["output_throughput"]))
    assert [path.name for path, _ in load_results(directory)] == ["c1.json", "z64.json"]


def test_unreadable_results_are_named(tmp_path: Path):
    with pytest.raises(ReportError) as missing:
        load_results(tmp_path / "nope")
    assert str(missing.value) == f"{tmp_path / 'nope'}: not a directory"
    (tmp_path / "c1.json").write_text("{")
    with pytest.raises(ReportError) as broken:
        load_results(tmp_path)
    assert str(broken.value) == (f"{tmp_path / 'c1.json'}: not valid JSON (Expecting property name enclosed in "
                                 "double quotes: line 1 column 2 (char 1))")
    result = vllm_result(1, 64.0, 12.5)
    del result["median_tpot_ms"], result["p99_ttft_ms"]
    with pytest.raises(ReportError) as incomplete:
        row_from_result(tmp_path / "c1.json", result, 1.35)
    assert str(incomplete.value) == (f"{tmp_path / 'c1.json'}: missing p99_ttft_ms, median_tpot_ms (max_concurrency "
                                     "needs --max-concurrency; TTFT/TPOT need a generative model)")


def test_rows_keep_their_source_and_request_counts(tmp_path: Path):
    failed = row_from_result(tmp_path / "c8.json", vllm_result(8, 0.0, 0.0, completed=0, failed=12), 1.35)
    assert (failed.source, failed.completed, failed.failed, failed.measured) == ("c8.json", 0, 12, False)
    partial = row_from_result(tmp_path / "c4.json", vllm_result(4, 10.0, 5.0, completed=9, failed=3), 1.35)
    assert (partial.source, partial.completed, partial.failed) == ("c4.json", 9, 3)


def test_a_plot_without_a_title_has_no_heading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    figures = drawn_figures(monkeypatch, render=False)
    rows = report_rows(write_sweep(tmp_path / "a", vllm_result(1, 64.0, 12.5)), price_per_hour=1.35)
    benchreport.plot_runs({"a": rows}, tmp_path / "plot.png")
    (figure,) = figures
    assert figure.get_suptitle() == ""
    assert [line.get_xydata().tolist() for line in figure.axes[0].get_lines()] == [[[1.0, 64.0]]]


def test_a_sweep_that_ended_before_any_level_finished_says_why(tmp_path: Path):
    """Issue 34 item 7: the reason sweep.json recorded, not "no result JSON"."""
    reason = ("concurrency 1: all 8 requests failed; vLLM: This model's maximum context length is 1024 tokens "
              "(log: runs/cpu/c1.log)")
    (tmp_path / "sweep.json").write_text(json.dumps({"tool": "tpuserve bench sweep", "runs": [], "finished_at": None,
                                                     "unfinished": {"concurrency": 1, "reason": reason,
                                                                    "at": "2026-12-02T10:00:00+00:00"}}))
    result = CliRunner().invoke(main, ["bench", "report", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == f"Error: {tmp_path}: the sweep ended before any level finished: {reason}"
