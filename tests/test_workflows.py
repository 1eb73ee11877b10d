"""The deploy pipeline runs `tpuserve up` with a deadline: its command line parses with the real command, and the
deadline plus the clean-up fit the job's timeout."""

from __future__ import annotations

import shlex

import yaml

from tests.pulumi_harness import ROOT
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
    assert install["with"]["command"] == "${{ inputs.command != 'up' && inputs.command || '' }}"  # install only
