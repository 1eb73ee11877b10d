"""What the next `pulumi up` would do to the TPU VM, read from `pulumi preview --json` before anything happens.
The digest's shape and why: docs/design/capacity.md#look-before-leaping."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

INSTANCE = "gcp:compute/instance:Instance"
NODE_POOL = "gcp:container/nodePool:NodePool"
DYNAMIC = "pulumi-python:dynamic:Resource"
CACHE_DISK_SUFFIX = "-cache-disk"  # components/cache.py names the disk resource `<base>-cache-disk`

# Top-level inputs of the Instance and the cache disk -> the stack settings that set them (tests/cli/test_preview.py
# checks that every input the program declares is here).
INPUT_KEYS: dict[str, tuple[str, ...]] = {
    "name": ("vmSlot",), "zone": ("zone",), "project": ("project",), "machineType": ("machineType",),
    "bootDisk": ("bootImage", "bootDiskSizeGb", "bootDiskType"), "scheduling": ("maxRunDuration",),
    "serviceAccount": ("hfTokenSecretId", "project"), "networkInterfaces": ("network", "subnetwork", "externalIp"),
    "attachedDisks": ("cacheDiskSizeGb", "zone", "vmSlot"), "labels": ("labels",), "tags": (),
    "metadata": ("model", "containerImage", "the serving flags"), "reservationAffinity": (), "deletionProtection": (),
    # the cache disk's dynamic resource
    "sizeGb": ("cacheDiskSizeGb",), "provisionedIops": ("cacheDiskIops",),
    "provisionedThroughput": ("cacheDiskThroughputMibps",), "type": (),
}
# Inputs finer than their top-level key (components/instance.py BOOT_IMAGE_KEY).
PATH_KEYS: dict[str, tuple[str, ...]] = {'metadata["tpu-serve-boot-image"]': ("bootImage",)}


@dataclass(frozen=True)
class Step:
    op: str
    urn: str
    type: str
    name: str
    old_inputs: Mapping[str, Any] = field(default_factory=dict)
    new_inputs: Mapping[str, Any] = field(default_factory=dict)
    diff_reasons: tuple[str, ...] = ()
    replace_reasons: tuple[str, ...] = ()
    detailed_diff: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def is_vm(self) -> bool:
        return self.type == INSTANCE

    @property
    def is_cache_disk(self) -> bool:
        return self.type == DYNAMIC and self.name.endswith(CACHE_DISK_SUFFIX)

    @property
    def what(self) -> str:
        return "the TPU VM" if self.is_vm else "the cache disk" if self.is_cache_disk else "the TPU node pool"

    def reasons(self) -> list[str]:
        """The top-level inputs that cause the step: a replace's replaceReasons and `*-replace` detailedDiff paths
        (docs/design/capacity.md#look-before-leaping), else its diffReasons; never `__meta`."""
        replacing = [top_key(path) for path, diff in self.detailed_diff.items()
                     if str(diff.get("kind", "")).endswith("-replace")]
        found = [*self.replace_reasons, *replacing] if self.op == "replace" else [*self.diff_reasons]
        return [key for key in dict.fromkeys(found or self.diff_reasons) if key != "__meta"]

    def changes(self) -> list[str]:
        """'machineType: ct6e-standard-1t -> ct6e-standard-4t' for each reason."""
        return [f"{key}: {short(self.old_inputs.get(key))} -> {short(self.new_inputs.get(key))}"
                for key in self.reasons()]

    def settings(self) -> list[str]:
        """The stack settings behind this step's reasons, in order, each once."""
        finer = [path for path in self.detailed_diff if path in PATH_KEYS]
        covered = {top_key(path) for path in finer} - {top_key(path) for path in self.detailed_diff
                                                          if path not in PATH_KEYS}
        reasons = [reason for reason in self.reasons() if reason not in covered]
        return list(dict.fromkeys([*(key for path in finer for key in PATH_KEYS[path]),
                                   *(key for reason in reasons for key in INPUT_KEYS.get(reason, (reason,)))]))


def top_key(path: str) -> str:
    """`scheduling.maxRunDuration.seconds` -> scheduling, `networkInterfaces[0].network` -> networkInterfaces."""
    return path.split(".", 1)[0].split("[", 1)[0]


def short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 1] + "…"


