"""Facts the stack, the VM's startup script and the toolkit must agree on; each is stated once, here."""

# The VM writes its boot progress as guest attributes under this namespace; the gate and `diagnose` read them.
GUEST_ATTRIBUTE_NAMESPACE = "tpu-serve"
# Google's budget for guest attributes (https://cloud.google.com/compute/docs/metadata/manage-guest-attributes, "When to
# use guest attributes"): at most 10 queries a minute per VM, bursts of at most 3 a second; beyond that Compute Engine
# "might arbitrarily remove guest attributes that are in the process of being written". The reads of the gate count
# (the page does not exempt reads through the Compute API), so the budget is split:
GUEST_ATTRIBUTE_QUERIES_PER_MINUTE = 10
GUEST_ATTRIBUTE_BURST_PER_SECOND = 3
# - the VM keeps the boot's whole state in one key (a JSON object of the fields readers know: stage, config-hash,
#   since, reason, at-<stage>, cache, image, weights, compile-cache, restarts, supervisor, ops-agent; tpuserve/
#   guest_state.py expands it) and writes it at most every GUEST_WRITE_INTERVAL_S (5 a minute), re-asserting it every
#   GUEST_REASSERT_S so a dropped write (a lost `serving`) is repaired within a minute (vm/guest_state.py);
GUEST_STATE_KEY = "state"
GUEST_WRITE_INTERVAL_S = 12.0
GUEST_REASSERT_S = 60.0
# - the gate reads every GATE_POLL_S (4 a minute): 9 of the 10 queries a minute at most, one left for `tpuserve status`.
GATE_POLL_S = 15.0
# Boot stages in the order they are reached: the startup script runs the first three at every boot, the supervisor
# (vm/supervisor.py) the rest, again for every served-config change. `failed` can follow any of them.
BOOT_STAGES = ("preparing-disk", "installing-docker", "starting-supervisor", "pulling-image",
               "restoring-compile-cache", "fetching-token", "starting-server", "loading-model", "serving")
FAILED_STAGE = "failed"
# Written by the supervisor when the container exits after `serving`: it is being restarted (with backoff), and
# `reason` holds the container's last log lines. `serving` follows when it is healthy again; `failed` after
# SUPERVISOR_MAX_RESTARTS restarts in a row that did not stay up.
RESTARTING_STAGE = "restarting"
SUPERVISOR_MAX_RESTARTS = 5

# Instance metadata keys. `startup-script` (boot logic, independent of what is served) runs at every boot; the served
# config (image, `docker run` argv, config hash, model, warm-up; never the token) and the supervisor's code have keys
# of their own, which the supervisor long-polls: a change of either is applied on the running VM.
STARTUP_SCRIPT_KEY = "startup-script"
SERVED_CONFIG_KEY = "tpu-serve-config"
SUPERVISOR_KEY = "tpu-serve-supervisor"

