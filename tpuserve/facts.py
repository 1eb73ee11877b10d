"""Facts the stack, the VM's startup script and the toolkit must agree on; each is stated once, here.

Code on the VM cannot import this: scripts/vm_facts.py copies what it reads into vm/facts.json
(docs/design/facts.md)."""

# The VM writes its boot state as guest attributes under this namespace; the gate and `diagnose` read them.
GUEST_ATTRIBUTE_NAMESPACE = "tpu-serve"
# Google's guest-attribute budget per VM (https://cloud.google.com/compute/docs/metadata/manage-guest-attributes);
# the gate's reads count too, so it is split between the VM's writes and the gate (docs/design/facts.md).
GUEST_ATTRIBUTE_QUERIES_PER_MINUTE = 10
GUEST_ATTRIBUTE_BURST_PER_SECOND = 3
# The boot's whole state is one attribute: a JSON object of string values, these fields plus `at-<stage>` (unix
# seconds) for each stage reached, and the writer's `seq` and `written`. vm/guest_state.py writes it (at most every
# GUEST_WRITE_INTERVAL_S, again every GUEST_REASSERT_S), tpuserve/guest_state.py reads it.
GUEST_STATE_KEY = "state"
GUEST_STATE_FIELDS = ("stage", "since", "config-hash", "reason", "cache", "image", "weights", "compile-cache",
                      "restarts", "supervisor", "ops-agent", "warning", "engines", "pruned")
GUEST_STATE_TIMELINE_PREFIX = "at-"
GUEST_WRITE_INTERVAL_S = 12.0
GUEST_REASSERT_S = 60.0
GATE_POLL_S = 15.0  # 4 reads a minute: with the VM's 5 writes, 9 of the 10, one left for `tpuserve status`
# Boot stages in the order they are reached: the startup script runs the first three at every boot, the supervisor
# the rest, again for every served-config change. `failed` can follow any of them.
BOOT_STAGES = ("preparing-disk", "installing-docker", "starting-supervisor", "pulling-image",
               "restoring-compile-cache", "fetching-token", "starting-server", "loading-model", "serving")
FAILED_STAGE = "failed"
# An engine exited after `serving` and is being restarted (`reason` holds its last log lines); `failed` after
# SUPERVISOR_MAX_RESTARTS restarts in a row that did not stay up.
RESTARTING_STAGE = "restarting"
SUPERVISOR_MAX_RESTARTS = 5

# Instance metadata keys: the boot logic, the served config (never the token) and the supervisor's code; the
# supervisor long-polls the last two and applies a change on the running VM.
STARTUP_SCRIPT_KEY = "startup-script"
SERVED_CONFIG_KEY = "tpu-serve-config"
SUPERVISOR_KEY = "tpu-serve-supervisor"
# Where the VM keeps the supervisor's files, and its per-boot state (a tmpfs): the guest-state file both writers
# share, the config hash the startup script booted with, and the cache disk's device it mounted.
VM_INSTALL_DIR = "/opt/tpu-serve"
VM_RUN_DIR = "/run/tpu-serve"
BOOT_HASH_FILE = f"{VM_RUN_DIR}/boot-config-hash"
CACHE_DEVICE_FILE = f"{VM_RUN_DIR}/cache-device"
CONTAINER_HASH_LABEL = "tpu-serve.config-hash"  # on each container the supervisor starts: the config it serves
OPS_AGENT_CONFIG_FILE = "ops-agent.yaml"  # in the supervisor bundle, beside vm/ops-agent-install.sh
APT_LOCK_TIMEOUT_S = 600  # apt waits this long for dpkg's lock (unattended-upgrades holds it at first boot)

