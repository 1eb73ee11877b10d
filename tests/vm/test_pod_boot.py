"""vm/pod_boot.py, the gke pods' startup probe, run as the kubelet runs it (the script from a scripts directory with
its sibling, the interpreter's own site-packages) against a fake vLLM on 127.0.0.1 and caches laid out as
huggingface_hub and JAX leave them. What it must get right: exit 0 only once /health answers; one log line per stage
saying what was warm; a second look never repeats a line or re-counts the bucket."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.httpfake import FakeServer, Response

ROOT = Path(__file__).resolve().parents[2]
MODEL = "google/gemma-4-E2B-it"
COMMIT = "1f0a2b3c4d5e6f708192a3b4c5d6e7f801234567"
T = 1_796_112_000.0  # 2026-12-01 08:00 UTC: the container's start in the tests that need no real clock


def cached_model(hf_home: Path) -> None:
    """The hub cache's layout (huggingface_hub, "Understand caching": refs/<revision> names a commit,
    snapshots/<commit>/<file> links into blobs/<hash>)."""
    repo = hf_home / "hub" / f"models--{MODEL.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "blobs").mkdir()
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name, blob, content in (("config.json", "a1", b"{}"), ("model.safetensors", "b2", b"\0" * 64)):
        (repo / "blobs" / blob).write_bytes(content)
        (snapshot / name).symlink_to(Path("../../blobs") / blob)


def compiled(xla_dir: Path, entries: int) -> None:
    """JAX's LRU cache: `<key>-cache` per program, plus an `-atime` file that is not an entry."""
    xla_dir.mkdir(parents=True, exist_ok=True)
    for number in range(entries):
        (xla_dir / f"jit_step_{number}-cache").write_bytes(b"x")
        (xla_dir / f"jit_step_{number}-atime").write_bytes(b"0")


class Vllm:
    """/health: 503 while loading, 200 once `up`."""

    def __init__(self) -> None:
        self.up = False
        self.server = FakeServer({("GET", "/health"): lambda _: Response(200 if self.up else 503, b"")})


@pytest.fixture
def pod(tmp_path: Path):
    scripts = tmp_path / "opt-tpu-serve"  # the ConfigMap's mount: pod_boot.py beside compile_cache.py
    scripts.mkdir()
    for name in ("pod_boot.py", "compile_cache.py"):
        shutil.copy(ROOT / "vm" / name, scripts / name)
    vllm = Vllm()
    with vllm.server:
        yield scripts, vllm, tmp_path


def probe(pod, started: float, now: float) -> tuple[int, str, list[str]]:
    scripts, vllm, tmp = pod
    log = tmp / "container-stdout"
    done = subprocess.run(
        [sys.executable, "-I", str(scripts / "pod_boot.py"), "--url", vllm.server.url, "--model", MODEL,
         "--state", str(tmp / "boot.json"), "--hf-home", str(tmp / "huggingface"), "--xla-dir", str(tmp / "xla"),
         "--log", str(log), "--started", str(started), "--now", str(now)],
        capture_output=True, text=True, timeout=60, cwd="/")
    lines = log.read_text().splitlines() if log.exists() else []
    return done.returncode, done.stdout.strip(), lines


def test_a_cold_pod_says_it_downloaded_and_compiled(pod) -> None:
    _, vllm, tmp = pod
    started = T
    code, said, log = probe(pod, started, started + 40)
    assert (code, said) == (1, "loading-model for 40 s: /health answered HTTP 503")
    assert log == [f"tpu-serve boot: loading-model at +40 s: weights not cached: downloading {MODEL} into the "
                   "cache, compile cache 0 entries"]
    cached_model(tmp / "huggingface")  # what vLLM did meanwhile: the weights into the bucket, 3 programs compiled
    compiled(tmp / "xla", 3)
    vllm.up = True
    code, said, log = probe(pod, started - 300, started + 250)  # the first look's start time holds
    assert (code, said) == (0, "healthy at +250 s")
    assert log[1] == ("tpu-serve boot: healthy at +250 s: weights were downloaded, compile cache 0 -> 3 entries "
                      "(compiled cold)")
    state = json.loads((tmp / "boot.json").read_text())
    assert (state["weights"], state["compileBefore"], state["compileAfter"]) == (False, 0, 3)
    assert set(state["stages"]) == {"loading-model", "healthy"}


def test_a_warm_pod_says_what_was_warm_and_is_quiet_after(pod) -> None:
    _, vllm, tmp = pod
    cached_model(tmp / "huggingface")
    compiled(tmp / "xla", 412)
    vllm.up = True
    code, said, log = probe(pod, T, T + 95)
    assert (code, said) == (0, "healthy at +95 s")
    assert log == [f"tpu-serve boot: loading-model at +95 s: weights cached ({MODEL}), compile cache 412 entries",
                   "tpu-serve boot: healthy at +95 s: weights were cached, compile cache 412 -> 412 entries (warm)"]
    shutil.rmtree(tmp / "xla")  # a later look neither counts again nor writes another line
    vllm.up = False
    assert probe(pod, T, T + 500) == (0, "healthy since +95 s", log)


def test_nothing_listening_keeps_the_pod_starting(pod, tmp_path: Path) -> None:
    scripts, vllm, _ = pod
    vllm.server.__exit__(None, None, None)
    code, said, _ = probe(pod, T, T)
    assert code == 1 and said.startswith("loading-model for 0 s: /health not answering (")
