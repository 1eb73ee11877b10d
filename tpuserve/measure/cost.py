"""`tpuserve cost`: when does an hourly-billed TPU beat a per-token API, and what does a session cost?"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from tpuserve.cli import echo_json, json_option
from tpuserve.facts import (DEFAULT_CACHE_DISK_GB, DEFAULT_CACHE_DISK_IOPS, DEFAULT_CACHE_DISK_MIBPS,
                            HYPERDISK_BALANCED_FREE_IOPS, HYPERDISK_BALANCED_FREE_MIBPS, HYPERDISK_BALANCED_MAX_IOPS,
                            HYPERDISK_BALANCED_MAX_MIBPS, HYPERDISK_BALANCED_USD_PER_GB_MONTH, PRICE_PER_CHIP_HOUR,
                            hyperdisk_balanced_monthly_usd)
from tpuserve.measure import benchreport


def breakeven_output_tok_s(price_per_hour: float, api_usd_per_m: float) -> float:
    """Sustained output tok/s at which an hour of the machine costs what the API charges for the same tokens."""
    return price_per_hour / 3600 / api_usd_per_m * 1e6


def cold_start_usd(price_per_hour: float, cold_start_min: float) -> float:
    """Billed minutes before the first token: the VM runs while the image pulls and the model compiles."""
    return price_per_hour * cold_start_min / 60


@dataclass(frozen=True)
class Session:
    """A billed session of `hours`, of which the cold start serves nothing, at a steady output rate."""

    hours: float
    serving_hours: float
    output_tok_s: float
    output_tokens: float
    usd: float
    usd_per_m_output: float
    api_usd: float

    @property
    def saving_usd(self) -> float:
        return self.api_usd - self.usd


def session(price_per_hour: float, api_usd_per_m: float, hours: float, cold_start_min: float,
            output_tok_s: float) -> Session:
    serving_hours = max(hours - cold_start_min / 60, 0.0)
    output_tokens = output_tok_s * 3600 * serving_hours
    usd = price_per_hour * hours
    return Session(hours, serving_hours, output_tok_s, output_tokens, usd,
                   usd / output_tokens * 1e6 if output_tokens else float("inf"), output_tokens / 1e6 * api_usd_per_m)


def operating_point(rows: list[benchreport.BenchRow], concurrency: int | None) -> benchreport.BenchRow:
    """The requested level, else the best output tok/s; only levels where requests completed count."""
    usable = [row for row in rows if row.measured and row.output_tok_s > 0]
    if concurrency is None:
        if not usable:
            raise click.ClickException("no level of the report completed a request: nothing to price (see "
                                       "`tpuserve bench report`)")
        return max(usable, key=lambda row: row.output_tok_s)
    for row in rows:
        if row.concurrency == concurrency:
            if row not in usable:
                raise click.BadParameter(f"{concurrency}: {'; '.join(row.notes) or 'no output measured'}",
                                         param_hint="--concurrency")
            return row
    measured = ", ".join(str(row.concurrency) for row in rows)
    raise click.BadParameter(f"{concurrency} was not measured (measured: {measured})", param_hint="--concurrency")


def cache_disk_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The stack's cache disk settings, as `plan` and `cost` take them."""
    for option in (
        click.option("--cache-disk-iops", default=DEFAULT_CACHE_DISK_IOPS, show_default=True,
                     type=click.IntRange(HYPERDISK_BALANCED_FREE_IOPS, HYPERDISK_BALANCED_MAX_IOPS),
                     help="The stack's cacheDiskIops; above 3,000 it bills by the month."),
        click.option("--cache-disk-throughput", "cache_disk_mibps", default=DEFAULT_CACHE_DISK_MIBPS,
                     type=click.IntRange(HYPERDISK_BALANCED_FREE_MIBPS, HYPERDISK_BALANCED_MAX_MIBPS),
                     show_default=True, help="The stack's cacheDiskThroughputMibps: how fast a warm boot reads the "
                     "weights; above 140 MiB/s it bills by the month."),
        click.option("--cache-disk-gb", type=click.IntRange(min=0), default=DEFAULT_CACHE_DISK_GB, show_default=True,
                     help="The stack's cacheDiskSizeGb (0: none); it bills by the month, VM or not.")):
        command = option(command)
    return command


@click.command()
@click.option("--chips", type=click.IntRange(min=1), default=1, show_default=True,
              help="TPU chips of the machine (ct6e-standard-4t: 4); every one bills.")
@click.option("--engines", type=click.IntRange(min=1), default=1, show_default=True,
              help="vLLM engines the machine runs (chips / tensorParallelSize): the operating point is one engine's "
              "and the machine serves this many times it; 1: the operating point is the whole machine's.")
@click.option("--price-per-chip-hour", type=click.FloatRange(min=0, min_open=True), default=PRICE_PER_CHIP_HOUR,
              show_default=True, help="$ per chip-hour (default: the reference flex-start v6e price).")
@click.option("--price-per-hour", type=click.FloatRange(min=0, min_open=True),
              help="$ per hour of the whole machine, instead of --chips × --price-per-chip-hour.")
@click.option("--api-price-per-m", type=click.FloatRange(min=0, min_open=True), default=0.40, show_default=True,
              help="The API's $ per million output tokens to compare with.")
