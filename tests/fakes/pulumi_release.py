"""A fake Pulumi CLI release in the real release layout, a fake `pulumi` to put in it or on PATH, and a sandbox that
runs the repository's real scripts (copied into a scratch "clone") with only the tools they need on PATH.

Release layout, copied from public sources:
- archive names: pulumi/pulumi .goreleaser.yml, `name_template: '{{ .ProjectName }}-{{ .Tag }}-{{ .Os }}-{{ if eq
  .Arch "amd64" }}x64{{ else }}{{ .Arch }}{{ end }}'` for goos linux/darwin/windows x goarch amd64/arm64, zip on
  windows: pulumi-v3.X.Y-linux-x64.tar.gz, -linux-arm64, -darwin-x64, -darwin-arm64, -windows-x64.zip, ...
- inner layout: same file, `wrap_in_directory: pulumi{{ if eq .Os "windows" }}/bin{{ end }}` with the binaries
  pulumi, pulumi-language-python, pulumi-language-nodejs, ... at that level (pulumi/get.pulumi.com dist/install.sh
  copies "${EXTRACT_DIR}/pulumi/." into ~/.pulumi/bin).
- checksums file: same file, `checksum: name_template: "{{ .ProjectName }}-{{ .Version }}-checksums.txt"` (Version has
  no leading v); GoReleaser's default algorithm is sha256 and it writes "%v  %v\\n" (hex digest, two spaces, archive
  name), lines sorted by name (goreleaser internal/pipe/checksums/checksums.go).
- host: pulumi/docs data/versions.json lists, per release, "downloads" such as
  https://get.pulumi.com/releases/sdk/pulumi-v3.83.0-linux-x64.tar.gz and "checksums"
  https://get.pulumi.com/releases/sdk/pulumi-3.83.0-checksums.txt (pulumi/actions reads the same file).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.fakes.httpfake import FakeServer, Request, Response

ROOT = Path(__file__).resolve().parents[2]
RELEASES_PATH = "/releases/sdk"
# What the scripts may call; nothing else is on PATH, so no real pulumi or gcloud can leak in.
TOOLS = ("bash", "env", "curl", "tar", "gzip", "sha256sum", "awk", "sed", "mktemp", "uname", "dirname", "tr",
         "head", "cut", "mkdir", "mv", "rm", "cat", "chmod")
PLATFORMS = ("linux-x64", "linux-arm64", "darwin-x64", "darwin-arm64", "windows-x64", "windows-arm64")


def fake_pulumi(version: str) -> str:
    """A `pulumi` that prints `version` like the real one ("v3.X.Y") and logs every other call, one line each:
    the arguments, then PULUMI_BACKEND_URL. FAKE_TARGET / FAKE_PROJECT answer `config get target|project`; unset,
    the call fails the way the CLI does for a key the stack lacks."""
    return f"""#!/usr/bin/env bash
if [[ $1 == version ]]; then echo v{version}; exit 0; fi
echo "$* | $PULUMI_BACKEND_URL" >>"$PULUMI_LOG"
if [[ $1 == config && $2 == get ]]; then
  var=FAKE_${{3^^}}
  if [[ -n ${{!var:-}} ]]; then echo "${{!var}}"; exit 0; fi
  echo "error: configuration key 'tpu-serve:$3' not found for stack '$5'" >&2
  exit 255
fi
exit 0
"""


def release_archive(version: str, pulumi_script: str | None = None) -> bytes:
    """pulumi-vX.Y.Z-<os>-<arch>.tar.gz as GoReleaser wraps it: pulumi/pulumi and a language host beside it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        directory = tarfile.TarInfo("pulumi")
        directory.type, directory.mode = tarfile.DIRTYPE, 0o755
        archive.addfile(directory)
        for name, text in (("pulumi/pulumi", pulumi_script or fake_pulumi(version)),
                           ("pulumi/pulumi-language-python", "#!/bin/sh\nexit 0\n")):
            data = text.encode()
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(data), 0o755
            archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def archive_name(version: str, platform: str) -> str:
    return f"pulumi-v{version}-{platform}.{'zip' if platform.startswith('windows') else 'tar.gz'}"


