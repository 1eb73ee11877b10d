"""`tpuserve status`: one screen with the VM (state, time left until flex-start deletes it, cost so far, boot stage)
and the server live from two reads of its `/metrics` (where each field comes from: docs/design/gate-and-status.md)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import requests

from tpuserve import vllm_metrics as metrics
from tpuserve import gce
from tpuserve.gce import COMPUTE_URL, ComputeApiError, ComputeClient, Instance
from tpuserve.cli import echo_json, request_failure
from tpuserve.durations import human
from tpuserve.flex_start import clock, deletion_at, started_at
from tpuserve.urls import server_root
from tpuserve.deploy.stack import TunnelError, endpoint_for, read_outputs, stack_options, url_option
from tpuserve.facts import GUEST_ATTRIBUTE_NAMESPACE, PRICE_PER_CHIP_HOUR
from tpuserve.serving import ConfigError

DEFAULT_INTERVAL_S = 5.0
EXPIRY_WARNING_S = 30 * 60
SCRAPE_TIMEOUT_S = 10.0
CHIPS = re.compile(r"-(\d+)t$")  # ct6e-standard-4t: 4 chips
GONE = "GONE"  # the status of a VM the Compute API no longer knows


class ServerUnreachable(RuntimeError):
    """`/metrics` did not answer with the Prometheus text format."""


@dataclass(frozen=True)
class VmView:
    name: str
    zone: str
    project: str
    status: str  # the instance's status, or GONE
    machine_type: str | None = None
    chips: int | None = None
    provisioning_model: str | None = None
    started_at: str | None = None
    uptime_s: float | None = None
    deletion_at: str | None = None
    left_s: float | None = None
    cost_so_far_usd: float | None = None
    price_per_chip_hour: float | None = None
    boot_stage: str | None = None
    config_hash: str | None = None
    expected_config_hash: str | None = None
    reason: str | None = None
    ops_agent: str | None = None
    compile_cache: str | None = None  # the VM's verdict: "warm (N hits; ...)" or "cold (why; ...)"
    warning: str | None = None  # what the VM found wrong without failing the boot
    engines: str | None = None  # beside other engines: "3 of 4 serving; vllm-2 restarting"


def vm_view(target: Instance, instance: Mapping[str, Any] | None, attributes: Mapping[str, str], now: datetime,
            price_per_chip_hour: float, expected_config_hash: str | None = None) -> VmView:
    """What the instance resource (None once deleted) and its guest attributes say at `now`."""
    if instance is None:
        return VmView(target.name, target.zone, target.project, GONE, expected_config_hash=expected_config_hash)
    machine_type = str(instance.get("machineType", "")).rsplit("/", 1)[-1] or None
    chips = int(found.group(1)) if (found := CHIPS.search(machine_type or "")) else None
    start, end = started_at(instance), deletion_at(instance)
    running = instance.get("status") == "RUNNING"
    uptime = (now - start).total_seconds() if start and running else None
    return VmView(
        name=target.name, zone=target.zone, project=target.project, status=str(instance.get("status", "")),
        machine_type=machine_type, chips=chips,
        provisioning_model=(instance.get("scheduling") or {}).get("provisioningModel"),
        started_at=start.isoformat() if start else None, uptime_s=uptime,
        deletion_at=end.isoformat() if end else None, left_s=(end - now).total_seconds() if end else None,
        cost_so_far_usd=round(uptime / 3600 * chips * price_per_chip_hour, 2) if uptime is not None and chips
        else None,
        price_per_chip_hour=price_per_chip_hour,
        boot_stage=attributes.get("stage"), config_hash=attributes.get("config-hash"),
        expected_config_hash=expected_config_hash, reason=attributes.get("reason"),
        ops_agent=attributes.get("ops-agent"), compile_cache=attributes.get("compile-cache") or None,
        warning=attributes.get("warning") or None, engines=attributes.get("engines") or None)


def expiry_warning(view: VmView, stack: str | None) -> str | None:
    """Under 30 minutes before the flex-start deletion: say so, and how to keep serving (`tpuserve renew`)."""
    if view.left_s is None or view.left_s > EXPIRY_WARNING_S or view.status == GONE:
        return None
    when = "now" if view.left_s <= 0 else f"in {human(view.left_s)}"
    return (f"{view.name} is deleted {when} (flex-start max run ends {clock(view.deletion_at)}). To keep serving, "
            "renew it now: a successor VM boots (~10 min) and serves before this one goes, and once it is gone "
            f"renew deploys a new one:\n  tpuserve renew --stack {stack or '<stack>'}")


def scrape(http: requests.Session, root: str, clock: Callable[[], float] = time.monotonic) -> metrics.Scrape:
    try:
        response = http.get(f"{root}/metrics", timeout=SCRAPE_TIMEOUT_S)
    except requests.RequestException as err:
        raise ServerUnreachable(request_failure(err)) from err
    if response.status_code != 200:
        raise ServerUnreachable(f"{root}/metrics answered HTTP {response.status_code}")
    try:
        return metrics.parse(response.text, clock())
    except metrics.MetricsError as err:
        raise ServerUnreachable(f"{root}/metrics: {err}") from err


@dataclass(frozen=True)
class Quantiles:
    p50: float | None
    p95: float | None


@dataclass(frozen=True)
class LiveView:
    """Gauges from the later read; everything else over the `interval_s` between the two reads."""

    url: str
    interval_s: float
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None  # fraction, 1 = full
    ttft_s: Quantiles
    itl_s: Quantiles
    first_tokens: float  # how many requests got their first token in the interval (TTFT observations)
    finished: float | None
    finished_by_reason: dict[str, float]
    prompt_tokens_per_s: float | None
    generation_tokens_per_s: float | None
    prefix_cache_hit_rate: float | None
    preemptions: float | None


def quantiles(before: metrics.Scrape, after: metrics.Scrape, histogram: str) -> tuple[Quantiles, float]:
    window = metrics.bucket_increase(before.buckets(histogram), after.buckets(histogram))
    return Quantiles(metrics.histogram_quantile(0.5, window), metrics.histogram_quantile(0.95, window)), \
        metrics.observations(window)


def live_view(url: str, before: metrics.Scrape, after: metrics.Scrape) -> LiveView:
    seconds = after.at - before.at

    def grown(name: str, **match: str) -> float | None:
        return metrics.increase(before.total(name, **match), after.total(name, **match))

    def per_s(name: str) -> float | None:
        count = grown(name)
        return count / seconds if count is not None and seconds > 0 else None

    ttft, first_tokens = quantiles(before, after, metrics.TTFT)
    queries, hits = grown(metrics.PREFIX_CACHE_QUERIES), grown(metrics.PREFIX_CACHE_HITS)
    by_reason = {reason: grown(metrics.REQUEST_SUCCESS, finished_reason=reason)
                 for reason in sorted(after.label_values(metrics.REQUEST_SUCCESS, metrics.FINISHED_REASON))}
    return LiveView(
        url=url, interval_s=round(seconds, 3), running=after.total(metrics.RUNNING),
        waiting=after.total(metrics.WAITING), kv_cache_usage=after.total(metrics.KV_CACHE_USAGE), ttft_s=ttft,
        itl_s=quantiles(before, after, metrics.ITL)[0], first_tokens=first_tokens,
        finished=grown(metrics.REQUEST_SUCCESS), finished_by_reason={r: n for r, n in by_reason.items() if n},
        prompt_tokens_per_s=per_s(metrics.PROMPT_TOKENS), generation_tokens_per_s=per_s(metrics.GENERATION_TOKENS),
        prefix_cache_hit_rate=hits / queries if queries and hits is not None else None,
        preemptions=grown(metrics.PREEMPTIONS))


@dataclass
class Report:
    vm: VmView | None = None
    server: LiveView | None = None
    server_error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"vm": asdict(self.vm) if self.vm else None,
                "server": asdict(self.server) if self.server else ({"error": self.server_error}
                                                                    if self.server_error else None),
                "warnings": self.warnings}


def ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def number(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def percent(fraction: float | None) -> str:
    return "–" if fraction is None else f"{fraction * 100:.1f} %"


def render(report: Report) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    for warning in report.warnings:  # command lines (indented) go below the panel, whole, to copy and paste
        lines = warning.splitlines()
        parts.append(Panel("\n".join(line for line in lines if not line.startswith("  ")),
                           title="flex-start expiry", border_style="bold red"))
        parts.extend(Text(line.strip(), style="bold", no_wrap=True, overflow="ignore")
                     for line in lines if line.startswith("  "))
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    if report.vm:
        v = report.vm
        chips = f" ({v.chips} chip{'s' if v.chips != 1 else ''})" if v.chips else ""
        table.add_row("VM", f"{v.name}  {v.zone}  [bold]{v.status}[/]  {v.machine_type or ''}{chips}")
        if v.status == GONE:
            table.add_row("", "deleted (flex-start max run ended?) or destroyed: `tpuserve renew` or `tpuserve up` "
                          "makes a new one")
        if v.uptime_s is not None:
            table.add_row("up", f"{human(v.uptime_s)} since {clock(v.started_at)}")
        if v.left_s is not None and v.status != GONE:
            left = human(v.left_s)
            table.add_row("deleted in", (f"[bold red]{left}[/]" if v.left_s <= EXPIRY_WARNING_S else left)
                          + f" (at {clock(v.deletion_at)}, flex-start max run)")
        if v.cost_so_far_usd is not None:
            table.add_row("cost so far", f"${v.cost_so_far_usd:,.2f} (at ${v.price_per_chip_hour:g} per chip-hour)")
        if v.status != GONE:
            wanted = v.expected_config_hash
            wants = f" (the stack wants {wanted})" if wanted and wanted != v.config_hash else ""
            table.add_row("boot", f"{v.boot_stage or 'no stage reported yet'} · config {v.config_hash or '?'}{wants}"
                          + (f" · metrics agent {v.ops_agent}" if v.ops_agent else ""))
            for label, value in (("engines", v.engines), ("reason", v.reason),
                                 ("warning", v.warning and Text(v.warning, style="yellow")),
                                 ("compile cache", v.compile_cache)):
                if value:
                    table.add_row(label, value)
    if report.vm and (report.server or report.server_error):
        table.add_row("", "")
    if report.server:
        s = report.server
        reasons = ", ".join(f"{reason} {count:g}" for reason, count in s.finished_by_reason.items())
        table.add_row("server", f"{s.url} · last {s.interval_s:g} s")
        table.add_row("requests", f"running {number(s.running)} · waiting {number(s.waiting)} · "
                      f"finished {number(s.finished)}" + (f" ({reasons})" if reasons else ""))
        table.add_row("KV cache", f"{percent(s.kv_cache_usage)} used · prefix-cache hits "
                      f"{percent(s.prefix_cache_hit_rate)} · preemptions {number(s.preemptions)}")
        table.add_row("TTFT", f"p50 {ms(s.ttft_s.p50)} · p95 {ms(s.ttft_s.p95)} "
                      f"({number(s.first_tokens)} first tokens)")
        table.add_row("ITL", f"p50 {ms(s.itl_s.p50)} · p95 {ms(s.itl_s.p95)}")
        table.add_row("tokens/s", f"prompt {number(s.prompt_tokens_per_s, 1)} · generation "
                      f"{number(s.generation_tokens_per_s, 1)}")
    elif report.server_error:
        table.add_row("server", f"[red]{report.server_error}[/]")
    parts.append(table)
    return Group(*parts)


@dataclass
class Sources:
    """Where a report comes from: a VM through the Compute API and/or a server's /metrics."""

    compute: ComputeClient | None = None
    target: Instance | None = None
    stack: str | None = None
    expected_config_hash: str | None = None
    price_per_chip_hour: float = PRICE_PER_CHIP_HOUR
    http: requests.Session | None = None
    root: str | None = None
    server_error: str | None = None

    def vm(self) -> tuple[VmView | None, list[str]]:
        """One look through the Compute API; a deleted VM is a view (GONE), other API errors raise."""
        if self.compute is None or self.target is None:
            return None, []
        instance = self.compute.get_or_none(f"{self.compute.base_url}{self.target.path}")
        attributes = {} if instance is None else self.compute.guest_attributes(self.target, GUEST_ATTRIBUTE_NAMESPACE)
        view = vm_view(self.target, instance, attributes, datetime.now(timezone.utc), self.price_per_chip_hour,
                       self.expected_config_hash)
        warning = expiry_warning(view, self.stack)
        return view, [warning] if warning else []


