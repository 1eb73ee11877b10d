"""Facts the stack, the VM's startup script and the toolkit must agree on; each is stated once, here."""

# The VM writes its boot progress as guest attributes under this namespace; the gate and `diagnose` read them.
GUEST_ATTRIBUTE_NAMESPACE = "tpu-serve"
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
# Reference price of Hyperdisk Balanced capacity, USD per GiB-month (us-central1; 3,000 IOPS and 140 MiB/s are
# included at no charge: https://cloud.google.com/compute/docs/disks/hd-types/hyperdisk-balanced). Check
# https://cloud.google.com/compute/disks-image-pricing for your region.
HYPERDISK_BALANCED_USD_PER_GB_MONTH = 0.08
# Label on the cache disk and bucket (value: the stack), so `tpuserve cache ls` finds them in every zone.
CACHE_LABEL = "tpu-serve-cache"

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
