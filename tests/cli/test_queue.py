"""A flex-start VM in Compute Engine's queue (tpuserve/deploy/queue.py) against the stateful fake cloud, on its clock:
granted, ended by Google at the end of its wait, refused, or abandoned (Ctrl-C) with nothing left behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from tests.fakes.cloud_world import CloudTime
from tests.fakes.fake_cloud import FakeCloud
from tpuserve.deploy import queue as queues
from tpuserve.gce import ComputeClient

PROJECT, ZONE = "my-ml-sandbox", "europe-west4-a"
BODY = {"name": "tpu-serve-dev", "machineType": f"projects/{PROJECT}/zones/{ZONE}/machineTypes/ct6e-standard-1t",
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
            "sourceImage": "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu",
            "diskSizeGb": "200", "diskType": f"projects/{PROJECT}/zones/{ZONE}/diskTypes/hyperdisk-balanced"}}],
        "networkInterfaces": [{"network": f"projects/{PROJECT}/global/networks/default"}],
        "scheduling": {"provisioningModel": "FLEX_START", "maxRunDuration": {"seconds": "14400"},
                       "instanceTerminationAction": "DELETE", "onHostMaintenance": "TERMINATE",
                       "automaticRestart": False},
        "labels": {"app": "tpu-serve", "stack": "dev"}}


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCloud]:
    with FakeCloud(operation_polls=0) as fake:
        fake.capacity[(ZONE, "ct6e-standard-1t")] = 0
        monkeypatch.setattr(queues, "time", CloudTime(fake))
        yield fake


def wait(cloud: FakeCloud, seconds: int, body: dict | None = None) -> tuple[queues.Queued, list[str]]:
    lines: list[str] = []
    done = queues.queue_vm(ComputeClient(requests.Session(), cloud.url), PROJECT, ZONE, body or BODY, seconds,
                           lines.append)
    return done, lines


def test_a_queued_vm_waits_pending_billing_nothing_until_a_chip_frees_then_runs(cloud: FakeCloud):
    cloud.schedule_capacity(ZONE, "ct6e-standard-1t", 1, after_s=25 * 60)
    done, lines = wait(cloud, 7200)
    assert (done.outcome, done.waited_s) == (queues.RUNNING, 25 * 60)
    assert done.instance["status"] == "RUNNING"
    sent = cloud.calls_to("POST", r"/instances$")[0].body
    assert sent["params"] == {"requestValidForDuration": {"seconds": "7200"}} and sent["name"] == "tpu-serve-dev"
    assert lines[0] == "queued tpu-serve-dev in europe-west4-a: Compute Engine holds the request for up to 2h 00m"
    assert lines[1:3] == ["queued in europe-west4-a for 0 s, 2h 00m left",
                          "queued in europe-west4-a for 30 s, 1h 59m left"]
    assert lines[-1] == "granted in europe-west4-a after 25 min: tpu-serve-dev runs"
    assert len(lines) == 1 + 25 * 2 + 1  # a line per 30 s poll
    assert cloud.bill().usd("instance", "tpu-serve-dev") == 0.0  # it bills from now on, not while PENDING


def test_at_the_end_of_its_wait_compute_engine_deletes_it_and_nothing_is_left(cloud: FakeCloud):
    done, lines = wait(cloud, 600)
    assert done.outcome == queues.NO_CAPACITY and done.waited_s == 600
    assert "does not have enough resources available to fulfill the request" in done.reason  # the operation's
    assert [r for r in cloud.inventory() if r.kind in ("instance", "disk")] == []
    assert cloud.bill().total == 0.0


def test_a_refused_insert_is_a_failure_with_the_apis_words(cloud: FakeCloud):
    body = {**BODY, "machineType": f"zones/{ZONE}/machineTypes/ct6e-standard-3t"}
    done, lines = wait(cloud, 600, body)
    assert done.outcome == queues.FAILED
    assert "Machine type with name 'ct6e-standard-3t' does not exist in zone" in done.reason
    assert cloud.inventory() == [] and lines == []


def test_ctrl_c_while_queued_deletes_the_request(cloud: FakeCloud, monkeypatch: pytest.MonkeyPatch):
    """Nobody would follow a VM granted later: it would boot and bill unseen."""
    clock = CloudTime(cloud)
    polls = iter(range(3))

    def sleep(seconds: float) -> None:
        if next(polls, None) is None:
            raise KeyboardInterrupt
        clock.sleep(seconds)

    monkeypatch.setattr(clock, "sleep", sleep)
    monkeypatch.setattr(queues, "time", clock)
    with pytest.raises(KeyboardInterrupt):
        wait(cloud, 7200)
    cloud.clock.advance(60)
    assert [r for r in cloud.inventory() if r.kind == "instance"] == []
    cloud.capacity[(ZONE, "ct6e-standard-1t")] = 1
    cloud.clock.advance(3600)
    assert cloud.bill().total == 0.0  # capacity came, and nothing was there to take it


@pytest.mark.parametrize("left, asked", [(89, 0), (90, 90), (3600.5, 3600), (5 * 3600, 7200)])
def test_the_wait_asked_for_is_what_is_left_within_googles_90_s_to_2_h(left: float, asked: int):
    assert queues.wait_for(left) == asked
