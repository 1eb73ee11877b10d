"""vm/hf_token.py (the gke init container) against a fake GKE metadata server and Secret Manager on 127.0.0.1.

Shapes: the metadata token body is the documented `{"access_token", "expires_in", "token_type"}`; Secret Manager's
`versions/latest:access` answers `{"name", "payload": {"data": base64}}` and errors in Google's JSON error format
(`{"error": {"code", "message", "status"}}`, https://cloud.google.com/apis/design/errors), with the
PERMISSION_DENIED text Secret Manager returns for a missing grant.
"""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.httpfake import FakeServer, Request, Response
from tests.fakes.leaks import leaked
from vm import hf_token

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "vm" / "hf_token.py"
SECRET = "projects/my-ml-sandbox/secrets/hf-token"
CANARY = "hf_CANARYgke0123456789"
ACCESS_TOKEN = "ya29.fake-wi-token"
DENIED = ("Permission 'secretmanager.versions.access' denied for resource "
          f"'{SECRET}/versions/latest' (or it may not exist).")


def google_error(status: int, message: str, reason: str) -> Response:
    return Response(status, {"error": {"code": status, "message": message, "status": reason}})


def fake_google(secret_statuses: list[int], metadata_status: int = 200, metadata_statuses: list[int] | None = None,
                payload: str = f"{CANARY}\n") -> FakeServer:
    """Secret Manager answers `secret_statuses` in turn (then 200); the metadata token request `metadata_statuses` in
    turn (then 200), or `metadata_status` always."""
    replies = list(secret_statuses)
    token_replies = list(metadata_statuses or [])

    def token(request: Request) -> Response:
        if request.headers.get("Metadata-Flavor") != "Google":
            return Response(403, "Missing Metadata-Flavor:Google header.")
        status = token_replies.pop(0) if token_replies else metadata_status
        if status != 200:
            return Response(status, "")
        return Response(200, {"access_token": ACCESS_TOKEN, "expires_in": 3599, "token_type": "Bearer"})

    def access(request: Request) -> Response:
        if request.headers.get("Authorization") != f"Bearer {ACCESS_TOKEN}":
            return google_error(401, "Request had invalid authentication credentials.", "UNAUTHENTICATED")
        status = replies.pop(0) if replies else 200
        if status == 200:
            return Response(200, {"name": f"{SECRET}/versions/3",
                                  "payload": {"data": base64.b64encode(payload.encode()).decode()}})
        if status == 403:
            return google_error(403, DENIED, "PERMISSION_DENIED")
        return google_error(status, "The service is currently unavailable.", "UNAVAILABLE")

    return FakeServer({("GET", "/computeMetadata/v1/instance/service-accounts/default/token"): token,
                       ("GET", f"/v1/{SECRET}/versions/latest:access"): access})


def run(fake: FakeServer, out: Path, attempts: int = 5) -> subprocess.CompletedProcess:
    """As the init container runs it: the file alone, standard library only."""
    return subprocess.run([sys.executable, "-I", str(SCRIPT), "--secret", SECRET, "--out", str(out),
                           "--metadata-url", fake.url, "--secret-manager-url", fake.url,
                           "--attempts", str(attempts), "--retry-delay", "0"],
                          capture_output=True, text=True, timeout=60)


def test_token_lands_in_a_private_file_and_nowhere_else(tmp_path: Path) -> None:
    out = tmp_path / "token"
    with fake_google([200]) as fake:
        done = run(fake, out)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == CANARY
    assert stat.S_IMODE(out.stat().st_mode) == 0o400
    assert CANARY not in done.stdout + done.stderr
    assert done.stdout.strip() == f"hf_token: wrote the latest version of {SECRET} to {out}"


def test_transient_errors_are_retried(tmp_path: Path) -> None:
    out = tmp_path / "token"
    with fake_google([503, 429, 200]) as fake:
        done = run(fake, out)
        accesses = [r for r in fake.requests if r.path.endswith(":access")]
    assert done.returncode == 0 and out.read_text() == CANARY
    assert len(accesses) == 3
    assert "HTTP 503 (attempt 1/5)" in done.stderr and "HTTP 429 (attempt 2/5)" in done.stderr


def test_a_refusal_fails_at_once_with_googles_message(tmp_path: Path) -> None:
    out = tmp_path / "token"
    with fake_google([403]) as fake:
        done = run(fake, out)
        accesses = [r for r in fake.requests if r.path.endswith(":access")]
    assert done.returncode == 1 and len(accesses) == 1 and not out.exists()
    assert f"refused {SECRET} with HTTP 403 ({DENIED})" in done.stderr
    assert "roles/secretmanager.secretAccessor" in done.stderr


def test_no_workload_identity_fails_at_once(tmp_path: Path) -> None:
    with fake_google([200], metadata_status=403) as fake:
        done = run(fake, tmp_path / "token")
    assert done.returncode == 1 and "metadata server refused an access token with HTTP 403" in done.stderr


