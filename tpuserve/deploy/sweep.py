"""The capacity sweep: try a deployment in one zone after another until an attempt succeeds, within a deadline.
It knows nothing about GCP or Pulumi (docs/design/capacity.md#the-sweep)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuserve.zones import region_of

ZONE, REGION, STOP = "zone", "region", "stop"
FIRST_GAP_S = 30.0
MAX_GAP_S = 600.0


@dataclass(frozen=True)
class Failure:
    """Why one attempt failed and how far that reaches."""

    kind: str  # what went wrong, e.g. capacity, quota, permission (tpuserve.deploy.capacity names them)
    block: str  # ZONE, REGION or STOP
    reason: str  # one line, in the provider's own words
    lasting: bool = False  # waiting will not fix it (a missing quota, a machine type a zone does not offer)
    region: str | None = None  # the region a REGION failure names, when it names one
    suggested: tuple[str, ...] = ()  # zones the provider says have capacity now
    hint: str = ""  # what to do about it


@dataclass(frozen=True)
class Attempt:
    zone: str
    round: int
    seconds: float
    failure: Failure | None = None  # None: the attempt succeeded

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def kind(self) -> str:
        return "created" if self.failure is None else self.failure.kind

    def as_dict(self) -> dict[str, Any]:
        return {"zone": self.zone, "round": self.round, "outcome": "ok" if self.ok else "failed", "class": self.kind,
                "seconds": round(self.seconds, 1), "reason": self.failure.reason if self.failure else None}


@dataclass
class SweepResult:
    attempts: list[Attempt] = field(default_factory=list)
    zone: str | None = None  # where the attempt succeeded
    stopped: Failure | None = None  # the failure that ended the sweep at once
    deadline_hit: bool = False

    @property
    def ok(self) -> bool:
        return self.zone is not None


def sweep(candidates: Sequence[str], attempt: Callable[[str, float], Failure | None], deadline_s: float, *,
          retry_until_up: bool = False, first_gap_s: float = FIRST_GAP_S, max_gap_s: float = MAX_GAP_S,
          on_attempt: Callable[[Attempt], None] = lambda a: None,
          on_wait: Callable[[float, int], None] = lambda seconds, next_round: None,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> SweepResult:
    """Try `candidates` in order; `attempt(zone, seconds_left)` deploys in one zone. Returns every attempt made."""
    started, result = clock(), SweepResult()
    lasting_zones: set[str] = set()
    lasting_regions: set[str] = set()
    gap, round_no = first_gap_s, 1

    def left() -> float:
        return deadline_s - (clock() - started)

    while True:
        blocked_zones, blocked_regions = set(lasting_zones), set(lasting_regions)
        queue = list(dict.fromkeys(candidates))
        while queue:
            zone = queue.pop(0)
            if zone in blocked_zones or region_of(zone) in blocked_regions:
                continue
            if left() <= 0:
                result.deadline_hit = True
                return result
            began = clock()
            failure = attempt(zone, left())
            result.attempts.append(done := Attempt(zone, round_no, clock() - began, failure))
            on_attempt(done)
            if failure is None:
                result.zone = zone
                return result
            if failure.block == STOP:
                result.stopped = failure
                return result
            if left() <= 0:  # the attempt ran into the deadline: its failure says nothing about capacity
                result.deadline_hit = True
                return result
            if failure.block == REGION:
                region = failure.region or region_of(zone)
                (lasting_regions if failure.lasting else blocked_regions).add(region)
                blocked_regions.add(region)
            else:
                (lasting_zones if failure.lasting else blocked_zones).add(zone)
                blocked_zones.add(zone)
            for suggested in reversed(failure.suggested):
                if suggested in queue:
                    queue.remove(suggested)
                    queue.insert(0, suggested)
        usable = [zone for zone in candidates if zone not in lasting_zones and region_of(zone) not in lasting_regions]
        if not retry_until_up or not usable:
            return result
        wait = min(gap, left())
        if wait <= 0:
            result.deadline_hit = True
            return result
        on_wait(wait, round_no + 1)
        sleep(wait)
        gap, round_no = min(gap * 2, max_gap_s), round_no + 1
