"""The gke pods' startup probe: exit 0 once /health answers 200, and leave the boot's timeline (what was warm, how
long loading took) on the container's output and in --state. Why: docs/design/supervisor.md#on-gke.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compile_cache  # noqa: E402 - a sibling, shipped beside this file

PREFIX = "tpu-serve boot:"
LOADING, HEALTHY = "loading-model", "healthy"
WEIGHTS_BEFORE = {True: "weights cached ({model})", False: "weights not cached: downloading {model} into the cache",
                  None: "weights: unknown (no huggingface_hub)"}


def weights_cached(hf_home: str, model: str) -> bool | None:
    """Whether huggingface_hub's cache under `hf_home` holds the model's config and weights (None: no hub)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    config = try_to_load_from_cache(model, "config.json", cache_dir=os.path.join(hf_home, "hub"))
    if not isinstance(config, str):
        return False
    return any(name.endswith(".safetensors") for name in os.listdir(os.path.dirname(config)))


def container_started() -> float | None:
    """When the container's first process started (its /proc stat start time, in clock ticks after boot)."""
    try:
        ticks = int(Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19])
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def healthy(url: str, timeout_s: float) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout_s) as response:  # noqa: S310
            return response.status == 200, f"/health answered HTTP {response.status}"
    except urllib.error.HTTPError as err:
        return False, f"/health answered HTTP {err.code}"
    except OSError as err:
        return False, f"/health not answering ({getattr(err, 'reason', err)})"


def emit(log: str, line: str) -> None:
    """One timeline line on the container's output; a probe never fails for want of a log."""
    try:
        with open(log, "a", encoding="utf-8") as out:
            out.write(line + "\n")
    except OSError:
        pass


def probe(args: argparse.Namespace, now: float) -> tuple[int, str]:
    state_path = Path(args.state)
    try:
        state: dict[str, Any] = json.loads(state_path.read_text())
    except (OSError, ValueError):
        state = {}
    if not state.get("stages"):
        started = args.started if args.started is not None else container_started()
        state = {"started": started if started is not None and started <= now else now, "stages": {},
                 "weights": weights_cached(args.hf_home, args.model),
                 "compileBefore": compile_cache.entries(Path(args.xla_dir))}
        state["stages"][LOADING] = round(now - state["started"])
        emit(args.log, f"{PREFIX} {LOADING} at +{state['stages'][LOADING]} s: "
                       f"{WEIGHTS_BEFORE[state['weights']].format(model=args.model)}, "
                       f"compile cache {state['compileBefore']} entries")
    elapsed = round(now - state["started"])
    if HEALTHY in state["stages"]:
        return 0, f"{HEALTHY} since +{state['stages'][HEALTHY]} s"
    ok, detail = healthy(args.url, args.timeout)
    if ok:
        state["stages"][HEALTHY] = elapsed
        state["compileAfter"] = compile_cache.entries(Path(args.xla_dir))
        warmth = "warm" if state["compileBefore"] and state["compileAfter"] <= state["compileBefore"] else \
            "compiled cold" if not state["compileBefore"] else "partly warm"
        weights = {True: "were cached", False: "were downloaded", None: "unknown"}[state["weights"]]
        emit(args.log, f"{PREFIX} {HEALTHY} at +{elapsed} s: weights {weights}, compile cache "
                       f"{state['compileBefore']} -> {state['compileAfter']} entries ({warmth})")
    compile_cache.write_atomic(state_path, json.dumps(state))
    if ok:
        return 0, f"{HEALTHY} at +{elapsed} s"
    return 1, f"{LOADING} for {elapsed} s: {detail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--hf-home", default=os.environ.get("HF_HOME", ""))
    parser.add_argument("--xla-dir", default=os.environ.get("VLLM_XLA_CACHE_PATH", ""))
    parser.add_argument("--log", default="/proc/1/fd/1")
    parser.add_argument("--timeout", type=float, default=5.0)
    # Tests: the container's start and the probe's clock, so the timeline does not depend on the machine's speed.
    parser.add_argument("--started", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--now", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    code, line = probe(args, time.time() if args.now is None else args.now)
    print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
