"""tpuserve/deploy/pulumi_cli.py against the fake `pulumi` on PATH (tests/fake_pulumi.py): which CLI calls it makes.
Every call starts the CLI, ≈ 1 s against a cloud backend, so the calls it saves are pinned here as literals."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fake_pulumi import FakePulumi, install
from tpuserve.deploy.pulumi_cli import PulumiCli, PulumiError


@pytest.fixture
def pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakePulumi:
    fake = install(tmp_path / "bin", tmp_path / "pulumi-home")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_PULUMI_HOME", str(fake.home))
    fake.set_config(project="my-ml-sandbox", zone="europe-west4-a")
    return fake


def test_the_stack_list_follows_the_stacks_this_process_creates_and_removes(pulumi: FakePulumi) -> None:
    cli = PulumiCli("dev")
    assert cli.stacks() == ["dev"]
    replica = cli.for_stack("dev-r1")
    replica.init("dev")
    assert cli.stacks() == ["dev", "dev-r1"] and replica.stacks() == ["dev", "dev-r1"]
    replica.remove()
    assert cli.stacks() == ["dev"]
    assert pulumi.commands() == ["stack ls", "stack init dev-r1", "stack rm dev-r1"]
    assert pulumi.calls()[1] == ["stack", "init", "--copy-config-from", "dev", "--stack", "dev-r1",
                                 "--non-interactive"]


def test_a_failed_create_or_removal_makes_it_ask_again(pulumi: FakePulumi) -> None:
    cli = PulumiCli("dev")
    replica = cli.for_stack("dev-r1")
    replica.init("dev")  # before any listing: nothing to update
    assert cli.stacks() == ["dev", "dev-r1"]
    with pytest.raises(PulumiError, match="stack 'dev-r1' already exists"):
        replica.init("dev")
    assert cli.stacks() == ["dev", "dev-r1"]
    replica.remove()
    with pytest.raises(PulumiError, match="no stack named 'dev-r1' found"):
        replica.remove()
    assert cli.stacks() == ["dev"]
    assert pulumi.commands() == ["stack init dev-r1", "stack ls", "stack init dev-r1", "stack ls", "stack rm dev-r1",
                                "stack rm dev-r1", "stack ls"]


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
