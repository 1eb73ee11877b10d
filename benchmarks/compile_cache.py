"""Cold and warm time-to-/health of the real CPU vLLM with its compile cache on a persistent path: the CPU analogue
of the TPU VM's XLA cache on the cache disk. How and why: docs/design/benchmarks.md#the-compile-cache.

    python benchmarks/compile_cache.py [--vllm-venv ~/.cache/tpuserve/vllm-venv] [--cache-dir DIR]
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e import cpu_server  # noqa: E402
from tpuserve.deploy.stack import free_local_port  # noqa: E402
from tpuserve.serving import ServingConfig  # noqa: E402

CACHE_DIR = Path.home() / ".cache" / "tpuserve"
BUILDER = ROOT / "tests" / "e2e" / "tiny_gemma4.py"


def tiny_model(vllm_venv: Path) -> Path:
    """The e2e tier's tiny random Gemma 4 (tests/e2e/conftest.py keys it by the builder's hash the same way)."""
    model_dir = CACHE_DIR / f"tiny-gemma4-{hashlib.sha256(BUILDER.read_bytes()).hexdigest()[:12]}"
    if not (model_dir / "model.safetensors").exists():
        staging = Path(tempfile.mkdtemp(prefix="tiny-gemma4-building-", dir=CACHE_DIR))
        subprocess.run([str(vllm_venv / "bin" / "python"), str(BUILDER), str(staging)], check=True,
                       env={**cpu_server.SERVER_ENV, "PATH": "/usr/bin:/bin"})
        staging.rename(model_dir)
    return model_dir


# vLLM 0.32's timing log lines (vllm/model_executor/model_loader/default_loader.py, compilation/backends.py,
# compilation/monitor.py, v1/engine/core.py).
PHASES = {
    "weights": r"Loading weights took ([0-9.]+) seconds",
    "dynamo bytecode transform": r"Dynamo bytecode transform time: ([0-9.]+) s",
    "graphs compiled": r"Compiling a graph for compile range \S+ takes ([0-9.]+) s",
    "graphs loaded from the cache": r"Directly load the compiled graph\(s\) for compile range \S+ from the cache, "
                                    r"took ([0-9.]+) s",
    "torch.compile in total": r"torch\.compile took ([0-9.]+) s in total",
    "engine init (profile, KV cache, warm-up)": r"init engine \(profile, create kv cache, warmup model\) took "
                                                r"([0-9.]+)",
}


# The CPU backend's compile logs no duration of its own (vllm/v1/worker/cpu_model_runner.py warms the model up "for
# the compilation", vllm/compilation/decorators.py saves or loads the AOT-compiled backbone): it is the time between
# these two lines, and whether the AOT cache was loaded, or why not, is said by decorators.py.
STAMP = r"(\d\d-\d\d \d\d:\d\d:\d\d) \[[^\]]+\] "
COMPILE_SPAN = (STAMP + r"Warming up model for the compilation", STAMP + r"Warming up done")
AOT_LOADED = r"Directly load AOT compilation from path"
AOT_FAILED = r"Compiling model again due to a load failure from \S+, reason: (.*)"
COMPILE_PHASE = "compile (warm-up for the compilation)"


def phases(log: Path) -> dict[str, float]:
    """Seconds per phase found in a vLLM log (summed where a phase logs once per graph)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = {}
    for name, pattern in PHASES.items():
        values = [float(v) for v in re.findall(pattern, text)]
        if values:
            found[name] = round(sum(values), 2)
    begin, end = (re.search(pattern, text) for pattern in COMPILE_SPAN)
    if begin and end:
        found[COMPILE_PHASE] = float((stamp(end[1]) - stamp(begin[1])).total_seconds())
    return found


