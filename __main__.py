"""tpu-serve: vLLM on a flex-start Cloud TPU v6e VM (target gcp), a flex-start TPU node pool on GKE (target gke), or
a local Docker host (target local); target router is a fleet's LiteLLM proxy (`tpuserve fleet`). Reads config,
builds the deployment for the target, exports its outputs."""

import pulumi

from components.config import load_stack_config
from components.deployment import TpuServeDeployment
from components.gke_deployment import GkeTpuServe
from components.local import LocalVllm
from components.router import FleetRouter

TARGETS = {"gcp": TpuServeDeployment, "gke": GkeTpuServe, "local": LocalVllm, "router": FleetRouter}

cfg = load_stack_config()
deployment = TARGETS[cfg.target]("tpu-serve", cfg, pulumi.get_stack())
for key, value in deployment.outputs.items():
    pulumi.export(key, value)
