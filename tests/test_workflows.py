"""The pipelines: the deploy runs `tpuserve up` with a deadline (its command line parses with the real command; the
deadline, the boot after it and the clean-up fit the job's timeout), renewals run `tpuserve renew` every 15 minutes,
and the concurrency groups keep updates of one stack apart without a renewal and a deploy cancelling or holding each
other."""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from tests.fakes.pulumi_harness import ROOT
from tpuserve.ops.destroy import destroy
from tpuserve.ops.renew import DEFAULT_LEAD, renew
from tpuserve.ops.up import BOOT_UPDATE_S, CLEANUP_TIMEOUT_S, parse_deadline, up

WORKFLOWS = ROOT / ".github" / "workflows"


def test_every_deploy_job_runs_up_with_a_deadline_that_fits_the_job():
    deploy = yaml.safe_load((WORKFLOWS / "deploy.yml").read_text())
    job = yaml.safe_load((WORKFLOWS / "pulumi.yml").read_text())["jobs"]["pulumi"]
    # A push never replaces a VM on its own; a person does, from the workflow's form
    assert deploy[True]["workflow_dispatch"]["inputs"]["replace_vm"] == {
        "description": deploy[True]["workflow_dispatch"]["inputs"]["replace_vm"]["description"], "type": "boolean",
        "default": False}
    for name in ("dev", "prod"):
        inputs = deploy["jobs"][name]["with"]
        assert inputs["command"] == "up"
        assert inputs["replace-vm"] == "${{ inputs.replace_vm || false }}"
        # A VM granted from the queue at the deadline still boots behind its gate, then the clean-up runs.
        assert parse_deadline(inputs["deadline"]) + BOOT_UPDATE_S + CLEANUP_TIMEOUT_S <= job["timeout-minutes"] * 60, \
            name


def test_the_up_step_is_a_valid_tpuserve_up_command_with_the_policy_pack():
    steps = yaml.safe_load((WORKFLOWS / "pulumi.yml").read_text())["jobs"]["pulumi"]["steps"]
    step = next(step for step in steps if step.get("if") == "inputs.command == 'up'")
    for replace_vm in ("", "--replace-vm"):  # what REPLACE_VM is without and with the input
        argv = shlex.split(step["run"].replace("$STACK", "dev").replace("$DEADLINE", step["env"]["DEADLINE"])
                           .replace("$REPLACE_VM", replace_vm))
        assert argv[:2] == [".venv/bin/tpuserve", "up"]
        params = up.make_context("up", argv[2:]).params
        assert params["replace_vm"] is bool(replace_vm)
    assert step["env"]["REPLACE_VM"] == "${{ inputs.replace-vm && '--replace-vm' || '' }}"
    assert params["stack"] == "dev" and params["deadline_text"] == "${{ inputs.deadline }}"
    assert params["yes"] and params["retry_until_up"] and params["as_json"]
    assert params["pulumi_args"] == ("--policy-pack", "policy", "--policy-pack-config", "policy/config/dev.json")
    assert params["queue"]  # a deploy with no VM waits in Compute Engine's queue once no zone has a TPU free
    install = next(step for step in steps if step.get("uses", "").startswith("pulumi/actions"))
    # preview runs in the action; up, destroy and renew through tpuserve, the action then only installs.
    assert install["with"]["command"] == "${{ inputs.command == 'preview' && inputs.command || '' }}"


def test_the_destroy_step_is_tpuserve_destroy_which_ends_with_the_inventory():
    steps = yaml.safe_load((WORKFLOWS / "pulumi.yml").read_text())["jobs"]["pulumi"]["steps"]
    step = next(step for step in steps if step.get("if") == "inputs.command == 'destroy'")
    argv = shlex.split(step["run"].replace("$STACK", "dev"))
    assert argv[:2] == [".venv/bin/tpuserve", "destroy"]
    params = destroy.make_context("destroy", argv[2:]).params
    assert params["stack"] == "dev" and params["yes"] and params["as_json"]


def test_renewal_runs_every_15_minutes_in_the_deploy_job_with_its_auth():
    workflow = yaml.safe_load((WORKFLOWS / "renew.yml").read_text())
    assert workflow[True]["schedule"] == [{"cron": "*/15 * * * *"}]  # yaml reads the `on:` key as True
    job = workflow["jobs"]["dev"]
    assert job["uses"] == "./.github/workflows/pulumi.yml"  # the deploy's own job: same auth and environment
    assert job["with"] == {"stack": "dev", "command": "renew"}
    pulumi_job = yaml.safe_load((WORKFLOWS / "pulumi.yml").read_text())["jobs"]["pulumi"]
    # One renewal at its worst: tries until the old VM's deletion, the last successor's boot, the clean-up.
    assert parse_deadline(DEFAULT_LEAD) + BOOT_UPDATE_S + CLEANUP_TIMEOUT_S <= pulumi_job["timeout-minutes"] * 60


