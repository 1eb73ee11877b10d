"""tpu-serve: vLLM on a flex-start Cloud TPU v6e VM. Reads config, builds the deployment, exports its outputs."""

import pulumi

from components.config import load_stack_config
from components.deployment import TpuServeDeployment

deployment = TpuServeDeployment("tpu-serve", load_stack_config(), pulumi.get_stack())
for key, value in deployment.outputs.items():
    pulumi.export(key, value)