def reports(sources: Sources, interval_s: float, watch: bool,
            sleep: Callable[[float], None] = time.sleep) -> Iterator[Report]:
    """One report (two reads `interval_s` apart), or with `watch` one per interval until interrupted. A server that
    stops answering, or a Compute API hiccup, shows in the report while watching; the first look must succeed,
    except a server's beside a VM: a booting VM is worth seeing while its server does not answer yet."""
    previous, unanswered = None, None
    if sources.root and sources.http:
        try:
            previous = scrape(sources.http, sources.root)
        except ServerUnreachable as err:
            if sources.compute is None:
                raise  # nothing else to show: an unreachable server fails the command
            unanswered = str(err)
    first = True
    while True:
        if previous is not None or not first:
            sleep(interval_s)
        report = Report(server_error=sources.server_error)
        try:
            report.vm, report.warnings = sources.vm()
        except (ComputeApiError, requests.RequestException) as err:
            if first:
                raise click.ClickException(f"Compute API: {err}") from err
            report.warnings = [f"Compute API: {err}"]
        if unanswered is not None:
            report.server_error, unanswered = unanswered, None
        elif sources.root and sources.http:
            try:
                current = scrape(sources.http, sources.root)
                if previous is None:
                    report.server_error = f"{sources.root} answers again; measuring the next {interval_s:g} s"
                else:
                    report.server = live_view(sources.root, previous, current)
                previous = current
            except ServerUnreachable as err:
                report.server_error, previous = str(err), None
        yield report
        first = False
        if not watch:
            return