def test_the_renew_step_is_a_valid_renew_command_with_the_policy_pack():
    steps = yaml.safe_load((WORKFLOWS / "pulumi.yml").read_text())["jobs"]["pulumi"]["steps"]
    step = next(step for step in steps if step.get("if") == "inputs.command == 'renew'")
    argv = shlex.split(step["run"].replace("$STACK", "dev"))
    assert argv[:2] == [".venv/bin/tpuserve", "renew"]
    params = renew.make_context("renew", argv[2:]).params
    assert params["stack"] == "dev" and params["yes"] and params["as_json"]
    assert params["lead_text"] == DEFAULT_LEAD == "45m"
    assert params["pulumi_args"] == ("--policy-pack", "policy", "--policy-pack-config", "policy/config/dev.json")


# --- concurrency: the groups each caller's jobs land in, and GitHub's rules replayed on them -------------------------
#
# GitHub's semantics (docs.github.com/en/actions/using-jobs/using-concurrency): a group holds at most one running and
# one pending job; a job queued while another of the group runs becomes the pending one and cancels any pending job
# before it; `cancel-in-progress` true also cancels the running one. Group names are case-insensitive. The group and
# cancel-in-progress of the reusable job are expressions of its inputs, so they are evaluated here for every caller,
# by a small evaluator of the expression syntax they use (docs.github.com, "Evaluate expressions in workflows":
# literals, contexts, ==, !=, !, && and || returning an operand, format()).

TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)|(?P<op>==|!=|&&|\|\||[!(),])"
                   r"|(?P<name>[A-Za-z_][A-Za-z0-9_.-]*))")


def evaluate(expression: str, contexts: dict[str, Any]) -> Any:
    """The value of one `${{ }}` body."""
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(expression.rstrip()):
        match = TOKEN.match(expression, position)
        assert match, f"cannot read {expression[position:]!r}"
        kind = match.lastgroup or ""
        tokens.append((kind, match[kind]))
        position = match.end()
    tokens.append(("end", ""))
    at = 0

    def peek() -> str:
        return tokens[at][1]

    def take(expected: str | None = None) -> tuple[str, str]:
        nonlocal at
        token = tokens[at]
        assert expected is None or token[1] == expected, (expected, token, expression)
        at += 1
        return token

    def primary() -> Any:
        kind, text = take()
        if text == "!":
            return not truthy(primary())
        if text == "(":
            value = either()
            take(")")
            return value
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text)
        if text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[text]
        if peek() == "(":  # a function call: format() is the only one these files use
            take("(")
            args = [either()]
            while peek() == ",":
                take(",")
                args.append(either())
            take(")")
            assert text == "format", text
            return re.sub(r"\{(\d+)\}", lambda m: str(args[1 + int(m[1])]), args[0])
        value: Any = contexts
        for part in text.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    def comparison() -> Any:
        left = primary()
        while peek() in ("==", "!="):
            op = take()[1]
            right = primary()
            same = str(left).lower() == str(right).lower() if isinstance(left, str) and isinstance(right, str) \
                else left == right
            left = same if op == "==" else not same
        return left

    def both() -> Any:
        left = comparison()
        while peek() == "&&":
            take()
            right = comparison()
            left = right if truthy(left) else left
        return left

    def either() -> Any:
        left = both()
        while peek() == "||":
            take()
            right = both()
            left = left if truthy(left) else right
        return left

    value = either()
    assert tokens[at][0] == "end", (tokens[at:], expression)
    return value


def truthy(value: Any) -> bool:
    return value not in (False, 0, 0.0, "", None)


def interpolate(value: Any, contexts: dict[str, Any]) -> Any:
    """A workflow value: a lone `${{ }}` keeps its type, text around expressions is joined as strings."""
    if not isinstance(value, str) or "${{" not in value:
        return value
    parts = re.split(r"\$\{\{(.*?)\}\}", value.strip(), flags=re.S)
    if len(parts) == 3 and not parts[0] and not parts[2]:
        return evaluate(parts[1], contexts)
    return "".join(part if index % 2 == 0 else str(evaluate(part, contexts)) for index, part in enumerate(parts))