@click.option("--cold-start-min", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Billed minutes from create to first token.")
@click.option("--session-h", type=click.FloatRange(min=0, min_open=True), default=4.0, show_default=True,
              help="Billed hours of one session, cold start included.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="A `tpuserve bench sweep` directory to take the operating point from.")
@click.option("--concurrency", type=int, help="Operating point's level in --report (default: best output tok/s).")
@click.option("--output-tok-s", type=click.FloatRange(min=0, min_open=True),
              help="Operating point given directly instead of --report.")
@click.option("--disk-price-per-gb-month", type=click.FloatRange(min=0), default=HYPERDISK_BALANCED_USD_PER_GB_MONTH,
              show_default=True, help="$ per GB-month of Hyperdisk Balanced (reference price; check your region's).")
@cache_disk_options
@json_option
def cost(chips: int, engines: int, price_per_chip_hour: float, price_per_hour: float | None, api_price_per_m: float,
         cold_start_min: float, session_h: float, report_dir: Path | None, concurrency: int | None,
         output_tok_s: float | None, cache_disk_gb: int, disk_price_per_gb_month: float, cache_disk_mibps: int,
         cache_disk_iops: int, as_json: bool) -> None:
    """Breakeven throughput against an API price, the cost of a cold start, and what a session yields."""
    if price_per_hour is None:
        price_per_hour = chips * price_per_chip_hour  # every chip of the machine bills, serving or not
    if report_dir and output_tok_s:
        raise click.BadParameter("give --report or --output-tok-s, not both", param_hint="--output-tok-s")
    if concurrency is not None and not report_dir:
        raise click.BadParameter("needs --report", param_hint="--concurrency")
    if engines > chips:
        raise click.BadParameter(f"{engines} engines need at least {engines} chips (--chips {chips})",
                                 param_hint="--engines")
    label = f"--output-tok-s {output_tok_s:g}" if output_tok_s else None
    notes: list[str] = []
    if report_dir:
        point = operating_point(benchreport.report_rows(report_dir, price_per_hour), concurrency)
        output_tok_s, label = point.output_tok_s, f"concurrency {point.concurrency} of {report_dir}"
        notes = benchreport.report_notes([point])  # what `bench report` flags about this level, in its words
    engine_tok_s = output_tok_s
    if output_tok_s and engines > 1:
        output_tok_s, label = output_tok_s * engines, f"{engines} engines × {label}"
    breakeven = breakeven_output_tok_s(price_per_hour, api_price_per_m)
    monthly = hyperdisk_balanced_monthly_usd(cache_disk_gb, cache_disk_iops, cache_disk_mibps, disk_price_per_gb_month)
    result = session(price_per_hour, api_price_per_m, session_h, cold_start_min, output_tok_s) if output_tok_s else None
    if as_json:
        echo_json({"price_per_hour": price_per_hour, "api_price_per_m": api_price_per_m,
                   "breakeven_output_tok_s": breakeven, "cold_start_min": cold_start_min,
                   "cold_start_usd": cold_start_usd(price_per_hour, cold_start_min),
                   "session": None if result is None else {**asdict(result), "saving_usd": result.saving_usd,
                                                           "operating_point": label,
                                                           "above_breakeven": result.output_tok_s > breakeven},
                   **({"engines": {"count": engines, "engine_output_tok_s": engine_tok_s}} if engines > 1 else {}),
                   "cache_disk": {"size_gb": cache_disk_gb, "throughput_mibps": cache_disk_mibps,
                                  "iops": cache_disk_iops, "usd_per_month": monthly} if cache_disk_gb else None,
                   "notes": notes})
        return
    say(f"Breakeven vs ${api_price_per_m:g}/M: {breakeven:,.1f} output tok/s sustained at ${price_per_hour:g}/h")
    say(f"One cold start ({cold_start_min:g} min): ${cold_start_usd(price_per_hour, cold_start_min):.3f}")
    if cache_disk_gb:
        say(f"Cache disk ({cache_disk_gb} GB Hyperdisk Balanced, {cache_disk_mibps} MiB/s, {cache_disk_iops:,} "
            f"IOPS): ${monthly:.2f} / month while it exists, VM or not (`tpuserve cache ls` lists them, "
            "`cache rm` removes them)")
        say("Its throughput sets how fast a warm boot reads the weights: `tpuserve plan` shows what it buys")
    if result and engines > 1:
        say(f"{engines} engines × {engine_tok_s:,.1f} output tok/s = {output_tok_s:,.1f} for the machine: each engine "
            "on its own chips serves what one did, if the load keeps every engine busy (the front's cost is "
            "measured in docs/more-than-one-chip.md)")
    if result:
        verdict = "above" if result.output_tok_s > breakeven else "below"
        outcome = (f"saving ${result.saving_usd:.2f}" if result.saving_usd >= 0
                   else f"${-result.saving_usd:.2f} more than the API")
        say(f"Session of {session_h:g} h at {output_tok_s:,.1f} output tok/s ({label}, {verdict} breakeven):")
        say(f"cost ${result.usd:.2f}; {result.serving_hours:.2f} h serving after the cold start yields "
            f"{result.output_tokens / 1e6:,.2f} M output tokens = ${result.usd_per_m_output:.3f} / M", "  ")
        say(f"the API would charge ${result.api_usd:.2f} for them: {outcome}", "  ")
    for note in notes:
        say(f"⚠ {note}")


def say(text: str, indent: str = "") -> None:
    """One statement wrapped between words to the terminal (COLUMNS), never splitting a number or path."""
    width = shutil.get_terminal_size().columns
    click.echo(textwrap.fill(text, width=max(width, 40), initial_indent=indent,
                             subsequent_indent=indent + "  ", break_long_words=False, break_on_hyphens=False))

