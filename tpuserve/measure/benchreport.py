"""Turn saved `vllm bench serve` results into the reference's table, comparisons and a plot.

Measuring (`tpuserve bench sweep`) only writes files; everything here reads them, so a report can be redone,
re-priced or compared long after the VM is gone.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SWEEP_MANIFEST = "sweep.json"  # the one JSON in a sweep directory that is not a `vllm bench serve` result
# The vLLM result fields a report needs; from request_throughput on, in BenchRow's order.
REQUIRED_FIELDS = ("max_concurrency", "completed", "request_throughput", "output_throughput",
                   "total_token_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms")
# Faster per stream means tokens arrived in bursts, not one by one (docs/design/measuring.md#plausible-rates).
MAX_PLAUSIBLE_PER_STREAM_TOK_S = 10_000.0


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
    completed: int = 0
    failed: int = 0
    notes: tuple[str, ...] = ()  # what a reader must know before trusting the row

    @property
    def measured(self) -> bool:
        """Whether any request completed: a level where all failed has no numbers, only its failure."""
        return self.completed > 0


# BenchRow attribute -> (header, terminal header, format), in the reference's order. No word of a terminal header is
# wider than a v6e sweep's numbers, so nine columns fit 80 and a header wraps between words.
COLUMNS: dict[str, tuple[str, str, str]] = {
    "concurrency": ("Concurrency", "Conc", "{:d}"),
    "requests_per_s": ("Req/s", "Req/s", "{:.2f}"),
    "output_tok_s": ("Output tok/s", "Out tok/s", "{:.1f}"),
    "total_tok_s": ("Total tok/s", "Total tok/s", "{:.1f}"),
    "ttft_median_ms": ("TTFT med (ms)", "TTFT med ms", "{:.1f}"),
    "ttft_p99_ms": ("TTFT p99 (ms)", "TTFT p99 ms", "{:.1f}"),
    "tpot_median_ms": ("TPOT med (ms)", "TPOT med ms", "{:.2f}"),
    "per_stream_tok_s": ("Per-stream tok/s", "Stream tok/s", "{:.1f}"),
    "usd_per_m_output": ("$ / M output tokens", "$/M out", "{:.3f}"),
}


def per_stream_tok_s(median_tpot_ms: float) -> float:
    """Decode speed one user sees: one token every median TPOT (NaN when there is no TPOT to speak of)."""
    return 1000.0 / median_tpot_ms if median_tpot_ms > 0 else math.nan


def request_counts(result: dict[str, Any], num_prompts: int | None = None) -> tuple[int, int]:
    completed = int(result.get("completed") or 0)
    failed = result.get("failed")
    if failed is None:
        failed = max(int(result.get("num_prompts") or num_prompts or completed) - completed, 0)
    return completed, int(failed)


def row_notes(completed: int, failed: int, median_tpot_ms: float, per_stream: float) -> tuple[str, ...]:
    if completed == 0:
        return (f"all {failed} requests failed: nothing was measured (see the level's .log)",)
    notes = []
    if failed:
        notes.append(f"{failed} of {completed + failed} requests failed: the numbers cover the {completed} that "
                     "completed")
    if median_tpot_ms <= 0:
        notes.append("median TPOT is 0: no per-stream rate (outputs of one token, or a buffered stream)")
    elif per_stream > MAX_PLAUSIBLE_PER_STREAM_TOK_S:
        notes.append(f"per-stream {per_stream:,.0f} tok/s (median TPOT {median_tpot_ms:.4f} ms) is implausible: "
                     f"no decoder streams over {MAX_PLAUSIBLE_PER_STREAM_TOK_S:,.0f} tok/s, so tokens arrived in "
                     "bursts (buffered streaming, or too short outputs)")
    return tuple(notes)


def usd_per_million_output(price_per_hour: float, output_tok_s: float) -> float:
    """What a million output tokens cost on a machine billed by the hour, kept busy at this rate."""
    return price_per_hour / (output_tok_s * 3600) * 1e6 if output_tok_s > 0 else math.inf


def load_results(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every `vllm bench serve` result JSON in `directory` (the sweep manifest and other JSON are skipped)."""
    if not directory.is_dir():
        raise ReportError(f"{directory}: not a directory")
    results = []
    for path in sorted(path for path in directory.glob("*.json") if path.name != SWEEP_MANIFEST):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ReportError(f"{path}: not valid JSON ({error})") from error
        if isinstance(data, dict) and "output_throughput" in data:
            results.append((path, data))
    if not results:
        if why := unfinished_reason(read_manifest(directory)):  # the sweep said why nothing was measured
            raise ReportError(f"{directory}: the sweep ended before any level finished: {why}")
        raise ReportError(f"{directory}: no `vllm bench serve` result JSON (run `tpuserve bench sweep --out DIR`)")
    return results


