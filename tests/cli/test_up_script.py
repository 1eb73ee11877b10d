"""scripts/up.sh end to end on a fresh "clone": the real script and installer, a fake `pulumi` (on PATH, or inside
the fake release the installer downloads from 127.0.0.1), the real credential check (tpuserve.deploy.adc_check)
reading stub credential files, and a stand-in for scripts/bootstrap.sh (the venv is this checkout's).

Credentials never reach Google: google.auth only reads the file GOOGLE_APPLICATION_CREDENTIALS names (an
authorized_user file in the shape `gcloud auth application-default login` writes, never refreshed here), the
metadata server check is off (NO_GCE_CHECK) and points at a closed port on 127.0.0.1, and a fake gcloud fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.fakes.pulumi_release import ROOT, Clone, Release, fake_pulumi

PIN = "3.272.0"


@pytest.fixture
def clone(tmp_path: Path) -> Clone:
    clone = Clone(tmp_path)
    clone.pin(PIN)
    venv_with_stub_tpuserve(clone.root / ".venv")
    (clone.root / "scripts" / "bootstrap.sh").write_text('#!/bin/sh\necho "bootstrap $*" >>"$PULUMI_LOG"\n')
    (clone.root / "scripts" / "bootstrap.sh").chmod(0o755)
    clone.put_on_path("gcloud", '#!/bin/sh\necho "gcloud must not run in tests: $*" >&2\nexit 1\n')
    for stack in ("dev", "staging"):  # a stack is its file (scripts/up.sh refuses a name without one)
        (clone.root / f"Pulumi.{stack}.yaml").write_text((ROOT / "Pulumi.dev.yaml").read_text())
    adc = tmp_path / "application_default_credentials.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "stub.apps.googleusercontent.com",
                               "client_secret": "stub-secret", "refresh_token": "stub-refresh-token"}))
    (tmp_path / "gcloud-config").mkdir()
    clone.env.update({"GOOGLE_APPLICATION_CREDENTIALS": str(adc), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud-config"),
                      "NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9",
                      "PULUMI_CONFIG_PASSPHRASE": "test"})
    return clone


# scripts/up.sh checks the stack file with `tpuserve check` and ends by handing over to `tpuserve up`
# (tests/cli/test_check.py and tests/cli/test_up.py drive those); here a stand-in logs each call and which pulumi it would
# drive, and fails `check` with the line the real one prints when FAKE_CHECK_FAILS says so.
TPUSERVE_STUB = """#!/bin/sh
if [ "$1" = check ]; then
  echo "tpuserve $*" >>"$PULUMI_LOG"
  if [ -n "$FAKE_CHECK_FAILS" ]; then echo "Error: $FAKE_CHECK_FAILS" >&2; exit 2; fi
  exit 0
