"""tpu-serve: vLLM on a flex-start Cloud TPU v6e VM (target gcp), a flex-start TPU node pool on GKE (target gke), or
a local Docker host (target local); target router is a fleet's LiteLLM proxy (`tpuserve fleet`). Reads config,
builds the deployment for the target, exports its outputs. Only the target's own component module is imported:
the others bring provider SDKs (pulumi_kubernetes, pulumi_docker) this stack does not use."""

import importlib

import pulumi

from components.config import load_stack_config

TARGETS = {"gcp": ("components.deployment", "TpuServeDeployment"), "gke": ("components.gke_deployment", "GkeTpuServe"),
           "local": ("components.local", "LocalVllm"), "router": ("components.router", "FleetRouter")}

cfg = load_stack_config()
module, component = TARGETS[cfg.target]
deployment = getattr(importlib.import_module(module), component)("tpu-serve", cfg, pulumi.get_stack())
for key, value in deployment.outputs.items():
    pulumi.export(key, value)