@dataclass(frozen=True)
class Plan:
    """The steps of one preview, and what they mean for the stateful resources."""

    steps: tuple[Step, ...]

    def _stateful(self, step: Step) -> bool:
        return step.is_vm or step.is_cache_disk or step.type == NODE_POOL

    @property
    def losing(self) -> list[Step]:
        """The steps that replace or delete the VM, its cache disk or a TPU node pool (replacement steps folded in)."""
        return [step for step in self.steps if self._stateful(step) and step.op in ("replace", "delete")]

    @property
    def in_place(self) -> list[Step]:
        return [step for step in self.steps if self._stateful(step) and step.op == "update"]

    def vm_replacement(self) -> Step | None:
        return next((step for step in self.steps if step.is_vm and step.op == "replace"), None)

    def serving_change(self) -> bool:
        """The served config changes on the running VM: the supervisor restarts vLLM."""
        return any(path.startswith('metadata["tpu-serve-config"]') or path == "metadata"
                   for step in self.in_place if step.is_vm for path in step.detailed_diff)


def parse(text: str) -> Plan:
    """A `pulumi preview --json` digest -> Plan. Raises ValueError when the text is not one."""
    try:
        digest = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"pulumi preview --json printed no JSON digest ({err.msg} at line {err.lineno})") from None
    if not isinstance(digest, dict):
        raise ValueError("pulumi preview --json printed no JSON digest (not an object)")
    steps = []
    for raw in digest.get("steps") or []:
        urn = str(raw.get("urn", ""))
        state = raw.get("newState") or raw.get("oldState") or {}
        # else the URN's type, its last `$`-separated part (a child's type carries its parents')
        urn_type = urn.split("::")[2].rsplit("$", 1)[-1] if urn.count("::") >= 3 else ""
        steps.append(Step(
            op=str(raw.get("op", "")), urn=urn, type=str(state.get("type") or urn_type), name=urn.rsplit("::", 1)[-1],
            old_inputs=(raw.get("oldState") or {}).get("inputs") or {},
            new_inputs=(raw.get("newState") or {}).get("inputs") or {},
            diff_reasons=tuple(raw.get("diffReasons") or ()), replace_reasons=tuple(raw.get("replaceReasons") or ()),
            detailed_diff=raw.get("detailedDiff") or {}))
    return Plan(tuple(steps))


def replacement_lines(step: Step, stack: str, chips: int, max_run_seconds: int, price_per_chip_hour: float,
                      delete_first: bool, why: str = "") -> list[str]:
    """What replacing the VM costs, for the warning before it happens; `why` explains the order."""
    from tpuserve.facts import COLD_START_MINUTES

    hours = max_run_seconds / 3600
    return [
        f"{step.what} would be REPLACED by this change ({', '.join(step.settings()) or 'see the diff'}):",
        *(f"  {change}" for change in step.changes()),
        "  the flex-start grant and its max-run clock are lost: the new VM is a new capacity request, which the "
        "zone may not have",
        f"  a cold boot takes {COLD_START_MINUTES[0]}-{COLD_START_MINUTES[1]} min (less with a warm cache disk); the "
        f"new run may bill up to {hours:g} h x {chips} chip(s) x ${price_per_chip_hour:g} = "
        f"${hours * chips * price_per_chip_hour:.2f}",
        "  order: " + ("the old VM is deleted FIRST (no quota room for two at once): the stack serves nothing "
                       "until the new one is ready, and nothing if no zone has capacity" if delete_first else
                       "the old VM keeps serving until the new one is created and ready, then it is deleted "
                       "(for a moment the stack holds twice the chips)"),
        *([f"  {why}"] if why else []),
        f"  go ahead: tpuserve up --stack {stack} --replace-vm (or answer yes when asked)",
    ]


def summary_lines(plan: Plan) -> list[str]:
    """One line per in-place change of the stateful resources."""
    lines = []
    for step in plan.in_place:
        if step.is_vm and plan.serving_change():
            lines.append("in place: the VM keeps serving, the supervisor restarts vLLM with the new config")
        elif step.is_cache_disk:
            lines.append(f"in place: the cache disk changes ({', '.join(step.changes())}); the VM grows its "
                         "filesystem online")
        else:
            lines.append(f"in place: {step.what} keeps running ({', '.join(step.settings()) or 'metadata'})")
    return list(dict.fromkeys(lines))
