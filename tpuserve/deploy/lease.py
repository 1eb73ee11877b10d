"""A fleet's lease: one `tpuserve fleet up|renew|down` acts on a fleet at a time, whichever machine runs it.

Without it a scheduled `fleet renew` and a manual `fleet up` read the same replicas, pick the same next replica stack,
and one's failure path retires what the other just routed; router membership is last-writer-wins. Pulumi's own lock
covers one stack for one update, not a command that reads N stacks and then updates several of them.

The lease is one Cloud Storage object, `leases/fleet.json` in the fleet's bucket, and Cloud Storage's request
preconditions make it a lock ("Preconditions are often used to prevent race conditions in mutating requests ... when
independent processes each attempt to modify the same resource", https://cloud.google.com/storage/docs/request-
preconditions):
- acquire: upload it with `ifGenerationMatch=0`, which succeeds "only if there are no live versions of the object"
  (https://cloud.google.com/storage/docs/json_api/v1/objects/insert); of two commands racing, one gets 200 and the
  other 412 Precondition Failed. The body says who holds it: {holder (user@host), pid, command, started, expires}.
- renew: every third of the TTL, from a background thread, upload it again with `ifGenerationMatch=<the generation
  this holder wrote last>`: every write makes a new generation (https://cloud.google.com/storage/docs/
  metadata#generation-number), so a 412 means someone else wrote it meanwhile. A lost lease (a 412, or no successful
  renewal until shortly before `expires`) is recorded and `check()` raises at the command's next safe point (before a
  `pulumi up`, a router update, a destroy): the command stops rather than act beside another writer.
- expire: a holder that dies stops renewing. A lease past `expires` (plus SKEW_ALLOWANCE_S) may be taken over by
  replacing exactly that generation: one upload with `ifGenerationMatch=<its generation>` (the issue's delete-then-
  create in one request: it fails with 412 if the holder renewed, or a third command took it, in between).
- release: at exit (also on Ctrl-C and SIGTERM, through the command's exit stack), delete it with
  `ifGenerationMatch=<ours>`, so a lease someone else took over is never deleted.

Clock skew: `expires` is written by the holder's clock and judged by the taker's. A taker whose clock runs ahead of the
holder's by more than two thirds of the TTL plus SKEW_ALLOWANCE_S (the lease is at most a third of its TTL old when
read) could take over a live lease; the holder's next renewal then gets 412 and it stops at its next safe point, while
Pulumi's per-stack update lock still refuses a second concurrent update of any one stack. NTP-synced machines (CI
runners, laptops) are off by milliseconds; the TTL (10 minutes) and the allowance (1 minute) leave minutes of margin.

One write per second per object name is Cloud Storage's limit (https://cloud.google.com/storage/quotas#objects); a
renewal every TTL/3 is far below it.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import requests

from tpuserve.client import error_message
from tpuserve.deploy.gcs import STORAGE_URL

OBJECT = "leases/fleet.json"
TTL_S = 600.0
SKEW_ALLOWANCE_S = 60.0
POLL_S = 15.0  # how often a waiting command looks again
RETRY_S = 15.0  # a renewal that failed for another reason than 412 is retried this often, until it is too late
EXIT_LEASE_HELD = 6  # a fleet command that did not get the lease (0-5: tpuserve up's and fleet's other outcomes)
PRECONDITION_FAILED = 412


class LeaseError(RuntimeError):
    """Cloud Storage answered something other than the lease's own outcomes (no bucket, no permission, ...)."""


class LeaseHeld(RuntimeError):
    """Another command holds the lease (and kept holding it for as long as this one would wait)."""

    def __init__(self, fleet: str, holder: Holder, now: datetime):
        super().__init__(holder.line(fleet, now))
        self.holder = holder


class LeaseLost(RuntimeError):
    """This command no longer holds the lease: it must stop before its next change."""


