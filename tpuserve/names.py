"""Names with a length limit, kept unique: a cut name ends in a short hash of the whole (docs/design/core.md#names)."""

from __future__ import annotations

import hashlib
import re

PROJECT_NAME = "tpu-serve"  # Pulumi.yaml's `name`, the first part of every resource name
HASH_CHARS = 6  # 16^6 = 16.7 M names per prefix: a collision between a project's few stacks is out of reach


def stack_labels(stack: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The labels on everything a stack makes (`up` and `inventory` find orphans by them), plus `extra`."""
    return {"app": PROJECT_NAME, "stack": stack_slug(stack), "managed-by": "pulumi", **(extra or {})}


# The stack that owns a Cloud Router's NAT, read back by tpuserve/deploy/nat.py (docs/design/cloud-nat.md).
ROUTER_DESCRIPTION = re.compile(r"^tpu-serve stack (?P<stack>\S+):")


def router_description(stack: str) -> str:
    return f"tpu-serve stack {stack}: Cloud NAT for the VMs of the region without an external IP"


def bounded(name: str, limit: int, separator: str = "-") -> str:
    """`name` if it has at most `limit` characters, else its first characters, `separator` and a hash of it."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:HASH_CHARS]
    head = name[:limit - HASH_CHARS - len(separator)].rstrip("-_.")
    return f"{head}{separator}{digest}"


def stack_slug(stack: str) -> str:
    """A stack's name as a label value (lowercase letters, digits, _ and -; at most 63), unique per stack name."""
    return bounded(re.sub(r"[^a-z0-9_-]+", "-", stack.lower()), 63)


def service_account_id(base: str) -> str:
    """A service account id (6-30 characters) for the resources named `base`."""
    return bounded(base, 30)


def base_name(stack: str) -> str:
    """`tpu-serve-<stack>` in the characters every GCP resource name accepts: the stem of the stack's resource names."""
    slug = re.sub(r"[^a-z0-9-]+", "-", stack.lower()).strip("-") or "stack"
    return bounded(f"{PROJECT_NAME}-{slug}", 40)


def vm_name(base: str, slot: str) -> str:
    """Slot a is `base`, slot b `base-b`: a successor is created beside the VM it replaces, in the same zone."""
    return base if slot == "a" else f"{base}-b"