# The cache disk: attached under this device name (the guest sees /dev/disk/by-id/google-<name>) and mounted at
# CACHE_ROOT, which holds Docker's data root, the Hugging Face cache and the XLA compilation cache. Without the disk
# (or when it is unusable) CACHE_ROOT is a directory on the boot disk: the container argv is the same either way.
CACHE_DEVICE_NAME = "tpu-serve-cache"
CACHE_ROOT = "/var/lib/tpu-serve/cache"
# Where the container sees them; VLLM_XLA_CACHE_PATH and JAX_COMPILATION_CACHE_DIR both point at CONTAINER_XLA_CACHE.
CONTAINER_HF_HOME = "/cache/huggingface"
CONTAINER_XLA_CACHE = "/cache/xla"
# The host's XLA cache directory is CACHE_ROOT/xla/<key>, the key made on the VM from the image digest and the machine
# type; the served config carries this placeholder where the key goes.
XLA_CACHE_KEY_PLACEHOLDER = "{xla_cache_key}"
DEFAULT_CACHE_DISK_GB = 100
# The vLLM TPU image a stack runs unless containerImage says otherwise: a digest, so every boot runs the same vLLM
# although vllm/vllm-tpu:nightly moves daily and each new digest is another 20-26 GB on the cache disk
# (vllm-project/tpu-inference#1245). Update it only by a deliberate commit, after load-testing the newer build:
# `python -m tpuserve.registry vllm/vllm-tpu:nightly` prints the tag pinned to its current digest, and `tpuserve images
# check` asks the registry whether the pin still resolves. No workspace of this project could reach a TPU, so the pick
# is the digest with the strongest public record of serving the stock default model on the default machine type
# (VLLM_TPU_IMAGE_EVIDENCE). The only other candidate, the nightly of 2026-09-28 (sha256:ea98ed06..., vLLM
# 0.30.1rc1.dev221), has public runs only with a patched tpu_inference (QAT checkpoints), none of stock E2B. The
# image is newer than tpu-inference b8692ff (2026-08-22), where tpuserve/data/tpu-inference-support.json was read: what
# is refused there stays refused (conservative if this build supports more).
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
# #1245) plus its compressed layers while they download, with room to spare. The VM checks it before pulling and fails
# with the numbers instead of ENOSPC halfway.
IMAGE_PULL_FREE_GB = 40
# Reference price of Hyperdisk Balanced capacity, USD per GiB-month (us-central1; 3,000 IOPS and 140 MiB/s are
# included at no charge: https://cloud.google.com/compute/docs/disks/hd-types/hyperdisk-balanced). Check
# https://cloud.google.com/compute/disks-image-pricing for your region.
HYPERDISK_BALANCED_USD_PER_GB_MONTH = 0.08
# Hyperdisk Balanced "include[s], at no extra charge, up to 3,000 IOPS and 140 MiB/s of throughput. You're billed for
# provisioned throughput that exceeds 140 MiB/s and provisioned IOPS that exceeds 3,000 IOPS"; one volume takes up to
# 160,000 IOPS and 2,400 MiB/s (https://cloud.google.com/compute/docs/disks/hd-types/hyperdisk-balanced). Google also
# bounds throughput by the provisioned IOPS and IOPS by the size: disks.insert refuses a pair outside them, in its words.
HYPERDISK_BALANCED_FREE_IOPS = 3000
HYPERDISK_BALANCED_FREE_MIBPS = 140
HYPERDISK_BALANCED_MAX_IOPS = 160_000
HYPERDISK_BALANCED_MAX_MIBPS = 2400
# What the provisioned IOPS and MiB/s above the free ones cost, USD per month of 730 h, from Google's hourly list prices
# in Iowa (us-central1): "Hyperdisk Balanced IOPS" $0.000027397 per IOPS-hour and "Hyperdisk Balanced Throughput"
# $0.000109589 per MiB/s-hour, as Google's Cloud SQL pricing page listed them on 2026-04-15
# (https://cloud.google.com/sql/docs/sqlserver/pricing, Storage). The Compute Engine page
# (https://cloud.google.com/compute/disks-image-pricing) could not be read from the workspace that wrote this: check
# your region's figures there. (Cloud SQL's capacity price, $0.115/GiB-month, is above Compute Engine's $0.08: these
# are likely upper bounds.)
HYPERDISK_PRICES_AS_OF = "2026-04-15"
HYPERDISK_BALANCED_USD_PER_IOPS_MONTH = round(0.000027397 * 730, 4)
HYPERDISK_BALANCED_USD_PER_MIBPS_MONTH = round(0.000109589 * 730, 4)
# The cache disk's default throughput and IOPS: the free ones. A warm boot reads mostly the weights (Gemma 4 E2B:
# 9.5 GiB, 69 s at 140 MiB/s); 400 MiB/s reads them in 24 s, 45 s off each warm boot for $20.80 a month. The TPU
# bills $0.017 for those 45 s, so the faster disk pays for itself only past ~1,200 warm boots a month, which no dev
# stack makes: faster throughput is an option (`tpuserve plan --cache-disk-throughput` shows what it buys).
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
# A cold boot of a new TPU VM to `serving`, in minutes: the image pull ≈ 5 min and the XLA compile 329 s of 404 s
# (the reference deployment's timeline).
COLD_START_MINUTES = (8.5, 10.5)
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

# The VM's readiness clock (READY_TIMEOUT_S, the stack's `readinessTimeout`) starts only when vLLM starts loading;
# `pulumi up`'s gate starts when the instance is created. So the gate waits for the VM's deadline plus what the
# startup script does before it, each allowance named here, plus a margin to read the VM's own `failed` report:
# the VM, not the gate, is the one to give up first and say why.
GUEST_BOOT_ALLOWANCE_S = 180  # the guest OS boots and runs the startup script
DOCKER_INSTALL_ALLOWANCE_S = 300  # apt-get installs Docker when the image lacks it
IMAGE_PULL_ALLOWANCE_S = 900  # the vllm-tpu image pull (≈5 min measured), retried 5 times with backoff
VM_REPORT_MARGIN_S = 120  # the VM writes `failed` and its reason; the gate polls every few seconds
PRE_READINESS_ALLOWANCES_S = (GUEST_BOOT_ALLOWANCE_S, DOCKER_INSTALL_ALLOWANCE_S, IMAGE_PULL_ALLOWANCE_S,
                              IAM_PROPAGATION_WAIT_S, VM_REPORT_MARGIN_S)

# The Cloud Logging log name of the vLLM container's output on a gcp VM: the Ops Agent's logging receiver id
# (components/ops_agent.py), which `tpuserve logs --source cloud` and `diagnose` read back.
CONTAINER_LOG_NAME = "vllm"

# One stream of google/gemma-4-E2B-it on one v6e chip (the reference flags): output tokens per second, measured. A
# remote sweep's first level takes its deadline from it (tpuserve/measure/bench.py), having no request of its own
# to time from this machine.
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
