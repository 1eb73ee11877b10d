"""Orphans: instances and disks with a stack's labels that its Pulumi state does not hold, found and deleted in the
zones `tpuserve up` tried (docs/design/inventory.md#two-sweeps)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tpuserve.gce import ComputeClient
from tpuserve.facts import CACHE_LABEL


@dataclass(frozen=True)
class Orphan:
    collection: str  # "instances" or "disks"
    zone: str
    name: str
    status: str
    created: str

    @property
    def kind(self) -> str:
        return self.collection.removesuffix("s")

    def resource_id(self, project: str) -> str:
        return f"projects/{project}/zones/{self.zone}/{self.collection}/{self.name}"

    def describe(self) -> str:
        return f"{self.kind} {self.name} in {self.zone} ({self.status or 'unknown status'}, created {self.created})"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "zone": self.zone, "name": self.name, "status": self.status}

    @classmethod
    def of(cls, collection: str, zone: str, item: Mapping[str, Any]) -> Orphan:
        return cls(collection, zone, item["name"], item.get("status", ""), item.get("creationTimestamp", ""))


def managed_ids(state: Mapping[str, Any]) -> set[str]:
    """The provider ids of a `pulumi stack export`'s resources (what a pending create makes counts as an orphan)."""
    resources = state.get("deployment", {}).get("resources") or []
    return {str(resource["id"]) for resource in resources if resource.get("id")}


def find_orphans(compute: ComputeClient, project: str, zones: Iterable[str], labels: Mapping[str, str],
                 managed: set[str]) -> list[Orphan]:
    """Instances labelled `app` and `stack` that the state does not hold, and unattached disks with them, in `zones`."""
    selector = {key: labels[key] for key in ("app", "stack")}
    found: list[Orphan] = []
    for zone in dict.fromkeys(zones):
        found += [Orphan.of("instances", zone, item) for item in compute.labelled(project, zone, "instances", selector)]
        # a boot disk in use goes with its VM; a cache disk is kept on purpose (a warm boot in a zone left)
        found += [Orphan.of("disks", zone, item) for item in compute.labelled(project, zone, "disks", selector)
                  if not item.get("users") and CACHE_LABEL not in (item.get("labels") or {})]
    return [orphan for orphan in found if orphan.resource_id(project) not in managed]


def blank_cache_disks(compute: ComputeClient, project: str, zones: Iterable[str],
                      labels: Mapping[str, str]) -> list[Orphan]:
    """The stack's cache disks in `zones` no VM ever attached: a failed create's leftovers, holding nothing."""
    selector = {key: labels[key] for key in ("app", "stack")}
    return [Orphan.of("disks", zone, item) for zone in dict.fromkeys(zones)
            for item in compute.labelled(project, zone, "disks", selector)
            if CACHE_LABEL in (item.get("labels") or {}) and not item.get("users")
            and not item.get("lastAttachTimestamp")]


def delete_orphans(compute: ComputeClient, project: str, orphans: Iterable[Orphan]) -> list[str]:
    """Start deleting each orphan; returns the operation names (Compute Engine finishes the deletes)."""
    return [compute.delete(project, orphan.zone, orphan.collection, orphan.name) for orphan in orphans]