def checksums_file(version: str, archives: dict[str, bytes]) -> str:
    """pulumi-X.Y.Z-checksums.txt: every platform's archive, "<sha256>  <name>", sorted by name. Platforms the test
    does not serve get the digest of stand-in bytes."""
    lines = []
    for platform in PLATFORMS:
        name = archive_name(version, platform)
        data = archives.get(name, f"stand-in {name}".encode())
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    return "".join(sorted(lines, key=lambda line: line.split("  ")[1]))


@dataclass
class Release:
    """One release served under /releases/sdk: its archives and checksums file (editable before the run)."""
    version: str
    archives: dict[str, bytes] = field(default_factory=dict)
    checksums: str = ""
    unavailable: bool = False  # every file answers 503, which curl --retry retries (no network to the releases)

    @classmethod
    def build(cls, version: str, platform: str = "linux-x64", pulumi_script: str | None = None) -> Release:
        archives = {archive_name(version, platform): release_archive(version, pulumi_script)}
        return cls(version, archives, checksums_file(version, archives))

    def routes(self) -> dict:
        def serve(body: bytes | str):
            return lambda request: Response(503, "Service Unavailable") if self.unavailable else Response(200, body)

        routes = {("GET", f"{RELEASES_PATH}/{name}"): serve(data) for name, data in self.archives.items()}
        routes[("GET", f"{RELEASES_PATH}/pulumi-{self.version}-checksums.txt")] = serve(self.checksums)
        return routes


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    requests: list[Request]


class Clone:
    """A scratch copy of the repository's scripts, run with a hermetic PATH: `bin/` (fakes) then the tools above."""

    def __init__(self, root: Path):
        self.root = root / "clone"
        (self.root / "scripts").mkdir(parents=True)
        for name in ("scripts/install-pulumi.sh", "scripts/up.sh", ".pulumi-version", "pyproject.toml"):
            shutil.copy2(ROOT / name, self.root / name)
        self.bin = root / "bin"
        self.tools = root / "tools"
        self.tmp = root / "tmp"
        for directory in (self.bin, self.tools, self.tmp):
            directory.mkdir()
        for tool in TOOLS:
            found = shutil.which(tool)
            assert found, f"the tests need {tool} on PATH"
            (self.tools / tool).symlink_to(found)
        self.pulumi_log = root / "pulumi.log"
        self.env = {"PATH": f"{self.bin}:{self.tools}", "HOME": str(root), "TMPDIR": str(self.tmp),
                    "PULUMI_LOG": str(self.pulumi_log), "LANG": "C.UTF-8"}
        self.fake_uname("Linux", "x86_64")  # the same archive name on every test machine

    def pin(self, version: str) -> None:
        (self.root / ".pulumi-version").write_text(f"{version}\n")

    def put_on_path(self, name: str, script: str) -> Path:
        path = self.bin / name
        path.write_text(script)
        path.chmod(0o755)
        return path

    def fake_uname(self, system: str, machine: str) -> None:
        self.put_on_path("uname", f'#!/bin/sh\ncase "$1" in -s) echo {system} ;; -m) echo {machine} ;; esac\n')

    @property
    def installed(self) -> Path:
        return self.root / ".tools" / "pulumi" / "bin"

    def pulumi_calls(self) -> list[str]:
        return self.pulumi_log.read_text().splitlines() if self.pulumi_log.exists() else []

    def run(self, script: str, *args: str, release: Release | None = None, env: dict[str, str] | None = None,
            timeout: float = 60) -> Result:
        with FakeServer(release.routes() if release else {}) as server:
            full_env = {**self.env, "TPUSERVE_PULUMI_DOWNLOAD_URL": f"{server.url}{RELEASES_PATH}", **(env or {})}
            done = subprocess.run([str(self.root / "scripts" / script), *args], cwd=self.root, env=full_env,
                                  capture_output=True, text=True, timeout=timeout)
            return Result(done.returncode, done.stdout, done.stderr, list(server.requests))


def no_strays(directory: Path) -> bool:
    return not any(os.scandir(directory))
