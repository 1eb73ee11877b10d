"""Turn saved `vllm bench serve` results into the reference's table, comparisons and a plot.

Measuring (`tpuserve bench sweep`) only writes files; everything here reads them, so a report can be redone,
re-priced or compared long after the VM is gone.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Files in a sweep directory that are not `vllm bench serve` results.
SWEEP_MANIFEST = "sweep.json"

# vLLM result fields the report reads; a file missing one of them is not a usable result.
REQUIRED_FIELDS = ("max_concurrency", "request_throughput", "output_throughput", "total_token_throughput",
                   "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms")


class ReportError(ValueError):
    """Saved results that cannot be reported; the message names the file or directory."""


@dataclass(frozen=True)
class BenchRow:
    """One concurrency level, in the reference table's columns."""

    concurrency: int
    requests_per_s: float
    output_tok_s: float
    total_tok_s: float
    ttft_median_ms: float
    ttft_p99_ms: float
    tpot_median_ms: float
    per_stream_tok_s: float
    usd_per_m_output: float
    source: str


# (BenchRow attribute, column header, format) in the reference's order.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("concurrency", "Concurrency", "{:d}"),
    ("requests_per_s", "Req/s", "{:.2f}"),
    ("output_tok_s", "Output tok/s", "{:.1f}"),
    ("total_tok_s", "Total tok/s", "{:.1f}"),
    ("ttft_median_ms", "TTFT med (ms)", "{:.1f}"),
    ("ttft_p99_ms", "TTFT p99 (ms)", "{:.1f}"),
    ("tpot_median_ms", "TPOT med (ms)", "{:.2f}"),
    ("per_stream_tok_s", "Per-stream tok/s", "{:.1f}"),
    ("usd_per_m_output", "$ / M output tokens", "{:.3f}"),
)
METRICS = COLUMNS[1:]


def per_stream_tok_s(median_tpot_ms: float) -> float:
    """Decode speed one user sees: one token every median TPOT."""
    return 1000.0 / median_tpot_ms if median_tpot_ms > 0 else math.inf


def usd_per_million_output(price_per_hour: float, output_tok_s: float) -> float:
    """What a million output tokens cost when the machine is billed by the hour and kept busy at this rate."""
    return price_per_hour / (output_tok_s * 3600) * 1e6 if output_tok_s > 0 else math.inf


def load_results(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every `vllm bench serve` result JSON in `directory` (the sweep manifest and other JSON are skipped)."""
    if not directory.is_dir():
        raise ReportError(f"{directory}: not a directory")
    results = []
    for path in sorted(directory.glob("*.json")):
        if path.name == SWEEP_MANIFEST:
            continue
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ReportError(f"{path}: not valid JSON ({error})") from error
        if isinstance(data, dict) and "output_throughput" in data:
            results.append((path, data))
    if not results:
        raise ReportError(f"{directory}: no `vllm bench serve` result JSON (run `tpuserve bench sweep --out DIR`)")
    return results


def row_from_result(path: Path, result: dict[str, Any], price_per_hour: float) -> BenchRow:
    missing = [name for name in REQUIRED_FIELDS if result.get(name) is None]
    if missing:
        raise ReportError(f"{path}: missing {', '.join(missing)} (max_concurrency needs --max-concurrency; "
                          "TTFT/TPOT need a generative model)")
    return BenchRow(
        concurrency=int(result["max_concurrency"]),
        requests_per_s=result["request_throughput"],
        output_tok_s=result["output_throughput"],
        total_tok_s=result["total_token_throughput"],
        ttft_median_ms=result["median_ttft_ms"],
        ttft_p99_ms=result["p99_ttft_ms"],
        tpot_median_ms=result["median_tpot_ms"],
        per_stream_tok_s=per_stream_tok_s(result["median_tpot_ms"]),
        usd_per_m_output=usd_per_million_output(price_per_hour, result["output_throughput"]),
        source=path.name,
    )


def report_rows(directory: Path, price_per_hour: float) -> list[BenchRow]:
    """One row per concurrency level, ascending; two results for one level are an error, not an average."""
    rows = sorted((row_from_result(path, result, price_per_hour) for path, result in load_results(directory)),
                  key=lambda row: row.concurrency)
    for previous, current in itertools.pairwise(rows):
        if previous.concurrency == current.concurrency:
            raise ReportError(f"{directory}: {previous.source} and {current.source} both measure concurrency "
                              f"{current.concurrency}; move one out")
    return rows


@dataclass(frozen=True)
class Comparison:
    """One metric (a BenchRow attribute) at one concurrency in two runs; ratio is candidate / baseline."""

    concurrency: int
    metric: str
    baseline: float
    candidate: float
    ratio: float | None


def compare_rows(baseline: list[BenchRow], candidate: list[BenchRow]) -> list[Comparison]:
    """Every metric at the concurrency levels both runs measured."""
    by_level = {row.concurrency: row for row in candidate}
    common = [row for row in baseline if row.concurrency in by_level]
    if not common:
        raise ReportError("the two runs share no concurrency level")
    comparisons = []
    for base in common:
        other = by_level[base.concurrency]
        for attribute, _, _ in METRICS:
            a, b = getattr(base, attribute), getattr(other, attribute)
            ratio = b / a if a and math.isfinite(a) and math.isfinite(b) else None
            comparisons.append(Comparison(base.concurrency, attribute, a, b, ratio))
    return comparisons


def format_cell(attribute: str, value: float) -> str:
    template = next(fmt for name, _, fmt in COLUMNS if name == attribute)
    return template.format(value) if math.isfinite(value) else "∞"


def header_of(attribute: str) -> str:
    return next(header for name, header, _ in COLUMNS if name == attribute)


def comparison_cells(item: Comparison) -> list[str]:
    return [str(item.concurrency), header_of(item.metric), format_cell(item.metric, item.baseline),
            format_cell(item.metric, item.candidate), f"{item.ratio:.3f}" if item.ratio is not None else "n/a"]


def row_cells(row: BenchRow) -> list[str]:
    return [format_cell(attribute, getattr(row, attribute)) for attribute, _, _ in COLUMNS]


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def json_record(record: BenchRow | Comparison) -> dict[str, Any]:
    """The record as strict JSON allows it: a value that is not finite (from a zero TPOT or throughput) is null."""
    return {key: None if isinstance(value, float) and not math.isfinite(value) else value
            for key, value in asdict(record).items()}


COMPARISON_HEADERS = ["Concurrency", "Metric", "Baseline", "Candidate", "Ratio"]


def plot_runs(runs: dict[str, list[BenchRow]], path: Path) -> None:
    """Output tok/s, per-stream tok/s and TTFT p99 against concurrency, one panel each so no metric's scale hides
    another's, one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("output_tok_s", "Output tok/s"), ("per_stream_tok_s", "Per-stream tok/s"),
              ("ttft_p99_ms", "TTFT p99 (ms)"))
    figure, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(8, 9), dpi=100)
    for (attribute, title), axis in zip(panels, axes):
        for label, rows in runs.items():
            axis.plot([row.concurrency for row in rows], [getattr(row, attribute) for row in rows], "o-",
                      label=label)
        axis.set_ylabel(title)
        axis.grid(True, alpha=0.3)
    levels = sorted({row.concurrency for rows in runs.values() for row in rows})
    axes[-1].set_xscale("log", base=2)
    axes[-1].set_xticks(levels, [str(level) for level in levels])
    axes[-1].set_xlabel("Concurrency")
    axes[0].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