@click.command()
@url_option("Any vLLM server: host:port or http(s)://host:port, with or without /v1 (its /metrics is read). With "
            "--stack, the VM comes from the stack and the live view from here.")
@click.option("--watch", is_flag=True, help="Refresh in place every --interval seconds until Ctrl-C.")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.5), default=DEFAULT_INTERVAL_S,
              show_default=True, help="Seconds between the two reads of /metrics that rates and TTFT/ITL quantiles "
              "come from (and between refreshes with --watch).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead (with --watch: one object per line).")
@click.option("--price-per-chip-hour", type=click.FloatRange(min=0), default=PRICE_PER_CHIP_HOUR, show_default=True,
              help="USD per chip-hour, for the cost so far.")
@click.option("--compute-url", default=COMPUTE_URL, show_default=True, help="Compute API root (tests use a fake).")
@stack_options
def status(url: str | None, watch: bool, interval_s: float, as_json: bool, price_per_chip_hour: float,
           compute_url: str, stack: str | None, stack_outputs: Path | None) -> None:
    """The VM (state, time left until flex-start deletes it, cost so far, boot stage) and the server live from
    /metrics (running/waiting, KV cache, TTFT and ITL p50/p95, tokens/s).

    With --stack, a gcp stack's VM is read through the Compute API and its server through an IAP tunnel; --url
    reads any vLLM. Under 30 minutes before the flex-start deletion it says so, and how to keep serving."""
    outputs = read_outputs(stack, stack_outputs)
    if not url and outputs is None:
        raise click.UsageError("give --url (any vLLM server) or --stack (a deployment)")
    root = url  # the server root already (tpuserve.urls), or None
    with ExitStack() as exits:
        sources = Sources(price_per_chip_hour=price_per_chip_hour, stack=stack or stack_of(outputs))
        if outputs is not None and outputs.get("target") == "gcp":
            sources.compute = ComputeClient(exits.enter_context(gce.adc_session()), compute_url)
            sources.target = Instance(str(outputs.get("project")), str(outputs.get("zone")),
                                      str(outputs.get("instanceName")))
            sources.expected_config_hash = outputs.get("configHash")
        if root is None and outputs is not None:  # /metrics needs no API key and no model: no /v1/models asked
            try:
                root = server_root(exits.enter_context(endpoint_for(outputs)))
            except (ConfigError, TunnelError) as err:
                if sources.compute is None:
                    raise click.ClickException(str(err)) from err
                sources.server_error = f"server not reachable: {err}"  # a VM is still worth seeing
        if root:
            sources.http, sources.root = exits.enter_context(requests.Session()), root
        show(reports(sources, interval_s, watch), as_json, watch)


def stack_of(outputs: Mapping[str, Any] | None) -> str | None:
    """The stack name inside the VM's URN (urn:pulumi:<stack>::<project>::...), for --stack-outputs."""
    urn = (outputs or {}).get("vmUrn") or ""
    return urn.split("::", 1)[0].split(":", 2)[2] if urn.startswith("urn:pulumi:") else None


def show(stream: Iterator[Report], as_json: bool, watch: bool) -> None:
    from rich.console import Console

    try:
        if as_json:
            for report in stream:
                echo_json(report.as_json())  # --watch: JSON Lines, one per refresh as it happens
            return
        console = Console()
        with console.status("reading /metrics"):
            report = next(stream)
        if not watch:
            console.print(render(report))
            return
        from rich.live import Live

        with Live(render(report), console=console, auto_refresh=False) as live:
            for report in stream:
                live.update(render(report), refresh=True)
    except ServerUnreachable as err:
        raise click.ClickException(str(err)) from err
    except KeyboardInterrupt:
        pass
