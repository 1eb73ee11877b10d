"""The Google Cloud Ops Agent's configuration on the VM: vLLM's `/metrics` to Cloud Monitoring, the container's logs
to Cloud Logging. Installed by vm/ops-agent-install.sh, compared with tests/components/goldens/ops-agent-config.yaml;
what ships where: docs/monitoring.md; the shape's sources: docs/design/pulumi-program.md#monitoring-and-the-ops-agent.
"""

from __future__ import annotations

from collections.abc import Sequence

import yaml

from tpuserve.facts import CACHE_ROOT, CONTAINER_LOG_NAME

RECEIVER = CONTAINER_LOG_NAME  # the receivers' id, and so the Cloud Logging log name of the container's logs
JOB_NAME = "vllm"
INSTANCE_LABEL = "instance_name"  # what the dashboard and alerts select on, from the agent's __meta_gce_* labels
SCRAPE_INTERVAL = "15s"  # the agent's floor is 10s (confgenerator/prometheus.go minScrapeInterval)
# Docker's json-file logs under its data root: on the cache disk (facts.CACHE_ROOT) if any, else the default.
DOCKER_JSON_LOGS = (f"{CACHE_ROOT}/docker/containers/*/*-json.log", "/var/lib/docker/containers/*/*-json.log")
# Docker's json-file timestamps (RFC 3339, nanoseconds, UTC), as fluent-bit's docker parser reads them.
DOCKER_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%L"
HEADER = ("# Written by the tpu-serve startup script (components/ops_agent.py); changes here are lost at the next "
          "boot.\n")
ENGINE_LABEL = "engine"


def scrape_targets(port: int, engines: Sequence[tuple[str, int]] = ()) -> list[dict]:
    """The lone server on `port`, or each of `engines` ((name, port)) labelled with its name."""
    if not engines:
        return [{"targets": [f"localhost:{port}"]}]
    return [{"targets": [f"localhost:{engine_port}"], "labels": {ENGINE_LABEL: name}}
            for name, engine_port in engines]


def ops_agent_config(port: int, engines: Sequence[tuple[str, int]] = ()) -> dict:
    scrape = {"job_name": JOB_NAME, "scrape_interval": SCRAPE_INTERVAL, "metrics_path": "/metrics",
              "static_configs": scrape_targets(port, engines),
              "relabel_configs": [{"source_labels": ["__meta_gce_instance_name"], "target_label": INSTANCE_LABEL}],
              "metric_relabel_configs": [
                  {"source_labels": ["__name__"], "regex": "vllm:.+", "action": "keep"},
                  {"source_labels": ["__name__"], "regex": ".+_created", "action": "drop"}]}
    logs = {"type": "files", "include_paths": list(DOCKER_JSON_LOGS), "wildcard_refresh_interval": "30s"}
    parse = {"type": "parse_json", "time_key": "time", "time_format": DOCKER_TIME_FORMAT}
    return {
        "metrics": {"receivers": {RECEIVER: {"type": "prometheus", "config": {"scrape_configs": [scrape]}}},
                    "service": {"pipelines": {RECEIVER: {"receivers": [RECEIVER]}}}},
        "logging": {"receivers": {RECEIVER: logs}, "processors": {"docker_json": parse},
                    "service": {"pipelines": {RECEIVER: {"receivers": [RECEIVER], "processors": ["docker_json"]}}}},
    }


def render_ops_agent_config(port: int, engines: Sequence[tuple[str, int]] = ()) -> str:
    return HEADER + yaml.safe_dump(ops_agent_config(port, engines), sort_keys=False, width=120)


if __name__ == "__main__":  # golden file: python -m components.ops_agent > tests/components/goldens/ops-agent-config.yaml
    from tpuserve.serving import DEFAULT_PORT

    print(render_ops_agent_config(DEFAULT_PORT), end="")
