"""`tpuserve check --stack S` (issue 34 item 6): a stack file checked offline with the program's own rules, in a
scratch project (this checkout's components/ and Pulumi.yaml) holding the files under test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpuserve.cli import main
from tpuserve.deploy.check import read_stack_file, settings_of

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(path.name[len("Pulumi."):-len(".yaml")] for path in ROOT.glob("Pulumi.*.yaml"))
DEV = (ROOT / "Pulumi.dev.yaml").read_text()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Pulumi project with this checkout's program and the dev stack file, as the working directory."""
    (tmp_path / "components").symlink_to(ROOT / "components")
    (tmp_path / "Pulumi.yaml").symlink_to(ROOT / "Pulumi.yaml")
    (tmp_path / "Pulumi.dev.yaml").write_text(DEV)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def check(*args: str):
    return CliRunner().invoke(main, ["check", *args])


@pytest.mark.parametrize("stack", SHIPPED)
def test_every_shipped_stack_file_passes(stack: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(ROOT)
    result = check("--stack", stack, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["ok"] is True and document["file"] == str(ROOT / f"Pulumi.{stack}.yaml")


@pytest.mark.parametrize("stack", SHIPPED)
def test_the_file_is_read_as_the_pulumi_harness_reads_it(stack: str):
    """The same settings the stack tests run the program with (tests/fakes/pulumi_harness.py stack_file_config)."""
    from tests.fakes.pulumi_harness import stack_file_config

    raw, problems = settings_of(read_stack_file(ROOT / f"Pulumi.{stack}.yaml"))
    assert (raw, problems) == (stack_file_config(stack), [])


def test_each_problem_is_one_line_naming_its_key_and_the_file_exits_2(project: Path):
    (project / "Pulumi.dev.yaml").write_text(DEV.replace("tpu-serve:zone:", "tpu-serve:zoen:").replace(
        "maxRunDuration: 4h", "maxRunDuration: forever") + "  tpu-serve:externalIp: maybe\n  gcp:region: x\n")
    result = check("--stack", "dev")
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines == [
        "Pulumi.dev.yaml: zoen: unknown setting (did you mean zone?); Pulumi.yaml lists every setting with its "
        "description",
        "Pulumi.dev.yaml: externalIp: expected true or false, got 'maybe'",
        "Pulumi.dev.yaml: maxRunDuration: 'forever' is not a duration like 4h, 90m or 1d12h",
        "Error: Pulumi.dev.yaml: zoen: unknown setting (did you mean zone?); Pulumi.yaml lists every setting with its "
        "description (and 2 more, above)"]  # gcp:region is the provider's, not judged here
    document = json.loads(check("--stack", "dev", "--json").stdout)
    assert (document["ok"], document["exit"], len(document["problems"])) == (False, 2, 3)


def test_a_rule_about_keys_together_is_the_programs(project: Path):
    (project / "Pulumi.dev.yaml").write_text(DEV.replace("  tpu-serve:hfTokenSecretId: hf-token\n", ""))
    result = check("--stack", "dev")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: Pulumi.dev.yaml: hfTokenSecretId: set exactly one of hfTokenSecretId (an existing secret) or hfToken "
        "(pulumi config set --secret hfToken ...)")


def test_a_key_of_another_target_names_the_target_it_belongs_to(project: Path):
    local = (ROOT / "Pulumi.local.yaml").read_text()
    (project / "Pulumi.local.yaml").write_text(local + "  tpu-serve:zone: us-east5-b\n  tpu-serve:gkeMaxNodes: 4\n")
    result = check("--stack", "local")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[:2] == ["Pulumi.local.yaml: zone: applies to targets gcp and gke, not local",
                                              "Pulumi.local.yaml: gkeMaxNodes: applies to target gke, not local"]


def test_a_secret_counts_as_set_and_its_value_is_never_shown(project: Path):
    (project / "Pulumi.dev.yaml").write_text(DEV.replace("  tpu-serve:hfTokenSecretId: hf-token\n", "  tpu-serve:hfToken:\n    secure: v1:AAAA-cipher-text\n"))
    result = check("--stack", "dev", "--json")
    assert result.exit_code == 0, result.output
    assert "hfToken" in json.loads(result.stdout)["settings"] and "cipher" not in result.output


@pytest.mark.parametrize("text, said", [
    ("config:\n  tpu-serve:zone: [unclosed\n", "Pulumi.dev.yaml line 3: not YAML (expected ',' or ']', but got "
                                               "'<stream end>')"),
    ("config: just-text\n", "Pulumi.dev.yaml: `config:` must be a mapping of namespace:key to value"),
    ("config:\n  zone: europe-west4-a\n  tpu-serve:project: my-ml-sandbox\n  tpu-serve:hfTokenSecretId: t\n",
     "Pulumi.dev.yaml: zone: a stack file's keys are namespace:name: write tpu-serve:zone"),
])
def test_a_file_that_is_no_stack_file_is_one_line(project: Path, text: str, said: str):
    (project / "Pulumi.dev.yaml").write_text(text)
    result = check("--stack", "dev")
    assert (result.exit_code, result.stderr.splitlines()[-1]) == (2, f"Error: {said}")


def test_a_misspelled_stack_names_the_stacks_there_are(project: Path):
    (project / "Pulumi.prod.yaml").write_text(DEV)
    result = check("--stack", "dve")
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        f"Error: Invalid value for --stack: no Pulumi.dve.yaml in {project} (did you mean dev?): the stacks here are "
        "dev, prod; a new stack starts as a copy of one: cp Pulumi.dev.yaml Pulumi.dve.yaml")


def test_it_finds_the_project_from_below_and_says_when_there_is_none(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path_factory: pytest.TempPathFactory):
    (project / "docs").mkdir()
    monkeypatch.chdir(project / "docs")
    assert check("--stack", "dev").exit_code == 0
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    result = check("--stack", "dev")
    assert result.exit_code == 2 and "no Pulumi.yaml in " in result.output.splitlines()[-1]


def test_it_needs_neither_the_pulumi_cli_nor_the_pulumi_sdk(project: Path):
    """Offline: a PATH without pulumi, and the Pulumi SDK never imported (nor the cloud clients)."""
    probe = ("import sys\nfrom click.testing import CliRunner\nfrom tpuserve.cli import main\n"
             "result = CliRunner().invoke(main, ['check', '--stack', 'dev'])\n"
             "print(result.exit_code, sorted({m.split('.')[0] for m in sys.modules} & {'pulumi', 'pulumi_gcp', "
             "'google', 'requests'}))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=project, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(project)}, check=True)
    assert done.stdout.split(None, 1) == ["0", "[]\n"]