def utc(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


def whoami(environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """(user@host, the CI run's URL or ""): who a held lease names."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container) and no USER variable
        user = "unknown"
    run = ""
    if environ.get("GITHUB_ACTIONS") == "true" and environ.get("GITHUB_RUN_ID"):
        run = (f"{environ.get('GITHUB_SERVER_URL', 'https://github.com')}/{environ.get('GITHUB_REPOSITORY', '')}"
               f"/actions/runs/{environ['GITHUB_RUN_ID']}")
    return f"{user}@{socket.gethostname()}", run


@dataclass(frozen=True)
class Holder:
    """The lease's body: who holds it, for what, since and until when."""

    holder: str
    pid: int
    command: str
    fleet: str
    started: datetime
    expires: datetime
    ttl_s: float = TTL_S
    run: str = ""  # the CI run's URL, when a CI job holds it

    def body(self) -> bytes:
        return json.dumps({"holder": self.holder, "pid": self.pid, "command": self.command, "fleet": self.fleet,
                           "started": utc(self.started), "expires": utc(self.expires), "ttlSeconds": self.ttl_s,
                           **({"run": self.run} if self.run else {})}).encode()

    @classmethod
    def parse(cls, raw: bytes) -> Holder:
        """The body as written; a body this code cannot read (hand-made, another version) is an unnamed holder whose
        lease expires at once, so it never blocks a fleet for good."""
        try:
            body = json.loads(raw)
            return cls(str(body["holder"]), int(body["pid"]), str(body["command"]), str(body.get("fleet", "")),
                       parse_utc(body["started"]), parse_utc(body["expires"]), float(body.get("ttlSeconds", TTL_S)),
                       str(body.get("run", "")))
        except (ValueError, KeyError, TypeError):
            epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
            return cls("an unreadable lease", 0, "unknown", "", epoch, epoch)

    def as_dict(self) -> dict[str, Any]:
        return {**json.loads(self.body()), "ttlSeconds": self.ttl_s}

    def expired(self, now: datetime, allowance_s: float = SKEW_ALLOWANCE_S) -> bool:
        return now > self.expires + timedelta(seconds=allowance_s)

    def line(self, fleet: str, now: datetime) -> str:
        """'fleet dev is held by ci@runner (pid 4242, fleet renew) since 09:12 UTC, until 09:27 UTC'."""
        def at(value: datetime) -> str:
            text = f"{value.astimezone(timezone.utc):%H:%M} UTC"
            return text if value.date() == now.astimezone(timezone.utc).date() else \
                f"{value.astimezone(timezone.utc):%Y-%m-%d} {text}"

        text = (f"fleet {fleet} is held by {self.holder} (pid {self.pid}, {self.command}) since {at(self.started)}, "
                f"until {at(self.expires)}")
        if now > self.expires:
            text += (f" (expired {int((now - self.expires).total_seconds())} s ago; it may be taken over after "
                     f"{at(self.expires + timedelta(seconds=SKEW_ALLOWANCE_S))}, allowing for clock skew)")
        return text + (f"; {self.run}" if self.run else "")


class Conflict(RuntimeError):
    """412: the object's generation was not the one the request named."""


class LeaseStore:
    """The lease object through the Cloud Storage JSON API: a media upload with a generation precondition, a media
    download (its generation in the x-goog-generation header, so body and generation come from one response), a
    conditional delete. Shapes: https://cloud.google.com/storage/docs/json_api/v1/objects."""

    def __init__(self, session: requests.Session, bucket: str, name: str = OBJECT, base_url: str = STORAGE_URL,
                 timeout_s: float = 30.0):
        self.session, self.bucket, self.name = session, bucket, name
        self.base_url, self.timeout_s = base_url.rstrip("/"), timeout_s
        self._lock = threading.Lock()  # the renewal thread and the command share the session

    def _object_url(self) -> str:
        return f"{self.base_url}/storage/v1/b/{quote(self.bucket)}/o/{quote(self.name, safe='')}"

    def _fail(self, what: str, response: requests.Response) -> LeaseError:
        return LeaseError(f"{what} gs://{self.bucket}/{self.name}: HTTP {response.status_code}: "
                          f"{error_message(response)}")

    def read(self) -> tuple[Holder, int] | None:
        """(the holder, the object's generation), or None when nobody holds the lease."""
        with self._lock:
            response = self.session.get(self._object_url(), params={"alt": "media"}, timeout=self.timeout_s)
        if response.status_code == 404:
            return None
        if not response.ok:
            raise self._fail("reading", response)
        generation = response.headers.get("x-goog-generation")
        if not generation:
            raise LeaseError(f"reading gs://{self.bucket}/{self.name}: no x-goog-generation header")
        return Holder.parse(response.content), int(generation)

    def write(self, holder: Holder, if_generation: int) -> int:
        """Upload the lease if the live generation is `if_generation` (0: if there is none); its new generation."""
        params = {"uploadType": "media", "name": self.name, "ifGenerationMatch": str(if_generation)}
        with self._lock:
            response = self.session.post(f"{self.base_url}/upload/storage/v1/b/{quote(self.bucket)}/o",
                                         params=params, data=holder.body(),
                                         headers={"Content-Type": "application/json"}, timeout=self.timeout_s)
        if response.status_code == PRECONDITION_FAILED:
            raise Conflict(error_message(response))
        if not response.ok:
            raise self._fail("writing", response)
        return int(response.json()["generation"])

    def delete(self, generation: int) -> bool:
        """Delete the lease if it is still `generation`; False when it is not (someone else's now, or gone)."""
        with self._lock:
            response = self.session.delete(self._object_url(), params={"ifGenerationMatch": str(generation)},
                                           timeout=self.timeout_s)
        if response.status_code in (PRECONDITION_FAILED, 404):
            return False
        if not response.ok:
            raise self._fail("deleting", response)
        return True


@dataclass
class Lease:
    """The lease of one fleet for one command: `acquire`, then `check()` at every safe point, `release` at exit
    (or use it as a context manager). `now`, `sleep` and `wait` (the renewal thread's pause, an Event's wait) are
    parameters so tests run it on a fake clock."""

    store: LeaseStore
    fleet: str
    command: str
    ttl_s: float = TTL_S
    say: Callable[[str], None] = lambda line: None
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    sleep: Callable[[float], None] = time.sleep
    retry_s: float = RETRY_S
    identity: tuple[str, str] = field(default_factory=whoami)
    pid: int = field(default_factory=os.getpid)
    generation: int | None = None  # what this command wrote last; None while it holds nothing
    holder: Holder | None = None
    lost: str = ""  # why the lease was lost, once it was
    lost_event: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    # --- acquiring ----------------------------------------------------------------------------------------------

    def _body(self, started: datetime) -> Holder:
        holder, run = self.identity
        return Holder(holder, self.pid, self.command, self.fleet, started,
                      self.now() + timedelta(seconds=self.ttl_s), self.ttl_s, run)

    def try_acquire(self) -> Holder | None:
        """Take the lease if it is free or expired; None when taken, else who holds it."""
        body = self._body(self.now())
        try:
            self.generation = self.store.write(body, 0)
            self.holder = body
            return None
        except Conflict:
            pass
        found = self.store.read()
        if found is None:  # released between the two requests: try again at once
            return self.try_acquire()
        held, generation = found
        if not held.expired(self.now()):
            return held
        body = self._body(self.now())
        try:
            self.generation = self.store.write(body, generation)
        except Conflict:  # renewed, or taken by a third command, since it was read
            return self.try_acquire()
        self.say(f"took over the lease of fleet {self.fleet} from {held.holder} (pid {held.pid}, {held.command}), "
                 f"which expired at {held.expires:%H:%M:%S} UTC without a renewal")
        self.holder = body
        return None

    def acquire(self, wait_s: float = 0.0, poll_s: float = POLL_S) -> None:
        """Take the lease, waiting up to `wait_s` while another command holds it; LeaseHeld when it still does. The
        renewal thread starts once it is taken."""
        waited, announced = 0.0, False
        while True:
            held = self.try_acquire()
            if held is None:
                self._start_renewing()
                return
            if waited >= wait_s:
                raise LeaseHeld(self.fleet, held, self.now())
            if not announced:
                self.say(f"waiting up to {wait_s / 60:.0f} min for the lease: {held.line(self.fleet, self.now())}")
                announced = True
            pause = min(poll_s, wait_s - waited)
            self.sleep(pause)
            waited += pause

    # --- holding ------------------------------------------------------------------------------------------------

    def renew_once(self) -> bool:
        """Write the lease again with a new `expires`; False (and the lease lost) when someone else wrote it since
        this command last did. Other failures raise (the thread retries them)."""
        if self.generation is None or self.holder is None:
            return False
        body = Holder(self.holder.holder, self.pid, self.command, self.fleet, self.holder.started,
                      self.now() + timedelta(seconds=self.ttl_s), self.ttl_s, self.holder.run)
        try:
            self.generation = self.store.write(body, self.generation)
        except Conflict:
            found = self.store.read()
            self._lose("another command wrote the lease" + (f": {found[0].line(self.fleet, self.now())}"
                                                               if found else " and released it"))
            return False
        self.holder = body
        return True

    def _lose(self, why: str) -> None:
        if not self.lost:
            self.lost = why
            self.generation = None
            self.lost_event.set()
            self.say(f"warning: lost the lease of fleet {self.fleet} ({why}); stopping before the next change")

    def _renewal_loop(self) -> None:
        interval = self.ttl_s / 3
        pause = interval
        while not self._stop.wait(pause):
            try:
                pause = interval if self.renew_once() else 0
                if self.lost:
                    return
            except Exception as err:  # noqa: BLE001 - the thread must never end silently while the lease is held
                assert self.holder is not None
                # Stop trusting the lease well before another command may take it over.
                left = (self.holder.expires - self.now()).total_seconds() - self.ttl_s / 6
                if left <= 0:
                    self._lose(f"no renewal succeeded before {self.holder.expires:%H:%M:%S} UTC: {err}")
                    return
                pause = min(self.retry_s, left)

    def _start_renewing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._renewal_loop, name=f"lease-{self.fleet}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """At a safe point: LeaseLost when this command no longer holds the lease."""
        if self.lost:
            raise LeaseLost(f"the lease of fleet {self.fleet} was lost ({self.lost})")
        if self.holder is not None and self.now() >= self.holder.expires:
            self._lose(f"it expired at {self.holder.expires:%H:%M:%S} UTC without a renewal")
            raise LeaseLost(f"the lease of fleet {self.fleet} was lost ({self.lost})")

    # --- releasing ----------------------------------------------------------------------------------------------

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still this command's."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.store.timeout_s + 5)
        generation, self.generation = self.generation, None
        if generation is None:
            return
        try:
            if not self.store.delete(generation):
                self.say(f"warning: the lease of fleet {self.fleet} was no longer this command's at exit")
        except (LeaseError, requests.RequestException) as err:
            self.say(f"warning: could not release the lease of fleet {self.fleet} ({err}); it expires at "
                     f"{self.holder.expires:%H:%M} UTC" if self.holder else f"warning: {err}")

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
