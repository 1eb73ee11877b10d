"""A stack's whole world for scenario tests: the stateful fake cloud (tests/fakes/fake_cloud.py), the fake `pulumi` on PATH
in stateful mode (tests/fakes/fake_pulumi.py), whose updates the fake engine in this process runs against the cloud
(tests/fakes/fake_engine.py: the real program under mocks, each resource applied in the program's dependency order), and
VMs that boot as the test says. `tpuserve up` and `destroy` run through their real code; a scenario ends by
asserting what the cloud holds and what it billed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.fakes.fake_cloud import FakeCloud
from tests.fakes.fake_engine import Engine, EngineServer
from tests.fakes.fake_providers import Cloud
from tests.fakes.fake_pulumi import FakePulumi, install
from tpuserve import alert_metrics
from tpuserve.ops import alerts

PROJECT = "my-ml-sandbox"
RECORDING = Path(__file__).resolve().parents[1] / "data" / "vllm-0.32.0-metrics.prom"


def agent_series(instance_name: str) -> list[dict[str, Any]]:
    """What the VM's Ops Agent writes at its first export: a series per vLLM metric family of the real scrape, typed
    as Managed Prometheus types them (tpuserve/alert_metrics.py prometheus_type), labelled by its relabel rule."""
    from prometheus_client.parser import text_string_to_metric_families

    return [{"metric": {"type": f"prometheus.googleapis.com/{family.name}{'_total' if family.type == 'counter' else ''}"
                                f"/{family.type}", "labels": {"instance_name": instance_name}},
             "resource": {"type": "prometheus_target", "labels": {"location": "us-east5-a", "job": "vllm"}}}
            for family in text_string_to_metric_families(RECORDING.read_text())
            if family.name.startswith("vllm:") and family.type in ("counter", "gauge", "histogram")]


@dataclass
class World:
    cloud: FakeCloud
    pulumi: FakePulumi
    engine: Engine
    env: dict[str, str]
    # zone -> what a VM booting there reports: "serving", or the reason it fails (its `failed` stage)
    boots: dict[str, str] = field(default_factory=dict)
    # seconds after serving before the Ops Agent's first samples reach Cloud Monitoring (it installs after serving);
    # None: never (its install failed). The default stands for a project an earlier deploy already wrote them to:
    # settled, the alert policies need no wait.
    ops_agent_s: float | None = -alert_metrics.SETTLE_S

    def boot(self, instance: dict[str, Any]) -> None:
        """What the VM's startup script and supervisor would report once it runs its `tpu-serve-config`."""
        zone = str(instance.get("zone", "")).rsplit("/", 1)[-1]
        items = {item["key"]: item.get("value", "") for item in (instance.get("metadata") or {}).get("items", [])}
        served = json.loads(items.get("tpu-serve-config") or "{}")
        outcome = self.boots.get(zone, "serving")
        values = {"stage": "serving", "config-hash": served.get("config_hash", "")} if outcome == "serving" else \
            {"stage": "failed", "reason": outcome, "config-hash": served.get("config_hash", "")}
        self.cloud.set_guest_attributes(instance["name"], zone, values, namespace="tpu-serve")
        if outcome == "serving" and self.ops_agent_s is not None:
            self.cloud.write_time_series(agent_series(instance["name"]), at=self.cloud.clock.now() + self.ops_agent_s,
                                         project=PROJECT)
        if outcome == "serving" and served.get("cache_disk") and served.get("compile_cache_bucket"):
            # the supervisor's post-serving marker (vm/supervisor.py mark_cache_disk, tested in the VM sandbox)
            self.cloud.api("POST", f"/upload/storage/v1/b/{served['compile_cache_bucket']}/o",
                           json.dumps({"config_hash": served.get("config_hash")}).encode(),
                           {"uploadType": "media", "name": f"disks/{served['cache_disk']}"})

    def tpuserve(self, command: Any, *args: str) -> tuple[int, dict[str, Any], str]:
        """Run a click command (e.g. tpuserve.ops.up.up) with the cloud's endpoints; (exit code, its last JSON line,
        stderr)."""
        result: Result = CliRunner().invoke(command, [*args, *self.cloud.endpoint_options()], env=self.env)
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        lines = [line for line in result.stdout.strip().splitlines() if line.startswith("{")]
        return result.exit_code, json.loads(lines[-1]) if lines else {}, result.stderr

    def run_pulumi(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The fake CLI itself, as a user runs it (`pulumi destroy -s dev`)."""
        return subprocess.run(["pulumi", *args, "--non-interactive"], env={**os.environ, **self.env},
                              capture_output=True, text=True, check=False, timeout=120)

    def on_the_clock(self, monkeypatch: pytest.MonkeyPatch, *modules: Any) -> None:
        """The toolkit's waits and deadlines in `modules` (their `time`) follow the cloud's clock: a sleep advances
        it, so a two-hour queue passes in a moment and Google's deadlines and ours are on one clock."""
        for module in modules:
            monkeypatch.setattr(module, "time", CloudTime(self.cloud))

    def kinds(self, *kinds: str) -> list[tuple[str, str, str]]:
        """(kind, location, name) of what the cloud holds, of these kinds."""
        return sorted((r.kind, r.location, r.name) for r in self.cloud.inventory() if not kinds or r.kind in kinds)


@dataclass
class CloudTime:
    """`time` as the toolkit uses it (monotonic, time, sleep), on the fake cloud's clock."""

    cloud: FakeCloud

    def monotonic(self) -> float:
        return self.cloud.clock.now()

    def time(self) -> float:
        return self.cloud.clock.now()

    def sleep(self, seconds: float) -> None:
        self.cloud.clock.advance(seconds)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    cloud = FakeCloud(operation_polls=0)
    with cloud:
        env = cloud.env(tmp_path / "adc")
        pulumi = install(tmp_path / "bin", tmp_path / "pulumi-home")
        env.update({"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FAKE_PULUMI_HOME": str(pulumi.home)})
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(alerts, "sleep", cloud.clock.advance)  # `tpuserve up` waits in virtual time
        monkeypatch.setattr(alerts, "monotonic", cloud.clock.now)
        monkeypatch.setattr(alert_metrics, "now", cloud.clock.now)  # and asks how old a metric is in it
        engine_world = World(cloud, pulumi, None, env)  # type: ignore[arg-type]
        engine = Engine(Cloud(cloud.url, boot=engine_world.boot))
        cloud.on_granted = engine_world.boot  # a VM granted from the queue boots without any provider
        engine_world.engine = engine
        with EngineServer(engine) as server:
            (pulumi.home / "engine.json").write_text(json.dumps({"port": server.port}))
            cloud.api("POST", f"/v1/projects/{PROJECT}/secrets", {"replication": {"automatic": {}}},
                      {"secretId": "hf-token"})
            cloud.api("POST", f"/v1/projects/{PROJECT}/secrets/hf-token:addVersion",
                      {"payload": {"data": "aGZfZmFrZQ=="}})
            pulumi.set_config(project=PROJECT, zone="us-east5-a", hfTokenSecretId="hf-token")
            yield engine_world
