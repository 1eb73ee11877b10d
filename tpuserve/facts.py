"""Facts the stack, the VM's startup script and the toolkit must agree on; each is stated once, here.

Code on the VM cannot import this: scripts/vm_facts.py copies what it reads into vm/facts.json
(docs/design/facts.md)."""

GUEST_ATTRIBUTE_NAMESPACE = "tpu-serve"  # of the VM's boot state (guest attributes)
# Google's guest-attribute budget per VM, split between the VM's writes and the gate's reads (docs/design/facts.md).
GUEST_ATTRIBUTE_QUERIES_PER_MINUTE = 10
GUEST_ATTRIBUTE_BURST_PER_SECOND = 3
# The boot state: one attribute, JSON of these fields, `at-<stage>`, `seq` and `written` (docs/design/facts.md).
GUEST_STATE_KEY = "state"
GUEST_STATE_FIELDS = ("stage", "since", "config-hash", "reason", "cache", "image", "weights", "compile-cache",
                      "restarts", "supervisor", "ops-agent", "warning", "engines", "pruned")
GUEST_STATE_TIMELINE_PREFIX = "at-"
GUEST_WRITE_INTERVAL_S = 12.0
GUEST_REASSERT_S = 60.0
GATE_POLL_S = 15.0  # 4 reads a minute: with the VM's 5 writes, 9 of the 10, one left for `tpuserve status`
# In order: the startup script's three at every boot, then the supervisor's for each served config; `failed` after any.
BOOT_STAGES = ("preparing-disk", "installing-docker", "starting-supervisor", "pulling-image",
               "restoring-compile-cache", "fetching-token", "starting-server", "loading-model", "serving")
FAILED_STAGE = "failed"
RESTARTING_STAGE = "restarting"  # an engine exited after `serving`; `failed` after SUPERVISOR_MAX_RESTARTS in a row
SUPERVISOR_MAX_RESTARTS = 5

# Instance metadata keys: the boot logic, the served config (never the token) and the supervisor's code.
STARTUP_SCRIPT_KEY = "startup-script"
SERVED_CONFIG_KEY = "tpu-serve-config"
SUPERVISOR_KEY = "tpu-serve-supervisor"
# The supervisor's files, and the VM's per-boot state (a tmpfs).
VM_INSTALL_DIR = "/opt/tpu-serve"
VM_RUN_DIR = "/run/tpu-serve"
BOOT_HASH_FILE = f"{VM_RUN_DIR}/boot-config-hash"
CACHE_DEVICE_FILE = f"{VM_RUN_DIR}/cache-device"
CONTAINER_HASH_LABEL = "tpu-serve.config-hash"  # on each serving container (VM and local): the config it serves
OPS_AGENT_CONFIG_FILE = "ops-agent.yaml"  # in the supervisor bundle, beside vm/ops-agent-install.sh
APT_LOCK_TIMEOUT_S = 600  # apt waits this long for dpkg's lock (unattended-upgrades holds it at first boot)

CACHE_DEVICE_NAME = "tpu-serve-cache"  # the cache disk: /dev/disk/by-id/google-<name>, mounted at CACHE_ROOT
CACHE_ROOT = "/var/lib/tpu-serve/cache"  # Docker's data root and the caches (a boot-disk directory without the disk)
CONTAINER_HF_HOME = "/cache/huggingface"  # where the container sees the caches
CONTAINER_XLA_CACHE = "/cache/xla"
# Where the VM puts the XLA cache key (CACHE_ROOT/xla/<key>, vm/compile_cache.py) in the served config's argv.
XLA_CACHE_KEY_PLACEHOLDER = "{xla_cache_key}"
DEFAULT_CACHE_DISK_GB = 100
# The default vLLM TPU image, a digest changed only deliberately; why this one: docs/design/facts.md#the-default-image.
VLLM_TPU_IMAGE = "vllm/vllm-tpu@sha256:19a1a0526476f902eb83e1057f3d8938f35b457dd7716a30e9ab4f7bee90d507"
# Its boot banner's vLLM version, which the support data and the planner's measurements are checked against.
VLLM_TPU_IMAGE_VLLM = "0.29.1rc1.dev468+g0b7f11a1e"
# The pin's evidence, one public run (not ours), quoted; `tpuserve images check` prints it.
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
IMAGE_PULL_FREE_GB = 40  # the image extracted (20-26 GB) plus its layers while they download, checked before a pull
# Hyperdisk Balanced, us-central1: price, free and maximum IOPS and MiB/s, monthly prices above the free ones
# (730 h of Google's hourly list prices as of HYPERDISK_PRICES_AS_OF; sources: docs/design/facts.md).
HYPERDISK_BALANCED_USD_PER_GB_MONTH = 0.08
HYPERDISK_BALANCED_FREE_IOPS = 3000
HYPERDISK_BALANCED_FREE_MIBPS = 140
HYPERDISK_BALANCED_MAX_IOPS = 160_000
HYPERDISK_BALANCED_MAX_MIBPS = 2400
HYPERDISK_PRICES_AS_OF = "2026-04-15"
HYPERDISK_BALANCED_USD_PER_IOPS_MONTH = round(0.000027397 * 730, 4)
HYPERDISK_BALANCED_USD_PER_MIBPS_MONTH = round(0.000109589 * 730, 4)
# The free ones: a faster disk pays only past ~1,200 warm boots a month (docs/boot-and-caches.md#caches).
DEFAULT_CACHE_DISK_MIBPS = HYPERDISK_BALANCED_FREE_MIBPS
DEFAULT_CACHE_DISK_IOPS = HYPERDISK_BALANCED_FREE_IOPS


