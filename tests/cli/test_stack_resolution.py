"""`--stack` resolution: stack outputs from the pulumi CLI and the IAP tunnel from gcloud, both replaced by PATH
shims. The fake gcloud records its argv and serves HTTP on the local port it was asked for (127.0.0.1 only)."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from tpuserve.deploy import stack
from tpuserve.deploy.pulumi_cli import missing_cli
from tpuserve.serving import ConfigError

GCP_OUTPUTS = {"target": "gcp", "instanceName": "tpu-serve-dev", "zone": "us-east5-b", "project": "my-ml-sandbox",
               "endpoint": "http://10.150.0.7:8000/v1", "model": "google/gemma-4-E2B-it"}
LOCAL_OUTPUTS = {"target": "local", "endpoint": "http://127.0.0.1:8011/v1", "model": "google/gemma-4-E2B-it"}

FAKE_PULUMI = """#!/bin/sh
printf '%s\\n' "$@" > "$SHIM_LOG/pulumi.argv"
pwd > "$SHIM_LOG/pulumi.cwd"
cat "$SHIM_LOG/pulumi.stdout"
cat "$SHIM_LOG/pulumi.stderr" >&2
exit "$(cat "$SHIM_LOG/pulumi.rc")"
"""

FAKE_GCLOUD = f"""#!{sys.executable}
import os, sys
open(os.path.join(os.environ["SHIM_LOG"], "gcloud.argv"), "w").write("\\n".join(sys.argv[1:]))
if os.environ.get("FAKE_GCLOUD_FAIL"):
    sys.exit("ERROR: (gcloud.compute.start-iap-tunnel) " + os.environ["FAKE_GCLOUD_FAIL"])
port = next(a for a in sys.argv if a.startswith("--local-host-port=")).rsplit(":", 1)[1]
os.execv(sys.executable, [sys.executable, "-m", "http.server", port, "--bind", "127.0.0.1",
                          "--directory", os.environ["SHIM_LOG"]])
"""


def write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def shims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH holding only the fake pulumi and gcloud (plus sh); returns the directory they log into."""
    bin_dir, log_dir = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log_dir.mkdir()
    write_executable(bin_dir / "pulumi", FAKE_PULUMI)
    write_executable(bin_dir / "gcloud", FAKE_GCLOUD)
    os.symlink("/bin/cat", bin_dir / "cat")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("SHIM_LOG", str(log_dir))
    return log_dir


def fake_pulumi_result(log_dir: Path, stdout: str, rc: int = 0, stderr: str = "") -> None:
    (log_dir / "pulumi.stdout").write_text(stdout)
    (log_dir / "pulumi.stderr").write_text(stderr)
    (log_dir / "pulumi.rc").write_text(str(rc))


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_stack_outputs_asks_pulumi_for_the_named_stack(shims: Path, tmp_path: Path) -> None:
    fake_pulumi_result(shims, json.dumps(GCP_OUTPUTS))
    assert stack.stack_outputs("dev", cwd=tmp_path) == GCP_OUTPUTS
    assert (shims / "pulumi.argv").read_text().split() == ["stack", "output", "--json", "--stack", "dev",
                                                                "--non-interactive"]
    assert (shims / "pulumi.cwd").read_text().strip() == str(tmp_path)


@pytest.mark.parametrize(("stdout", "rc", "stderr", "expected"), [
    ("", 255, "error: no stack named 'nope' found", "no stack named 'nope' found"),
    ("{}", 0, "", "has no outputs; deploy it first: pulumi up --stack nope"),
])
def test_stack_outputs_errors_name_the_option(shims: Path, stdout: str, rc: int, stderr: str, expected: str) -> None:
    fake_pulumi_result(shims, stdout, rc, stderr)
    with pytest.raises(ConfigError, match=expected) as err:
        stack.stack_outputs("nope")
    assert err.value.key == "--stack"


def test_missing_pulumi_cli_is_a_clear_error(shims: Path) -> None:
    (shims.parent / "bin" / "pulumi").unlink()
    with pytest.raises(ConfigError) as err:
        stack.stack_outputs("dev")
    assert err.value.key == "--stack"
    assert str(err.value) == f"--stack: reading stack 'dev': {missing_cli('dev')}"


def test_the_missing_cli_is_said_one_way_everywhere_with_the_way_to_get_it(shims: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34 item 6: the toolkit's wording lacked the install hint that `tpuserve up`'s had."""
    from tpuserve.deploy.pulumi_cli import PulumiCli, PulumiError

    (shims.parent / "bin" / "pulumi").unlink()
    with pytest.raises(PulumiError) as raised:
        PulumiCli("dev")
    assert str(raised.value) == missing_cli("dev")
    assert "scripts/install-pulumi.sh" in missing_cli("dev") and "tpuserve check --stack dev" in missing_cli("dev")


def test_local_stack_endpoint_needs_no_tunnel(shims: Path) -> None:
    with stack.endpoint_for(LOCAL_OUTPUTS) as endpoint:
        assert endpoint == LOCAL_OUTPUTS["endpoint"]
    assert not (shims / "gcloud.argv").exists()


def test_gcp_stack_is_reached_through_an_iap_tunnel_closed_on_exit(shims: Path) -> None:
    (shims / "v1").mkdir()
    (shims / "v1" / "marker").write_text("through the tunnel")
    with stack.endpoint_for(GCP_OUTPUTS) as endpoint:
        port = int(endpoint.split(":")[2].split("/")[0])
        assert endpoint == f"http://localhost:{port}/v1"
        assert requests.get(f"http://127.0.0.1:{port}/v1/marker", timeout=5).text == "through the tunnel"
        argv = (shims / "gcloud.argv").read_text().split("\n")
    assert argv == ["compute", "start-iap-tunnel", "tpu-serve-dev", "8000", f"--local-host-port=localhost:{port}",
                    "--zone", "us-east5-b", "--project", "my-ml-sandbox"]
    assert not accepts(port)


def test_tunnel_is_closed_when_the_command_fails(shims: Path) -> None:
    with pytest.raises(RuntimeError, match="command failed"):
        with stack.endpoint_for(GCP_OUTPUTS) as endpoint:
            port = int(endpoint.split(":")[2].split("/")[0])
            raise RuntimeError("command failed")
    assert not accepts(port)


def test_gcloud_failure_is_reported_with_its_message(shims: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_GCLOUD_FAIL", "not authorized to tunnel")
    with pytest.raises(stack.TunnelError, match="not authorized to tunnel"):
        with stack.endpoint_for(GCP_OUTPUTS):
            pytest.fail("the block must not run without a tunnel")


def test_missing_gcloud_names_the_option(shims: Path) -> None:
    (shims.parent / "bin" / "gcloud").unlink()
    with pytest.raises(ConfigError, match="needs gcloud on PATH") as err:
        with stack.endpoint_for(GCP_OUTPUTS):
            pytest.fail("the block must not run without a tunnel")
    assert err.value.key == "--stack"


@pytest.mark.parametrize("outputs", [{"endpoint": "http://x/v1"}, {"target": "azure", "endpoint": "http://x/v1"}])
def test_unknown_target_names_the_option(outputs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="expected gcp, gke or local") as err:
        with stack.endpoint_for(outputs):
            pytest.fail("no endpoint for an unknown target")
    assert err.value.key == "--stack"