@dataclass(frozen=True)
class CallerJob:
    """One job instance calling pulumi.yml: which workflow, which job, its inputs, and where its job lands."""

    workflow: str
    job: str
    inputs: dict[str, Any]
    needs: tuple[str, ...]
    group: str
    cancel_in_progress: bool

    @property
    def updates(self) -> frozenset[str]:
        """The Pulumi stacks this job updates: up/destroy/renew its stack; a preview none."""
        stack, command = self.inputs["stack"], self.inputs["command"]
        return frozenset({"up": {stack}, "destroy": {stack}, "renew": {stack}, "preview": set()}[command])


def github_context(workflow: dict[str, Any]) -> dict[str, Any]:
    on = workflow[True]  # yaml reads `on:` as True
    if "pull_request" in on:
        return {"ref": "refs/pull/7/merge", "event_name": "pull_request"}
    return {"ref": "refs/heads/main", "event_name": "push" if "push" in on else "workflow_dispatch"}


def caller_jobs() -> list[CallerJob]:
    """Every job instance of every workflow that calls pulumi.yml (matrix and dispatch choices expanded), with the
    group and cancel-in-progress of pulumi.yml's job evaluated for its inputs."""
    reusable = yaml.safe_load((WORKFLOWS / "pulumi.yml").read_text())
    concurrency = reusable["jobs"]["pulumi"]["concurrency"]
    defaults = {name: spec.get("default") for name, spec in reusable[True]["workflow_call"]["inputs"].items()}
    found = []
    for path in sorted(WORKFLOWS.glob("*.yml")):
        workflow = yaml.safe_load(path.read_text())
        github = github_context(workflow)
        dispatch = (workflow[True].get("workflow_dispatch") or {}).get("inputs") or {}
        choices = [dict(zip(dispatch, values)) for values in itertools.product(
            *[spec.get("options") or ["x"] for spec in dispatch.values()])] or [{}]
        for job_name, job in workflow["jobs"].items():
            if job.get("uses") != "./.github/workflows/pulumi.yml":
                continue
            matrix = (job.get("strategy") or {}).get("matrix") or {}
            for combo in itertools.product(*matrix.values()):
                for dispatched in choices:
                    outer = {"github": github, "matrix": dict(zip(matrix, combo)), "inputs": dispatched}
                    inputs = {**defaults, **{k: interpolate(v, outer) for k, v in job["with"].items()}}
                    inner = {"github": github, "inputs": inputs}
                    needs = job.get("needs") or ()
                    found.append(CallerJob(path.stem, job_name, inputs, (needs,) if isinstance(needs, str)
                                           else tuple(needs), str(interpolate(concurrency["group"], inner)).lower(),
                                           truthy(interpolate(concurrency["cancel-in-progress"], inner))))
    return found


def test_every_caller_is_found_with_its_evaluated_group() -> None:
    """The evaluator reads the real expressions: each command lands where the comment in pulumi.yml says."""
    groups = {(job.workflow, job.inputs["stack"], job.inputs["command"]): job.group for job in caller_jobs()}
    assert groups == {
        ("deploy", "dev", "up"): "pulumi-dev-update", ("deploy", "prod", "up"): "pulumi-prod-update",
        ("destroy", "dev", "destroy"): "pulumi-dev-update", ("destroy", "prod", "destroy"): "pulumi-prod-update",
        ("preview", "dev", "preview"): "pulumi-dev-preview-refs/pull/7/merge",
        ("preview", "prod", "preview"): "pulumi-prod-preview-refs/pull/7/merge",
        ("renew", "dev", "renew"): "pulumi-dev-renew"}
    assert evaluate("a == 'A' && format('x-{0}-{1}', 'y', 2) || 'z'", {"a": "a"}) == "x-y-2.0"  # GitHub's == is
    assert evaluate("!(1 == 2) && ''", {}) == ""  # case-insensitive on strings; && and || return an operand


def test_jobs_that_update_one_stack_share_a_group_and_no_update_is_ever_cancelled_while_running() -> None:
    jobs = caller_jobs()
    for first, second in itertools.combinations(jobs, 2):
        # Two updates of one stack would fight over its lock: they queue in one group, except a renewal, which waits
        # for the lock itself (test_a_renewal_that_meets_the_stack_locked_waits_for_it, tests/cli/test_lifecycle.py).
        if first.updates & second.updates and "renew" not in (first.inputs["command"], second.inputs["command"]):
            assert first.group == second.group, (first, second)
    for job in jobs:
        # A cancelled `pulumi up`/`destroy`/renewal leaves a locked, half-applied stack: only previews cancel.
        assert job.cancel_in_progress == (job.inputs["command"] == "preview"), job
        if not job.updates:  # read-only jobs never share a group with an update (they would cancel its pending one)
            assert all(other.group != job.group for other in jobs if other.updates), job


