"""tpuserve/deploy/pulumi_cli.py against the fake `pulumi` on PATH (tests/fakes/fake_pulumi.py): which CLI calls it makes.
Every call starts the CLI, ≈ 1 s against a cloud backend, so the calls it saves are pinned here as literals."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.fake_pulumi import FakePulumi, install
from tpuserve.deploy.pulumi_cli import PulumiCli


@pytest.fixture
def pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakePulumi:
    fake = install(tmp_path / "bin", tmp_path / "pulumi-home")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_PULUMI_HOME", str(fake.home))
    fake.set_config(project="my-ml-sandbox", zone="europe-west4-a")
    return fake


def test_up_saves_the_config_it_is_given_with_the_update(pulumi: FakePulumi) -> None:
    cli = PulumiCli("dev")
    run = cli.up(["--policy-pack", "policy"], 30.0, {"zone": "us-east1-d", "createCloudNat": "false"})
    assert run.ok and "Updating (dev):" in run.output
    assert pulumi.calls() == [["up", "--yes", "--skip-preview", "--refresh", "--config", "zone=us-east1-d", "--config",
                               "createCloudNat=false", "--policy-pack", "policy", "--stack", "dev",
                               "--non-interactive"]]
    assert cli.config() == {"project": "my-ml-sandbox", "zone": "us-east1-d", "createCloudNat": "false"}
    cli.up([], 30.0)
    assert pulumi.calls()[-1] == ["up", "--yes", "--skip-preview", "--refresh", "--stack", "dev", "--non-interactive"]
