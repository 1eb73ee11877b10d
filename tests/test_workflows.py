"""The deploy pipeline runs `tpuserve up` with a deadline: its command line parses with the real command, and the
deadline plus the clean-up fit the job's timeout."""

from __future__ import annotations

import shlex

import yaml

from tests.pulumi_harness import ROOT
from tpuserve.ops.fleet import DESTROY_TIMEOUT_S, DRAIN_TIMEOUT_S, ROUTER_TIMEOUT_S, fleet
from tpuserve.ops.up import CLEANUP_TIMEOUT_S, parse_deadline, up

WORKFLOWS = ROOT / ".github" / "workflows"


def test_every_deploy_job_runs_up_with_a_deadline_that_fits_the_job():
    deploy = yaml.safe_load((WORKFLOWS / "deploy.yml").read_text())
    job = yaml.safe_load((WORKFLOWS / "pulumi.yml").read_text())["jobs"]["pulumi"]
    for name in ("dev", "prod"):
        inputs = deploy["jobs"][name]["with"]
        assert inputs["command"] == "up"
        assert parse_deadline(inputs["deadline"]) + CLEANUP_TIMEOUT_S + 10 * 60 <= job["timeout-minutes"] * 60, name


def test_the_up_step_is_a_valid_tpuserve_up_command_with_the_policy_pack():
    steps = yaml.safe_load((WORKFLOWS / "pulumi.yml").read_text())["jobs"]["pulumi"]["steps"]
    step = next(step for step in steps if step.get("if") == "inputs.command == 'up'")
    argv = shlex.split(step["run"].replace("$STACK", "dev").replace("$DEADLINE", step["env"]["DEADLINE"]))
    assert argv[:2] == [".venv/bin/tpuserve", "up"]
    params = up.make_context("up", argv[2:]).params
    assert params["stack"] == "dev" and params["deadline_text"] == "${{ inputs.deadline }}"
    assert params["yes"] and params["retry_until_up"] and params["as_json"]
    assert params["pulumi_args"] == ("--policy-pack", "policy", "--policy-pack-config", "policy/config/dev.json")
    install = next(step for step in steps if step.get("uses", "").startswith("pulumi/actions"))
    # preview and destroy run in the action; up and fleet-renew through tpuserve, the action then only installs.
    assert install["with"]["command"] == ("${{ (inputs.command == 'preview' || inputs.command == 'destroy') && "
                                          "inputs.command || '' }}")


def test_renewal_runs_every_15_minutes_in_the_deploy_job_with_its_auth_and_concurrency_group():
    renew = yaml.safe_load((WORKFLOWS / "renew.yml").read_text())
    assert renew[True]["schedule"] == [{"cron": "*/15 * * * *"}]  # yaml reads the `on:` key as True
    job = renew["jobs"]["dev"]
    assert job["uses"] == "./.github/workflows/pulumi.yml"  # the deploy's own job: same auth, environment, group
    assert job["with"]["command"] == "fleet-renew" and job["with"]["stack"] == "dev"
    pulumi_job = yaml.safe_load((WORKFLOWS / "pulumi.yml").read_text())["jobs"]["pulumi"]
    assert "'update'" in pulumi_job["concurrency"]["group"]  # non-preview commands of a stack share one group
    # One renewal at its worst (the deadline, two router updates, a drain, a destroy) fits the job's timeout.
    budget = parse_deadline(job["with"]["deadline"]) + 2 * ROUTER_TIMEOUT_S + DRAIN_TIMEOUT_S + DESTROY_TIMEOUT_S
    assert budget <= pulumi_job["timeout-minutes"] * 60


def test_the_renew_step_is_a_valid_fleet_renew_command_with_the_policy_pack():
    steps = yaml.safe_load((WORKFLOWS / "pulumi.yml").read_text())["jobs"]["pulumi"]["steps"]
    step = next(step for step in steps if step.get("if") == "inputs.command == 'fleet-renew'")
    argv = shlex.split(step["run"].replace("$STACK", "dev").replace("$DEADLINE", "30m"))
    assert argv[:3] == [".venv/bin/tpuserve", "fleet", "renew"]
    params = fleet.commands["renew"].make_context("renew", argv[3:]).params
    assert params["stack"] == "dev" and params["deadline_text"] == "30m" and params["yes"] and params["as_json"]
    assert params["lead_text"] == "45m"
    assert params["pulumi_args"] == ("--policy-pack", "policy", "--policy-pack-config", "policy/config/dev.json")