def stamp(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%m-%d %H:%M:%S")


def aot_cache(log: Path) -> str:
    """What the start did with the AOT compile cache: loaded, or compiled again and why, or compiled (none there)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    failed = re.search(AOT_FAILED, text)
    if failed:
        return f"compiled again: the cached program did not load ({failed[1].strip()[:160]})"
    return "loaded from the cache" if re.search(AOT_LOADED, text) else "compiled (nothing cached)"


def entries(directory: Path) -> int:
    return sum(1 for path in directory.rglob("*") if path.is_file()) if directory.exists() else 0


def time_to_health(vllm_bin: Path, model_dir: Path, cache_root: Path, log: Path) -> float:
    port = free_local_port()
    cfg = dataclasses.replace(ServingConfig(), model=str(model_dir), max_model_len=1024, host="127.0.0.1", port=port,
                              extra_args=("--dtype", "float32"))  # start_server names it tiny-gemma4
    cfg.validate(backend="cpu")
    saved = dict(cpu_server.SERVER_ENV)
    cpu_server.SERVER_ENV["VLLM_CACHE_ROOT"] = str(cache_root)  # the persistent path, as the VM mounts it
    try:
        started = time.time()
        server = cpu_server.start_server(vllm_bin, cfg, "tiny-gemma4", log)
        try:
            return cpu_server.wait_healthy(server, timeout_s=900) - started
        finally:
            cpu_server.stop_server(server)
    finally:
        cpu_server.SERVER_ENV.clear()
        cpu_server.SERVER_ENV.update(saved)


@click.command()
@click.option("--vllm-venv", type=click.Path(path_type=Path), default=CACHE_DIR / "vllm-venv")
@click.option("--cache-dir", type=click.Path(path_type=Path), help="Persistent compile-cache root (default: a new "
              "temporary directory, removed afterwards).")
def main(vllm_venv: Path, cache_dir: Path | None) -> None:
    model_dir = tiny_model(vllm_venv)
    scratch = Path(tempfile.mkdtemp(prefix="compile-cache-bench-"))
    cache_root = cache_dir or scratch / "cache"
    cache_root.mkdir(parents=True, exist_ok=True)
    try:
        cold = time_to_health(vllm_venv / "bin" / "vllm", model_dir, cache_root, scratch / "cold.log")
        cold_entries = entries(cache_root)
        print(f"cold start (empty compile cache): {cold:.1f} s to /health; cache now {cold_entries} files", flush=True)
        warm = time_to_health(vllm_venv / "bin" / "vllm", model_dir, cache_root, scratch / "warm.log")
        warm_entries = entries(cache_root)
        print(f"warm start (same compile cache):  {warm:.1f} s to /health; cache now {warm_entries} files "
              f"({warm_entries - cold_entries:+d})")
        print(f"ratio warm / cold: {warm / cold:.2f}")
        cold_phases, warm_phases = phases(scratch / "cold.log"), phases(scratch / "warm.log")
        print(f"{'phase (s)':44} {'cold':>8} {'warm':>8}")
        for name in [*PHASES, COMPILE_PHASE]:
            print(f"{name:44} {cold_phases.get(name, 0):8.2f} {warm_phases.get(name, 0):8.2f}")
        cold_aot, warm_aot = aot_cache(scratch / "cold.log"), aot_cache(scratch / "warm.log")
        print(f"AOT compile cache: cold start {cold_aot}; warm start {warm_aot}")
        # torch.compile (Dynamo, the graphs) runs inside the engine's profile run; weights load before it.
        known = warm_phases.get("weights", 0) + warm_phases.get("engine init (profile, KV cache, warm-up)", 0)
        print(f"warm start outside weights and engine init (imports, process start, API server): "
              f"{warm - known:.1f} s")
        print(json.dumps({"cold_s": round(cold, 1), "warm_s": round(warm, 1), "ratio": round(warm / cold, 3),
                          "cache_files": cold_entries, "cache_files_added_warm": warm_entries - cold_entries,
                          "cold_phases_s": cold_phases, "warm_phases_s": warm_phases, "cold_aot": cold_aot,
                          "warm_aot": warm_aot}))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
