"""The `local` target: the same `vllm serve` flags in the vLLM OpenAI container on your own Docker host."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_docker as docker

from components.config import LocalConfig
from tpuserve.facts import CONTAINER_HASH_LABEL
from tpuserve.names import base_name, stack_labels
from components.readiness import ReadinessGate, url_target
from tpuserve.serving import config_hash, vllm_serve_args

CONTAINER_HF_CACHE = "/root/.cache/huggingface"
LOOPBACK = "127.0.0.1"
SHM_SIZE_MB = 10 * 1024  # vLLM's workers share tensors through /dev/shm; Docker's 64 MB default is too small


class LocalVllm(pulumi.ComponentResource):
    """Pulls the image, runs `vllm serve` with the model cache mounted and the port on 127.0.0.1 only, then waits in
    `tpuserve gate --url` until the model answers; `outputs` is what `__main__.py` exports."""

    def __init__(self, name: str, cfg: LocalConfig, stack: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:docker:LocalVllm", name, None, opts)
        base = base_name(stack)
        serving_hash = config_hash(cfg.serving)
        labels = {**stack_labels(stack, dict(cfg.labels)), CONTAINER_HASH_LABEL: serving_hash}

        child = pulumi.ResourceOptions(parent=self)
        image = docker.RemoteImage(base, name=cfg.serving.image, keep_locally=True, opts=child)
        container = docker.Container(
            base, name=base, image=image.image_id, command=vllm_serve_args(cfg.serving),
            gpus=cfg.local_gpus or None, shm_size=SHM_SIZE_MB,
            volumes=[docker.ContainerVolumeArgs(host_path=cfg.local_model_cache_path,
                                                container_path=CONTAINER_HF_CACHE)],
            ports=[docker.ContainerPortArgs(internal=cfg.serving.port, external=cfg.local_port, ip=LOOPBACK)],
            # HF_TOKEN only when a token is configured; the env list is then a secret like the token itself
            envs=[] if cfg.hf_token is None else pulumi.Output.secret(cfg.hf_token).apply(
                lambda token: [f"HF_TOKEN={token}"]),
            labels=[docker.ContainerLabelArgs(label=key, value=value) for key, value in sorted(labels.items())],
            opts=child)

        server_url = f"http://{LOOPBACK}:{cfg.local_port}"
        gate = ReadinessGate(f"{base}-ready", url_target(server_url, cfg.serving.model), cfg.readiness_timeout_seconds,
                             triggers=[container.id, serving_hash], opts=child)

        self.outputs: dict[str, Any] = {"target": cfg.target, "endpoint": f"{server_url}/v1",
                                        "model": cfg.serving.model, "vllmArgs": vllm_serve_args(cfg.serving),
                                        "configHash": serving_hash, "bootTimeline": gate.timeline}
        self.register_outputs(self.outputs)
