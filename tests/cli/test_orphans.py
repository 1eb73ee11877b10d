"""The orphan sweep's parts: the labels it looks for, the Compute list filter and pages, what counts as an orphan."""

from __future__ import annotations

from urllib.parse import parse_qs

import requests

from tests.fakes.google_fakes import PROJECT, labelled_instance, state_with_instance
from tests.fakes.httpfake import FakeServer, Request, Response
from tpuserve.gce import ComputeClient, label_filter
from tpuserve.deploy.orphans import find_orphans, managed_ids
from tpuserve.names import stack_labels

ZONE = "us-east5-a"
BASE = f"/compute/v1/projects/{PROJECT}/zones/{ZONE}"


def test_the_sweep_looks_for_the_labels_every_resource_carries():
    assert stack_labels("Team Dev") == {"app": "tpu-serve", "stack": "team-dev", "managed-by": "pulumi"}
    assert stack_labels("Team Dev", {"env": "dev"}) == {**stack_labels("Team Dev"), "env": "dev"}
    assert label_filter({"app": "tpu-serve", "stack": "dev"}) == '(labels.app = "tpu-serve") (labels.stack = "dev")'


def test_orphans_are_labelled_instances_outside_the_state_and_unattached_disks():
    in_state = labelled_instance(ZONE, name="tpu-serve-dev", status="RUNNING")
    leftover = labelled_instance(ZONE, name="tpu-serve-dev-old", status="TERMINATED")
    pages = {"": {"items": [in_state], "nextPageToken": "p2"}, "p2": {"items": [leftover]}}

    def instances(request: Request) -> Response:
        query = parse_qs(request.query)
        assert query["filter"] == ['(labels.app = "tpu-serve") (labels.stack = "dev")']
        return Response(200, {"kind": "compute#instanceList", **pages[query.get("pageToken", [""])[0]]})

    disks = {"kind": "compute#diskList", "items": [
        {"name": "tpu-serve-dev", "status": "READY", "users": [f"https://www.googleapis.com/compute/v1{BASE}/"
                                                               "instances/tpu-serve-dev"]},
        {"name": "tpu-serve-dev-old", "status": "READY", "creationTimestamp": "2026-11-29T01:58:00.000-08:00"},
        # the stack's warm cache disk, unattached since the VM moved zones: never an orphan
        {"name": "tpu-serve-dev-cache", "status": "READY", "labels": {"app": "tpu-serve", "stack": "dev",
                                                                      "tpu-serve-cache": "dev"}}]}
    routes = {("GET", f"{BASE}/instances"): instances, ("GET", f"{BASE}/disks"): lambda r: Response(200, disks)}
    with FakeServer(routes) as fake, requests.Session() as session:
        found = find_orphans(ComputeClient(session, fake.url), PROJECT, [ZONE, ZONE], stack_labels("dev"),
                             managed_ids(state_with_instance(ZONE)))
    assert [(o.kind, o.name, o.status) for o in found] == [("instance", "tpu-serve-dev-old", "TERMINATED"),
                                                           ("disk", "tpu-serve-dev-old", "READY")]
    assert len(fake.requests) == 3  # two pages of instances, one of disks; the zone listed twice is asked once
