"""The cache disk's provisioned IOPS and throughput (cacheDiskIops, cacheDiskThroughputMibps) reach Compute Engine:
in disks.insert's body for a new disk, and as a PATCH with `paths` (what terraform-provider-google sends,
services/compute/resource_compute_disk.go, "Performance (PATCH)") for an existing or adopted one. The fake Compute
API is tests/cli/test_cache.py's, which holds its disks across calls; its PATCH route is added here."""

from __future__ import annotations

import dataclasses
import urllib.parse

import pytest

from components.config import build_stack_config
from tests.fakes.httpfake import Request, Response
from tests.fakes.pulumi_harness import stack_file_config
from tests.cli.test_cache import SPEC, FakeCompute, disks_client, operation
from tpuserve.caches import ensure_disk
from components.cache_provider import CacheDiskProvider
from tpuserve.serving import ConfigError


class PerformanceCompute(FakeCompute):
    def handle(self, request: Request) -> Response:
        zone = request.path.split("/zones/")[-1].split("/")[0] if "/zones/" in request.path else ""
        if request.method == "PATCH":
            paths = urllib.parse.parse_qs(request.query)["paths"]
            body = request.json()
            self.disks[zone].update({key: body[key] for key in paths})
            return Response(200, operation("op-update", "RUNNING"))
        response = super().handle(request)
        if request.method == "POST" and request.path.endswith("/disks"):  # insert: keep what was provisioned
            body = request.json()
            self.disks[zone].update({k: body[k] for k in ("provisionedIops", "provisionedThroughput") if k in body})
        return response


FAST = dataclasses.replace(SPEC, provisioned_iops=3000, provisioned_throughput=400)


def test_a_new_disk_is_created_with_its_provisioned_performance():
    fake = PerformanceCompute()
    with fake.server:
        disk, adopted = ensure_disk(disks_client(fake), FAST)
    [insert] = [r for r in fake.server.requests if r.method == "POST"]
    assert (insert.json()["provisionedIops"], insert.json()["provisionedThroughput"]) == ("3000", "400")
    assert not adopted and [r for r in fake.server.requests if r.method == "PATCH"] == []
    assert "provisionedIops" not in SPEC.body() and "provisionedThroughput" not in SPEC.body()  # 0: Google's default


def test_an_existing_disk_gets_the_new_performance_in_place_and_only_what_changed():
    fake = PerformanceCompute()
    with fake.server:
        ensure_disk(disks_client(fake), FAST)
        ensure_disk(disks_client(fake), FAST)  # nothing changed: nothing sent
        assert [r for r in fake.server.requests if r.method == "PATCH"] == []
        faster = dataclasses.replace(FAST, provisioned_throughput=800)
        disk, adopted = ensure_disk(disks_client(fake), faster)
    [patch] = [r for r in fake.server.requests if r.method == "PATCH"]
    assert patch.path.endswith("/disks/tpu-serve-dev-cache") and patch.query == "paths=provisionedThroughput"
    assert patch.json() == {"name": "tpu-serve-dev-cache", "provisionedThroughput": "800"}
    assert adopted and disk["provisionedThroughput"] == "800" and disk["provisionedIops"] == "3000"


def test_the_provider_sees_a_performance_change_as_an_update_not_a_replacement():
    olds = {"project": "p", "zone": "z", "name": "n", "sizeGb": 100, "provisionedIops": 3000,
            "provisionedThroughput": 400}
    diff = CacheDiskProvider().diff("id", olds, {**olds, "provisionedThroughput": 800})
    assert diff.changes and diff.replaces == []
    assert not CacheDiskProvider().diff("id", olds, dict(olds)).changes


@pytest.mark.parametrize("key, value, message", [
    ("cacheDiskThroughputMibps", "100", "cacheDiskThroughputMibps: must be from 140 (included free) to 2400 MiB/s "
                                        "(Hyperdisk Balanced's range), got 100"),
    ("cacheDiskThroughputMibps", "2401", "cacheDiskThroughputMibps: must be from 140 (included free) to 2400 MiB/s "
                                         "(Hyperdisk Balanced's range), got 2401"),
    ("cacheDiskIops", "2999", "cacheDiskIops: must be from 3000 (included free) to 160000 (Hyperdisk Balanced's "
                              "range), got 2999"),
])
def test_performance_outside_hyperdisk_balanceds_range_is_one_line_naming_the_key(key, value, message):
    with pytest.raises(ConfigError) as err:
        build_stack_config({**stack_file_config("dev"), key: value})
    assert str(err.value) == message and err.value.key == key


def test_the_monthly_cost_counts_what_is_provisioned_above_the_free_performance():
    default = build_stack_config(stack_file_config("dev"))
    assert default.cache_disk_monthly_usd == 8.0  # 100 GB × $0.08: the default performance is the free one
    faster = build_stack_config({**stack_file_config("dev"), "cacheDiskThroughputMibps": "400"})
    assert faster.cache_disk_monthly_usd == 28.8  # and 260 MiB/s above the free 140 × $0.08
    none = build_stack_config({**stack_file_config("dev"), "cacheDiskSizeGb": "0"})
    assert none.cache_disk_monthly_usd == 0.0