def test_renewals_and_deploys_never_share_a_group() -> None:
    jobs = caller_jobs()
    renewals = [job for job in jobs if job.inputs["command"] == "renew"]
    assert renewals
    for renewal in renewals:
        assert all(other.group != renewal.group for other in jobs if other.inputs["command"] != "renew"), renewal


class Actions:
    """GitHub's concurrency rules for job instances, replayed on a clock (minutes): queue, start, finish, cancel."""

    def __init__(self) -> None:
        self.running: dict[str, tuple[str, float]] = {}  # group -> (job id, ends at)
        self.pending: dict[str, tuple[str, float, float]] = {}  # group -> (job id, duration, queued at)
        self.log: dict[str, dict[str, Any]] = {}  # job id -> queued, started, finished or cancelled

    def queue(self, job_id: str, job: CallerJob, duration: float, now: float) -> None:
        self.log[job_id] = {"queued": now, "job": job}
        if job.cancel_in_progress and job.group in self.running:
            self.log[self.running.pop(job.group)[0]]["cancelled"] = now
        if job.group not in self.running:
            self.start(job_id, job.group, duration, now)
            return
        if job.group in self.pending:
            self.log[self.pending[job.group][0]]["cancelled"] = now
        self.pending[job.group] = (job_id, duration, now)

    def start(self, job_id: str, group: str, duration: float, now: float) -> None:
        self.running[group] = (job_id, now + duration)
        self.log[job_id]["started"] = now

    def advance(self, now: float, on_finish: Any) -> None:
        """Finish every job that ends by `now`, in time order, starting pending ones as their group frees."""
        while True:
            ending = sorted((end, group) for group, (_, end) in self.running.items() if end <= now)
            if not ending:
                return
            end, group = ending[0]
            job_id = self.running.pop(group)[0]
            self.log[job_id]["finished"] = end
            if group in self.pending:
                pending_id, duration, _ = self.pending.pop(group)
                self.start(pending_id, group, duration, end)
            on_finish(job_id, end)


def test_github_rules_replayed_renewals_keep_their_lead_and_every_pushed_deploy_reaches_prod() -> None:
    """Three pushes to main a minute apart deploy dev for 100 minutes each (its deadline, capacity search and queue)
    while renewals come every 15 minutes (2 minutes when nothing is due, 25 when one renews, one 40 minutes long):
    a renewal is cancelled only by a newer one, which renews the same VM, every tick is followed by a renewal start
    within 25 minutes (inside the 45-minute lead), the only deploy cancelled is the second push's pending one (the
    newest main supersedes it), and each remaining push's prod runs after its dev. (Where a renewal and a deploy
    both run `pulumi up`, Pulumi's lock orders them: the later one waits, Deployer.update.)"""
    by_key = {(job.workflow, job.job): job for job in caller_jobs()}
    deploy_dev, deploy_prod, renewal = by_key[("deploy", "dev")], by_key[("deploy", "prod")], by_key[("renew", "dev")]
    assert deploy_prod.needs == ("dev",)
    actions = Actions()
    waiting_for: dict[str, str] = {}  # a job id -> the job id it needs

    def on_finish(job_id: str, end: float) -> None:
        for dependent, needed in list(waiting_for.items()):
            if needed == job_id:
                del waiting_for[dependent]
                actions.queue(dependent, deploy_prod, 5, end)

    events = [(0.0, "push-0"), (1.0, "push-1"), (2.0, "push-2")] + [(15.0 * n, f"renew-{n}") for n in range(1, 16)]
    for at, name in sorted(events):
        actions.advance(at, on_finish)
        if name.startswith("push"):
            actions.queue(f"{name}/dev", deploy_dev, 100, at)
            waiting_for[f"{name}/prod"] = f"{name}/dev"
        else:
            number = int(name.split("-")[1])
            actions.queue(name, renewal, 40 if number == 4 else 25 if number % 3 == 1 else 2, at)
    actions.advance(10_000, on_finish)

    log = actions.log
    started = sorted(entry["started"] for job_id, entry in log.items() if job_id.startswith("renew")
                     and "started" in entry)
    for at, name in events:
        if name.startswith("renew"):
            assert any(at <= start <= at + 25 for start in started), name
    assert parse_deadline(DEFAULT_LEAD) / 60 > 15 + 25  # the lead covers a schedule interval plus that wait
    cancelled = {job_id for job_id, entry in log.items() if "cancelled" in entry}
    assert cancelled == {"push-1/dev", "renew-5"}  # renew-5 waited behind the 40-minute renew-4; renew-6 replaced it
    assert log["push-0/prod"]["started"] >= log["push-0/dev"]["finished"]
    assert log["push-2/prod"]["started"] >= log["push-2/dev"]["finished"] and "finished" in log["push-2/prod"]
