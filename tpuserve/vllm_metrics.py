"""vLLM's Prometheus metrics: the series this project charts, alerts on and shows, and the math to read them
(docs/design/core.md#vllms-metrics)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # a fraction despite the name: 1 means 100 % (vLLM's HELP text)
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"  # tokens looked up in the prefix cache
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"  # tokens found there
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
REQUEST_SUCCESS = "vllm:request_success_total"  # one series per finished_reason: stop, length, abort, error, ...
FINISHED_REASON = "finished_reason"
TTFT = "vllm:time_to_first_token_seconds"  # histogram: read `TTFT + "_bucket"`
ITL = "vllm:inter_token_latency_seconds"  # histogram
BUCKET, LE = "_bucket", "le"

Labels = tuple[tuple[str, str], ...]
Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), ascending, the last bound +Inf


class MetricsError(ValueError):
    """The text is not the Prometheus exposition format."""


@dataclass(frozen=True)
class Scrape:
    """One read of `/metrics`: every sample by (name, labels), and when it was taken (seconds, any clock)."""

    samples: Mapping[tuple[str, Labels], float]
    at: float

    def total(self, name: str, **match: str) -> float | None:
        """The sum over every series of `name` (one per engine) whose labels include `match`; None without any."""
        values = [value for (sample, labels), value in self.samples.items()
                  if sample == name and match.items() <= dict(labels).items()]
        return sum(values) if values else None

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(labels)[label] for sample, labels in self.samples if sample == name and label in dict(labels)}

    def buckets(self, histogram: str) -> Buckets:
        """The histogram's cumulative buckets, summed over its series (engines)."""
        by_bound: dict[float, float] = {}
        for (sample, labels), value in self.samples.items():
            if sample == histogram + BUCKET:
                bound = float(dict(labels)[LE])
                by_bound[bound] = by_bound.get(bound, 0.0) + value
        return sorted(by_bound.items())


def parse(text: str, at: float) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[tuple[str, Labels], float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    except ValueError as err:
        raise MetricsError(f"not Prometheus text format: {err}") from err
    return Scrape(samples, at)


def increase(before: float | None, after: float | None) -> float | None:
    """How much a counter grew; a smaller value means the server restarted, so all of `after` is new."""
    if after is None:
        return None
    if before is None or after < before:
        return after
    return after - before


def bucket_increase(before: Buckets, after: Buckets) -> Buckets:
    """The observations made between two reads of one histogram (all of `after` if it was reset meanwhile)."""
    earlier = dict(before)
    if any(count < earlier.get(bound, 0.0) for bound, count in after):
        return list(after)
    return [(bound, count - earlier.get(bound, 0.0)) for bound, count in after]


def observations(buckets: Buckets) -> float:
    return buckets[-1][1] if buckets and math.isinf(buckets[-1][0]) else 0.0


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets; None without observations."""
    ordered = sorted(buckets)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return None
    total = ordered[-1][1]
    if total <= 0 or not 0 <= q <= 1:
        return None
    rank = q * total
    index = next(i for i, (_, count) in enumerate(ordered) if count >= rank)
    if index == len(ordered) - 1:
        return ordered[-2][0]  # the rank is past every finite bound: the best Prometheus can say
    upper, count = ordered[index]
    if index == 0 and upper <= 0:
        return upper
    lower, below = (0.0, 0.0) if index == 0 else ordered[index - 1]
    in_bucket = count - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket
