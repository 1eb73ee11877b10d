"""What a gcp stack shows and alerts on in Cloud Monitoring: one dashboard and three PromQL alert policies over the
vLLM metrics the VM's Ops Agent ships (components/ops_agent.py), each selecting the stack's VM by INSTANCE_LABEL.
Sources: docs/design/pulumi-program.md#monitoring-and-the-ops-agent; why a policy waits: docs/design/alerts.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi.dynamic
from pulumi_gcp import monitoring

from components.config import GcpConfig
from components.ops_agent import INSTANCE_LABEL
from tpuserve import vllm_metrics as m
from tpuserve.alert_metrics import MetricsWrittenProvider, metric_types

WINDOW = "5m"  # the rate window of every chart and of the TTFT alert
COLUMNS, TILE_WIDTH, TILE_HEIGHT = 48, 24, 16
QUANTILES = (0.5, 0.95, 0.99)
QUEUE_TREND = "10m"
PromQlCondition = monitoring.AlertPolicyConditionConditionPrometheusQueryLanguageArgs


@dataclass(frozen=True)
class Alert:
    key: str  # resource-name suffix
    title: str
    query: str
    duration: str  # how long the query must hold before the alert fires
    severity: str
    content: str

    @property
    def metrics(self) -> tuple[str, ...]:
        return metric_types(self.query)


def selector(instance_name: str) -> str:
    return f'{{{INSTANCE_LABEL}="{instance_name}"}}'


def quantile(q: float, histogram: str, sel: str) -> str:
    return f"histogram_quantile({q:g}, sum by ({m.LE}) (rate({histogram}{m.BUCKET}{sel}[{WINDOW}])))"


def rate_sum(counter: str, sel: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({counter}{sel}[{WINDOW}]))"


def chart(title: str, unit: str, *series: tuple[str, str]) -> dict:
    """An xyChart widget of PromQL lines: (query, legend)."""
    return {"title": title, "xyChart": {
        "dataSets": [{"timeSeriesQuery": {"prometheusQuery": query, "unitOverride": unit}, "plotType": "LINE",
                      "legendTemplate": legend, "targetAxis": "Y1"} for query, legend in series],
        "yAxis": {"label": unit, "scale": "LINEAR"}}}


def widgets(instance_name: str) -> list[dict]:
    sel = selector(instance_name)
    return [
        chart("Time to first token (p50, p95, p99)", "s",
              *((quantile(q, m.TTFT, sel), f"p{q * 100:g}") for q in QUANTILES)),
        chart("Inter-token latency (p50, p95, p99)", "s",
              *((quantile(q, m.ITL, sel), f"p{q * 100:g}") for q in QUANTILES)),
        chart("Requests running vs waiting", "1",
              (f"sum({m.RUNNING}{sel})", "running"), (f"sum({m.WAITING}{sel})", "waiting")),
        chart("KV-cache usage", "%", (f"100 * max({m.KV_CACHE_USAGE}{sel})", "used")),
        chart("Prefix-cache hit rate (tokens)", "%",
              (f"100 * {rate_sum(m.PREFIX_CACHE_HITS, sel)} / {rate_sum(m.PREFIX_CACHE_QUERIES, sel)}", "hits")),
        chart("Tokens per second", "1/s",
              (rate_sum(m.PROMPT_TOKENS, sel), "prompt"), (rate_sum(m.GENERATION_TOKENS, sel), "generation")),
        chart("Preemptions per minute", "1/min", (f"60 * {rate_sum(m.PREEMPTIONS, sel)}", "preemptions")),
        chart("Finished requests per second, by finish reason", "1/s",
              (rate_sum(m.REQUEST_SUCCESS, sel, by=m.FINISHED_REASON), f"${{metric.labels.{m.FINISHED_REASON}}}")),
    ]


def dashboard_json(display_name: str, instance_name: str, labels: Mapping[str, str]) -> str:
    tiles = [{"xPos": (i % 2) * TILE_WIDTH, "yPos": (i // 2) * TILE_HEIGHT, "width": TILE_WIDTH,
              "height": TILE_HEIGHT, "widget": widget} for i, widget in enumerate(widgets(instance_name))]
    return json.dumps({"displayName": display_name, "labels": dict(labels),
                       "mosaicLayout": {"columns": COLUMNS, "tiles": tiles}}, indent=2)


def alerts(cfg: GcpConfig, name: str, stack: str) -> list[Alert]:
    sel, ttft_s, depth = selector(name), cfg.alert_ttft_p99_seconds, cfg.alert_queue_depth
    down_s = cfg.alert_down_after_seconds
    down = f"{down_s // 60}m" if down_s % 60 == 0 else f"{down_s}s"  # a PromQL duration
    return [
        Alert("down", f"{name}: vLLM down",
              f"absent_over_time({m.RUNNING}{sel}[{down}])", "60s", "CRITICAL",
              f"No vLLM metrics from {name} for {down_s // 60} minutes: the server is down, the Ops Agent "
              "stopped, or the VM is gone (flex-start deletes it when its max run ends; `pulumi up --refresh` makes "
              f"a new one). Look with `tpuserve status --stack {stack}` and `tpuserve diagnose --stack "
              f"{stack}`."),
        Alert("ttft", f"{name}: p99 time to first token above {ttft_s:g} s",
              f"{quantile(0.99, m.TTFT, sel)} > {ttft_s:g}", "600s", "WARNING",
              f"The p99 time to first token over {WINDOW} has stayed above {ttft_s:g} s for 10 "
              "minutes: the server is saturated (see requests waiting and KV-cache usage on the dashboard) or "
              "prompts got longer."),
        Alert("queue", f"{name}: request queue growing",
              f"sum({m.WAITING}{sel}) >= {depth} and sum(delta({m.WAITING}{sel}[{QUEUE_TREND}])) > 0",
              "300s", "WARNING",
              f"At least {depth} requests wait and the queue has grown over {QUEUE_TREND}: more traffic "
              "than one VM serves. Lower the load or add capacity."),
    ]


class MetricsWritten(pulumi.dynamic.Resource):
    """Which of `metricTypes` an alert policy may name now (`ready`), asked after the gate."""

    ready: pulumi.Output[list]
    reason: pulumi.Output[str]

    def __init__(self, name: str, props: dict, opts: pulumi.ResourceOptions):
        super().__init__(MetricsWrittenProvider(), name, {**props, "ready": None, "reason": None}, opts)


class ServingMonitoring(pulumi.ComponentResource):
    """The dashboard and the alert policies; `alerts` says which exist and which wait for their metrics (alerts.md)."""

    dashboard_url: pulumi.Output[str]
    alerts: pulumi.Output[dict]

    def __init__(self, name: str, cfg: GcpConfig, instance_name: str, stack: str, labels: Mapping[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gcp:ServingMonitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        dashboard = monitoring.Dashboard(
            f"{name}-dashboard", project=cfg.project,
            dashboard_json=dashboard_json(f"tpu-serve {stack}: {instance_name}", instance_name, labels), opts=child)
        wanted = alerts(cfg, instance_name, stack)
        # Cloud Monitoring refuses a policy on a metric never written, and the vLLM metrics come only after serving.
        written = MetricsWritten(f"{name}-metrics", {
            "project": cfg.project, "metricTypes": sorted({t for alert in wanted for t in alert.metrics})}, child)
        # Declared inside the apply: a policy exists only once its metrics do (a preview does not show it yet).
        self.alerts = pulumi.Output.all(written.ready, written.reason).apply(
            lambda seen: self._declare(name, cfg, labels, wanted, set(seen[0] or ()), seen[1] or ""))
        # The resource id is projects/<number>/dashboards/<id>; the console opens it by the last part.
        self.dashboard_url = dashboard.id.apply(
            lambda dashboard_id: "https://console.cloud.google.com/monitoring/dashboards/custom/"
                                 f"{dashboard_id.rsplit('/', 1)[-1]}?project={cfg.project}")
        self.register_outputs({"dashboardUrl": self.dashboard_url, "alerts": self.alerts})

    def _declare(self, name: str, cfg: GcpConfig, labels: Mapping[str, str], wanted: list[Alert], known: set[str],
                 reason: str) -> dict:
        ready = [alert for alert in wanted if set(alert.metrics) <= known]
        for alert in ready:
            monitoring.AlertPolicy(
                f"{name}-{alert.key}", project=cfg.project, display_name=alert.title, combiner="OR",
                severity=alert.severity,
                conditions=[monitoring.AlertPolicyConditionArgs(
                    display_name=alert.title, condition_prometheus_query_language=PromQlCondition(
                        query=alert.query, duration=alert.duration, evaluation_interval="60s"))],
                documentation=monitoring.AlertPolicyDocumentationArgs(content=alert.content,
                                                                      mime_type="text/markdown"),
                alert_strategy=monitoring.AlertPolicyAlertStrategyArgs(auto_close="1800s"),
                notification_channels=list(cfg.alert_notification_channels), user_labels=dict(labels),
                opts=pulumi.ResourceOptions(parent=self))
        pending = [alert for alert in wanted if alert not in ready]
        return {"created": [alert.key for alert in ready], "pending": [alert.key for alert in pending],
                "metrics": sorted({t for alert in pending for t in alert.metrics}),
                "reason": reason if pending else ""}
