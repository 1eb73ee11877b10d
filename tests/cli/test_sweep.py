"""The sweep loop alone, with a scripted attempt and a fake clock: blocking, promotion, deadline, retry with backoff."""

from __future__ import annotations

from tpuserve.deploy.sweep import REGION, STOP, ZONE, Failure, sweep

CAPACITY = Failure("capacity", ZONE, "no capacity")
QUOTA = Failure("quota", REGION, "no quota", lasting=True)
DENIED = Failure("permission", STOP, "denied")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Script:
    """attempt(zone) returns the next scripted outcome for that zone; each attempt takes `cost` seconds."""

    def __init__(self, clock: Clock, outcomes: dict[str, list[Failure | None]], cost: float = 10.0):
        self.clock, self.outcomes, self.cost = clock, {z: list(o) for z, o in outcomes.items()}, cost
        self.tried: list[str] = []

    def __call__(self, zone: str, seconds_left: float) -> Failure | None:
        self.tried.append(zone)
        self.clock.now += min(self.cost, seconds_left)
        return self.outcomes[zone].pop(0) if self.outcomes.get(zone) else CAPACITY


def run(candidates, outcomes, deadline_s=3600.0, cost=10.0, **options):
    clock = Clock()
    script = Script(clock, outcomes, cost)
    result = sweep(candidates, script, deadline_s, clock=clock, sleep=clock.sleep, **options)
    return result, script.tried, clock


def test_first_success_ends_the_sweep_and_every_attempt_is_recorded():
    result, tried, _ = run(["a-b1-a", "a-b1-b", "c-d2-a"], {"a-b1-b": [None]})
    assert result.ok and result.zone == "a-b1-b"
    assert tried == ["a-b1-a", "a-b1-b"]
    assert [(a.zone, a.kind, a.seconds) for a in result.attempts] == [("a-b1-a", "capacity", 10.0),
                                                                      ("a-b1-b", "created", 10.0)]


def test_a_regional_failure_skips_the_rest_of_the_region():
    result, tried, _ = run(["us-east5-a", "us-east5-b", "europe-west4-a"], {"us-east5-a": [QUOTA],
                                                                          "europe-west4-a": [None]})
    assert tried == ["us-east5-a", "europe-west4-a"]
    assert result.zone == "europe-west4-a"


def test_a_failure_can_name_another_region_than_its_zones():
    named = Failure("quota", REGION, "no quota in us-east5", lasting=True, region="us-east5")
    _, tried, _ = run(["europe-west4-a", "us-east5-b", "us-east1-d"], {"europe-west4-a": [named]})
    assert tried == ["europe-west4-a", "us-east1-d"]


def test_suggested_zones_are_tried_next_when_they_are_candidates():
    hint = Failure("capacity", ZONE, "try elsewhere", suggested=("us-central1-b", "nowhere-else1-z"))
    result, tried, _ = run(["us-east5-a", "us-east1-d", "asia-northeast1-b", "us-central1-b"],
                           {"us-east5-a": [hint], "us-central1-b": [None]})
    assert tried == ["us-east5-a", "us-central1-b"]
    assert result.zone == "us-central1-b"


def test_a_stop_failure_ends_the_sweep_at_once():
    result, tried, _ = run(["a-b1-a", "a-b1-b"], {"a-b1-a": [DENIED]})
    assert tried == ["a-b1-a"] and result.stopped == DENIED and not result.ok


def test_one_pass_without_retry_and_no_capacity_anywhere():
    result, tried, clock = run(["a-b1-a", "c-d2-a"], {})
    assert tried == ["a-b1-a", "c-d2-a"]
    assert not result.ok and result.stopped is None and not result.deadline_hit
    assert clock.slept == []


def test_no_attempt_starts_after_the_deadline_and_one_cut_by_it_ends_the_sweep():
    result, tried, clock = run(["a-b1-a", "a-b1-b", "c-d2-a"], {}, deadline_s=15.0)
    assert tried == ["a-b1-a", "a-b1-b"]  # the second attempt had 5 s left and was cut at the deadline
    assert result.deadline_hit and not result.ok
    assert clock.now - 1000.0 == 15.0


def test_retry_until_up_waits_30_s_doubling_up_to_the_cap_then_finds_capacity():
    outcomes = {"a-b1-a": [CAPACITY] * 4 + [None]}
    result, tried, clock = run(["a-b1-a"], outcomes, retry_until_up=True, cost=1.0, max_gap_s=100.0)
    assert result.zone == "a-b1-a"
    assert clock.slept == [30.0, 60.0, 100.0, 100.0]
    assert [a.round for a in result.attempts] == [1, 2, 3, 4, 5]


def test_retry_until_up_keeps_lasting_blocks_and_gives_up_when_nothing_can_change():
    lasting = Failure("unavailable", ZONE, "no such machine type", lasting=True)
    result, tried, clock = run(["us-east5-a", "us-east5-b", "x-y1-a"], {"us-east5-a": [QUOTA], "x-y1-a": [lasting]},
                               retry_until_up=True)
    assert tried == ["us-east5-a", "x-y1-a"]
    assert not result.ok and clock.slept == []


def test_retry_until_up_stops_waiting_at_the_deadline():
    result, tried, clock = run(["a-b1-a"], {}, deadline_s=100.0, retry_until_up=True, cost=10.0)
    assert clock.slept == [30.0, 50.0]  # 10 + 30 + 10, then the 60 s gap is cut to the 50 s left
    assert result.deadline_hit and len(result.attempts) == 2 and clock.now - 1000.0 == 100.0
