"""scripts/install-pulumi.sh, run for real against a fake release server on 127.0.0.1 (layout: tests/fakes/pulumi_release.py).

Each test copies the script into a scratch clone and runs it with only the tools it needs on PATH, so no real pulumi
can be found and nothing but 127.0.0.1 is reached.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.fakes.pulumi_release import ROOT, Clone, Release, archive_name, fake_pulumi, no_strays, release_archive

PIN = "3.272.0"
CHECKSUMS_PATH = "/releases/sdk/pulumi-3.272.0-checksums.txt"
ARCHIVE_PATH = "/releases/sdk/pulumi-v3.272.0-linux-x64.tar.gz"


@pytest.fixture
def clone(tmp_path: Path) -> Clone:
    clone = Clone(tmp_path)
    clone.pin(PIN)
    return clone


def paths(result) -> list[str]:
    return [request.path for request in result.requests]


def version_of(pulumi: Path) -> str:
    return subprocess.run([str(pulumi), "version"], capture_output=True, text=True, check=True).stdout.strip()


def test_without_pulumi_the_pinned_release_is_verified_installed_and_used(clone: Clone):
    result = clone.run("install-pulumi.sh", release=Release.build(PIN))

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{clone.installed}\n"
    # The checksums come first: the archive is checked against them before anything is unpacked.
    assert paths(result) == [CHECKSUMS_PATH, ARCHIVE_PATH]
    assert version_of(clone.installed / "pulumi") == "v3.272.0"
    assert (clone.installed / "pulumi-language-python").is_file()
    assert sorted(p.name for p in (clone.root / ".tools" / "pulumi").iterdir()) == ["bin"]  # no staging left
    assert no_strays(clone.tmp)
    assert "installed pulumi v3.272.0" in result.stderr


def test_a_second_run_reuses_the_installed_cli_without_a_download(clone: Clone):
    release = Release.build(PIN)
    assert clone.run("install-pulumi.sh", release=release).returncode == 0

    again = clone.run("install-pulumi.sh", release=release)

    assert again.returncode == 0, again.stderr
    assert again.stdout == f"{clone.installed}\n"
    assert again.requests == []


def test_a_checksum_mismatch_is_refused_and_nothing_is_installed(clone: Clone):
    release = Release.build(PIN)
    # Another, well-formed archive whose pulumi would leave a mark if it were ever unpacked and run.
    marker = clone.root.parent / "ran-unverified-code"
    release.archives[archive_name(PIN, "linux-x64")] = release_archive(
        PIN, f"#!/bin/sh\ntouch {marker}\necho v{PIN}\n")

    result = clone.run("install-pulumi.sh", release=release)

    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[-1].startswith("install-pulumi: checksum mismatch for pulumi-v3.272.0-linux-x64.tar.gz (expected ")
    assert "nothing was installed" in lines[-1]
    assert not (clone.root / ".tools").exists()
    assert no_strays(clone.tmp)
    assert not marker.exists()


def test_an_archive_missing_from_the_checksums_file_is_refused(clone: Clone):
    release = Release.build(PIN)
    release.checksums = "".join(line for line in release.checksums.splitlines(keepends=True)
                                if not line.endswith("-linux-x64.tar.gz\n"))

    result = clone.run("install-pulumi.sh", release=release)

    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == ("install-pulumi: pulumi-3.272.0-checksums.txt lists no checksum for "
                                              "pulumi-v3.272.0-linux-x64.tar.gz; nothing was installed")
    assert not (clone.root / ".tools").exists()


def test_a_failed_download_stops_with_one_line_and_installs_nothing(clone: Clone):
    release = Release.build(PIN)
    release.archives.clear()  # the server answers 404 for the archive

    result = clone.run("install-pulumi.sh", release=release)

    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[-1].startswith("install-pulumi: could not download http://127.0.0.1:")
    assert "/releases/sdk/pulumi-v3.272.0-linux-x64.tar.gz (" in lines[-1]
    assert "404" in lines[-1]
    assert not (clone.root / ".tools").exists()
    assert no_strays(clone.tmp)


def test_an_archive_that_is_not_the_pinned_cli_is_refused(clone: Clone):
    # Checksums match (the release is self-consistent) but the binary inside reports another version.
    release = Release.build(PIN, pulumi_script=fake_pulumi("3.100.0"))

    result = clone.run("install-pulumi.sh", release=release)

    assert result.returncode == 1
    assert "does not hold pulumi/pulumi reporting v3.272.0 (got '3.100.0')" in result.stderr.splitlines()[-1]
    assert sorted(p.name for p in (clone.root / ".tools" / "pulumi").iterdir()) == []


@pytest.mark.parametrize("version", ["3.200.0", "3.305.2"])
def test_a_pulumi_on_path_at_or_above_the_minimum_is_used_without_a_download(clone: Clone, version: str):
    own = clone.put_on_path("pulumi", fake_pulumi(version))

    result = clone.run("install-pulumi.sh", release=Release.build(PIN))

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{own.parent}\n"
    assert result.requests == []
    assert not (clone.root / ".tools").exists()


@pytest.mark.parametrize("version", ["3.199.9", "2.25.2"])
def test_a_pulumi_on_path_older_than_the_minimum_triggers_the_download(clone: Clone, version: str):
    clone.put_on_path("pulumi", fake_pulumi(version))

    result = clone.run("install-pulumi.sh", release=Release.build(PIN))

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{clone.installed}\n"
    assert paths(result) == [CHECKSUMS_PATH, ARCHIVE_PATH]
    assert f"is v{version}, older than the v3.200.0 this program needs" in result.stderr


def test_a_pin_bump_replaces_the_installed_cli_and_a_bad_one_keeps_the_old(clone: Clone):
    assert clone.run("install-pulumi.sh", release=Release.build(PIN)).returncode == 0

    clone.pin("3.273.1")
    bad = Release.build("3.273.1")
    bad.checksums = "".join("0" * 64 + line[64:] if line.endswith("-linux-x64.tar.gz\n") else line
                            for line in bad.checksums.splitlines(keepends=True))
    refused = clone.run("install-pulumi.sh", release=bad)
    assert refused.returncode == 1
    assert version_of(clone.installed / "pulumi") == "v3.272.0"  # the old CLI is untouched

    bumped = clone.run("install-pulumi.sh", release=Release.build("3.273.1"))
    assert bumped.returncode == 0, bumped.stderr
    assert [request.path for request in bumped.requests] == ["/releases/sdk/pulumi-3.273.1-checksums.txt",
                                                             "/releases/sdk/pulumi-v3.273.1-linux-x64.tar.gz"]
    assert version_of(clone.installed / "pulumi") == "v3.273.1"
    assert sorted(p.name for p in (clone.root / ".tools" / "pulumi").iterdir()) == ["bin"]


@pytest.mark.parametrize(("system", "machine", "archive"), [
    ("Linux", "aarch64", "pulumi-v3.272.0-linux-arm64.tar.gz"),
    ("Darwin", "arm64", "pulumi-v3.272.0-darwin-arm64.tar.gz"),
    ("Darwin", "x86_64", "pulumi-v3.272.0-darwin-x64.tar.gz"),
])
def test_the_archive_matches_the_os_and_architecture(clone: Clone, system: str, machine: str, archive: str):
    clone.fake_uname(system, machine)
    platform = archive.removeprefix("pulumi-v3.272.0-").removesuffix(".tar.gz")

    result = clone.run("install-pulumi.sh", release=Release.build(PIN, platform))

    assert result.returncode == 0, result.stderr
    assert paths(result) == [CHECKSUMS_PATH, f"/releases/sdk/{archive}"]


def test_an_unsupported_system_says_what_to_do_and_downloads_nothing(clone: Clone):
    clone.fake_uname("MINGW64_NT-10.0-19045", "x86_64")

    result = clone.run("install-pulumi.sh", release=Release.build(PIN))

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "install-pulumi: no Pulumi CLI for MINGW64_NT-10.0-19045 here: install pulumi >= 3.200.0 yourself "
        "(https://www.pulumi.com/docs/install/)"]
    assert result.requests == []


def test_the_repository_pins_one_version_that_ci_uses_too():
    pin = (ROOT / ".pulumi-version").read_text()
    assert pin.endswith("\n") and pin.count("\n") == 1
    major, minor, patch = (int(part) for part in pin.strip().split("."))
    assert (major, minor, patch) >= (3, 200, 0)  # at least the minimum (the SDK floor in pyproject.toml)

    workflow = yaml.safe_load((ROOT / ".github/workflows/pulumi.yml").read_text())
    [step] = [step for step in workflow["jobs"]["pulumi"]["steps"]
              if str(step.get("uses", "")).startswith("pulumi/actions@")]
    assert step["with"]["pulumi-version-file"] == ".pulumi-version"
    assert "pulumi-version" not in step["with"]  # the action refuses both at once


def test_the_installed_cli_is_git_ignored():
    ignored = subprocess.run(["git", "check-ignore", "--no-index", ".tools/pulumi/bin/pulumi"], cwd=ROOT,
                             capture_output=True, text=True)
    assert ignored.returncode == 0, ignored.stderr


def test_a_pulumi_on_path_that_reports_no_version_is_not_trusted(clone: Clone):
    clone.put_on_path("pulumi", "#!/bin/sh\necho 'something else entirely'\n")

    result = clone.run("install-pulumi.sh", release=Release.build(PIN))

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{clone.installed}\n"
    assert "reports no version; using v3.272.0 from .tools/pulumi instead" in result.stderr