def test_gives_up_after_the_attempts(tmp_path: Path) -> None:
    with fake_google([503] * 10) as fake:
        done = run(fake, tmp_path / "token", attempts=3)
        accesses = [r for r in fake.requests if r.path.endswith(":access")]
    assert done.returncode == 1 and len(accesses) == 3
    assert done.stderr.strip().splitlines()[-1] == ("hf_token: Secret Manager unavailable after 3 attempts "
                                                     "(last HTTP 503)")


def test_rewrites_an_existing_token_file(tmp_path: Path) -> None:
    out = tmp_path / "token"
    out.write_text("hf_old")
    os.chmod(out, 0o400)
    with fake_google([200]) as fake:
        assert run(fake, out).returncode == 0
    assert out.read_text() == CANARY and stat.S_IMODE(out.stat().st_mode) == 0o400


@pytest.mark.parametrize("args", [["--out", "x"], ["--secret", SECRET]])
def test_usage_errors_exit_2(args: list[str]) -> None:
    assert subprocess.run([sys.executable, "-I", str(SCRIPT), *args], capture_output=True).returncode == 2


# --- read_secret in-process: every retried and refused status, attempts exhausted, the backoff, the IAM wait -------

@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The delays read_secret sleeps, recorded instead of slept."""
    recorded: list[float] = []
    monkeypatch.setattr(hf_token.time, "sleep", recorded.append)
    return recorded


def secret_accesses(fake: FakeServer) -> int:
    return len([r for r in fake.requests if r.path.endswith(":access")])


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_every_transient_secret_manager_status_is_retried(status, sleeps):
    with fake_google([status, status, 200]) as fake:
        assert hf_token.read_secret(SECRET, fake.url, fake.url, retry_delay_s=0.5) == CANARY
        assert secret_accesses(fake) == 3
    assert sleeps == [0.5, 1.0]


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_transient_metadata_token_status_is_retried(status, sleeps):
    with fake_google([200], metadata_statuses=[status, 200]) as fake:
        assert hf_token.read_secret(SECRET, fake.url, fake.url, retry_delay_s=0.5) == CANARY
    assert sleeps == [0.5]


def test_attempts_are_exhausted_exactly_with_a_doubling_delay(sleeps, capsys):
    with fake_google([503] * 10) as fake:
        with pytest.raises(hf_token.TokenError) as err:
            hf_token.read_secret(SECRET, fake.url, fake.url, attempts=5, retry_delay_s=0.5)
        assert secret_accesses(fake) == 5
    assert str(err.value) == "Secret Manager unavailable after 5 attempts (last HTTP 503)"
    assert sleeps == [0.5, 1.0, 2.0, 4.0]  # none after the last attempt
    stderr = capsys.readouterr().err
    assert "Secret Manager answered HTTP 503 (attempt 4/5); retrying in 4s" in stderr
    assert not leaked(ACCESS_TOKEN, stderr, size=8) and not leaked(CANARY, stderr, size=8)


@pytest.mark.parametrize("status", [400, 404])
def test_a_bad_name_or_missing_secret_is_refused_at_once(status, sleeps):
    with fake_google([status]) as fake:
        with pytest.raises(hf_token.TokenError, match=f"refused {SECRET} with HTTP {status} "
                                                      r"\(no such secret or no enabled version\)"):
            hf_token.read_secret(SECRET, fake.url, fake.url, iam_wait_s=60)  # no IAM wait for these
        assert secret_accesses(fake) == 1
    assert sleeps == []


@pytest.mark.parametrize("status", [401, 403])
def test_a_fresh_grant_is_waited_for_on_401_and_403(status, sleeps):
    told: list[str] = []
    with fake_google([status, status, 200]) as fake:
        assert hf_token.read_secret(SECRET, fake.url, fake.url, iam_wait_s=60, iam_poll_s=7,
                                    on_wait=told.append) == CANARY
    assert sleeps == [7, 7]
    assert told[0] == f"waiting for the secret grant to propagate (HTTP {status}, 0 s)"
    assert told[-1].startswith("the secret grant propagated after 0 s of HTTP 401/403")


def test_a_grant_that_never_arrives_is_given_up_after_the_window(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(hf_token.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(hf_token.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    with fake_google([403] * 50) as fake:
        with pytest.raises(hf_token.TokenError, match=f"still refuses {SECRET} with HTTP 403 after 2 min: hint"):
            hf_token.read_secret(SECRET, fake.url, fake.url, iam_wait_s=120, iam_poll_s=30, grant_hint="hint")
        assert secret_accesses(fake) == 5  # refused at 0, 30, 60, 90 s; at 120 s the window is over


def test_an_empty_secret_is_refused(sleeps):
    with fake_google([200], payload="  \n") as fake:
        with pytest.raises(hf_token.TokenError, match=f"secret {SECRET} is empty"):
            hf_token.read_secret(SECRET, fake.url, fake.url)