def read_manifest(directory: Path) -> dict[str, Any]:
    """sweep.json, or {} when it is missing or no JSON object."""
    try:
        manifest = json.loads((directory / SWEEP_MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def unfinished_reason(manifest: dict[str, Any]) -> str | None:
    """Why sweep.json says the sweep ended early, or None."""
    unfinished = manifest.get("unfinished")
    return str(unfinished.get("reason") or "reason not recorded") if isinstance(unfinished, dict) else None


def row_from_result(path: Path, result: dict[str, Any], price_per_hour: float) -> BenchRow:
    missing = [name for name in REQUIRED_FIELDS if result.get(name) is None]
    if missing:
        raise ReportError(f"{path}: missing {', '.join(missing)} (max_concurrency needs --max-concurrency; "
                          "TTFT/TPOT need a generative model)")
    completed, failed = request_counts(result)
    concurrency = int(result["max_concurrency"])
    if completed == 0:  # vLLM still writes zeros for every metric: they are not measurements
        return BenchRow(concurrency, *([math.nan] * 8), source=path.name, completed=0, failed=failed,
                        notes=row_notes(0, failed, 0.0, math.nan))
    per_stream = per_stream_tok_s(result["median_tpot_ms"])
    return BenchRow(concurrency, *(result[name] for name in REQUIRED_FIELDS[2:]), per_stream,  # the columns' order
                    usd_per_million_output(price_per_hour, result["output_throughput"]), path.name, completed, failed,
                    row_notes(completed, failed, result["median_tpot_ms"], per_stream))


def report_rows(directory: Path, price_per_hour: float) -> list[BenchRow]:
    """One row per concurrency level, ascending; two results for one level are an error, not an average."""
    rows = sorted((row_from_result(path, result, price_per_hour) for path, result in load_results(directory)),
                  key=lambda row: row.concurrency)
    for previous, current in itertools.pairwise(rows):
        if previous.concurrency == current.concurrency:
            raise ReportError(f"{directory}: {previous.source} and {current.source} both measure concurrency "
                              f"{current.concurrency}; move one out")
    return rows


# Counted lengths differ from requested ones by a special token or two (64 -> 65 with the tiny Gemma 4's BOS).
LENGTH_TOLERANCE_TOKENS = 2
LENGTH_TOLERANCE_SHARE = 0.05


@dataclass(frozen=True)
class RunInfo:
    """What a sweep measured: model, request lengths requested (sweep.json) and counted (per completed request)."""

    directory: str
    model: str | None
    requested: tuple[int, int] | None
    measured: tuple[int, int] | None
    date: str | None
    unfinished: str | None = None  # why the sweep ended early (sweep.json `unfinished`), when it did

    @property
    def lengths(self) -> str:
        input_len, output_len = self.requested or self.measured or ("?", "?")
        return f"{input_len} in / {output_len} out"


def run_info(directory: Path) -> RunInfo:
    manifest = read_manifest(directory)
    parameters = manifest.get("parameters") if isinstance(manifest.get("parameters"), dict) else {}
    results = [result for _, result in load_results(directory)]
    measured = [r for r in results if (r.get("completed") or 0) > 0]

    def mean_length(total_key: str) -> int | None:
        totals = [(r.get(total_key), r["completed"]) for r in measured if r.get(total_key) is not None]
        return round(sum(t for t, _ in totals) / sum(c for _, c in totals)) if totals else None

    requested = (parameters.get("input_len"), parameters.get("output_len"))
    means = (mean_length("total_input_tokens"), mean_length("total_output_tokens"))
    return RunInfo(str(directory), manifest.get("model") or next((r.get("model_id") for r in results), None),
                   requested if None not in requested else None, means if None not in means else None,
                   day(manifest.get("started_at") or next((r.get("date") for r in results if r.get("date")), None)),
                   unfinished_reason(manifest))


def day(stamp: Any) -> str | None:
    """'2026-11-29' from sweep.json's ISO time or vLLM's result 'date' ('20261129-104500')."""
    text = str(stamp or "")
    if re.match(r"^\d{8}-\d{6}$", text):
        return f"{text[:4]}-{text[4:6]}-{text[6:8]}"
    return text[:10] or None


def same_lengths(a: RunInfo, b: RunInfo) -> bool:
    """Requested lengths when both runs recorded them, else what the server counted, within a token or two."""
    if a.requested and b.requested:
        return a.requested == b.requested
    if a.measured and b.measured:
        return all(abs(x - y) <= max(LENGTH_TOLERANCE_TOKENS, LENGTH_TOLERANCE_SHARE * max(x, y))
                   for x, y in zip(a.measured, b.measured))
    return True  # nothing to compare by: the runs' own files say nothing about lengths


def check_comparable(baseline: RunInfo, candidate: RunInfo) -> list[str]:
    """Refuse runs of different request lengths (different work); notes for what may differ (the model)."""
    if not same_lengths(baseline, candidate):
        raise ReportError(f"{candidate.directory} measured {candidate.lengths}, its baseline {baseline.directory} "
                          f"{baseline.lengths}: levels of different lengths are not comparable (--allow-mismatch "
                          "compares them anyway)")
    if baseline.model != candidate.model:
        return [f"the runs measured different models: baseline {baseline.model}, candidate {candidate.model}"]
    return []


@dataclass(frozen=True)
class Comparison:
    """One metric at one concurrency in two runs, ratio candidate / baseline; None for a side without it."""

    concurrency: int
    metric: str
    baseline: float | None
    candidate: float | None
    ratio: float | None


def compare_rows(baseline: list[BenchRow], candidate: list[BenchRow]) -> list[Comparison]:
    """Every metric at every level either run measured; a level on one side only keeps its row, ratio n/a."""
    base_by_level = {row.concurrency: row for row in baseline}
    other_by_level = {row.concurrency: row for row in candidate}
    if not set(base_by_level) & set(other_by_level):
        raise ReportError("the two runs share no concurrency level")
    comparisons = []
    for level in sorted(set(base_by_level) | set(other_by_level)):
        base, other = base_by_level.get(level), other_by_level.get(level)
        for attribute in list(COLUMNS)[1:]:
            a = getattr(base, attribute) if base and base.measured else None
            b = getattr(other, attribute) if other and other.measured else None
            finite = a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
            comparisons.append(Comparison(level, attribute, a, b, b / a if finite and a else None))
    return comparisons


def format_cell(attribute: str, value: float | None) -> str:
    """The value in its column's format; '—' for none or NaN, '∞' for infinite."""
    if value is None or math.isnan(value):
        return "—"
    return COLUMNS[attribute][2].format(value) if math.isfinite(value) else "∞"


def comparison_cells(item: Comparison) -> list[str]:
    return [str(item.concurrency), COLUMNS[item.metric][0], format_cell(item.metric, item.baseline),
            format_cell(item.metric, item.candidate), f"{item.ratio:.3f}" if item.ratio is not None else "n/a"]


def row_cells(row: BenchRow) -> list[str]:
    """The row's cells; a level where every request failed says so instead of showing zeros."""
    if not row.measured:
        return [str(row.concurrency), f"all {row.failed} failed", *["—"] * (len(COLUMNS) - 2)]
    flagged = {"per_stream_tok_s"} if any(note.startswith("per-stream") for note in row.notes) else set()
    return [format_cell(name, getattr(row, name)) + (" ⚠" if name in flagged else "") for name in COLUMNS]


def report_notes(rows: list[BenchRow], label: str = "") -> list[str]:
    """One line per flagged row: 'concurrency 8: 3 of 100 requests failed ...'."""
    prefix = f"{label}: " if label else ""
    return [f"{prefix}concurrency {row.concurrency}: {note}" for row in rows for note in row.notes]


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


COMPARISON_HEADERS = ["Concurrency", "Metric", "Baseline", "Candidate", "Ratio"]


def plot_title(infos: list[RunInfo], price_per_hour: float) -> str:
    """'tiny-gemma4 · 64 in / 16 out · 2026-11-29 · $1.35/h' (runs that differ list each value once)."""
    def joined(values: list[str | None]) -> str:
        return " vs ".join(dict.fromkeys(value or "?" for value in values))

    return (f"{joined([info.model for info in infos])} · {joined([info.lengths for info in infos])} · "
            f"{joined([info.date for info in infos])} · ${price_per_hour:g}/h")


def plot_runs(runs: dict[str, list[BenchRow]], path: Path, title: str = "") -> None:
    """Output tok/s, per-stream tok/s and TTFT p99 by concurrency, a panel each, a colour per run."""
    # pragma: no mutate block -- drawing only (the PNG test checks it); 15 s per mutant (tests/mutation/equivalents.md)
    from matplotlib.figure import Figure  # no pyplot: no backend, no global figure to close

    panels = (("output_tok_s", "Output tok/s"), ("per_stream_tok_s", "Per-stream tok/s"),
              ("ttft_p99_ms", "TTFT p99 (ms)"))
    figure = Figure(figsize=(8, 9), dpi=100)
    axes = figure.subplots(len(panels), 1, sharex=True)
    for (attribute, ylabel), axis in zip(panels, axes):
        for label, rows in runs.items():
            shown = [row for row in rows if row.measured and math.isfinite(getattr(row, attribute))]
            axis.plot([row.concurrency for row in shown], [getattr(row, attribute) for row in shown], "o-",
                      label=label)
        axis.set_ylabel(ylabel)
        axis.grid(True, alpha=0.3)
    levels = sorted({row.concurrency for rows in runs.values() for row in rows})
    axes[-1].set_xscale("log", base=2)
    axes[-1].set_xticks(levels, [str(level) for level in levels])
    axes[-1].set_xlabel("Concurrency")
    axes[0].legend(fontsize="small")
    if title:
        figure.suptitle(title, fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, format="png")
