"""The stack's Cloud Monitoring dashboard and alert policies (components/monitoring.py) under Pulumi mocks, every
PromQL series they name checked against the real vLLM 0.32 scrape (tests/data/vllm-0.32.0-metrics.prom, kept current
by tests/e2e/test_metrics_e2e.py), and the policies' life against the fake Cloud Monitoring, which refuses a policy on
a metric never written: a first `up` serves before the Ops Agent ships the metrics, and ends well
(docs/design/alerts.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
import yaml

from components.config import build_stack_config
from components.ops_agent import render_ops_agent_config
from tests.fakes.cloud_world import PROJECT, World, agent_series, world  # noqa: F401 - the fixture
from tests.fakes.fake_cloud import FakeCloud
from tests.fakes.fake_providers import AlertPolicyProvider, Cloud, ProviderError
from tests.fakes.pulumi_harness import RecordingMocks, run_stack, stack_file_config, stack_file_run
from tpuserve import alert_metrics, vllm_metrics
from tpuserve.ops import up as up_module
from tpuserve.serving import ConfigError

DASHBOARD = "gcp:monitoring/dashboard:Dashboard"
ALERT = "gcp:monitoring/alertPolicy:AlertPolicy"
DYNAMIC = "pulumi-python:dynamic:Resource"
RUNNING = "prometheus.googleapis.com/vllm:num_requests_running/gauge"
WAITING = "prometheus.googleapis.com/vllm:num_requests_waiting/gauge"
TTFT = "prometheus.googleapis.com/vllm:time_to_first_token_seconds/histogram"
# hashicorp/terraform-provider-google#11102 (2026-04-15 comment, provider v7.28.0), with our metric's type
REFUSED = ('Error creating AlertPolicy: googleapi: Error 404: Cannot find metric(s) that match type = "{}". If a '
           "metric was created recently, it could take up to 10 minutes to become available. Please try again soon.")
RECORDING = Path(__file__).resolve().parents[1] / "data" / "vllm-0.32.0-metrics.prom"
VALID = {"project": "proj-1", "hfTokenSecretId": "hf-token"}
CHANNELS = ["projects/proj-1/notificationChannels/1234567890", "projects/proj-1/notificationChannels/42"]


@pytest.fixture(scope="module", params=["dev", "prod"])
def stack_run(request):
    return request.param, stack_file_run(request.param)


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
    scraped = {name for name, _ in recorded.samples}
    assert named and named <= scraped, named - scraped
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


# --- alert policies wait for their metrics (docs/design/alerts.md) -------------------------------------------------

class MetricsSeen(RecordingMocks):
    """A project where alert policies may name only `ready` of the metrics the alerts name."""

    def __init__(self, ready: list[str]) -> None:
        super().__init__()
        self.ready = ready

    def new_resource(self, args):
        id_, outputs = super().new_resource(args)
        if args.name.endswith("-metrics"):
            outputs.update(ready=self.ready, reason="not written yet: the others")
        return id_, outputs


def test_each_policy_is_declared_once_the_metrics_its_query_names_are_written(stack_run):
    """The check asks for exactly the types the three queries name, as the Ops Agent writes them (the fake agent
    derives its types from the real scrape); a policy whose metrics are not all known is left out and reported."""
    stack, run = stack_run
    [check] = [r for r in run.of_type(DYNAMIC) if r.name == f"tpu-serve-{stack}-metrics"]
    assert check.inputs["metricTypes"] == sorted([RUNNING, TTFT, WAITING])
    assert {RUNNING, TTFT, WAITING} <= {s["metric"]["type"] for s in agent_series(f"tpu-serve-{stack}")}
    assert run.outputs["alerts"] == {"created": ["down", "ttft", "queue"], "pending": [], "metrics": [], "reason": ""}

    gauges_only = run_stack(VALID, mocks=MetricsSeen([RUNNING, WAITING]))
    assert sorted(p.name for p in gauges_only.of_type(ALERT)) == ["tpu-serve-dev-down", "tpu-serve-dev-queue"]
    assert gauges_only.outputs["alerts"] == {"created": ["down", "queue"], "pending": ["ttft"], "metrics": [TTFT],
                                             "reason": "not written yet: the others"}
    nothing = run_stack(VALID, mocks=MetricsSeen([]))
    assert nothing.of_type(ALERT) == [] and nothing.outputs["alerts"]["pending"] == ["down", "ttft", "queue"]
    assert nothing.outputs["dashboardUrl"]  # the dashboard does not wait: dashboards name no metric Monitoring checks


def test_prometheus_types_follow_managed_prometheus_naming():
    assert alert_metrics.prometheus_type("vllm:num_requests_running") == RUNNING
    assert alert_metrics.prometheus_type("vllm:time_to_first_token_seconds_bucket") == TTFT
    assert alert_metrics.prometheus_type("vllm:prompt_tokens_total") == \
        "prometheus.googleapis.com/vllm:prompt_tokens_total/counter"
    assert alert_metrics.metric_types('sum(vllm:num_requests_waiting{a="b"}) >= 8 and sum(delta('
                                      'vllm:num_requests_waiting{a="b"}[10m])) > 0') == (WAITING,)


def policy_inputs(query: str) -> dict:
    return {"project": PROJECT, "displayName": "tpu-serve-dev: vLLM down", "combiner": "OR", "conditions": [
        {"displayName": "down", "conditionPrometheusQueryLanguage": {"query": query, "duration": "60s"}}]}


def test_the_fake_refuses_a_policy_on_a_metric_never_written_as_cloud_monitoring_does(fake_cloud: FakeCloud):
    """What the previous order met: the provider's create of the "down" policy, before the Ops Agent wrote a sample,
    fails with the reported 404; once the agent wrote it (timeSeries.create), the descriptor exists and the same
    create passes."""
    session = requests.Session()
    provider = AlertPolicyProvider(Cloud(fake_cloud.url), ALERT)
    reg = SimpleNamespace(inputs=policy_inputs('absent_over_time(vllm:num_requests_running{instance_name="x"}[10m])'))
    with pytest.raises(ProviderError) as refused:
        provider.create(reg)
    assert str(refused.value) == REFUSED.format(RUNNING)
    descriptor = f"{fake_cloud.url}/v3/projects/{PROJECT}/metricDescriptors/{RUNNING}"
    assert session.get(descriptor).status_code == 404
    assert [r.kind for r in fake_cloud.inventory()] == []

    written = session.post(f"{fake_cloud.url}/v3/projects/{PROJECT}/timeSeries",
                           json={"timeSeries": agent_series("tpu-serve-dev")})
    assert (written.status_code, written.json()) == (200, {})
    assert {k: v for k, v in session.get(descriptor).json().items() if k != "labels"} == {
        "name": f"projects/{PROJECT}/metricDescriptors/{RUNNING}", "type": RUNNING, "metricKind": "GAUGE",
        "valueType": "DOUBLE", "monitoredResourceTypes": ["prometheus_target"]}
    policy_id, _ = provider.create(reg)
    assert policy_id.startswith(f"projects/{PROJECT}/alertPolicies/")
    assert [(r.kind, r.name) for r in fake_cloud.inventory()] == [("alertPolicy", "tpu-serve-dev: vLLM down")]
    # a histogram is known by its base name; a series the agent never wrote stays refused
    provider.create(SimpleNamespace(inputs=policy_inputs(f"rate({vllm_metrics.TTFT}_bucket{{a=\"b\"}}[5m]) > 1")))
    with pytest.raises(ProviderError, match="vllm:never_written/gauge"):
        provider.create(SimpleNamespace(inputs=policy_inputs('vllm:never_written{a="b"} > 1')))


@pytest.fixture
def monitoring(fake_cloud_env: FakeCloud, monkeypatch: pytest.MonkeyPatch) -> FakeCloud:
    """The fake cloud with credentials, its clock the one the check reads a metric's age by."""
    monkeypatch.setattr(alert_metrics, "now", fake_cloud_env.clock.now)
    return fake_cloud_env


