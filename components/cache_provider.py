"""Pulumi dynamic providers for the caches: create adopts a disk or bucket of the same name, so a kept cache never
fails the next `up` with "already exists" (docs/boot-and-caches.md#caches); its own module, for dill's pickles."""

from __future__ import annotations

from typing import Any

from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, ResourceProvider, \
    UpdateResult

from tpuserve import caches as cache
from tpuserve import gce
from tpuserve.gce import COMPUTE_URL, ZonalDisks
from tpuserve.gcs import STORAGE_URL, Buckets


def disk_id(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/zones/{zone}/disks/{name}"


def _spec(props: dict[str, Any]) -> cache.DiskSpec:
    return cache.DiskSpec(str(props["project"]), str(props["zone"]), str(props["name"]), int(props["sizeGb"]),
                          dict(props.get("labels") or {}), int(props.get("provisionedIops") or 0),
                          int(props.get("provisionedThroughput") or 0))


class CacheDiskProvider(ResourceProvider):
    def __init__(self, compute_url: str = COMPUTE_URL):
        self.compute_url = compute_url

    def _disks(self) -> ZonalDisks:
        return ZonalDisks(gce.adc_session(), self.compute_url)

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        if olds and olds.get("zone") == news.get("zone") and int(news["sizeGb"]) < int(olds.get("sizeGb", 0)):
            return CheckResult(news, [CheckFailure("sizeGb", f"cacheDiskSizeGb: a disk cannot shrink "
                                                             f"({olds['sizeGb']} -> {news['sizeGb']} GB); `tpuserve "
                                                             "cache rm` it first, or keep the size")])
        return CheckResult(news, [])

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [key for key in ("project", "zone", "name") if olds.get(key) != news.get(key)]
        changes = replaces + [key for key in ("sizeGb", "provisionedIops", "provisionedThroughput")
                              if int(olds.get(key) or 0) != int(news.get(key) or 0)]
        return DiffResult(changes=bool(changes), replaces=replaces, delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        disk, adopted = cache.ensure_disk(self._disks(), _spec(props))
        return CreateResult(disk_id(props["project"], props["zone"], props["name"]),
                            {**props, "sizeGb": int(disk.get("sizeGb", props["sizeGb"])), "adopted": adopted})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        disk = self._disks().get(props["project"], props["zone"], props["name"])
        if disk is None:
            return ReadResult(None, {})  # gone (e.g. `tpuserve cache rm`): the next `pulumi up` creates it again
        return ReadResult(id_, {**props, "sizeGb": int(disk.get("sizeGb", props["sizeGb"]))})

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        disk, _ = cache.ensure_disk(self._disks(), _spec(news))  # grows it
        return UpdateResult({**news, "sizeGb": int(disk.get("sizeGb", news["sizeGb"]))})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        self._disks().delete(props["project"], props["zone"], props["name"])


class CacheBucketProvider(ResourceProvider):
    def __init__(self, storage_url: str = STORAGE_URL):
        self.storage_url = storage_url

    def _buckets(self) -> Buckets:
        return Buckets(gce.adc_session(), self.storage_url)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        """A new name (or project) is another bucket. A new location is only recorded: a bucket cannot move, and a
        replacement would adopt the same global name, then delete it as the old one under the VM."""
        replaces = [key for key in ("project", "name") if olds.get(key) != news.get(key)]
        moved = olds.get("location") != news.get("location")
        return DiffResult(changes=bool(replaces) or moved, replaces=replaces, delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        spec = cache.BucketSpec(str(props["project"]), str(props["name"]), str(props["location"]),
                                dict(props.get("labels") or {}))
        bucket, adopted = cache.ensure_bucket(self._buckets(), spec)
        return CreateResult(str(props["name"]), {**props, "adopted": adopted,
                                                 "bucketLocation": str(bucket.get("location", props["location"]))})

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult({**news, "adopted": olds.get("adopted"),
                             "bucketLocation": olds.get("bucketLocation", olds.get("location"))})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_, props) if self._buckets().get(props["name"]) else ReadResult(None, {})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        self._buckets().delete(props["name"])
