"""Whether Cloud Monitoring takes the metrics an alert policy names yet, as a Pulumi dynamic resource the policies
wait for (docs/design/alerts.md). An importable module, so Pulumi's provider process can load it; it never fails."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

MONITORING_URL = "https://monitoring.googleapis.com"
PROMETHEUS = "prometheus.googleapis.com"
SERIES = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{")  # every series our queries name carries a selector
SETTLE_S = 600  # "it could take up to 10 minutes to become available" (the refusal's text; docs/design/alerts.md)
SPAN_S = 7 * 24 * 3600  # how far back a settled sample is looked for
TIMEOUT_S = 30.0
now = time.time  # the fake cloud's clock in tests


def prometheus_type(series: str) -> str:
    """A PromQL series' Cloud Monitoring type (opentelemetry-operations-go googlemanagedprometheus/naming.go)."""
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix):
            return f"{PROMETHEUS}/{series.removesuffix(suffix)}/histogram"
    return f"{PROMETHEUS}/{series}/{'counter' if series.endswith('_total') else 'gauge'}"


def metric_types(promql: str) -> tuple[str, ...]:
    return tuple(sorted({prometheus_type(name) for name in SERIES.findall(promql)}))


@dataclass(frozen=True)
class Presence:
    ready: tuple[str, ...]  # metric types written at least SETTLE_S ago
    reason: str = ""  # why the others are not: not written yet, written too recently, or could not be asked


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def look(session: Any, project: str, types: list[str], url: str = MONITORING_URL) -> Presence:
    """Per type: metricDescriptors.get (404: never written), then timeSeries.list of one header with a point older
    than SETTLE_S (none, or a 404: too recent). Anything else, or no answer, is asked again next time."""
    import requests

    ready, unwritten, recent = [], [], []
    base, at = f"{url.rstrip('/')}/v3/projects/{project}", now()
    try:
        for metric_type in types:
            descriptor = session.get(f"{base}/metricDescriptors/{metric_type}", timeout=TIMEOUT_S)
            if descriptor.status_code == 404:
                unwritten.append(metric_type)
                continue
            if not descriptor.ok:
                return Presence(tuple(ready), asked_in_vain(descriptor))
            series = session.get(f"{base}/timeSeries", timeout=TIMEOUT_S, params={
                "filter": f'metric.type = "{metric_type}"', "interval.startTime": rfc3339(at - SPAN_S),
                "interval.endTime": rfc3339(at - SETTLE_S), "view": "HEADERS", "pageSize": "1"})
            if series.ok and series.json().get("timeSeries"):
                ready.append(metric_type)
            elif series.ok or series.status_code == 404:
                recent.append(metric_type)
            else:
                return Presence(tuple(ready), asked_in_vain(series))
    except (requests.RequestException, ValueError) as err:
        return Presence(tuple(ready), f"could not ask Cloud Monitoring: {err}")
    reasons = [f"not written yet: {', '.join(unwritten)}" if unwritten else "",
               f"written less than {SETTLE_S // 60} minutes ago: {', '.join(recent)}" if recent else ""]
    return Presence(tuple(ready), "; ".join(r for r in reasons if r))


def asked_in_vain(response: Any) -> str:
    return f"could not ask Cloud Monitoring (HTTP {response.status_code}): {response.text[:200]}"


class MetricsWrittenProvider(ResourceProvider):
    """Props: project, metricTypes; outputs add `ready` (the types a policy may name now) and `reason`. Nothing in
    the cloud to read back or delete: the base class's read and delete do."""

    def __init__(self, monitoring_url: str = MONITORING_URL):
        self.monitoring_url = monitoring_url

    def _outs(self, props: dict[str, Any], known: list[str]) -> dict[str, Any]:
        wanted = [t for t in props["metricTypes"] if t not in known]
        presence = Presence(())
        if wanted:
            try:
                from tpuserve.gce import adc_session

                presence = look(adc_session(), str(props["project"]), wanted, self.monitoring_url)
            except Exception as err:  # noqa: BLE001 - no credentials or a broken token: pending, never a failure
                presence = Presence((), f"could not ask Cloud Monitoring: {err}")
        ready = sorted({*known, *presence.ready} & set(props["metricTypes"]))
        return {**props, "ready": ready, "reason": presence.reason}

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(f"{props['project']}/alert-metrics", self._outs(props, []))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        """Another project is another question; else asked again until every type is ready."""
        if olds.get("project") != news.get("project"):
            return DiffResult(changes=True, replaces=["project"], delete_before_replace=False)
        if olds.get("ready") is None:  # inputs only (tests/fakes/config_changes.py plans from those): what is asked
            changes = olds.get("metricTypes") != news.get("metricTypes")
        else:
            changes = not set(news["metricTypes"]) <= set(olds["ready"])
        return DiffResult(changes=changes, replaces=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(self._outs(news, list(olds.get("ready") or ())))
