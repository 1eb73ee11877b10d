"""The caches that outlive a VM, as the program declares them and the CLI finds them: their names, and creating or
adopting a cache disk and the compile-cache bucket (docs/boot-and-caches.md#caches)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tpuserve.gce import ZonalDisks
from tpuserve.gcs import Buckets
from tpuserve.names import bounded

DISK_TYPE = "hyperdisk-balanced"


def disk_name(base: str) -> str:
    """`tpu-serve-<stack>-cache`: the same name in every zone (a disk name is unique per zone)."""
    return bounded(f"{base}-cache", 63)


def bucket_name(project: str, base: str) -> str:
    """Bucket names are global: the project id keeps them apart (3-63 characters, lowercase)."""
    return bounded(f"{project}-{base}-cache", 63)


@dataclass(frozen=True)
class DiskSpec:
    project: str
    zone: str
    name: str
    size_gb: int
    labels: Mapping[str, str]
    provisioned_iops: int = 0  # 0: Google's default (the free 3,000 IOPS and 140 MiB/s)
    provisioned_throughput: int = 0  # MiB/s

    def performance(self) -> dict:
        """disks.insert's provisionedIops / provisionedThroughput (int64 as strings), where they are set."""
        return {**({"provisionedIops": str(self.provisioned_iops)} if self.provisioned_iops else {}),
                **({"provisionedThroughput": str(self.provisioned_throughput)} if self.provisioned_throughput else {})}

    def body(self) -> dict:
        """The disks.insert body: Hyperdisk Balanced, with the provisioned performance when one is set."""
        return {"name": self.name, "sizeGb": str(self.size_gb), "type": f"zones/{self.zone}/diskTypes/{DISK_TYPE}",
                "labels": dict(self.labels), **self.performance(),
                "description": "tpu-serve cache: Docker image layers, Hugging Face cache, XLA compile cache"}


def ensure_disk(disks: ZonalDisks, spec: DiskSpec) -> tuple[dict, bool]:
    """(disk, adopted): the existing disk of that name, grown to `size_gb` if smaller, or a new one."""
    found = disks.get(spec.project, spec.zone, spec.name)
    if found is None:
        return disks.insert(spec.project, spec.zone, spec.body()), False
    if int(found.get("sizeGb", 0)) < spec.size_gb:
        disks.resize(spec.project, spec.zone, spec.name, spec.size_gb)
        found = disks.get(spec.project, spec.zone, spec.name) or found
    wanted = {key: value for key, value in spec.performance().items() if str(found.get(key, "")) != value}
    if wanted:  # a changed cacheDiskIops/ThroughputMibps, or an adopted disk made with other values
        disks.update_performance(spec.project, spec.zone, spec.name, wanted)
        found = disks.get(spec.project, spec.zone, spec.name) or found
    return found, True


@dataclass(frozen=True)
class BucketSpec:
    project: str
    name: str
    location: str
    labels: Mapping[str, str]

    def body(self) -> dict:
        """Private, uniform access, in the VM's region (https://cloud.google.com/storage/docs/json_api/v1/buckets)."""
        return {"name": self.name, "location": self.location.upper(), "labels": dict(self.labels),
                "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True},
                                     "publicAccessPrevention": "enforced"}}


def ensure_bucket(buckets: Buckets, spec: BucketSpec) -> tuple[dict, bool]:
    found = buckets.get(spec.name)
    if found is not None:
        return found, True
    return buckets.insert(spec.project, spec.body()), False