# The cache disk: attached under this device name (the guest sees /dev/disk/by-id/google-<name>) and mounted at
# CACHE_ROOT (Docker's data root, the Hugging Face cache, the XLA cache); without a usable disk CACHE_ROOT is a
# directory on the boot disk, and the container argv is the same.
CACHE_DEVICE_NAME = "tpu-serve-cache"
CACHE_ROOT = "/var/lib/tpu-serve/cache"
# Where the container sees them; VLLM_XLA_CACHE_PATH and JAX_COMPILATION_CACHE_DIR both point at CONTAINER_XLA_CACHE.
CONTAINER_HF_HOME = "/cache/huggingface"
CONTAINER_XLA_CACHE = "/cache/xla"
# The host's XLA cache is CACHE_ROOT/xla/<key> (vm/compile_cache.py xla_cache_key); the served config carries this
# placeholder where the VM puts the key.
XLA_CACHE_KEY_PLACEHOLDER = "{xla_cache_key}"
DEFAULT_CACHE_DISK_GB = 100
# The vLLM TPU image a stack runs unless containerImage says otherwise: a digest, updated only by a deliberate commit
# after load-testing a newer build (`python -m tpuserve.registry vllm/vllm-tpu:nightly` prints the nightly's). Why
# this one (the strongest public record of serving the default model): docs/design/facts.md.
VLLM_TPU_IMAGE = "vllm/vllm-tpu@sha256:19a1a0526476f902eb83e1057f3d8938f35b457dd7716a30e9ab4f7bee90d507"
# What that image reports itself as (its boot log's banner): what tpuserve/data/tpu-inference-support.json and the
# planner's measurements are checked against.
VLLM_TPU_IMAGE_VLLM = "0.29.1rc1.dev468+g0b7f11a1e"
# Where the pin's evidence comes from: one public run, quoted, not ours. `tpuserve images check` prints it.
VLLM_TPU_IMAGE_EVIDENCE = {
    "source": "https://github.com/xbill9/gemma4-dev/blob/c7f96dafacd803ee4128d955aab83de529795be4/jev-tpu/RESULTS.md",
    "log": "https://github.com/xbill9/gemma4-dev/blob/c7f96dafacd803ee4128d955aab83de529795be4/jev-tpu/results/"
           "2026-09-24-v6e1-evidence/run.log",
    "date": "2026-09-24",
    "ran": "stock google/gemma-4-E2B-it (bf16), TP 1, --max-model-len 2048 --max-num-seqs 16, every modality 0",
    "machine_type": "ct6e-standard-1t",
    "where": "europe-west4-a, on demand",
    "ready_s": 346,  # "READY google/gemma-4-E2B-it after 346s" (run.log); no compile cache
    "also": "E4B 421 s, 12B 512 s and RedHatAI/gemma-4-26B-A4B-it-FP8-dynamic 616 s on the same VM and image",
}
# Free space a pull of the vLLM TPU image needs on Docker's data root: the image extracted (20-26 GB, tpu-inference
# #1245) plus its compressed layers while they download. The VM checks it before pulling, not ENOSPC halfway.
IMAGE_PULL_FREE_GB = 40
# Hyperdisk Balanced, us-central1 (https://cloud.google.com/compute/docs/disks/hd-types/hyperdisk-balanced and
# https://cloud.google.com/compute/disks-image-pricing; check your region): capacity USD per GiB-month, the IOPS and
# MiB/s included free, a volume's maximums, and what provisioning above the free ones costs per month of 730 h, from
# Google's hourly list prices as of HYPERDISK_PRICES_AS_OF (where they were read: docs/design/facts.md).
HYPERDISK_BALANCED_USD_PER_GB_MONTH = 0.08
HYPERDISK_BALANCED_FREE_IOPS = 3000
HYPERDISK_BALANCED_FREE_MIBPS = 140
HYPERDISK_BALANCED_MAX_IOPS = 160_000
HYPERDISK_BALANCED_MAX_MIBPS = 2400
HYPERDISK_PRICES_AS_OF = "2026-04-15"
HYPERDISK_BALANCED_USD_PER_IOPS_MONTH = round(0.000027397 * 730, 4)
HYPERDISK_BALANCED_USD_PER_MIBPS_MONTH = round(0.000109589 * 730, 4)
# The cache disk's default throughput and IOPS: the free ones (a faster disk pays for itself only past ~1,200 warm
# boots a month: docs/boot-and-caches.md#caches; `tpuserve plan --cache-disk-throughput` shows what it buys).
DEFAULT_CACHE_DISK_MIBPS = HYPERDISK_BALANCED_FREE_MIBPS
DEFAULT_CACHE_DISK_IOPS = HYPERDISK_BALANCED_FREE_IOPS


