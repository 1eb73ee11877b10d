"""The startup script's `retry` helper, run alone in bash: exactly ATTEMPTS tries, the delay doubling between them.

The helper is taken verbatim from templates/startup.sh.j2 (it holds no Jinja), with `log` and `sleep` replaced by
recorders, so a retry count or a backoff that drifts fails here without booting the whole sandbox.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def retry_helper() -> str:
    template = (ROOT / "templates" / "startup.sh.j2").read_text()
    [helper] = re.findall(r"^retry\(\) \{\n.*?^\}\n", template, re.MULTILINE | re.DOTALL)
    assert "{{" not in helper and "{%" not in helper
    return helper


def run_retry(tmp_path: Path, attempts: int, first_delay: int, failures: int) -> tuple[int, list[str], list[str]]:
    """(retry's exit status, the recorded sleeps, the logged lines) for a command that fails `failures` times."""
    script = f"""set -euo pipefail
log() {{ printf '%s\\n' "$*" >> {tmp_path}/log; }}
sleep() {{ printf '%s\\n' "$1" >> {tmp_path}/sleeps; }}
{retry_helper()}
calls=0
flaky() {{ calls=$((calls + 1)); ((calls > {failures})); }}
status=0
retry {attempts} {first_delay} flaky || status=$?
echo "$status $calls"
"""
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    status, calls = map(int, done.stdout.split())
    sleeps = (tmp_path / "sleeps").read_text().split() if (tmp_path / "sleeps").exists() else []
    logged = (tmp_path / "log").read_text().splitlines() if (tmp_path / "log").exists() else []
    assert calls == min(failures + 1, attempts)
    return status, sleeps, logged


def test_a_command_that_never_succeeds_is_tried_exactly_attempts_times(tmp_path: Path) -> None:
    status, sleeps, logged = run_retry(tmp_path, attempts=5, first_delay=3, failures=99)
    assert status == 1
    assert sleeps == ["3", "6", "12", "24"]  # doubling, and no sleep after the last attempt
    assert logged == [f"attempt {n}/5 of 'flaky' failed; retrying in {delay}s"
                      for n, delay in ((1, 3), (2, 6), (3, 12), (4, 24))]


def test_success_on_the_last_attempt_counts(tmp_path: Path) -> None:
    status, sleeps, _ = run_retry(tmp_path, attempts=5, first_delay=1, failures=4)
    assert status == 0 and sleeps == ["1", "2", "4", "8"]


@pytest.mark.parametrize("failures, sleeps", [(0, []), (2, ["2", "4"])])
def test_a_command_that_succeeds_stops_the_retries(tmp_path: Path, failures: int, sleeps: list[str]) -> None:
    assert run_retry(tmp_path, attempts=5, first_delay=2, failures=failures)[:2] == (0, sleeps)


def test_one_attempt_means_no_retry(tmp_path: Path) -> None:
    assert run_retry(tmp_path, attempts=1, first_delay=2, failures=1) == (1, [], [])
