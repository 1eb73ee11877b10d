"""The stack's Cloud Monitoring dashboard and alert policies (components/monitoring.py) under Pulumi mocks, and every
PromQL series they name checked against the real vLLM 0.32 scrape (tests/data/vllm-0.32.0-metrics.prom, kept current
by tests/e2e/test_metrics_e2e.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from components.config import build_stack_config
from components.ops_agent import render_ops_agent_config
from tests.pulumi_harness import run_stack, stack_file_config
from tpuserve import vllm_metrics
from tpuserve.serving import ConfigError

DASHBOARD = "gcp:monitoring/dashboard:Dashboard"
ALERT = "gcp:monitoring/alertPolicy:AlertPolicy"
RECORDING = Path(__file__).resolve().parent / "data" / "vllm-0.32.0-metrics.prom"
VALID = {"project": "proj-1", "hfTokenSecretId": "hf-token"}
CHANNELS = ["projects/proj-1/notificationChannels/1234567890", "projects/proj-1/notificationChannels/42"]


@pytest.fixture(scope="module", params=["dev", "prod"])
def stack_run(request):
    return request.param, run_stack(stack_file_config(request.param), request.param)


@pytest.fixture(scope="module")
def recorded() -> vllm_metrics.Scrape:
    return vllm_metrics.parse(RECORDING.read_text(), 0.0)


def dashboard(run) -> dict:
    return json.loads(run.one(DASHBOARD).inputs["dashboardJson"])


def queries(run) -> list[str]:
    found = [data_set["timeSeriesQuery"]["prometheusQuery"] for tile in dashboard(run)["mosaicLayout"]["tiles"]
             for data_set in tile["widget"]["xyChart"]["dataSets"]]
    found += [condition["conditionPrometheusQueryLanguage"]["query"] for policy in run.of_type(ALERT)
              for condition in policy.inputs["conditions"]]
    return found


def expected_labels(stack: str) -> dict[str, str]:
    return {"app": "tpu-serve", "stack": stack, "managed-by": "pulumi", "env": stack}


def test_the_dashboard_charts_what_the_issue_asks_for(stack_run):
    stack, run = stack_run
    board = dashboard(run)
    assert run.one(DASHBOARD).inputs["project"] == stack_file_config(stack)["project"]
    assert board["displayName"] == f"tpu-serve {stack}: tpu-serve-{stack}"
    assert board["labels"] == expected_labels(stack)
    titles = [tile["widget"]["title"] for tile in board["mosaicLayout"]["tiles"]]
    assert titles == ["Time to first token (p50, p95, p99)", "Inter-token latency (p50, p95, p99)",
                      "Requests running vs waiting", "KV-cache usage", "Prefix-cache hit rate (tokens)",
                      "Tokens per second", "Preemptions per minute", "Finished requests per second, by finish reason"]
    legends = [[d["legendTemplate"] for d in tile["widget"]["xyChart"]["dataSets"]]
               for tile in board["mosaicLayout"]["tiles"]]
    assert legends[0] == legends[1] == ["p50", "p95", "p99"]
    assert legends[2] == ["running", "waiting"] and legends[5] == ["prompt", "generation"]
    assert legends[7] == ["${metric.labels.finished_reason}"]


def test_the_dashboard_tiles_fit_the_grid_without_overlapping(stack_run):
    _, run = stack_run
    layout = dashboard(run)["mosaicLayout"]
    taken = set()
    for tile in layout["tiles"]:
        assert tile["xPos"] + tile["width"] <= layout["columns"] == 48
        cells = {(x, y) for x in range(tile["xPos"], tile["xPos"] + tile["width"])
                 for y in range(tile["yPos"], tile["yPos"] + tile["height"])}
        assert not cells & taken
        taken |= cells


def test_the_alert_policies(stack_run):
    stack, run = stack_run
    policies = {policy.name: policy.inputs for policy in run.of_type(ALERT)}
    assert sorted(policies) == [f"tpu-serve-{stack}-{key}" for key in ("down", "queue", "ttft")]
    for name, policy in policies.items():
        assert policy["userLabels"] == expected_labels(stack)
        assert policy["project"] == stack_file_config(stack)["project"]
        assert policy["combiner"] == "OR" and policy["documentation"]["mimeType"] == "text/markdown"
        assert "notificationChannels" not in policy or policy["notificationChannels"] == []  # none by default
        [condition] = policy["conditions"]
        assert condition["conditionPrometheusQueryLanguage"]["evaluationInterval"] == "60s"
    down = policies[f"tpu-serve-{stack}-down"]
    assert down["severity"] == "CRITICAL"
    assert down["conditions"][0]["conditionPrometheusQueryLanguage"] == {
        "query": f'absent_over_time(vllm:num_requests_running{{instance_name="tpu-serve-{stack}"}}[10m])',
        "duration": "60s", "evaluationInterval": "60s"}
    ttft = policies[f"tpu-serve-{stack}-ttft"]["conditions"][0]["conditionPrometheusQueryLanguage"]
    assert ttft["query"] == ("histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket"
                             f'{{instance_name="tpu-serve-{stack}"}}[5m]))) > 5')
    assert ttft["duration"] == "600s"
    queue = policies[f"tpu-serve-{stack}-queue"]["conditions"][0]["conditionPrometheusQueryLanguage"]
    assert queue["query"].startswith(f'sum(vllm:num_requests_waiting{{instance_name="tpu-serve-{stack}"}}) >= 8 and')


def test_thresholds_and_channels_come_from_config():
    run = run_stack({**VALID, "alertNotificationChannels": json.dumps(CHANNELS), "alertTtftP99Seconds": "2.5",
                     "alertDownAfter": "15m", "alertQueueDepth": "20"})
    policies = {policy.name: policy.inputs for policy in run.of_type(ALERT)}
    assert all(policy["notificationChannels"] == CHANNELS for policy in policies.values())
    query = {name.rsplit("-", 1)[1]: policy["conditions"][0]["conditionPrometheusQueryLanguage"]["query"]
             for name, policy in policies.items()}
    assert query["ttft"].endswith(") > 2.5") and query["down"].endswith("[15m])")
    assert ">= 20 and" in query["queue"]
    assert policies["tpu-serve-dev-ttft"]["displayName"] == "tpu-serve-dev: p99 time to first token above 2.5 s"


@pytest.mark.parametrize("override,key", [
    ({"alertNotificationChannels": '["my-pager"]'}, "alertNotificationChannels"),
    ({"alertNotificationChannels": '"projects/proj-1/notificationChannels/1"'}, "alertNotificationChannels"),
    ({"alertDownAfter": "1m"}, "alertDownAfter"),
    ({"alertDownAfter": "soon"}, "alertDownAfter"),
    ({"alertTtftP99Seconds": "0"}, "alertTtftP99Seconds"),
    ({"alertTtftP99Seconds": "fast"}, "alertTtftP99Seconds"),
    ({"alertQueueDepth": "0"}, "alertQueueDepth"),
])
def test_bad_monitoring_config_names_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        build_stack_config({**VALID, **override})
    assert err.value.key == key and str(err.value).startswith(f"{key}: ")


SERIES = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{")


def test_every_series_the_dashboard_and_alerts_name_is_in_the_real_scrape(stack_run, recorded):
    stack, run = stack_run
    all_queries = queries(run)
    assert len(all_queries) == 14 + 3  # 14 chart lines, 3 alert conditions
    named = {name for query in all_queries for name in SERIES.findall(query)}
    assert named and named <= recorded.names(), named - recorded.names()
    for query in all_queries:
        # every series is selected by the stack's VM (no query reads another stack's metrics) ...
        assert len(re.findall(r"vllm:", query)) == len(re.findall(
            rf'vllm:[A-Za-z0-9_:]+\{{instance_name="tpu-serve-{stack}"\}}', query)), query
        # ... rates are taken of counters and histogram buckets only, quantiles of buckets only
        for name in re.findall(r"rate\(([A-Za-z0-9_:]+)\{", query):
            assert name.endswith(("_total", "_bucket")), query
        for name in re.findall(r"histogram_quantile\([^,]+, sum by \(le\) \(rate\(([A-Za-z0-9_:]+)\{", query):
            assert name.endswith("_bucket"), query


def test_the_labels_the_queries_group_by_are_on_those_series(stack_run, recorded):
    _, run = stack_run
    for query in queries(run):
        for labels in re.findall(r"by \(([^)]*)\)", query):
            for label in (part.strip() for part in labels.split(",")):
                carrying = {name for name, sample_labels in recorded.samples if label in dict(sample_labels)}
                assert carrying & set(SERIES.findall(query)), f"{label!r} is on none of the series of {query}"


def test_the_queries_select_on_the_label_the_ops_agent_sets(stack_run):
    """The instance_name label does not exist in vLLM's own scrape: the Ops Agent's relabel rule makes it."""
    _, run = stack_run
    [scrape] = yaml.safe_load(render_ops_agent_config(8000))["metrics"]["receivers"]["vllm"]["config"][
        "scrape_configs"]
    [rule] = scrape["relabel_configs"]
    assert rule == {"source_labels": ["__meta_gce_instance_name"], "target_label": "instance_name"}
    assert all('{instance_name="' in query for query in queries(run))


def test_the_outputs_open_the_dashboard_and_name_the_vm_for_a_replace(stack_run):
    stack, run = stack_run
    project = stack_file_config(stack)["project"]
    assert run.outputs["dashboardUrl"] == (f"https://console.cloud.google.com/monitoring/dashboards/custom/"
                                           f"tpu-serve-{stack}-dashboard-id?project={project}")
    assert run.outputs["vmUrn"].startswith(f"urn:pulumi:{stack}::tpu-serve::")
    assert run.outputs["vmUrn"].endswith(f"gcp:compute/instance:Instance::tpu-serve-{stack}")


def test_no_secret_reaches_the_monitoring_resources():
    canary = "hf_CANARY_monitoring_5e7"
    run = run_stack({"project": "proj-1", "hfToken": canary})
    inputs = json.dumps([r.inputs for r in run.of_type(DASHBOARD) + run.of_type(ALERT)])
    assert canary not in inputs and "hf-token" not in inputs