def test_a_metric_is_ready_ten_minutes_after_its_first_write_and_asking_never_raises(monitoring: FakeCloud):
    session, url = requests.Session(), monitoring.url
    assert alert_metrics.look(session, PROJECT, [RUNNING, TTFT], url) == alert_metrics.Presence(
        (), f"not written yet: {RUNNING}, {TTFT}")
    monitoring.write_time_series([s for s in agent_series("vm") if s["metric"]["type"] == RUNNING])
    assert alert_metrics.look(session, PROJECT, [RUNNING, TTFT], url) == alert_metrics.Presence(
        (), f"not written yet: {TTFT}; written less than 10 minutes ago: {RUNNING}")
    monitoring.clock.advance(alert_metrics.SETTLE_S)
    assert alert_metrics.look(session, PROJECT, [RUNNING, TTFT], url) == alert_metrics.Presence(
        (RUNNING,), f"not written yet: {TTFT}")
    [listed] = monitoring.calls_to("GET", "/timeSeries")[-1:]
    assert listed.query["view"] == ["HEADERS"] and listed.query["filter"] == [f'metric.type = "{RUNNING}"']
    monitoring.monitoring_unavailable = True
    assert alert_metrics.look(session, PROJECT, [RUNNING], url).reason.startswith(
        "could not ask Cloud Monitoring (HTTP 503)")
    closed = alert_metrics.look(session, PROJECT, [RUNNING], "http://127.0.0.1:9")
    assert closed.ready == () and closed.reason.startswith("could not ask Cloud Monitoring: ")


