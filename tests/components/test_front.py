"""The front of a VM's engines (components/front.py): the golden file, HAProxy's own check of it, and what the stack
puts in the served config."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from components.front import front_config, render_haproxy_config
from tpuserve.serving import ServingConfig

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "components" / "goldens" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")  # Debian puts it in /usr/sbin


def test_the_four_engine_front_is_the_golden_file():
    """Regenerate with `python -m components.front > tests/components/goldens/haproxy.cfg` and review the diff."""
    assert front_config(ServingConfig(chips=4, tensor_parallel_size=1)) == GOLDEN.read_text()


def test_a_lone_engine_has_no_front_and_each_engine_is_checked_and_balanced_by_requests_in_flight():
    assert front_config(ServingConfig(chips=4, tensor_parallel_size=4)) == ""
    text = front_config(ServingConfig(chips=8, tensor_parallel_size=2))
    servers = [line.split()[1:3] for line in text.splitlines() if line.strip().startswith("server")]
    assert servers == [[f"vllm-{i}", f"127.0.0.1:{8100 + i}"] for i in range(4)] * 2  # engines, then metrics
    assert "balance leastconn" in text and "option httpchk GET /health" in text and "bind :8000" in text


@pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed (apt-get install haproxy; CI installs it)")
@pytest.mark.parametrize("run_as", ["haproxy", None])
def test_haproxy_accepts_the_config(tmp_path, run_as):
    config = tmp_path / "haproxy.cfg"
    config.write_text(render_haproxy_config(8000, [("vllm-0", 8100), ("vllm-1", 8101)], run_as=run_as))
    done = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
