"""vm/drain.py, the gke pods' preStop hook: it waits for the endpoint's removal, then until vLLM's /metrics shows no
request running or waiting, at most its timeout; read from a real vLLM 0.32 scrape (tests/data), run as the kubelet
runs it against a fake vLLM on 127.0.0.1 whose gauges fall as requests finish."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.fakes.httpfake import FakeServer, Response
from vm import drain

ROOT = Path(__file__).resolve().parents[2]
SCRAPE = (ROOT / "tests" / "data" / "vllm-0.32.0-metrics.prom").read_text()


def scrape_with(running: dict[str, float], waiting: dict[str, float]) -> str:
    """The real scrape, its two gauges set per engine (a second engine's series added as vLLM would print it)."""
    text = SCRAPE
    for name, values in (("running", running), ("waiting", waiting)):
        lines = "\n".join(f'vllm:num_requests_{name}{{engine="{engine}",model_name="tiny-gemma4"}} {value}'
                          for engine, value in values.items())
        text = re.sub(rf'^vllm:num_requests_{name}\{{engine="0"[^\n]*$', lines, text, flags=re.MULTILINE)
    return text


def test_in_flight_sums_running_and_waiting_over_engines_and_ignores_the_per_reason_series() -> None:
    assert drain.in_flight(SCRAPE) == 0
    assert "vllm:num_requests_waiting_by_reason{" in SCRAPE  # would double the waiting count if it were read
    assert drain.in_flight(scrape_with({"0": 3.0, "1": 1.0}, {"0": 2.0, "1": 0.0})) == 6
    assert drain.in_flight("# no vLLM here\nprocess_cpu_seconds_total 1.0\n") is None


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def run(readings: list, timeout_s: float = 600, tmp: Path | None = None) -> tuple[tuple[str, int | None], Clock, str]:
    clock, log = Clock(), (tmp / "log") if tmp else Path("/dev/null")
    answers = iter(readings)

    def read(url: str, timeout: float) -> int | None:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer
    result = drain.drain("http://127.0.0.1:8000", 15, timeout_s, 2, str(log), read=read, clock=clock.now,
                         sleep=clock.sleep)
    return result, clock, log.read_text() if tmp else ""


def test_it_waits_for_the_endpoint_to_leave_then_for_the_last_request(tmp_path: Path) -> None:
    result, clock, log = run([3, 2, 2, 0], tmp=tmp_path)
    assert result == ("idle", 0)
    assert clock.slept == [15, 2, 2, 2] and clock.t == 21
    assert log.splitlines() == [
        "tpu-serve drain: pod is stopping; waiting 15 s for its endpoint to leave every router",
        "tpu-serve drain: no request in flight after 21 s: vLLM can stop"]


def test_it_gives_up_at_the_routes_longest_request(tmp_path: Path) -> None:
    result, clock, log = run([1] * 1000, timeout_s=600, tmp=tmp_path)
    assert result == ("timeout", 1) and 615 <= clock.t <= 617  # the settle, then the timeout
    assert log.splitlines()[-1] == "tpu-serve drain: 1 request(s) still in flight after 615 s: vLLM stops now"


def test_a_server_that_is_gone_has_nothing_to_wait_for_and_a_slow_one_is_waited_for() -> None:
    refused = ConnectionRefusedError(111, "Connection refused")
    result, clock, _ = run([refused] * 3)
    assert result == ("server gone", None) and clock.t == 15 + 2 * 2
    result, _, _ = run([refused, 2, refused, refused, 0])  # not three in a row
    assert result == ("idle", 0)
    # a busy vLLM answering late (urllib's timeout) is still serving: wait on
    result, _, _ = run([TimeoutError("timed out")] * 5 + [0])
    assert result == ("idle", 0)


def test_the_hook_as_the_kubelet_runs_it_against_a_vllm_finishing_its_requests(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name in ("drain.py", "pod_boot.py", "compile_cache.py"):  # shipped together in the pod's ConfigMap
        (scripts / name).write_text((ROOT / "vm" / name).read_text())
    left = iter([2, 1, 0])
    with FakeServer(fallback=lambda request: Response(
            200, scrape_with({"0": next(left, 0)}, {"0": 0.0}))) as vllm:
        done = subprocess.run([sys.executable, str(scripts / "drain.py"), "--url", vllm.url, "--settle", "0.05",
                               "--timeout", "30", "--poll", "0.05", "--log", str(tmp_path / "log")],
                              capture_output=True, text=True, timeout=60, check=False)
        asked = len(vllm.requests)
    assert done.returncode == 0 and done.stdout.strip() == "idle: 0 request(s) in flight"
    assert asked == 3 and (tmp_path / "log").read_text().splitlines()[-1].startswith(
        "tpu-serve drain: no request in flight after")


def test_the_hook_exits_zero_when_vllm_is_already_gone(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "vm" / "drain.py"), "--url", "http://127.0.0.1:9",
                           "--settle", "0", "--timeout", "30", "--poll", "0.01", "--log", str(tmp_path / "log")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "server gone: unknown request(s) in flight"