def test_the_check_asks_until_every_metric_is_ready_then_never_again(monitoring: FakeCloud,
                                                                      monkeypatch: pytest.MonkeyPatch):
    provider = alert_metrics.MetricsWrittenProvider(monitoring.url)
    props = {"project": PROJECT, "metricTypes": [RUNNING, TTFT, WAITING]}
    first = provider.create(props).outs
    assert (first["ready"], first["reason"]) == ([], f"not written yet: {RUNNING}, {TTFT}, {WAITING}")
    assert provider.diff("id", first, props).changes  # the next update asks again
    monitoring.write_time_series(agent_series("tpu-serve-dev"))
    assert provider.update("id", first, props).outs["ready"] == []  # written, but not 10 minutes ago
    monitoring.clock.advance(alert_metrics.SETTLE_S)
    later = provider.update("id", first, props).outs
    assert (later["ready"], later["reason"]) == (sorted([RUNNING, TTFT, WAITING]), "")
    asked = len(monitoring.calls_to("GET", "metricDescriptors"))
    assert not provider.diff("id", later, props).changes  # done: unchanged, not asked again
    assert provider.read("id", later).outs == later
    assert len(monitoring.calls_to("GET", "metricDescriptors")) == asked
    # ready metrics stay ready when the question cannot be asked
    monitoring.monitoring_unavailable = True
    wider = {**props, "metricTypes": [*props["metricTypes"], "prometheus.googleapis.com/vllm:new/gauge"]}
    assert provider.update("id", later, wider).outs["ready"] == sorted([RUNNING, TTFT, WAITING])
    # no credentials: a pending answer, not an exception
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json")
    blind = provider.create(props).outs
    assert blind["ready"] == [] and blind["reason"].startswith("could not ask Cloud Monitoring: ")


def policies(world: World) -> list[str]:
    return [name for kind, _, name in world.kinds("alertPolicy")]


def serving(world: World) -> bool:
    instance = world.cloud.instance("tpu-serve-dev", "us-east5-a")
    attributes = world.cloud.guest_attributes[(PROJECT, "us-east5-a", "tpu-serve-dev")]
    return instance is not None and instance["status"] == "RUNNING" and attributes[("tpu-serve", "stage")] == "serving"


ALL = ["tpu-serve-dev: p99 time to first token above 5 s", "tpu-serve-dev: request queue growing",
       "tpu-serve-dev: vLLM down"]


def ups(world: World) -> int:
    return sum(command.split()[0] == "up" for command in world.pulumi.commands())


def up(world: World) -> tuple[int, dict, str]:
    return world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight", "--zones", "us-east5-a")


def test_a_first_up_serves_before_the_metrics_exist_and_creates_the_alerts_once_they_arrive(world: World):
    """The Ops Agent's first samples reach Cloud Monitoring 2 minutes after serving: the first `pulumi up` declares no
    policy (none is refused), `tpuserve up` waits for the metrics and runs `pulumi up` once more."""
    world.ops_agent_s = 120
    code, verdict, stderr = up(world)
    assert code == 0, stderr
    assert serving(world)
    assert ups(world) == 2
    assert "alert policies down, ttft, queue wait for their metrics (not written yet:" in stderr
    assert "alert policies created: down, ttft, queue" in stderr
    assert verdict["alerts"] == {"created": ["down", "ttft", "queue"], "pending": [], "metrics": [], "reason": ""}
    assert policies(world) == ALL
    assert all(call.status == 200 for call in world.cloud.calls_to("POST", "/alertPolicies"))  # none was refused
    assert world.pulumi.outputs()["alerts"]["pending"] == []
    paths = [call.path for call in world.cloud.calls]
    gate = next(i for i, path in enumerate(paths) if path.endswith("/getGuestAttributes"))
    assert gate < next(i for i, path in enumerate(paths) if "/metricDescriptors/" in path)  # asked after the gate


