"""The Ops Agent's configuration (components/ops_agent.py) against a golden file and the agent's own schema, and the
VM-side installer (vm/ops-agent-install.sh) run for real with PATH shims for dpkg-query and systemctl.

The schema below is the subset of the Ops Agent's config structs this config uses, as they are declared in
GoogleCloudPlatform/ops-agent at 588c4b962526c18cc104d00a87ca83fcb9c19f94: confgenerator/config.go (ConfigComponent
`type` required; Pipeline `receivers`/`processors`; Metrics/Logging `receivers`, `processors`, `service.pipelines`),
confgenerator/logging_receivers.go (LoggingReceiverFiles: `include_paths` required, `exclude_paths`,
`wildcard_refresh_interval`, `record_log_file_path`), confgenerator/logging_processors.go (LoggingProcessorParseJson:
`field`, `time_key` and `time_format` only together) and confgenerator/prometheus.go (a Prometheus `config`; scrape
interval at least 10s, no honor_labels, metric relabelling must not rename `__name__`, relabelling must not write
location/namespace/cluster).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.ops_agent import render_ops_agent_config

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "components" / "goldens" / "ops-agent-config.yaml"
INSTALLER = ROOT / "vm" / "ops-agent-install.sh"

COMPONENT_KEYS = {
    ("metrics", "prometheus"): {"type", "config"},
    ("logging", "files"): {"type", "include_paths", "exclude_paths", "wildcard_refresh_interval",
                           "record_log_file_path"},
    ("logging", "parse_json"): {"type", "field", "time_key", "time_format"},
}
SECTION_KEYS = {"receivers", "processors", "service", "exporters"}
PIPELINE_KEYS = {"receivers", "processors"}
# Prometheus' scrape_config keys: https://prometheus.io/docs/prometheus/latest/configuration/configuration/
SCRAPE_KEYS = {"job_name", "scrape_interval", "scrape_timeout", "metrics_path", "scheme", "static_configs",
               "relabel_configs", "metric_relabel_configs", "params"}
RESERVED_TARGETS = {"location", "namespace", "cluster"}


def seconds(duration: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([smh])", duration).groups()
    return int(number) * {"s": 1, "m": 60, "h": 3600}[unit]


def test_the_rendered_config_is_the_golden_file():
    """Regenerate with `python -m components.ops_agent > tests/components/goldens/ops-agent-config.yaml` and review the diff."""
    assert render_ops_agent_config(8000) == GOLDEN.read_text()


def test_the_config_follows_the_ops_agent_schema():
    config = yaml.safe_load(render_ops_agent_config(8000))
    assert set(config) == {"metrics", "logging"}
    for kind, section in config.items():
        assert set(section) <= SECTION_KEYS, kind
        components = {**section.get("receivers", {}), **section.get("processors", {})}
        for name, component in components.items():
            allowed = COMPONENT_KEYS[(kind, component["type"])]
            assert set(component) <= allowed, f"{kind}.{name}: {set(component) - allowed}"
            assert not name.startswith("lib:")
        for name, pipeline in section["service"]["pipelines"].items():
            assert set(pipeline) <= PIPELINE_KEYS
            assert pipeline["receivers"], f"{kind} pipeline {name} names no receiver"
            assert set(pipeline["receivers"]) <= set(section["receivers"])
            assert set(pipeline.get("processors", [])) <= set(section.get("processors", {}))
    files = config["logging"]["receivers"]["vllm"]
    assert files["include_paths"]
    parse_json = config["logging"]["processors"]["docker_json"]
    assert ("time_key" in parse_json) == ("time_format" in parse_json)


def test_the_scrape_points_at_the_servers_metrics_on_localhost():
    config = yaml.safe_load(render_ops_agent_config(8123))
    [scrape] = config["metrics"]["receivers"]["vllm"]["config"]["scrape_configs"]
    assert set(scrape) <= SCRAPE_KEYS
    assert scrape["static_configs"] == [{"targets": ["localhost:8123"]}]
    assert scrape.get("metrics_path", "/metrics") == "/metrics"
    assert scrape.get("scheme", "http") == "http"
    assert seconds(scrape["scrape_interval"]) >= 10
    assert "honor_labels" not in scrape
    assert all(rule.get("target_label") not in RESERVED_TARGETS for rule in scrape["relabel_configs"])
    assert all(rule.get("target_label") != "__name__" for rule in scrape["metric_relabel_configs"])
    assert config["metrics"]["service"]["pipelines"]["vllm"]["receivers"] == ["vllm"]


def test_each_engine_of_a_vm_is_scraped_on_its_own_port_with_its_name():
    """The front answers /metrics from one engine only (components/front.py): a VM of several engines has each
    scraped, labelled `engine`; a lone engine keeps the unlabelled target above."""
    config = yaml.safe_load(render_ops_agent_config(8000, [("vllm-0", 8100), ("vllm-1", 8101)]))
    [scrape] = config["metrics"]["receivers"]["vllm"]["config"]["scrape_configs"]
    assert scrape["static_configs"] == [{"targets": ["localhost:8100"], "labels": {"engine": "vllm-0"}},
                                        {"targets": ["localhost:8101"], "labels": {"engine": "vllm-1"}}]
    assert all(set(static) <= {"targets", "labels"} for static in scrape["static_configs"])  # Prometheus' keys
    assert "engine" not in RESERVED_TARGETS


def test_the_series_filter_keeps_vllm_and_drops_the_created_timestamps():
    [scrape] = yaml.safe_load(render_ops_agent_config(8000))["metrics"]["receivers"]["vllm"]["config"][
        "scrape_configs"]
    keep, drop = scrape["metric_relabel_configs"]

    def kept(name: str) -> bool:  # Prometheus anchors relabel regexes at both ends
        return bool(re.fullmatch(keep["regex"], name)) and not re.fullmatch(drop["regex"], name)

    assert kept("vllm:num_requests_running") and kept("vllm:time_to_first_token_seconds_bucket")
    assert not kept("vllm:prompt_tokens_created") and not kept("python_gc_objects_collected_total")


def test_the_config_holds_no_secret_and_no_credentials():
    text = render_ops_agent_config(8000)
    for needle in ("hf_", "token", "password", "authorization", "api_key", "bearer", "secret"):
        assert needle not in text.lower()


# --- the installer on the VM ----------------------------------------------------------------------------------

SHIM = r'''#!/usr/bin/env python3
import json, os, pathlib, sys
state = pathlib.Path(os.environ["SHIM_STATE"])
name, args = pathlib.Path(sys.argv[0]).name, sys.argv[1:]
with open(state / "calls.jsonl", "a") as log:
    log.write(json.dumps([name, *args]) + "\n")
if name == "dpkg-query":
    print("install ok installed", end="")
elif name == "systemctl" and args[0] == "is-active":
    sys.exit(0 if (state / "active").exists() else 3)
elif name == "systemctl" and args[0] == "restart":
    (state / "active").write_text("")
'''


@pytest.fixture
def installer(tmp_path: Path):
    """run(config) -> (exit status, calls); the agent counts as installed; `active` says whether it runs."""
    shims, state = tmp_path / "shims", tmp_path / "state"
    shims.mkdir()
    state.mkdir()
    (shims / "shim.py").write_text(SHIM)
    (shims / "shim.py").chmod(0o755)
    for name in ("dpkg-query", "systemctl"):
        (shims / name).symlink_to(shims / "shim.py")
    config_path = tmp_path / "etc" / "config.yaml"

    def run(config: str, active: bool) -> tuple[int, list[list[str]], str]:
        (state / "active").unlink(missing_ok=True)
        if active:
            (state / "active").write_text("")
        (state / "calls.jsonl").write_text("")
        done = subprocess.run(["bash", str(INSTALLER), config], capture_output=True, text=True, timeout=30,
                              env={"PATH": f"{shims}:{Path(sys.executable).parent}:/usr/bin:/bin",
                                   "SHIM_STATE": str(state), "OPS_AGENT_CONFIG_PATH": str(config_path),
                                   "OPS_AGENT_REPO_SCRIPT_URL": "http://127.0.0.1:9/never-fetched",
                                   "OPS_AGENT_RETRY_DELAY_S": "0"})
        calls = [yaml.safe_load(line) for line in (state / "calls.jsonl").read_text().splitlines()]
        return done.returncode, calls, done.stderr

    run.config_path = config_path
    return run


def test_a_new_config_is_written_and_the_agent_restarted(installer):
    status, calls, _ = installer("metrics: {}\n", active=True)
    assert status == 0
    assert installer.config_path.read_text() == "metrics: {}\n"
    assert installer.config_path.stat().st_mode & 0o777 == 0o644
    assert ["systemctl", "restart", "google-cloud-ops-agent"] in calls


def test_an_unchanged_config_and_a_running_agent_are_left_alone(installer):
    installer("metrics: {}\n", active=True)
    status, calls, stderr = installer("metrics: {}\n", active=True)
    assert status == 0
    assert ["systemctl", "restart", "google-cloud-ops-agent"] not in calls
    assert "configuration unchanged" in stderr


def test_a_stopped_agent_is_restarted_even_with_an_unchanged_config(installer):
    installer("metrics: {}\n", active=True)
    status, calls, _ = installer("metrics: {}\n", active=False)
    assert status == 0 and ["systemctl", "restart", "google-cloud-ops-agent"] in calls


def test_the_installer_passes_shellcheck():
    shellcheck = Path(sys.executable).parent / "shellcheck"
    done = subprocess.run([str(shellcheck), "--severity=style", str(INSTALLER)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