def hyperdisk_balanced_monthly_usd(size_gb: int, iops: int = HYPERDISK_BALANCED_FREE_IOPS,
                                   throughput_mibps: int = HYPERDISK_BALANCED_FREE_MIBPS,
                                   usd_per_gb_month: float = HYPERDISK_BALANCED_USD_PER_GB_MONTH) -> float:
    """What a Hyperdisk Balanced volume bills per month, VM or not: capacity and what is above the free ones."""
    return (size_gb * usd_per_gb_month
            + max(iops - HYPERDISK_BALANCED_FREE_IOPS, 0) * HYPERDISK_BALANCED_USD_PER_IOPS_MONTH
            + max(throughput_mibps - HYPERDISK_BALANCED_FREE_MIBPS, 0) * HYPERDISK_BALANCED_USD_PER_MIBPS_MONTH)
# Label on the cache disk and bucket (value: the stack), so `tpuserve cache ls` finds them in every zone.
CACHE_LABEL = "tpu-serve-cache"

READY_TIMEOUT_S = 25 * 60  # how long `pulumi up` and `tpuserve gate` wait for the model to answer
COLD_START_MINUTES = (8.5, 10.5)  # a new TPU VM to `serving` (reference deployment: pull ≈ 5 min, compile 329 s)
PRICE_PER_CHIP_HOUR = 1.35  # flex-start USD per TPU v6e chip-hour (reference deployment)
V6E_HBM_GIB = 31.24  # HBM vLLM can address on one v6e chip (32 GB nominal)
# The VM asks Secret Manager again after a 401/403 this long: IAM takes 2 min, sometimes 7 or more, to propagate.
IAM_PROPAGATION_WAIT_S = 10 * 60
# The role the VM's account holds on the token secret; the VM names it when it is missing.
SECRET_ACCESSOR_ROLE = "roles/secretmanager.secretAccessor"

# The default `zones`: those offering ct6e-standard-*, in order of evidence (docs/design/facts.md#the-zones-tried).
V6E_ZONES = ("europe-west4-a", "us-east1-d", "us-central1-b", "asia-northeast1-b", "us-east5-a", "us-east5-b",
             "us-central1-ai1a", "us-south1-ai1b")

# The gate waits READY_TIMEOUT_S (from vLLM's start) plus what comes before it plus a margin: the VM gives up first.
GUEST_BOOT_ALLOWANCE_S = 180  # the guest OS boots and runs the startup script
DOCKER_INSTALL_ALLOWANCE_S = 300  # apt-get installs Docker when the image lacks it
IMAGE_PULL_ALLOWANCE_S = 900  # the vllm-tpu image pull (≈5 min measured), retried 5 times with backoff
VM_REPORT_MARGIN_S = 120  # the VM writes `failed` and its reason; the gate polls every few seconds
PRE_READINESS_ALLOWANCES_S = (GUEST_BOOT_ALLOWANCE_S, DOCKER_INSTALL_ALLOWANCE_S, IMAGE_PULL_ALLOWANCE_S,
                              IAM_PROPAGATION_WAIT_S, VM_REPORT_MARGIN_S)

CONTAINER_LOG_NAME = "vllm"  # Cloud Logging log name of the vLLM container's output on a VM (Ops Agent receiver)
# Measured output tokens/s of one google/gemma-4-E2B-it stream on one v6e chip: a sweep's first deadline.
SINGLE_STREAM_TOK_S = 213.0


def provider_facts() -> dict:
    """tpuserve/data/provider-facts.json: each resource type's replacement rules (docs/design/provider-facts.md)."""
    import json
    from importlib import resources

    return json.loads(resources.files("tpuserve").joinpath("data/provider-facts.json").read_text())


def stop_requiring_paths(type_token: str) -> tuple[str, ...]:
    """Input paths the provider changes only on a stopped instance (replaceOnChanges patterns), unconditional ones."""
    update = provider_facts()["resources"][type_token].get("update") or {}
    return tuple(e["path"] for e in update.get("needs_stop", []) if e["path"] is not None and not e.get("only_if"))