def test_metrics_that_never_come_leave_the_stack_serving_with_the_alerts_pending_until_a_later_up(world: World):
    """The Ops Agent's install failed: `tpuserve up` waits its bound, ends 0 with the model serving and says what
    creates the alerts; once the metrics arrive, the next `tpuserve up` does."""
    world.ops_agent_s = None
    code, verdict, stderr = up(world)
    assert code == 0, stderr
    assert serving(world) and policies(world) == []
    assert verdict["alerts"]["pending"] == ["down", "ttft", "queue"]
    assert verdict["alerts"]["reason"].startswith("not written yet: prometheus.googleapis.com/vllm:")
    assert "The model serves; the next `tpuserve up --stack dev` (or `pulumi up`) creates them" in stderr
    assert ups(world) == 1  # nothing to run again for
    assert world.cloud.calls_to("POST", "/alertPolicies") == []

    world.cloud.write_time_series(agent_series("tpu-serve-dev"), project=PROJECT)  # the agent, installed by hand
    code, verdict, stderr = up(world)
    assert code == 0, stderr
    assert serving(world) and policies(world) == ALL
    assert verdict["alerts"]["created"] == ["down", "ttft", "queue"]


def test_a_bare_pulumi_up_never_fails_on_the_alerts_and_keeps_them_once_made(world: World):
    """`pulumi up` alone, Cloud Monitoring refusing a metric for its first 10 minutes: the first up serves with the
    alerts pending, one just after the metrics arrived still waits (rather than meet the refusal), the one 10 minutes
    later creates them, and later ones keep them without asking again, even when Cloud Monitoring cannot be asked."""
    world.ops_agent_s = None
    world.cloud.metric_visibility_s = alert_metrics.SETTLE_S

    def pulumi_up() -> dict:
        run = world.run_pulumi("up", "--yes", "--skip-preview", "--stack", "dev")
        assert run.returncode == 0, run.stdout
        assert serving(world)
        return world.pulumi.outputs()["alerts"]

    assert pulumi_up()["pending"] == ["down", "ttft", "queue"] and policies(world) == []
    world.cloud.write_time_series(agent_series("tpu-serve-dev"), project=PROJECT)
    world.cloud.clock.advance(60)
    assert pulumi_up()["reason"].startswith("written less than 10 minutes ago: prometheus.googleapis.com/vllm:")
    assert policies(world) == []
    world.cloud.clock.advance(alert_metrics.SETTLE_S)
    assert pulumi_up()["created"] == ["down", "ttft", "queue"] and policies(world) == ALL

    world.cloud.monitoring_unavailable = True
    asked = len(world.cloud.calls_to("GET", "/v3/"))
    assert pulumi_up()["created"] == ["down", "ttft", "queue"] and policies(world) == ALL
    assert len(world.cloud.calls_to("GET", "/v3/")) == asked  # the check was not asked again
    assert all(call.status == 200 for call in world.cloud.calls_to("POST", "/alertPolicies"))  # none was refused


def test_a_check_that_cannot_be_made_or_a_policy_still_refused_ends_serving_with_the_alerts_pending(world: World):
    """Cloud Monitoring cannot be asked (503) during the first `up`: it ends 0, serving, alerts pending. Then it
    refuses the metrics for 15 minutes after their first write, longer than its error text says: the `pulumi up` that
    `tpuserve up` runs for the alerts fails, and `tpuserve up` still ends 0, serving, saying why; the next `tpuserve
    up`, later, creates them."""
    world.ops_agent_s = None
    world.cloud.monitoring_unavailable = True
    code, verdict, stderr = up(world)
    assert code == 0, stderr
    assert serving(world) and policies(world) == []
    assert verdict["alerts"]["reason"].startswith("could not ask Cloud Monitoring (HTTP 503)")

    world.cloud.monitoring_unavailable = False
    world.cloud.metric_visibility_s = 900
    world.cloud.write_time_series(agent_series("tpu-serve-dev"), project=PROJECT)
    code, verdict, stderr = up(world)
    assert code == 0, stderr
    assert serving(world) and policies(world) == []
    assert verdict["alerts"]["reason"].startswith("pulumi up failed (exit 255): ")
    assert "Cannot find metric(s) that match type" in verdict["alerts"]["reason"]
    assert "The model serves; the next `tpuserve up --stack dev` (or `pulumi up`) creates them" in stderr

    world.cloud.clock.advance(300)
    code, verdict, stderr = up(world)
    assert code == 0, stderr
    assert serving(world) and policies(world) == ALL
    assert verdict["alerts"]["pending"] == []
