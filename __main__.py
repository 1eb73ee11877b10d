"""tpu-serve: vLLM on a flex-start Cloud TPU v6e VM (target gcp), a flex-start TPU node pool on GKE (target gke), or
a local Docker host (target local). Reads config, builds the deployment for the target (only its component module is
imported: its config class's COMPONENT), exports its outputs."""

import importlib

import pulumi

from components.config import load_stack_config

cfg = load_stack_config()
module, component = cfg.COMPONENT.split(":")
deployment = getattr(importlib.import_module(module), component)("tpu-serve", cfg, pulumi.get_stack())
for key, value in deployment.outputs.items():
    pulumi.export(key, value)
