"""Names with a length limit, kept unique: a name that does not fit is cut and ends in a short hash of the whole.

GCP names have limits (a service account id 6-30 characters, a bucket 63, a disk or VM 63, a label value 63).
Cutting alone makes two names one: `tpu-serve-gemma4-serving-prod-r1` and `-r2` cut at 30 are the same account id, so
the second stack's create fails with 409, and two long stack names cut at 63 would adopt one bucket. A cut name
therefore keeps its last characters for a hash of the full name: the same input always gives the same name (so a
stack's resources keep theirs from one `pulumi up` to the next), and two inputs that differ give different names.
Names that fit are unchanged.
"""

from __future__ import annotations

import hashlib
import re

PROJECT_NAME = "tpu-serve"  # Pulumi.yaml's `name`, the first part of every resource name
HASH_CHARS = 6  # 16^6 = 16.7 M names per prefix: a collision between a project's few stacks is out of reach


def stack_labels(stack: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The labels that identify a stack's resources (the program puts them on everything; `up` and `inventory` find
    orphans by them), plus the stack's own."""
    return {"app": PROJECT_NAME, "stack": stack_slug(stack), "managed-by": "pulumi", **(extra or {})}


# A Cloud Router's description names the stack that owns its NAT (an in-place update of the Router: `description` is
# not ForceNew in resource_compute_router.go); tpuserve/deploy/nat.py reads it back.
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
    """`tpu-serve-<stack>` in the character set every GCP resource name accepts: what the stack's resources are
    named after (the program, components/deployment.py, and the toolkit that finds them, tpuserve inventory)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", stack.lower()).strip("-") or "stack"
    return bounded(f"{PROJECT_NAME}-{slug}", 40)


def vm_name(base: str, slot: str) -> str:
    """The VM's name in slot a (`tpu-serve-<stack>`, what every stack had before slots) or b (`...-b`): two names, so
    a successor can be created beside the VM it replaces in the same zone, where a name exists once."""
    return base if slot == "a" else f"{base}-b"
