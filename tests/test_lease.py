"""The fleet lease (tpuserve/deploy/lease.py) against the stateful fake Cloud Storage (tests/fake_cloud.py: generations,
ifGenerationMatch preconditions answering 412 conditionNotMet, media downloads with x-goog-generation).

Time is a fake clock the test moves (the lease's `now`); the renewal thread is driven by `renew_once` where a test is
about what a renewal does, and runs for real (on a short TTL, waited for through the lease's own event) where it is
about the thread."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone

import pytest
import requests

from tests.fake_cloud import PROJECT, FakeCloud
from tpuserve.deploy.cache import BucketSpec, ensure_bucket
from tpuserve.deploy.gcs import Buckets
from tpuserve.deploy.lease import OBJECT, Holder, Lease, LeaseHeld, LeaseLost, LeaseStore, whoami

BUCKET = f"{PROJECT}-tpu-serve-dev-cache"
T0 = datetime(2026, 11, 30, 9, 12, tzinfo=timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def store(fake_cloud: FakeCloud) -> LeaseStore:
    session = requests.Session()
    ensure_bucket(Buckets(session, fake_cloud.url), BucketSpec(PROJECT, BUCKET, "europe-west4", {}))
    return LeaseStore(session, BUCKET, base_url=fake_cloud.url)


def lease(store: LeaseStore, clock: Clock, who: str, pid: int, command: str = "fleet renew", **kwargs) -> Lease:
    lines: list[str] = []
    made = Lease(store, "dev", command, now=clock, sleep=clock.advance, identity=(who, ""), pid=pid,
                 say=lines.append, **kwargs)
    made.lines = lines  # type: ignore[attr-defined]
    return made


def held_body(fake_cloud: FakeCloud) -> dict:
    return json.loads(fake_cloud.objects[(BUCKET, OBJECT)]["data"])


def test_one_command_takes_the_lease_and_the_other_is_told_who_holds_it(fake_cloud: FakeCloud, store: LeaseStore):
    clock = Clock()
    first, second = lease(store, clock, "ci@runner", 4242), lease(store, clock, "ana@laptop", 77, "fleet up")
    first.acquire()
    try:
        with pytest.raises(LeaseHeld) as held:
            second.acquire(wait_s=0)
        assert str(held.value) == ("fleet dev is held by ci@runner (pid 4242, fleet renew) since 09:12 UTC, "
                                   "until 09:22 UTC")
        assert held_body(fake_cloud) == {"holder": "ci@runner", "pid": 4242, "command": "fleet renew", "fleet": "dev",
                                         "started": "2026-11-30T09:12:00Z", "expires": "2026-11-30T09:22:00Z",
                                         "ttlSeconds": 600.0}
        # The loser's attempt was one create with ifGenerationMatch=0, refused with 412, then one read.
        uploads = fake_cloud.calls_to("POST", f"/upload/storage/v1/b/{BUCKET}/o")
        assert [(c.query["ifGenerationMatch"], c.status) for c in uploads] == [(["0"], 200), (["0"], 412)]
    finally:
        first.release()
    assert (BUCKET, OBJECT) not in fake_cloud.objects  # released: deleted
    second.acquire()
    assert held_body(fake_cloud)["holder"] == "ana@laptop"
    second.release()


def test_a_waiting_command_gets_the_lease_once_it_is_released(store: LeaseStore):
    clock = Clock()
    first, second = lease(store, clock, "ci@runner", 1), lease(store, clock, "ana@laptop", 2, "fleet up")
    first.acquire()
    polls: list[datetime] = []

    def sleep(seconds: float) -> None:  # the holder finishes during the second's third pause
        polls.append(clock.now)
        clock.advance(seconds)
        if len(polls) == 3:
            first.release()

    second.sleep = sleep
    second.acquire(wait_s=3600, poll_s=15)
    assert len(polls) == 3 and second.generation is not None
    assert second.lines[0].startswith("waiting up to 60 min for the lease: fleet dev is held by ci@runner")
    second.release()


def test_waiting_ends_at_the_bound_with_the_holder_named(store: LeaseStore):
    clock = Clock()
    first, second = lease(store, clock, "ci@runner", 1), lease(store, clock, "ana@laptop", 2)
    first.acquire()
    first.renew_once()
    with pytest.raises(LeaseHeld, match="held by ci@runner"):
        second.acquire(wait_s=120, poll_s=50)
    assert clock.now == T0 + timedelta(seconds=120)  # 50 + 50 + 20 s of waiting, never more
    first.release()


def test_renewal_moves_expires_and_a_stale_writer_loses(fake_cloud: FakeCloud, store: LeaseStore):
    clock = Clock()
    holder = lease(store, clock, "ci@runner", 1)
    holder.acquire()
    holder._stop.set()  # this test drives the renewals itself
    clock.advance(200)
    generation = holder.generation
    assert holder.renew_once() and holder.generation != generation
    assert held_body(fake_cloud)["expires"] == "2026-11-30T09:25:20Z"
    holder.check()

    # Someone else overwrote it (a taker whose clock runs far ahead): the next renewal is refused and the lease lost.
    other = Holder("ana@laptop", 9, "fleet up", "dev", clock.now, clock.now + timedelta(minutes=10))
    store.write(other, holder.generation)
    assert not holder.renew_once()
    assert "another command wrote the lease: fleet dev is held by ana@laptop" in holder.lost
    with pytest.raises(LeaseLost):
        holder.check()
    holder.release()  # deletes nothing that is not its own
    assert held_body(fake_cloud)["holder"] == "ana@laptop"


def test_a_dead_holders_lease_is_taken_over_after_it_expires(fake_cloud: FakeCloud, store: LeaseStore):
    clock = Clock()
    dead = lease(store, clock, "ci@runner", 4242)
    dead.acquire()
    dead._stop.set()  # the process died: nothing renews it, nothing releases it
    taker = lease(store, clock, "ana@laptop", 7, "fleet up")
    clock.advance(600 + 30)  # expired 30 s ago: within the skew allowance, still held
    with pytest.raises(LeaseHeld, match=r"expired 30 s ago; it may be taken over after 09:23 UTC"):
        taker.acquire()
    clock.advance(31)
    taker.acquire()
    assert held_body(fake_cloud)["holder"] == "ana@laptop"
    assert taker.lines == ["took over the lease of fleet dev from ci@runner (pid 4242, fleet renew), which expired "
                           "at 09:22:00 UTC without a renewal"]
    # The takeover replaced exactly the expired generation (one conditional write), never a newer one.
    uploads = fake_cloud.calls_to("POST", f"/upload/storage/v1/b/{BUCKET}/o")
    assert uploads[-1].query["ifGenerationMatch"] == [str(dead.generation)] and uploads[-1].status == 200
    # The dead holder, were it only paused, finds out at its next renewal.
    assert not dead.renew_once() and "held by ana@laptop" in dead.lost
    taker.release()


def test_a_lease_that_could_not_be_renewed_is_given_up_before_it_expires(store: LeaseStore):
    """Storage unreachable: the thread retries, and once `expires` is a sixth of the TTL away declares the lease lost,
    so the command stops before another may take it over. Each failed attempt moves the fake clock on by 0.1 s."""
    clock = Clock()
    original, attempts = store.write, []

    def write(holder: Holder, if_generation: int) -> int:
        if not if_generation:
            return original(holder, if_generation)
        attempts.append(clock.now)
        clock.advance(0.1)
        raise requests.ConnectionError("Connection refused")

    store.write = write  # type: ignore[method-assign]
    holder = Lease(store, "dev", "fleet renew", ttl_s=0.6, retry_s=0.01, now=clock, identity=("ci@runner", ""))
    holder.acquire()  # the thread starts: first renewal after 0.2 s
    assert holder.lost_event.wait(10)
    assert "no renewal succeeded before 09:12:00 UTC: Connection refused" in holder.lost
    # It retried (every attempt failing) and gave up by the time `expires` was a sixth of the TTL (0.1 s) away.
    assert len(attempts) >= 4 and clock.now <= T0 + timedelta(seconds=0.6 - 0.1 + 0.1 + 1e-6)
    with pytest.raises(LeaseLost):
        holder.check()
    holder.release()


def test_the_thread_renews_until_released(fake_cloud: FakeCloud, store: LeaseStore):
    renewed = threading.Event()
    original = store.write

    def write(holder: Holder, if_generation: int) -> int:
        generation = original(holder, if_generation)
        if if_generation:
            renewed.set()
        return generation

    store.write = write  # type: ignore[method-assign]
    holder = Lease(store, "dev", "fleet renew", ttl_s=0.3, identity=("ci@runner", ""))
    holder.acquire()
    assert renewed.wait(10)  # a renewal landed: ifGenerationMatch=<the generation it wrote>
    holder.check()
    holder.release()
    assert (BUCKET, OBJECT) not in fake_cloud.objects


def test_an_unreadable_lease_never_blocks_a_fleet_for_good(fake_cloud: FakeCloud, store: LeaseStore):
    session = requests.Session()
    session.post(f"{fake_cloud.url}/upload/storage/v1/b/{BUCKET}/o", data=b"locked by hand",
                 params={"uploadType": "media", "name": OBJECT})
    taker = lease(store, Clock(), "ana@laptop", 7)
    taker.acquire()
    assert held_body(fake_cloud)["holder"] == "ana@laptop"
    taker.release()


def test_whoami_names_the_ci_run() -> None:
    holder, run = whoami({"GITHUB_ACTIONS": "true", "GITHUB_RUN_ID": "123", "GITHUB_REPOSITORY": "acme/tpu-serve",
                          "GITHUB_SERVER_URL": "https://github.com"})
    assert "@" in holder and run == "https://github.com/acme/tpu-serve/actions/runs/123"
    assert whoami({})[1] == ""