def hyperdisk_balanced_monthly_usd(size_gb: int, iops: int = HYPERDISK_BALANCED_FREE_IOPS,
                                   throughput_mibps: int = HYPERDISK_BALANCED_FREE_MIBPS,
                                   usd_per_gb_month: float = HYPERDISK_BALANCED_USD_PER_GB_MONTH) -> float:
    """What a Hyperdisk Balanced volume bills per month while it exists, VM or not: capacity, and what is
    provisioned above the free IOPS and throughput."""
    return (size_gb * usd_per_gb_month
            + max(iops - HYPERDISK_BALANCED_FREE_IOPS, 0) * HYPERDISK_BALANCED_USD_PER_IOPS_MONTH
            + max(throughput_mibps - HYPERDISK_BALANCED_FREE_MIBPS, 0) * HYPERDISK_BALANCED_USD_PER_MIBPS_MONTH)
# Label on the cache disk and bucket (value: the stack), so `tpuserve cache ls` finds them in every zone.
CACHE_LABEL = "tpu-serve-cache"

# How long `pulumi up` (and `tpuserve gate`) waits for the model to answer: a cold start takes 8.5-10.5 min.
READY_TIMEOUT_S = 25 * 60
# A cold boot of a new TPU VM to `serving`, in minutes (reference deployment: pull ≈ 5 min, XLA compile 329 s of 404).
COLD_START_MINUTES = (8.5, 10.5)
# Flex-start price of one TPU v6e chip-hour in USD (reference deployment).
PRICE_PER_CHIP_HOUR = 1.35
# HBM vLLM can address on one v6e chip (32 GB nominal).
V6E_HBM_GIB = 31.24
# How long the VM asks Secret Manager again after a 401/403: the grant is made in the same `pulumi up`, and IAM takes
# typically 2 minutes, sometimes 7 or more (https://cloud.google.com/iam/docs/access-change-propagation).
IAM_PROPAGATION_WAIT_S = 10 * 60
# The one role the VM's service account holds on the token secret; the startup script names it when it is missing.
SECRET_ACCESSOR_ROLE = "roles/secretmanager.secretAccessor"

# The stack's default `zones`: those offering ct6e-standard-* (https://cloud.google.com/tpu/docs/regions-zones), in
# the order of evidence (docs/design/facts.md); an offline hint only, `tpuserve preflight` asks Compute Engine.
V6E_ZONES = ("europe-west4-a", "us-east1-d", "us-central1-b", "asia-northeast1-b", "us-east5-a", "us-east5-b",
             "us-central1-ai1a", "us-south1-ai1b")

# The gate waits for the VM's own deadline (READY_TIMEOUT_S, which starts when vLLM starts loading) plus what comes
# before it, each allowance named here, plus a margin to read the VM's `failed`: the VM gives up first and says why.
GUEST_BOOT_ALLOWANCE_S = 180  # the guest OS boots and runs the startup script
DOCKER_INSTALL_ALLOWANCE_S = 300  # apt-get installs Docker when the image lacks it
IMAGE_PULL_ALLOWANCE_S = 900  # the vllm-tpu image pull (≈5 min measured), retried 5 times with backoff
VM_REPORT_MARGIN_S = 120  # the VM writes `failed` and its reason; the gate polls every few seconds
PRE_READINESS_ALLOWANCES_S = (GUEST_BOOT_ALLOWANCE_S, DOCKER_INSTALL_ALLOWANCE_S, IMAGE_PULL_ALLOWANCE_S,
                              IAM_PROPAGATION_WAIT_S, VM_REPORT_MARGIN_S)

# The Cloud Logging log name of the vLLM container's output on a gcp VM (the Ops Agent's receiver id).
CONTAINER_LOG_NAME = "vllm"

# One stream of google/gemma-4-E2B-it on one v6e chip (the reference flags), output tokens per second, measured: a
# remote sweep's first deadline (tpuserve/measure/bench.py).
SINGLE_STREAM_TOK_S = 213.0


def provider_facts() -> dict:
    """tpuserve/data/provider-facts.json: each resource type's replacement rules, read from the providers' source by
    scripts/provider_facts.py (docs/design/provider-facts.md)."""
    import json
    from importlib import resources

    return json.loads(resources.files("tpuserve").joinpath("data/provider-facts.json").read_text())


def stop_requiring_paths(type_token: str) -> tuple[str, ...]:
    """The input paths whose change the provider applies only to a stopped instance (replaceOnChanges patterns:
    `[*]` becomes `*`), from the update function's stop list. Conditional entries (only_if) are left out."""
    update = provider_facts()["resources"][type_token].get("update") or {}
    return tuple(e["path"] for e in update.get("needs_stop", []) if e["path"] is not None and not e.get("only_if"))