fi
echo "tpuserve $* (pulumi: $(command -v pulumi))" >>"$PULUMI_LOG"
"""


def venv_with_stub_tpuserve(venv: Path) -> None:
    """The virtualenv running the tests (this checkout's .venv: its python and packages, for the credential check)
    with `tpuserve` replaced. sys.prefix, not ROOT/.venv: scripts/mutation.sh runs the tests in a scratch copy of
    the tree, which has no .venv of its own."""
    running = Path(sys.prefix)
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text((running / "pyvenv.cfg").read_text())
    (venv / "lib").symlink_to(running / "lib")
    (venv / "bin" / "python").symlink_to(running / "bin" / "python")
    (venv / "bin" / "tpuserve").write_text(TPUSERVE_STUB)
    (venv / "bin" / "tpuserve").chmod(0o755)


def handed_over(clone: Clone) -> str:
    """The `tpuserve up` command line up.sh ended with, without the pulumi path."""
    return commands(clone)[-1].split(" (pulumi: ")[0]


def no_credentials(clone: Clone) -> None:
    del clone.env["GOOGLE_APPLICATION_CREDENTIALS"]  # and CLOUDSDK_CONFIG is an empty directory: never logged in


def commands(clone: Clone) -> list[str]:
    """The fake pulumi's calls without the backend column."""
    return [line.split(" | ")[0] for line in clone.pulumi_calls()]


def test_a_ready_machine_goes_from_setup_to_pulumi_up(clone: Clone):
    clone.put_on_path("pulumi", fake_pulumi("3.250.0"))

    result = clone.run("up.sh", "dev", "--yes", env={"FAKE_PROJECT": "my-gcp-project"})

    assert result.returncode == 0, result.stderr
    assert [*commands(clone)[:-1], handed_over(clone)] == [
        "bootstrap stack",
        "tpuserve check --stack dev",
        "stack select --create dev",
        "config get project --stack dev",
        "tpuserve up --stack dev --yes",
    ]
    backend = f"file://{clone.root}/.pulumi-state"
    assert all(line.endswith(f" | {backend}") for line in clone.pulumi_calls()[2:-1])
    assert (clone.root / ".pulumi-state").is_dir()
    assert result.requests == []  # the CLI on PATH is recent enough


def test_a_fresh_machine_gets_the_pinned_cli_and_runs_it(clone: Clone):
    result = clone.run("up.sh", "dev", release=Release.build(PIN), env={"FAKE_PROJECT": "my-gcp-project"})

    assert result.returncode == 0, result.stderr
    assert [request.path for request in result.requests] == ["/releases/sdk/pulumi-3.272.0-checksums.txt",
                                                              "/releases/sdk/pulumi-v3.272.0-linux-x64.tar.gz"]
    assert handed_over(clone) == "tpuserve up --stack dev"
    assert clone.pulumi_calls()[-1].endswith(f"(pulumi: {clone.root}/.tools/pulumi/bin/pulumi)")

    again = clone.run("up.sh", "dev", release=Release.build(PIN), env={"FAKE_PROJECT": "my-gcp-project"})
    assert again.returncode == 0, again.stderr
    assert again.requests == []


def test_a_failed_install_stops_before_any_pulumi_command(clone: Clone):
    release = Release.build(PIN)
    release.archives.clear()

    result = clone.run("up.sh", "dev", release=release)

    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("install-pulumi: could not download ")
    assert commands(clone) == ["bootstrap stack", "tpuserve check --stack dev"]


def test_missing_credentials_stop_before_pulumi_up_and_say_how_to_log_in(clone: Clone):
    clone.put_on_path("pulumi", fake_pulumi(PIN))
    no_credentials(clone)

    result = clone.run("up.sh", "dev", env={"FAKE_PROJECT": "my-gcp-project"})

    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # the one error line: the login check runs before the installer
    assert lines[-1].startswith("Error: no Google application-default credentials (")
    assert lines[-1].endswith("; run `gcloud auth application-default login`")
    assert "Traceback" not in result.stderr
    assert commands(clone) == ["bootstrap stack", "tpuserve check --stack dev"]


def test_the_login_check_comes_before_any_download(clone: Clone):
    no_credentials(clone)
    release = Release.build(PIN)
    release.unavailable = True

    result = clone.run("up.sh", "dev", release=release)

    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("Error: no Google application-default credentials (")
    assert result.requests == []  # told to log in without waiting on a download first


def test_without_network_to_the_releases_the_error_is_said_once_with_the_way_out(clone: Clone):
    release = Release.build(PIN)
    release.unavailable = True  # curl --retry 2 tries three times, and printed its error each time

    result = clone.run("up.sh", "dev", release=release)

    assert result.returncode == 1
    [line] = [line for line in result.stderr.splitlines() if "could not download" in line]
    assert line == (f"install-pulumi: could not download {line.split()[4]} ((22) The requested URL returned error: "
                    "503); nothing was installed. Any pulumi >= 3.200.0 on PATH works instead: install it "
                    "(https://www.pulumi.com/docs/install/) or copy one from a machine that has it, then run this "
                    "again; or point TPUSERVE_PULUMI_DOWNLOAD_URL at a mirror of https://get.pulumi.com/releases/sdk")
    assert result.stderr.count("503") == 1
    assert len(result.requests) == 3  # the checksums file, tried three times; the archive never
    assert commands(clone) == ["bootstrap stack", "tpuserve check --stack dev"]


def test_a_stack_without_a_project_says_the_exact_command(clone: Clone):
    clone.put_on_path("pulumi", fake_pulumi(PIN))

    result = clone.run("up.sh", "staging")

    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "Error: stack staging names no GCP project: run "
        f"`PULUMI_BACKEND_URL=file://{clone.root}/.pulumi-state pulumi config set -s staging project YOUR_PROJECT_ID`")
    assert commands(clone)[-1] == "config get project --stack staging"


def test_the_project_hint_names_the_installed_cli_and_leaves_a_chosen_backend_alone(clone: Clone):
    result = clone.run("up.sh", "dev", release=Release.build(PIN), env={"PULUMI_BACKEND_URL": "gs://my-state"})

    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "Error: stack dev names no GCP project: run "
        "`.tools/pulumi/bin/pulumi config set -s dev project YOUR_PROJECT_ID`")
    assert clone.pulumi_calls()[2] == "stack select --create dev | gs://my-state"


def test_a_local_stack_needs_neither_google_credentials_nor_a_project(clone: Clone):
    clone.put_on_path("pulumi", fake_pulumi(PIN))
    no_credentials(clone)

    (clone.root / "Pulumi.local.yaml").write_text((ROOT / "Pulumi.local.yaml").read_text())  # target: local

    result = clone.run("up.sh", "local")

    assert result.returncode == 0, result.stderr
    assert [*commands(clone)[:-1], handed_over(clone)] == ["bootstrap stack", "tpuserve check --stack local",
                                                           "stack select --create local", "tpuserve up --stack local"]


# Issue 34 item 6: a misspelled stack is not created, and a bad stack file stops everything before it starts.
def test_a_stack_without_its_file_is_refused_naming_the_stacks_there_are(clone: Clone):
    clone.put_on_path("pulumi", fake_pulumi(PIN))

    result = clone.run("up.sh", "dve")

    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "Error: no Pulumi.dve.yaml, so no stack dve: the stacks here are dev, staging; a new stack starts as a copy "
        "of one (cp Pulumi.dev.yaml Pulumi.dve.yaml)"]
    assert commands(clone) == []  # nothing set up, no stack created
    assert not (clone.root / ".pulumi-state").exists()


def test_a_bad_stack_file_stops_before_the_login_check_and_any_download(clone: Clone):
    no_credentials(clone)
    release = Release.build(PIN)

    result = clone.run("up.sh", "dev", release=release, env={"FAKE_CHECK_FAILS": "Pulumi.dev.yaml: zoen: unknown "
                                                                                 "setting (did you mean zone?)"})

    assert result.returncode == 2
    assert result.stderr.splitlines() == ["Error: Pulumi.dev.yaml: zoen: unknown setting (did you mean zone?)"]
    assert commands(clone) == ["bootstrap stack", "tpuserve check --stack dev"]
    assert result.requests == []
