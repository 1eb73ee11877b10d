"""A flag change applied in place by the VM's supervisor, against a fresh boot: the CPU analogue, measured.
How and what it leaves out: docs/design/benchmarks.md#an-in-place-change.

    python benchmarks/supervisor_reconfig.py [--vllm-venv ~/.cache/tpuserve/vllm-venv]
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.compile_cache import tiny_model  # noqa: E402
from components.startup_script import served_config, supervisor_bundle  # noqa: E402
from tests.fakes.vm_sandbox import SECRET, FakeGoogle, Knobs  # noqa: E402
from tpuserve.deploy.stack import free_local_port  # noqa: E402
from tpuserve.serving import ServingConfig  # noqa: E402
from vm.supervisor import install_bundle  # noqa: E402


def cpu_serving(model_dir: Path, port: int, *extra: str, **changes) -> ServingConfig:
    """The dev stack's options with the CPU's stand-ins; no --enforce-eager, so torch.compile runs and caches."""
    return dataclasses.replace(ServingConfig(), model=str(model_dir), max_model_len=1024, host="127.0.0.1",
                               port=port, extra_args=("--dtype", "float32", *extra), **changes).validate(backend="cpu")


def state(google: FakeGoogle) -> dict[str, str]:
    """The boot state the last applied guest-attribute write carried (its stage times are exact to the second)."""
    applied = [write for write in google.guest if write.applied]
    return applied[-1].state() if applied else {}


def wait_serving(google: FakeGoogle, config_hash: str, since: float, timeout_s: float = 900) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        attributes = state(google)
        if attributes.get("stage") == "serving" and attributes.get("config-hash") == config_hash:
            return attributes
        if attributes.get("stage") == "failed" and attributes.get("config-hash") == config_hash:
            raise RuntimeError(f"failed: {attributes.get('reason')}")
        time.sleep(0.1)
    raise TimeoutError(f"config {config_hash} not serving after {timeout_s} s")


@click.command()
@click.option("--vllm-venv", type=click.Path(path_type=Path), default=Path.home() / ".cache/tpuserve/vllm-venv")
def main(vllm_venv: Path) -> None:
    model_dir = tiny_model(vllm_venv)
    home = Path(tempfile.mkdtemp(prefix="supervisor-reconfig-"))
    vm_root, state, shims = home / "vmroot", home / "state", home / "shims"
    for path in (vm_root, state, shims):
        path.mkdir()
    (shims / "docker").symlink_to(ROOT / "benchmarks" / "cpu_docker.py")
    port = free_local_port()
    google = FakeGoogle(state, Knobs())
    supervisor = None
    try:
        with google.server:
            def publish(serving: ServingConfig) -> str:
                text = served_config(serving, SECRET, machine_type="ct6e-standard-1t", ready_timeout_s=900,
                                     server_url=f"http://127.0.0.1:{port}")
                google.set_attributes(**{"tpu-serve-config": text})
                return json.loads(text)["config_hash"]

            bundle = supervisor_bundle()
            google.set_attributes(**{"tpu-serve-supervisor": bundle})
            install_bundle(json.loads(bundle), vm_root / "opt/tpu-serve")
            first = publish(cpu_serving(model_dir, port))
            env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "DOCKER_SHIM_STATE": str(state),
                   "CPU_VLLM_BIN": str(vllm_venv / "bin" / "vllm")}
            started = time.time()
            supervisor = subprocess.Popen(
                ["/usr/bin/python3", str(vm_root / "opt/tpu-serve/supervisor.py"), "--metadata-url", google.server.url,
                 "--secret-manager-url", google.server.url, "--root", str(vm_root), "--watch-timeout-s", "30",
                 "--check-s", "1", "--poll-s", "0.2", "--retry-delay-s", "1"],
                env=env, stdout=open(state / "supervisor.log", "wb"), stderr=subprocess.STDOUT,
                start_new_session=True)
            fresh_s = float(wait_serving(google, first, started)["at-serving"]) - started
            print(f"fresh boot to serving: {fresh_s:.1f} s", flush=True)
            results = {"fresh_boot_s": round(fresh_s, 1)}
            # Two in-place changes: one that leaves the compiled graph alone (the reasoning parser is API-side),
            # one that changes it (--max-num-seqs sets the batch shapes torch.compile specializes on).
            changes = [("reasoning parser off", cpu_serving(model_dir, port, reasoning_parser="")),
                       ("--max-num-seqs 8", cpu_serving(model_dir, port, "--max-num-seqs", "8", reasoning_parser=""))]
            for label, serving in changes:
                changed_at = time.time()
                digest = publish(serving)
                served = wait_serving(google, digest, changed_at)
                change_s = float(served["at-serving"]) - changed_at
                reaction_s = float(served["at-starting-server"]) - int(changed_at)  # the state's times: whole seconds
                print(f"flag change ({label}) applied in place: {change_s:.1f} s to serving "
                      f"(container restarted {reaction_s:.1f} s after the metadata write); "
                      f"change / fresh boot = {change_s / fresh_s:.2f}", flush=True)
                results[label] = {"change_s": round(change_s, 1), "restart_after_s": round(reaction_s, 1),
                                  "ratio": round(change_s / fresh_s, 3)}
            print(json.dumps(results))
    finally:
        if supervisor is not None:
            os.killpg(supervisor.pid, 9)
        info = state / "container.json"
        if info.exists():
            subprocess.run([str(ROOT / "benchmarks" / "cpu_docker.py"), "rm", "-f", "vllm"],
                           env={**os.environ, "DOCKER_SHIM_STATE": str(state), "CPU_VLLM_BIN": "unused"})
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
