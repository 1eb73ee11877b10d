#!/usr/bin/env python3
"""`docker` for the CPU analogue of the VM: runs the container's `vllm serve ...` with the CPU vLLM venv.

Put on PATH as `docker` (benchmarks/supervisor_reconfig.py does). Understands what vm/supervisor.py calls: pull,
image inspect, inspect, ps, run, start, rm -f, logs. `run` maps the container's mounts back to host paths in its
environment (HF_HOME=/cache/huggingface -> the host directory mounted there), and gives vLLM's CPU compile cache
(VLLM_CACHE_ROOT) the directory mounted at /cache/xla: the CPU stand-in for the XLA cache the TPU image keeps there.
State: $DOCKER_SHIM_STATE/container.json; the server's output: $DOCKER_SHIM_STATE/vllm.log.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

STATE = Path(os.environ["DOCKER_SHIM_STATE"])
VLLM = os.environ["CPU_VLLM_BIN"]
SERVER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
              "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
CONTAINER = STATE / "container.json"
DIGEST = "sha256:" + "cd" * 32


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def spawn(argv: list[str], env: dict[str, str]) -> int:
    with open(STATE / "vllm.log", "ab") as log:
        return subprocess.Popen([VLLM, *argv], env={**os.environ, **SERVER_ENV, **env}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True).pid


def kill(info: dict) -> None:
    try:
        os.killpg(info["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(args: list[str]) -> None:
    mounts, env, labels, i = {}, {}, {}, 1
    while i < len(args):
        arg = args[i]
        if arg in ("-v", "-e", "--label", "--name"):
            value = args[i + 1]
            if arg == "-v":
                host, container = value.rsplit(":", 1)
                mounts[container] = host
            elif arg == "-e":
                key, _, val = value.partition("=")
                env[key] = val if _ else os.environ.get(key, "")
            elif arg == "--label":
                key, _, val = value.partition("=")
                labels[key] = val
            i += 2
        elif arg.startswith("-"):
            i += 1
        else:
            break
    command = args[i + 1:]  # after the image: vllm serve ...
    for key, value in list(env.items()):
        for container, host in mounts.items():
            if value.startswith(container):
                env[key] = host + value[len(container):]
    if "/cache/xla" in mounts:
        Path(mounts["/cache/xla"]).mkdir(parents=True, exist_ok=True)
        env["VLLM_CACHE_ROOT"] = mounts["/cache/xla"]
    env.pop("HF_TOKEN", None)
    argv = command[1:]  # drop "vllm"
    CONTAINER.write_text(json.dumps({"labels": labels, "argv": argv, "env": env, "pid": spawn(argv, env)}))
    print("c0ffee")


def main() -> int:
    args = sys.argv[1:]
    info = json.loads(CONTAINER.read_text()) if CONTAINER.exists() else None
    if args[0] == "pull":
        return 0
    if args[:2] == ["image", "inspect"]:
        print(json.dumps([args[-1].split(":")[0] + "@" + DIGEST]))
        return 0
    if args[0] == "inspect":
        if info is None:
            print(f"Error: No such object: {args[-1]}", file=sys.stderr)
            return 1
        running = alive(info["pid"])
        print(json.dumps([{"Config": {"Labels": info["labels"]}, "State": {"Running": running,
                                                                          "ExitCode": 0 if running else 1}}]))
        return 0
    if args[0] == "ps":  # --all --filter label=... --format '{{.Names}}': the one container it plays
        if info is not None:
            print("vllm")
        return 0
    if args[0] == "run":
        run(args)
        return 0
    if args[0] == "rm":
        if info is not None:
            kill(info)
            CONTAINER.unlink()
        return 0
    if args[0] == "start":
        info["pid"] = spawn(info["argv"], info["env"])
        CONTAINER.write_text(json.dumps(info))
        return 0
    if args[0] == "logs":
        lines = (STATE / "vllm.log").read_text(errors="replace").splitlines() if (STATE / "vllm.log").exists() else []
        print("\n".join(lines[-int(args[args.index("--tail") + 1]) if "--tail" in args else 0:]))
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
