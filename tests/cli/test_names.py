"""Names with a length limit never collide by truncation (tpuserve/names.py)."""

from __future__ import annotations

import re

import pytest

from tpuserve.names import base_name
from tpuserve.caches import bucket_name, disk_name
from tpuserve.names import bounded, service_account_id, stack_slug

SERVICE_ACCOUNT_ID = re.compile(r"^[a-z](?:[-a-z0-9]{4,28}[a-z0-9])$")  # IAM's accountId rule


def test_the_two_replicas_the_issue_named_get_two_service_accounts():
    """`gemma4-serving-prod-r1` and `-r2` cut at 30 were one account id: the second stack's create failed (409)."""
    ids = {service_account_id(base_name(stack)) for stack in ("gemma4-serving-prod-r1", "gemma4-serving-prod-r2")}
    assert len(ids) == 2
    assert all(SERVICE_ACCOUNT_ID.match(account) for account in ids)


@pytest.mark.parametrize("limit", [30, 40, 63])
def test_names_that_fit_are_unchanged_and_long_ones_are_unique_and_stable(limit):
    assert bounded("tpu-serve-dev", limit) == "tpu-serve-dev"
    names = [f"tpu-serve-{'x' * 70}-{i}" for i in range(50)]
    cut = [bounded(name, limit) for name in names]
    assert len(set(cut)) == len(names)
    assert all(len(name) <= limit and not name.endswith("-") for name in cut)
    assert cut == [bounded(name, limit) for name in names]  # the same stack keeps its names


def test_long_stacks_keep_distinct_buckets_disks_and_labels():
    project = "my-ml-sandbox-with-a-long-id"
    stacks = [f"team-research-gemma4-serving-experiment-{i}" for i in range(3)]
    assert len({bucket_name(project, base_name(stack)) for stack in stacks}) == 3
    assert len({disk_name(base_name(stack)) for stack in stacks}) == 3
    assert len({stack_slug(stack * 3) for stack in stacks}) == 3
    assert all(len(bucket_name(project, base_name(stack))) <= 63 for stack in stacks)
