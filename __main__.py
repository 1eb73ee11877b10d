"""tpu-serve: vLLM on a flex-start Cloud TPU v6e VM, or on a local Docker host (target local). Reads config, builds
the deployment for the target, exports its outputs."""

import pulumi

from components.config import load_stack_config
from components.deployment import TpuServeDeployment
from components.local import LocalVllm

cfg = load_stack_config()
deployment = (LocalVllm if cfg.target == "local" else TpuServeDeployment)("tpu-serve", cfg, pulumi.get_stack())
for key, value in deployment.outputs.items():
    pulumi.export(key, value)
