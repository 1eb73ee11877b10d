"""Test scheduling for the fast tier on pytest-xdist (scripts/test.sh).

- One worker runs every file that runs a Pulumi program under mocks (PULUMI_PROGRAM_FILES). The first program a
  process runs imports the provider SDKs (pulumi_gcp's compute types alone are half a second; with pulumi_kubernetes
  and the schemas, 3-4 s of CPU); spread over four workers, every worker paid it. Together in one process those files
  took 17 s of CPU where they took 60 s one process each. It is one scope to `--dist loadfile`: those tests still
  run in their files' order, each module fixture once.
- pytest-xdist hands each worker a whole scope at a time, in collection order when `--no-loadscope-reorder` is given
  (by default it starts with the scopes that have the most tests, which are not the ones that take longest). The
  Pulumi scope and the files below start real processes or wait on them (the VM sandbox, the fake `pulumi` CLI,
  real request timeouts), so each takes several times longer than most; started last, one of them alone would be
  the tier's tail. They go first, longest first, and the short files fill in around them.

Order and placement only: every test still runs, and none depends on another.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PULUMI_PROGRAM_FILES = frozenset({  # each calls tests/fakes/pulumi_harness.py's run_stack (or stack_file_run)
    "test_stack.py", "test_k8s_manifests.py", "test_gke_stack.py", "test_policy_gke.py", "test_monitoring.py",
    "test_policy.py", "test_config.py", "test_local_stack.py", "test_changes.py",
    "test_config_changes.py", "test_preview.py", "test_instance.py",
})
PULUMI_SCOPE = "tests/[pulumi programs]"

LONGEST_FIRST = (  # CPU seconds each took (the test process and what it started) in one run of the tier
    *sorted(PULUMI_PROGRAM_FILES),  # 29, together
    "test_startup_script.py",  # 29
    "test_lifecycle.py",  # 26
    "test_supervisor.py",  # 25
    "test_up.py",  # 4.5
    "test_up_script.py",  # 4 (and 3 s of curl's retries of an unavailable release)
    "test_bench_sweep.py",  # 3 (a fake vllm that really sends requests)
    "test_gate.py",  # 2.5
    "test_mutation_tool.py",  # 2.5
    "test_vm_ops_agent.py",  # 1.7
    "test_nat.py",  # 1.5
    "test_benchreport.py",  # 1.5
    "test_pod_boot.py",  # 1.4
    "test_install_pulumi.py",  # 1.3
    "test_gke_renew.py",  # 1.2
    "test_status.py",  # 0.7 (and waits: tunnels and port-forwards to fake servers)
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: within a file, nothing moves


def scope_of(nodeid: str) -> str:
    """The work unit a test belongs to: its file, or the one Pulumi scope."""
    path = nodeid.split("::", 1)[0]
    return PULUMI_SCOPE if path.rsplit("/", 1)[-1] in PULUMI_PROGRAM_FILES else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own scheduler for the mode asked for
    from xdist.scheduler import LoadFileScheduling

    class PulumiProgramsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return PulumiProgramsTogether(config, log)


# --- the stateful fake cloud (tests/fakes/fake_cloud.py), for any test that wants one ---------------------------------

@pytest.fixture
def fake_cloud() -> Iterator[Any]:
    """A started FakeCloud, fresh per test (imported here lazily: most tests never start one)."""
    from tests.fakes.fake_cloud import FakeCloud

    with FakeCloud() as cloud:
        yield cloud


@pytest.fixture
def fake_cloud_env(fake_cloud: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fake cloud, with application-default credentials in the environment that only it accepts: the real
    `tpuserve.gce.adc_session()` works and nothing leaves 127.0.0.1 (FakeCloud.env). Subprocesses inherit
    the same variables."""
    for name, value in fake_cloud.env(tmp_path / "fake-cloud-adc").items():
        monkeypatch.setenv(name, value)
    return fake_cloud
