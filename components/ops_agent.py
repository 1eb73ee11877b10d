"""The Google Cloud Ops Agent's configuration on the VM: vLLM's `/metrics` to Cloud Monitoring, the container's logs
to Cloud Logging.

Rendered here, written by the startup script to /etc/google-cloud-ops-agent/config.yaml (vm/ops-agent-install.sh),
and compared with tests/goldens/ops-agent-config.yaml. The shape follows the Ops Agent's own golden inputs,
GoogleCloudPlatform/ops-agent confgenerator/testdata/goldens/metrics-receiver_prometheus/input.yaml (a `prometheus`
metrics receiver whose `config.scrape_configs` is a Prometheus scrape config, named by a `service.pipelines` entry)
and .../logging-processor_parse_json_and_parse_regex_types/input.yaml (a `files` receiver with a `parse_json`
processor), and the docs page https://cloud.google.com/stackdriver/docs/solutions/agents/ops-agent/prometheus.

- Metrics land in Cloud Monitoring as `prometheus.googleapis.com/<name>/<kind>` (Managed Service for Prometheus) and
  are queried with PromQL by their Prometheus names, `vllm:` colon included (names of letters, digits, `_` and `:`
  need no UTF-8 quoting: https://cloud.google.com/stackdriver/docs/managed-prometheus/promql-differences).
- The agent adds the VM's identity as `__meta_gce_*` labels to every static target
  (confgenerator/resourcedetector/gce_detector.go `PrometheusStyleMetadata`); the relabel rule keeps the instance
  name as `instance_name`, the label the dashboard and alerts of a stack select on.
- A VM that runs more than one engine has each scraped on its own port, with an `engine` label (vllm-0, vllm-1,
  ...): the front answers /metrics from one engine only (components/front.py).
- Only `vllm:` series are kept, without the `_created` timestamps prometheus_client adds: Managed Prometheus bills
  per sample, and the Python/HTTP series of the API server are not charted.
- Logs: `docker run` uses the daemon's default json-file driver, one JSON object per line ({"log", "stream",
  "time"}) under <data root>/containers/<id>/<id>-json.log. The log name is the receiver id (`vllm`). The
  agent's built-in syslog pipeline already ships the startup script's own lines.
No secret is in here: the scrape needs no credentials (vLLM's --api-key does not cover /metrics).
"""

from __future__ import annotations

from collections.abc import Sequence

import yaml

from tpuserve.facts import CACHE_ROOT, CONTAINER_LOG_NAME

RECEIVER = CONTAINER_LOG_NAME  # metrics and logging receiver id; also the Cloud Logging log name of the container's logs
JOB_NAME = "vllm"
INSTANCE_LABEL = "instance_name"
SCRAPE_INTERVAL = "15s"  # the agent's floor is 10s (confgenerator/prometheus.go minScrapeInterval)
CONFIG_PATH = "/etc/google-cloud-ops-agent/config.yaml"
# Docker's json-file logs under its data root: on the cache disk when the VM has one (the startup script moves the
# data root there, facts.CACHE_ROOT), else Docker's default.
DOCKER_JSON_LOGS = (f"{CACHE_ROOT}/docker/containers/*/*-json.log", "/var/lib/docker/containers/*/*-json.log")
# Docker's json-file timestamps (RFC 3339 with nanoseconds, UTC); fluent-bit's own docker parser uses this format.
DOCKER_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%L"
HEADER = ("# Written by the tpu-serve startup script (components/ops_agent.py); changes here are lost at the next "
          "boot.\n")


ENGINE_LABEL = "engine"


def scrape_targets(port: int, engines: Sequence[tuple[str, int]] = ()) -> list[dict]:
    """The lone server on `port`, or each of `engines` ((name, port)) labelled with its name."""
    if not engines:
        return [{"targets": [f"localhost:{port}"]}]
    return [{"targets": [f"localhost:{engine_port}"], "labels": {ENGINE_LABEL: name}} for name, engine_port in engines]


def ops_agent_config(port: int, engines: Sequence[tuple[str, int]] = ()) -> dict:
    return {
        "metrics": {
            "receivers": {
                RECEIVER: {
                    "type": "prometheus",
                    "config": {
                        "scrape_configs": [{
                            "job_name": JOB_NAME,
                            "scrape_interval": SCRAPE_INTERVAL,
                            "metrics_path": "/metrics",
                            "static_configs": scrape_targets(port, engines),
                            "relabel_configs": [{"source_labels": ["__meta_gce_instance_name"],
                                                 "target_label": INSTANCE_LABEL}],
                            "metric_relabel_configs": [
                                {"source_labels": ["__name__"], "regex": "vllm:.+", "action": "keep"},
                                {"source_labels": ["__name__"], "regex": ".+_created", "action": "drop"},
                            ],
                        }],
                    },
                },
            },
            "service": {"pipelines": {RECEIVER: {"receivers": [RECEIVER]}}},
        },
        "logging": {
            "receivers": {
                RECEIVER: {"type": "files", "include_paths": list(DOCKER_JSON_LOGS),
                           "wildcard_refresh_interval": "30s"},
            },
            "processors": {
                "docker_json": {"type": "parse_json", "time_key": "time", "time_format": DOCKER_TIME_FORMAT},
            },
            "service": {"pipelines": {RECEIVER: {"receivers": [RECEIVER], "processors": ["docker_json"]}}},
        },
    }


def render_ops_agent_config(port: int, engines: Sequence[tuple[str, int]] = ()) -> str:
    return HEADER + yaml.safe_dump(ops_agent_config(port, engines), sort_keys=False, width=120)


if __name__ == "__main__":  # the golden file: python -m components.ops_agent > tests/goldens/ops-agent-config.yaml
    from tpuserve.serving import DEFAULT_PORT

    print(render_ops_agent_config(DEFAULT_PORT), end="")
