"""The caches that outlive the VM: a Hyperdisk Balanced disk in the VM's zone and the compile-cache bucket, adopted
when they exist and kept by `pulumi destroy` with `keepCaches` (docs/boot-and-caches.md#caches). The VM's service
account may read and write objects in this bucket only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi.dynamic
from pulumi_gcp import storage

from components.cache_provider import CacheBucketProvider, CacheDiskProvider, disk_id

BUCKET_ROLE = "roles/storage.objectUser"  # get, list, create and delete objects; nothing on the bucket itself


class CacheResource(pulumi.dynamic.Resource):
    """A disk or bucket its provider adopts when one of that name exists (`adopted` says whether it did)."""

    def __init__(self, provider: pulumi.dynamic.ResourceProvider, name: str, props: dict,
                 opts: pulumi.ResourceOptions):
        super().__init__(provider, name, {**props, "adopted": None}, opts)


@dataclass(frozen=True)
class ServingCacheArgs:
    project: str
    zone: str
    region: str
    disk_name: str
    bucket_name: str
    disk_gb: int  # 0: no disk
    bucket: bool
    keep: bool
    reader_email: pulumi.Input[str]
    labels: Mapping[str, str] = field(default_factory=dict)
    disk_iops: int = 0  # provisioned performance (0: Google's default: the free 3,000 IOPS and 140 MiB/s)
    disk_throughput_mibps: int = 0


class ServingCache(pulumi.ComponentResource):
    """`disk_source` (or None) is what the VM attaches; `bucket_name` ('' without) holds the compile cache."""

    disk_source: pulumi.Output[str] | None
    bucket_name: pulumi.Output[str]

    def __init__(self, name: str, args: ServingCacheArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gcp:ServingCache", name, None, opts)
        kept = pulumi.ResourceOptions(parent=self, retain_on_delete=args.keep)
        self.disk_source = None
        if args.disk_gb > 0:
            disk = CacheResource(CacheDiskProvider(), f"{name}-disk", {
                "project": args.project, "zone": args.zone, "name": args.disk_name, "sizeGb": args.disk_gb,
                "type": "hyperdisk-balanced", "labels": dict(args.labels),
                "provisionedIops": args.disk_iops, "provisionedThroughput": args.disk_throughput_mibps}, kept)
            path = disk_id(args.project, args.zone, args.disk_name)
            self.disk_source = disk.id.apply(lambda _: path)  # resolves once the disk exists
        self.bucket_name = pulumi.Output.from_input("")
        if args.bucket:
            bucket = CacheResource(CacheBucketProvider(), f"{name}-bucket", {
                "project": args.project, "name": args.bucket_name, "location": args.region,
                "labels": dict(args.labels)}, kept)
            self.bucket_name = bucket.id.apply(lambda _: args.bucket_name)
            storage.BucketIAMMember(f"{name}-bucket-user", bucket=self.bucket_name, role=BUCKET_ROLE,
                                    member=pulumi.Output.concat("serviceAccount:", args.reader_email),
                                    opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({"diskSource": self.disk_source, "bucketName": self.bucket_name})
