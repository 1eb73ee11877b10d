"""tpuserve.vllm_metrics on the recorded real scrape (tests/data/vllm-0.32.0-metrics.prom) and on hand-computed
histograms: Prometheus' histogram_quantile worked by hand, counter resets, series summed over engines."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tpuserve import vllm_metrics as metrics

RECORDING = Path(__file__).resolve().parents[1] / "data" / "vllm-0.32.0-metrics.prom"
INF = math.inf


@pytest.fixture(scope="module")
def recorded() -> metrics.Scrape:
    return metrics.parse(RECORDING.read_text(), 0.0)


def test_the_names_used_here_are_in_vllm_032s_export(recorded):
    expected = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                "vllm:generation_tokens_total", "vllm:num_preemptions_total", "vllm:request_success_total",
                "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket"}
    assert expected <= {name for name, _ in recorded.samples}
    used = {metrics.RUNNING, metrics.WAITING, metrics.KV_CACHE_USAGE, metrics.PREFIX_CACHE_QUERIES,
            metrics.PREFIX_CACHE_HITS, metrics.PROMPT_TOKENS, metrics.GENERATION_TOKENS, metrics.PREEMPTIONS,
            metrics.REQUEST_SUCCESS, metrics.TTFT + "_bucket", metrics.ITL + "_bucket"}
    assert used == expected


def test_the_deprecated_names_are_gone_from_vllm_032(recorded):
    """What the GKE recipes' dashboards still chart (and show empty)."""
    names = {name for name, _ in recorded.samples}
    assert not {name for name in names if name.startswith(("vllm:gpu_cache_usage_perc",
                                                           "vllm:time_per_output_token_seconds"))}
    assert "vllm:kv_cache_usage_perc" in names and "vllm:inter_token_latency_seconds_bucket" in names


def test_the_recording_reads_as_recorded(recorded):
    assert recorded.total("vllm:prompt_tokens_total") == 12.0
    assert recorded.total("vllm:request_success_total") == 1.0
    assert recorded.total("vllm:request_success_total", finished_reason="length") == 1.0
    assert recorded.total("vllm:request_success_total", finished_reason="stop") == 0.0
    assert recorded.total("vllm:no_such_metric") is None
    assert recorded.label_values("vllm:request_success_total", "finished_reason") == {
        "stop", "length", "abort", "error", "repetition"}
    buckets = recorded.buckets("vllm:time_to_first_token_seconds")
    assert buckets[:8] == [(0.001, 0.0), (0.005, 0.0), (0.01, 0.0), (0.02, 0.0), (0.04, 0.0), (0.06, 0.0),
                           (0.08, 1.0), (0.1, 1.0)]
    assert buckets[-1] == (INF, 1.0) and len(buckets) == 23


HAND = [(0.1, 2.0), (0.5, 6.0), (1.0, 8.0), (INF, 10.0)]


@pytest.mark.parametrize("q,expected", [
    (0.1, 0.05),   # rank 1 in the first bucket (0, 0.1]: half-way
    (0.5, 0.4),    # rank 5: 3 of the 4 observations in (0.1, 0.5]
    (0.8, 1.0),    # rank 8: the top of (0.5, 1.0]
    (0.95, 1.0),   # rank 9.5 lies in +Inf: the last finite bound
])
def test_histogram_quantile_interpolates_like_prometheus(q, expected):
    assert metrics.histogram_quantile(q, HAND) == pytest.approx(expected)


def test_no_observations_means_no_quantile():
    assert metrics.histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None
    assert metrics.histogram_quantile(0.5, []) is None
    assert metrics.histogram_quantile(0.5, [(0.1, 3.0)]) is None  # no +Inf bucket: not a histogram


def test_bucket_increase_is_the_window_and_a_reset_counts_whole():
    before = [(0.1, 2.0), (1.0, 5.0), (INF, 6.0)]
    after = [(0.1, 3.0), (1.0, 9.0), (INF, 12.0)]
    assert metrics.bucket_increase(before, after) == [(0.1, 1.0), (1.0, 4.0), (INF, 6.0)]
    restarted = [(0.1, 1.0), (1.0, 1.0), (INF, 2.0)]
    assert metrics.bucket_increase(before, restarted) == restarted
    assert metrics.observations(metrics.bucket_increase(before, after)) == 6.0


def test_counter_increase_survives_a_restart():
    assert metrics.increase(10.0, 25.0) == 15.0
    assert metrics.increase(10.0, 4.0) == 4.0
    assert metrics.increase(None, 4.0) == 4.0
    assert metrics.increase(3.0, None) is None


def test_series_of_several_engines_are_summed():
    text = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 4.0
"""
    scrape = metrics.parse(text, 0.0)
    assert scrape.total("vllm:num_requests_running") == 5.0
    assert scrape.total("vllm:num_requests_running", engine="1") == 3.0
    assert scrape.buckets("vllm:time_to_first_token_seconds") == [(0.1, 5.0), (INF, 6.0)]


def test_text_that_is_not_the_exposition_format_is_refused():
    with pytest.raises(metrics.MetricsError):
        metrics.parse("<html>not metrics</html>", 0.0)
