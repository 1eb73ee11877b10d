"""The VM's three metadata keys: the boot logic (`startup-script`, no serving setting in it), the served config
(`tpu-serve-config`, never the token) and the supervisor's code (`tpu-serve-supervisor`), the last two applied on the
running VM. Why: docs/design/supervisor.md#the-startup-script."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2

from components import ops_agent
from components.front import front_config
from tpuserve import facts
from tpuserve.facts import CACHE_DEVICE_NAME, GUEST_WRITE_INTERVAL_S, OPS_AGENT_CONFIG_FILE
from tpuserve.images import image_data_uri, modality_part
from tpuserve.serving import ServingConfig, config_hash, engine_addresses, mm_limits_of, tpu_container_run_args
from vm.hf_token import METADATA_URL

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = ROOT / "templates"
VM_DIR = ROOT / "vm"
# The supervisor, what it imports and reads, and the Ops Agent installer (its config is rendered in too).
SUPERVISOR_FILES = ("supervisor.py", "hf_token.py", "readycheck.py", "compile_cache.py", "guest_state.py",
                    "cache_disk.py", "ops-agent-install.sh", "facts.json")
UNIT_NAME = "tpu-serve-supervisor.service"
WARMUP_IMAGE = "red-square.png"  # one of the shipped probe images, sent once after boot when images are enabled
MIN_FREE_GB = 20  # below this the boot does not use the cache disk (a cold start): an image, weights, compile cache
DEVICE_WAIT_S = 60  # for the cache disk's device link (udev), before the boot goes cold without it


def template_environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    env.filters["shwords"] = lambda values: " ".join(shlex.quote(str(v)) for v in values)
    return env


def render_startup_script(*, cache_disk: bool = True, metadata_url: str = METADATA_URL, root: str = "",
                          cache_device: str = f"/dev/disk/by-id/google-{CACHE_DEVICE_NAME}",
                          python: str = "/usr/bin/python3", supervisor_args: tuple[str, ...] = (),
                          retry_delay_s: int = 10, device_wait_s: int = DEVICE_WAIT_S,
                          min_free_gb: int = MIN_FREE_GB,
                          guest_write_interval_s: float = GUEST_WRITE_INTERVAL_S) -> str:
    """The boot script: its arguments are machine settings and test seams, never a serving setting."""
    return template_environment().get_template("startup.sh.j2").render(
        facts=facts, metadata_url=metadata_url, root=root, cache_device=cache_device,
        expect_cache_disk="true" if cache_disk else "false", min_free_gb=min_free_gb, device_wait_s=device_wait_s,
        unit_name=UNIT_NAME, guest_write_interval_s=guest_write_interval_s, python=python,
        supervisor_args=supervisor_args, retry_delay_s=retry_delay_s)


API_KEY_ENV = "VLLM_API_KEY"  # vLLM's API key from the environment (vllm/envs.py), never --api-key in the argv


def served_hash(serving: ServingConfig, secret_env: Mapping[str, str] | None = None) -> str:
    """The `config-hash` the VM reports: config_hash, with the env's secrets too (a new API key restarts vLLM)."""
    digest = config_hash(serving)
    if not secret_env:
        return digest
    return hashlib.sha256(json.dumps([digest, sorted(secret_env.items())]).encode()).hexdigest()[:16]


def served_config(serving: ServingConfig, secret_name: str, *, machine_type: str, compile_cache_bucket: str = "",
                  ready_timeout_s: int = 3600, server_url: str | None = None, cache_disk: str = "",
                  api_key_secret: str = "", engine_urls: Sequence[str] | None = None) -> str:
    """The `tpu-serve-config` metadata value (JSON, keys sorted); its fields: docs/design/supervisor.md."""
    secret_env = {API_KEY_ENV: api_key_secret} if api_key_secret else {}
    digest = served_hash(serving, secret_env)
    server_url = server_url or f"http://127.0.0.1:{serving.port}"
    addresses = engine_addresses(serving)
    urls = list(engine_urls or ([server_url] if serving.engines == 1 else
                                [f"http://127.0.0.1:{port}" for _, port in addresses]))
    return json.dumps({
        "config_hash": digest, "model": serving.model, "image": serving.image,
        "engines": [{"name": name, "url": url,
                     "docker_run_args": tpu_container_run_args(serving, digest, tuple(secret_env), index)}
                    for index, ((name, _), url) in enumerate(zip(addresses, urls, strict=True))],
        **({"front": front_config(serving)} if serving.engines > 1 else {}),
        **({"secret_env": secret_env, "api_key_env": API_KEY_ENV} if secret_env else {}),
        "machine_type": machine_type, "hf_token_secret": secret_name, "server_url": server_url,
        "warmup_image": "" if serving.mm_limits is None or not serving.mm_limits.get("image")
        else image_data_uri(WARMUP_IMAGE),
        "compile_cache_bucket": compile_cache_bucket, "ready_timeout_s": ready_timeout_s,
        # The disabled-modality check: one request per modality at 0, each must answer 4xx.
        "refusal_parts": {modality: modality_part(modality) for modality, count in mm_limits_of(serving).items()
                          if count == 0},
        **({"cache_disk": cache_disk} if cache_disk else {}),
    }, sort_keys=True, separators=(",", ":"))


def supervisor_bundle(vm_dir: Path = VM_DIR, serving: ServingConfig | None = None) -> str:
    """The `tpu-serve-supervisor` value: {"version": content hash, "files": vm/'s files and the agent's config}."""
    serving = serving or ServingConfig()
    files = {name: (vm_dir / name).read_text() for name in SUPERVISOR_FILES}
    files[OPS_AGENT_CONFIG_FILE] = ops_agent.render_ops_agent_config(
        serving.port, engine_addresses(serving) if serving.engines > 1 else ())
    version = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:12]
    return json.dumps({"version": version, "files": files}, sort_keys=True)
