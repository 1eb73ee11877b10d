"""Facts the stack, the VM's startup script and the toolkit must agree on; each is stated once, here."""

# The VM writes its boot progress as guest attributes under this namespace; the gate and `diagnose` read them.
GUEST_ATTRIBUTE_NAMESPACE = "tpu-serve"
# Boot stages in the order the startup script reaches them; `failed` can follow any of them.
BOOT_STAGES = ("installing-docker", "pulling-image", "fetching-token", "starting-server", "loading-model", "serving")
FAILED_STAGE = "failed"

# How long `pulumi up` (and `tpuserve gate`) waits for the model to answer: a cold start takes 8.5-10.5 min.
READY_TIMEOUT_S = 25 * 60
# Flex-start price of one TPU v6e chip-hour in USD (reference deployment).
PRICE_PER_CHIP_HOUR = 1.35
# HBM vLLM can address on one v6e chip (32 GB nominal).
V6E_HBM_GIB = 31.24
# How long the VM keeps asking Secret Manager after a 401/403 before it fails the boot: the stack creates the
# token grant in the same `pulumi up` as the VM, and IAM changes typically take 2 minutes to propagate, sometimes 7
# or longer (https://cloud.google.com/iam/docs/access-change-propagation).
IAM_PROPAGATION_WAIT_S = 10 * 60
# The one role the VM's service account holds on the token secret; the startup script names it when it is missing.
SECRET_ACCESSOR_ROLE = "roles/secretmanager.secretAccessor"

# Zones whose Compute Engine offers TPU v6e machine types (ct6e-standard-*), ordered by evidence: europe-west4-a
# first (the reference deployment got flex-start capacity there twice after its us-east5-a/b requests expired
# unfulfilled, and us-east5 showed no CT6E quota), then the other v6e zones of
# https://cloud.google.com/tpu/docs/regions-zones, the AI zones last. The stack's default `zones` (what `tpuserve up`
# tries, in order); an offline hint only: `tpuserve preflight` asks Compute Engine (machineTypes.get) for each one.
V6E_ZONES = ("europe-west4-a", "us-east1-d", "us-central1-b", "asia-northeast1-b", "us-east5-a", "us-east5-b",
             "us-central1-ai1a", "us-south1-ai1b")

# The LiteLLM proxy a fleet's router runs: the router VM's container image (ghcr.io/berriai/litellm:v<version>, the
# tag scheme from 1.84 on) and the pinned pip install of the router tests and benchmark
# (scripts/install-litellm-proxy.sh) use this one version. 1.108.7 is the newest release whose `proxy` extra resolves
# from the package index (1.110's requires a `litellm-proxy` distribution that is not published there).
LITELLM_VERSION = "1.108.7"
