"""A stateful fake of the Google Cloud APIs tpu-serve touches: one HTTP server on 127.0.0.1 holding an inventory.

Not a script of answers: instances, disks, routers with their NATs, firewalls, buckets and objects, service
accounts, secrets, dashboards and alert policies are created, updated, listed and deleted through the REST shapes of
Google's references, mutating Compute calls answer Operations that finish, flex-start VMs are deleted by a fake
clock at the end of their run, and everything that exists is priced, so a test reads the bill. A test of a failure
path ends by asserting `cloud.inventory()`.

    with FakeCloud() as cloud:                       # or the `fake_cloud` fixture (tests/conftest.py)
        cloud.capacity[("europe-west4-a", "ct6e-standard-1t")] = 1
        cloud.quota["europe-west4"] = 4               # TPU chips per region
        ZonalDisks(requests.Session(), cloud.url, poll_s=0).insert(...)
        cloud.clock.advance(3600)                     # runs flex-start expiries, finishes timed operations
        cloud.inventory(), cloud.bill().total, cloud.calls

APIs and their references (each handler names the page of its shape or error text):
- Compute Engine v1 and beta, https://cloud.google.com/compute/docs/reference/rest/v1: instances, disks, routers
  (`nats[]` inside the Router resource), firewalls, networks, machineTypes, zones, zonal/regional/global
  operations (`get`, `wait`), aggregatedList keyed `zones/Z` / `regions/R`, `filter=` on labels and fields.
- Cloud Storage JSON API v1, https://cloud.google.com/storage/docs/json_api/v1: buckets, objects (media upload
  and download), generation/metageneration preconditions.
- IAM v1 service accounts, Secret Manager v1 secrets and versions, Cloud Monitoring dashboards (v1) and alert
  policies (v3): enough to create, list and delete what the stacks declare. An alert policy naming a metric that was
  never written is refused as Cloud Monitoring refuses it; `timeSeries.create` (the fake VM's Ops Agent, or
  `cloud.write_time_series`) makes a metric's descriptor exist, `metricDescriptors.get` reads it.
- What `tpuserve preflight` asks (Resource Manager projects.get and testIamPermissions, Service Usage batchGet,
  Cloud Quotas quotaInfos), answered from this state: `cloud.quota` is the TPU quota preflight reads and creates
  draw from.

Error texts are quoted from public sources (noted beside each); the TPU create failures are the ones of
tests/fakes/provider_errors.py, parsed from there so there is one copy, and `provider_error_text` renders an operation's
error the way the Terraform provider prints it (a test checks the round trip). Operation failures that Compute
reports asynchronously (stockout, quota, a disk in use when attaching) arrive on the DONE operation as
`error.errors[]`; refusals the API makes at once (412 fingerprint, 409 exists, 400 disk in use on delete, the
second all-subnetworks NAT) are HTTP errors.

Time: `FakeClock` (virtual seconds; optionally following wall time) is shared by the server and the test. An
operation's effect lands when its virtual duration has passed (0 by default: at once) and its status reads DONE
from the `operation_polls`-th poll on. Nothing here sleeps.

Fast to start (stdlib, tests.fakes.httpfake, tests.fakes.provider_errors, tpuserve.facts) and thread-safe (one lock around
every request and every public method).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote

from tests.fakes import provider_errors
from tests.fakes.httpfake import FakeServer, Request, Response
from tpuserve.facts import HYPERDISK_BALANCED_USD_PER_GB_MONTH, PRICE_PER_CHIP_HOUR, V6E_ZONES
from tpuserve.flex_start import QUEUE_MIN_S

PROJECT = provider_errors.PROJECT
START = "2026-11-29T02:00:00Z"  # the clock's default start, the date the other fixtures use
HOURS_PER_MONTH = 730  # Google's pricing pages turn monthly prices into hourly ones with 730 hours
TOKEN = "ya29.fake-cloud-token"  # the access token of the credentials `FakeCloud.env` writes

# --- prices --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Price:
    usd: float
    unit: str
    source: str
    checked: str  # when the source was read, or where the number already lives in this repository


PRICES: dict[str, Price] = {
    "tpu-v6e-flex-start": Price(PRICE_PER_CHIP_HOUR, "chip-hour", "tpuserve/facts.py PRICE_PER_CHIP_HOUR",
                                "the reference deployment"),
    "hyperdisk-balanced": Price(HYPERDISK_BALANCED_USD_PER_GB_MONTH, "GiB-month",
                                "tpuserve/facts.py HYPERDISK_BALANCED_USD_PER_GB_MONTH (us-central1; the 3,000 "
                                "IOPS and 140 MiB/s baseline are free)", "facts.py"),
    "pd-balanced": Price(0.10, "GiB-month", "https://cloud.google.com/compute/disks-image-pricing (us-central1)",
                         "2026-07: a Google Cloud pricing-calculator estimate (Zonal balanced PD, 30 GiB: $3.00)"),
    "pd-standard": Price(0.04, "GiB-month", "https://cloud.google.com/compute/disks-image-pricing (us-central1)",
                         "not re-read here: check the page"),
    "pd-ssd": Price(0.17, "GiB-month", "https://cloud.google.com/compute/disks-image-pricing (us-central1; "
                                       "a pricing-calculator estimate: 280 GiB zonal SSD PD $47.60)", "2026-07"),
    "e2-vcpu": Price(0.021811, "vCPU-hour", "https://cloud.google.com/compute/vm-instance-pricing#e2_machine_types "
                                           "(us-central1, on-demand)", "not re-read here: check the page"),
    "e2-memory": Price(0.002923, "GiB-hour", "https://cloud.google.com/compute/vm-instance-pricing#e2_machine_types "
                                             "(us-central1, on-demand)", "not re-read here: check the page"),
    "nat-vm": Price(0.0014, "VM-hour", "https://cloud.google.com/nat/pricing (per VM using the gateway, up to 32)",
                    "2026-07"),
    "nat-gateway-max": Price(0.044, "hour", "https://cloud.google.com/nat/pricing (more than 32 VMs)", "2026-07"),
    "nat-ip": Price(0.005, "IP-hour", "https://cloud.google.com/nat/pricing (each external IP the gateway uses)",
                    "2026-07"),
    "gcs-standard": Price(0.020, "GiB-month", "https://cloud.google.com/storage/pricing (Standard storage, "
                                              "us-central1, europe-west4)", "2026-07"),
    "secret-version": Price(0.06, "active version-month", "https://cloud.google.com/secret-manager/pricing",
                            "not re-read here: check the page"),
}


@dataclass(frozen=True)
class MachineType:
    vcpus: int
    memory_gib: float
    chips: int = 0  # TPU chips


# ct6e shapes: https://cloud.google.com/tpu/docs/v6e (1, 4 and 8 chips per VM); e2-standard-N: N vCPUs and 4N GB
# (https://cloud.google.com/compute/docs/general-purpose-machines#e2-standard).
MACHINE_TYPES: dict[str, MachineType] = {
    "ct6e-standard-1t": MachineType(44, 176, 1),
    "ct6e-standard-4t": MachineType(180, 720, 4),
    "ct6e-standard-8t": MachineType(180, 1440, 8),
    **{f"e2-standard-{n}": MachineType(n, 4 * n) for n in (2, 4, 8, 16, 32)},
}


def machine_price_per_hour(machine_type: str, provisioning_model: str) -> tuple[float | None, str]:
    """(USD per hour, the price keys) of a RUNNING VM; None when the table has no price for it (say so, don't
    guess: a v6e VM that is not flex-start has another price)."""
    shape = MACHINE_TYPES.get(machine_type)
    if shape is None:
        return None, ""
    if shape.chips:
        if provisioning_model != "FLEX_START":
            return None, ""
        return shape.chips * PRICES["tpu-v6e-flex-start"].usd, "tpu-v6e-flex-start"
    return (shape.vcpus * PRICES["e2-vcpu"].usd + shape.memory_gib * PRICES["e2-memory"].usd,
            "e2-vcpu+e2-memory")


# --- error texts -----------------------------------------------------------------------------------------------

OPERATION_ERROR_PREFIX = "Error waiting for instance to create: "  # the provider's wrapper of a create's op error


def _split_provider_text(text: str) -> tuple[str, str, str, str]:
    """(message, localized message, help description, help url) out of writeOperationError's layout."""
    body = text.removeprefix(OPERATION_ERROR_PREFIX)
    message, _, rest = body.partition("\n\n\n")
    localized, _, link = rest.partition("\n\n\n")
    description, _, url = link.strip("\n").partition("\n")
    return message.rstrip("\n"), localized.rstrip("\n"), description, url


_STOCKOUT_ZONE = "us-east5-b"
_STOCKOUT_AVAILABLE = "europe-west4-a, us-central1-b"
_stockout = _split_provider_text(provider_errors.STOCKOUT_WITH_SUGGESTION)
# kubernetes/k8s.io#9834 via tests/fakes/provider_errors.py: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS, its localized
# message naming the zones that have capacity, and the troubleshooting link.
STOCKOUT_DETAILED_MESSAGE = _stockout[0].replace(f"projects/{PROJECT}/zones/{_STOCKOUT_ZONE}", "{resource}")
STOCKOUT_LOCALIZED = (_stockout[1].replace("ct6e-standard-1t", "{machine_type}")
                      .replace(f"the {_STOCKOUT_ZONE} zone", "the {zone} zone")
                      .replace(_STOCKOUT_AVAILABLE, "{zones_available}"))
STOCKOUT_HELP = (_stockout[2], _stockout[3])
# terraform-google-forseti#631 via tests/fakes/provider_errors.py: the plain ZONE_RESOURCE_POOL_EXHAUSTED, when no other
# zone has room.
STOCKOUT_MESSAGE = (provider_errors.STOCKOUT.removeprefix(OPERATION_ERROR_PREFIX)
                    .replace(f"projects/{PROJECT}/zones/us-east5-a", "{resource}"))
# The reference deployment's runbook via tests/fakes/provider_errors.py: QUOTA_EXCEEDED with its quotaInfo.
_quota_lines = provider_errors.TPU_FAMILY_QUOTA.removeprefix(OPERATION_ERROR_PREFIX).splitlines()
QUOTA_MESSAGE = _quota_lines[0].replace("0.0", "{limit:.1f}").replace("us-east5", "{region}")
QUOTA_METRIC = _quota_lines[1].partition(" = ")[2]
QUOTA_LIMIT_NAME = _quota_lines[2].partition(" = ")[2]
TPU_FAMILY = "CT6E"


class ApiError(Exception):
    """An HTTP error in Google's JSON error envelope (https://cloud.google.com/apis/design/errors, and the legacy
    `errors[]` with `domain`/`reason` the Compute and Storage JSON APIs still send)."""

    def __init__(self, code: int, message: str, reason: str = "", status: str = "", domain: str = "global",
                 details: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.code, self.message, self.reason, self.status = code, message, reason, status
        self.domain, self.details, self.extra = domain, details, extra

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.reason:
            error["errors"] = [{"message": self.message, "domain": self.domain, "reason": self.reason,
                                **(self.extra or {})}]
        if self.status:
            error["status"] = self.status
        if self.details:
            error["details"] = self.details
        return {"error": error}


def not_found(resource: str) -> ApiError:
    # tests/fakes/google_fakes.py (machineTypes.get) and countless provider logs: "The resource '...' was not found"
    return ApiError(404, f"The resource '{resource}' was not found", "notFound", "NOT_FOUND")


def already_exists(resource: str) -> ApiError:
    # GoogleCloudPlatform/terraform-google-nat-gateway#13: "Error 409: The resource '...' already exists,
    # alreadyExists"
    return ApiError(409, f"The resource '{resource}' already exists", "alreadyExists", "ALREADY_EXISTS")


def invalid(message: str) -> ApiError:
    return ApiError(400, message, "invalid", "INVALID_ARGUMENT")


NAME_RE = re.compile(r"(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)")


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        # cockroachdb's Terraform harness via tests/fakes/provider_errors.py INVALID_ARGUMENT
        raise invalid(f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                      f"'{NAME_RE.pattern}'")
    return name


def provider_error_text(error: Mapping[str, Any]) -> str:
    """An operation's `error` as terraform-provider-google prints it (google/services/compute/compute_operation.go,
    ComputeOperationError.Error and writeOperationError, identical at the pinned 3dc173a397): each error's message,
    then for QUOTA_EXCEEDED the quotaInfo lines, then the first localized message and the first help link."""
    out: list[str] = []
    for item in error.get("errors", []):
        if "message" in item:
            out.append(item["message"] + "\n")
        localized, description, url = "", "", ""
        for detail in item.get("errorDetails", []):
            quota = detail.get("quotaInfo")
            if item.get("code") == "QUOTA_EXCEEDED" and quota is not None:
                out += [f"\t{name} = {quota[key]}\n" for key, name in (("metricName", "metric name"),
                                                                        ("limitName", "limit name"))
                        if key in quota]
                if quota.get("limit"):
                    out.append(f"\tlimit = {_go_number(quota['limit'])}\n")
                if quota.get("futureLimit"):
                    out.append(f"\tfuture limit = {_go_number(quota['futureLimit'])}\n\trollout status = in "
                               "progress\n")
                if quota.get("dimensions") is not None:
                    out.append(f"\tdimensions = {_go_map(quota['dimensions'])}\n")
                break
            localized = localized or detail.get("localizedMessage", {}).get("message", "")
            links = detail.get("help", {}).get("links", [])
            if not url and links:
                description, url = links[0].get("description", ""), links[0].get("url", "")
            if localized and url:
                break
        if localized:
            out.append("\n\n" + localized + "\n")
        if url:
            out.append("\n\n" + (description + "\n" if description else "") + url + "\n")
    return "".join(out)


def _go_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)  # fmt.Sprint of a float64


def _go_map(value: Any) -> str:
    if isinstance(value, Mapping):  # fmt.Sprint of a map: keys sorted
        return "map[" + " ".join(f"{key}:{_go_map(value[key])}" for key in sorted(value)) + "]"
    return str(value)


# --- the clock -------------------------------------------------------------------------------------------------


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text).timestamp()


PACIFIC = timezone(timedelta(hours=-8))  # Compute writes timestamps in Pacific time: '2026-11-29T01:58:00.000-08:00'


def compute_time(t: float) -> str:
    return datetime.fromtimestamp(t, PACIFIC).isoformat(timespec="milliseconds")


def zulu_time(t: float) -> str:
    """Storage, IAM and Secret Manager write UTC with a Z."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class FakeClock:
    """Virtual time in epoch seconds. `advance` moves it and, in time order, runs what falls due on the way
    (operations that finish, flex-start VMs that reach their end), so a bill covers exactly the time a resource
    existed. With `real_time=True` it also follows the wall clock (for subprocesses that sleep for real); what
    falls due then runs at the next request or public call."""

    def __init__(self, start: float | str = START, real_time: bool = False):
        self._base = parse_time(start) if isinstance(start, str) else float(start)
        self._offset = 0.0
        self._real_time = real_time
        self._started = time.monotonic()
        self._listeners: list[Any] = []
        self._lock = threading.RLock()

    def now(self) -> float:
        elapsed = time.monotonic() - self._started if self._real_time else 0.0
        return self._base + self._offset + elapsed

    def rfc3339(self) -> str:
        return zulu_time(self.now())

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        with self._lock:
            target = self.now() + seconds
            while True:
                due = [t for listener in self._listeners
                       if (t := listener.next_event_time()) is not None and t <= target]
                if not due:
                    break
                self._move_to(max(min(due), self.now()))
                for listener in self._listeners:
                    listener.run_due()
            self._move_to(target)
            for listener in self._listeners:
                listener.run_due()

    def _move_to(self, t: float) -> None:
        self._offset += t - self.now()

    def subscribe(self, listener: Any) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Any) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)


# --- records a test reads --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any  # parsed JSON, raw bytes (uploads), or None
    status: int
    authorized: bool  # carried `Authorization: Bearer <token>`


@dataclass(frozen=True)
class Resource:
    """One thing that exists, as `cloud.inventory()` lists it."""

    kind: str  # instance, disk, bucket, router, nat, firewall, serviceAccount, secret, dashboard, alertPolicy
    name: str
    project: str
    location: str  # zone, region, bucket location, or "global"
    labels: Mapping[str, str]
    created: str  # RFC 3339
    status: str
    billing: bool  # accrues charges now
    usd_per_hour: float | None  # None: the price table has no price for it
    attached_to: tuple[str, ...] = ()  # a disk's instances, an instance's disks, a NAT's router
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def usd_per_month(self) -> float | None:
        return None if self.usd_per_hour is None else round(self.usd_per_hour * HOURS_PER_MONTH, 4)


@dataclass(frozen=True)
class BillLine:
    kind: str
    name: str
    project: str
    location: str
    usd: float
    hours: float  # how long it accrued charges
    prices: str  # keys into PRICES


@dataclass(frozen=True)
class Bill:
    lines: tuple[BillLine, ...]
    until: str
    unpriced: tuple[str, ...] = ()  # resources that ran with no price in the table

    @property
    def total(self) -> float:
        return round(sum(line.usd for line in self.lines), 6)

    def usd(self, kind: str, name: str | None = None) -> float:
        return round(sum(line.usd for line in self.lines
                         if line.kind == kind and (name is None or line.name == name)), 6)


@dataclass
class RateLimits:
    """Google's documented request-rate limits, off by default so most tests never meet them.

    - Compute Engine rate quotas per project and minute per method group (https://cloud.google.com/compute/docs/
      api-rate-limits: "If your project exceeds a rate quota, you receive a 403 error with the reason
      rateLimitExceeded"; defaults 1,500/minute): {"read": N, "list": N, "default": N} (default = mutations).
    - Cloud Storage: "an update limit on each object of once per second" and bucket creation and deletion of about
      one every 2 seconds per project (https://cloud.google.com/storage/quotas); 429 rateLimitExceeded.
    """

    compute_per_minute: dict[str, int] = field(default_factory=dict)
    compute_status: int = 403
    gcs_object_write_interval_s: float | None = None  # 1.0 to enforce
    gcs_bucket_op_interval_s: float | None = None  # 2.0 to enforce


# --- helpers -----------------------------------------------------------------------------------------------------

_ids = itertools.count(1)


def _numeric_id(*parts: str) -> str:
    """A stable uint64-looking id (Compute ids are 19-digit strings)."""
    digest = hashlib.sha256("/".join(parts).encode() + str(next(_ids)).encode()).digest()
    return str(10**18 + int.from_bytes(digest[:8], "big") % (9 * 10**18))


def fingerprint(value: Any) -> str:
    """An opaque 8-byte base64 fingerprint of a value (what metadata, labels and tags fingerprints look like)."""
    return base64.b64encode(hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()[:8]).decode()


_PROJECTS_BY_NUMBER: dict[str, str] = {}


def project_number(project: str) -> str:
    """A project's number (stable per id); the APIs take either in paths and write the number in names."""
    number = str(100000000000 + int(hashlib.sha256(project.encode()).hexdigest(), 16) % 900000000000)
    _PROJECTS_BY_NUMBER[number] = project
    return number


def last_segment(value: Any) -> str:
    return str(value or "").rstrip("/").rsplit("/", 1)[-1]


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _public(value: Any) -> Any:
    """The API view of a stored record: bookkeeping keys (a leading underscore) removed, copied."""
    if isinstance(value, dict):
        return {key: _public(item) for key, item in value.items() if not key.startswith("_")}
    if isinstance(value, list):
        return [_public(item) for item in value]
    return value


def _version(value: Any, version: str) -> Any:
    """Compute links name the API version they were asked through."""
    if version == "v1":
        return value
    return json.loads(json.dumps(value).replace("/compute/v1/", f"/compute/{version}/"))


_TERM = re.compile(r"""\s*\(?\s*(?P<field>[A-Za-z_][\w.\-]*)\s*(?P<op>!=|=|:|\beq\b|\bne\b)\s*
                       (?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>[^\s()]+))\s*\)?\s*""", re.VERBOSE)


def parse_filter(text: str) -> Callable[[Mapping[str, Any]], bool]:
    """A Compute list filter (https://cloud.google.com/compute/docs/reference/rest/v1/instances/list, `filter`):
    `field = value`, `!=`, `field:*` (has it), terms ANDed with ` AND ` or by writing them side by side in
    parentheses, as tpuserve.gce.label_filter does. Anything else is refused, not guessed."""
    terms: list[tuple[str, str, str]] = []
    for part in re.split(r"\s+AND\s+|\)\s*(?=\()", text.strip()):
        if not part.strip():
            continue
        match = _TERM.fullmatch(part + (")" if part.lstrip().startswith("(") and not part.rstrip().endswith(")")
                                        else ""))
        if not match:
            raise invalid(f"Invalid value for field 'filter': '{text}'. Invalid list filter expression.")
        value = next(v for v in (match["dq"], match["sq"], match["bare"]) if v is not None)
        terms.append((match["field"], {"eq": "=", "ne": "!="}.get(match["op"], match["op"]), value))

    def matches(item: Mapping[str, Any]) -> bool:
        for path, op, value in terms:
            found: Any = item
            for key in path.split("."):
                found = found.get(key) if isinstance(found, Mapping) else None
            if op == ":":
                ok = found is not None if value == "*" else (found is not None and value in str(found))
            elif op == "=":
                ok = found is not None and str(found) == value
            else:
                ok = found is None or str(found) != value
            if not ok:
                return False
        return True

    return matches


def _page(items: list[Any], query: Mapping[str, list[str]], default: int) -> tuple[list[Any], str]:
    size = int(query.get("maxResults", [default])[0] or default)
    start = int(query.get("pageToken", ["0"])[0] or 0)
    return items[start:start + size], (str(start + size) if start + size < len(items) else "")


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    """Routes compile once per process, however many fakes a test session starts."""
    if pattern not in _PATTERNS:
        _PATTERNS[pattern] = re.compile(pattern)
    return _PATTERNS[pattern]


@dataclass
class _Operation:
    body: dict[str, Any]
    project: str
    due: float
    polls_needed: int
    effect: Callable[[], dict[str, Any] | None] | None
    polls: int = 0
    applied: bool = False


@dataclass
class _Period:
    start: float
    end: float | None
    usd_per_hour: float | None
    prices: str


@dataclass
class _Ledger:
    kind: str
    name: str
    project: str
    location: str
    periods: list[_Period] = field(default_factory=list)


class FakeCloud:
    """The fake: state, the HTTP server (`url`, started by `with` or `start()`), knobs, and what a test reads.

    Knobs (change them any time; they take effect on the next request):
    - capacity[(zone, machine_type)] = units the zone has for that type (TPU chips; 1 per VM for other types),
      held by the VMs there that are not stopped; unlisted: unlimited. An insert beyond it fails on its
      operation with ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS].
    - quota[region] = TPU chips the project may run there; unlisted: unlimited. QUOTA_EXCEEDED on the operation.
    - create_delay_s[zone] = virtual seconds an instance insert there takes (the "create that times out and
      appears later": the client gives up waiting, the instance is PROVISIONING, `clock.advance` makes it RUNNING).
    - The flex-start queue: an insert with `params.requestValidForDuration` of 90 s or more waits as PENDING, holding
      nothing, until quota and capacity admit it (granted first come, first served) or its wait ends (then it is
      deleted and its operation fails). `schedule_capacity(zone, machine_type, units, after_s)` changes a zone's
      capacity later on the clock; `on_granted(instance)` runs when a queued VM starts (it never passes a provider).
    - tpu_zones: zones whose machineTypes offer ct6e (default tpuserve.facts.V6E_ZONES).
    - operation_polls (default 1: the insert answers RUNNING, the first poll DONE; 0: an operation that is
      already finished answers DONE, for clients that sleep before their first poll) and operation_seconds (0).
    - rate_limits (RateLimits, off), disabled_apis, denied_permissions (for preflight), require_auth.
    - metric_visibility_s (seconds from a metric's first write until alert policies may name it; 0) and
      monitoring_unavailable (metricDescriptors.get answers 503).
    """

    def __init__(self, clock: FakeClock | None = None, *, project: str = PROJECT, operation_polls: int = 1,
                 operation_seconds: float = 0.0, require_auth: bool = False):
        self.clock = clock or FakeClock()
        self.project = project
        self.operation_polls = operation_polls
        self.operation_seconds = operation_seconds
        self.require_auth = require_auth
        self.capacity: dict[tuple[str, str], int] = {}
        self.quota: dict[str, int] = {}
        self.create_delay_s: dict[str, float] = {}
        self.tpu_zones: set[str] = set(V6E_ZONES)
        self.rate_limits = RateLimits()
        self.disabled_apis: set[str] = set()
        self.denied_permissions: set[str] = set()
        # seconds after its first write before a metric is accepted in an alert policy (the refusal's own text says
        # it "could take up to 10 minutes"); 0: at once
        self.metric_visibility_s = 0.0
        self.monitoring_unavailable = False  # metricDescriptors.get answers 503 (a read that cannot be made)
        self.image_build = "v20261125"  # the current build of every image family (a new one ships weekly)
        self.capacity_schedule: list[tuple[float, str, str, int]] = []  # (at, zone, machine type, units)
        self.on_granted: Callable[[dict[str, Any]], None] | None = None
        self._lock = threading.RLock()
        self._server: FakeServer | None = None
        self._clear()
        self.clock.subscribe(self)
        self._routes = self._route_table()

    # --- lifecycle ------------------------------------------------------------------------------------------

    def _clear(self) -> None:
        self.calls: list[Call] = []
        self.instances: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.disks: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.routers: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.firewalls: dict[tuple[str, str], dict[str, Any]] = {}
        self.buckets: dict[str, dict[str, Any]] = {}
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.service_accounts: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.dashboards: dict[tuple[str, str], dict[str, Any]] = {}
        self.alert_policies: dict[tuple[str, str], dict[str, Any]] = {}
        self.metric_descriptors: dict[tuple[str, str], dict[str, Any]] = {}  # (project, metric type)
        self.time_series: dict[tuple[str, str, str], list[dict[str, Any]]] = {}  # (project, type, labels): points
        self._metric_writes: list[tuple[float, str, list[dict[str, Any]]]] = []  # due, project, series
        self.operations: dict[str, _Operation] = {}
        self.guest_attributes: dict[tuple[str, str, str], dict[tuple[str, str], str]] = {}
        self.serial_output: dict[tuple[str, str, str], str] = {}
        self._ledgers: dict[str, _Ledger] = {}
        self._rate_windows: dict[tuple[str, str, int], int] = {}
        self._last_write: dict[tuple[str, ...], float] = {}
        self._granted: list[dict[str, Any]] = []

    def reset(self) -> None:
        """Forget every resource, operation, call and charge; the knobs stay."""
        with self._lock:
            self._clear()

    def start(self) -> FakeCloud:
        if self._server is None:
            self._server = FakeServer(fallback=self._serve_http).__enter__()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.__exit__(None, None, None)
            self._server = None

    def __enter__(self) -> FakeCloud:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the fake cloud is not started: use `with FakeCloud() as cloud` or cloud.start()")
        return self._server.url

    # --- how the toolkit reaches it ---------------------------------------------------------------------------

    def endpoint_options(self) -> list[str]:
        """`--endpoint SERVICE=URL` for every API root tpuserve.deploy.preflight.Endpoints knows (up,
        preflight); commands with `--compute-url`/`--storage-url` take `cloud.url` itself."""
        from tpuserve.deploy.preflight import Endpoints

        return [item for name in Endpoints.__dataclass_fields__ for item in ("--endpoint", f"{name}={self.url}")]

    def env(self, directory: Path) -> dict[str, str]:
        """Environment under which `tpuserve.gce.adc_session()` (google.auth.default) finds credentials and
        never leaves 127.0.0.1: an authorized_user ADC file in `directory` (the shape `gcloud auth
        application-default login` writes) carrying an access token that expires in 2099, so google.auth never
        refreshes it (it would refresh at oauth2.googleapis.com: from_authorized_user_info always sets that
        token_uri); the metadata server check off and pointed at a closed port; gcloud's config an empty
        directory. Also the GCP provider's custom-endpoint variables (terraform-provider-google-beta
        google-beta/services/*/product.go), for a provider that honours them."""
        directory.mkdir(parents=True, exist_ok=True)
        adc = directory / "application_default_credentials.json"
        adc.write_text(json.dumps({"type": "authorized_user", "client_id": "fake-cloud.apps.googleusercontent.com",
                                   "client_secret": "fake-cloud-secret", "refresh_token": "fake-cloud-refresh",
                                   "token": TOKEN, "expiry": "2099-01-01T00:00:00Z"}))
        (directory / "gcloud-config").mkdir(exist_ok=True)
        return {"GOOGLE_APPLICATION_CREDENTIALS": str(adc), "CLOUDSDK_CONFIG": str(directory / "gcloud-config"),
                "NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9",
                "GOOGLE_CLOUD_PROJECT": self.project,
                "GOOGLE_COMPUTE_CUSTOM_ENDPOINT": f"{self.url}/compute/beta/",
                "GOOGLE_STORAGE_CUSTOM_ENDPOINT": f"{self.url}/storage/v1/",
                "GOOGLE_SECRET_MANAGER_CUSTOM_ENDPOINT": f"{self.url}/v1/",
                "GOOGLE_RESOURCE_MANAGER_CUSTOM_ENDPOINT": f"{self.url}/v1/",
                "GOOGLE_MONITORING_CUSTOM_ENDPOINT": f"{self.url}/"}

    # --- what a test sets and reads ----------------------------------------------------------------------------

    def api(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
            headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
        """One request without HTTP (for a fake engine applying resources): (status, parsed JSON or bytes)."""
        query_text = "&".join(f"{quote(str(k))}={quote(str(v))}" for k, values in (query or {}).items()
                              for v in (values if isinstance(values, (list, tuple)) else [values]))
        raw = body if isinstance(body, bytes) else (b"" if body is None else json.dumps(body).encode())
        response = self._serve(Request(method, path, query_text, {"Authorization": f"Bearer {TOKEN}",
                                                                   **(headers or {})}, raw))
        if isinstance(response.body, (dict, list)):
            return response.status, response.body
        return response.status, response.body if response.body else None

    def set_guest_attributes(self, instance: str, zone: str, values: Mapping[str, str], namespace: str = "",
                             project: str | None = None) -> None:
        """What the VM's guest agent would write: `values` maps "namespace/key" (or key, with `namespace`)."""
        with self._lock:
            held = self.guest_attributes.setdefault((project or self.project, zone, instance), {})
            for key, value in values.items():
                ns, _, name = (f"{namespace}/{key}" if namespace else key).partition("/")
                held[(ns, name)] = str(value)

    def write_time_series(self, series: list[dict[str, Any]], at: float | None = None,
                          project: str | None = None) -> None:
        """What an agent writes (TimeSeries objects, as timeSeries.create takes them), now or at virtual time `at`."""
        with self._lock:
            self._metric_writes.append((self.clock.now() if at is None else at, project or self.project,
                                        [dict(item) for item in series]))
            self._settle()

    def append_serial_output(self, instance: str, zone: str, text: str, project: str | None = None) -> None:
        with self._lock:
            key = (project or self.project, zone, instance)
            self.serial_output[key] = self.serial_output.get(key, "") + text

    def instance(self, name: str, zone: str, project: str | None = None) -> dict[str, Any] | None:
        with self._lock:
            self._settle()
            found = self.instances.get((project or self.project, zone, name))
            return None if found is None else _public(found)

    def disk(self, name: str, zone: str, project: str | None = None) -> dict[str, Any] | None:
        with self._lock:
            self._settle()
            found = self.disks.get((project or self.project, zone, name))
            return None if found is None else _public(found)

    def inventory(self, project: str | None = None) -> list[Resource]:
        """Everything that exists now (in `project`, or in every project), priced."""
        with self._lock:
            self._settle()
            found = [*self._compute_inventory(), *self._other_inventory()]
            return sorted((r for r in found if project is None or r.project == project),
                          key=lambda r: (r.kind, r.project, r.location, r.name))

    def bill(self, until: float | str | None = None) -> Bill:
        """Dollars accrued by every resource that ever existed, from its billing periods (a VM bills while
        RUNNING, a disk and a bucket while they exist, a NAT by the VMs that use it), until `until` (default: now;
        it may lie in the future, extending the present rates)."""
        with self._lock:
            self._settle()
            end = self.clock.now() if until is None else (parse_time(until) if isinstance(until, str) else until)
            lines, unpriced = [], []
            for ledger in self._ledgers.values():
                usd, hours, prices = 0.0, 0.0, set()
                for period in ledger.periods:
                    span = max(0.0, min(period.end if period.end is not None else end, end) - period.start) / 3600
                    if not span or not (period.usd_per_hour or period.usd_per_hour is None):
                        continue
                    if period.usd_per_hour is None:
                        unpriced.append(f"{ledger.kind} {ledger.name}")
                        continue
                    usd, hours = usd + span * period.usd_per_hour, hours + span
                    prices.add(period.prices)
                if hours:
                    lines.append(BillLine(ledger.kind, ledger.name, ledger.project, ledger.location, round(usd, 6),
                                          round(hours, 6), "+".join(sorted(prices))))
            return Bill(tuple(lines), zulu_time(end), tuple(dict.fromkeys(unpriced)))

    def calls_to(self, method: str, path_pattern: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method and re.search(path_pattern, c.path)]

    # --- the clock's events ------------------------------------------------------------------------------------

    def next_event_time(self) -> float | None:
        with self._lock:
            times = [op.due for op in self.operations.values() if not op.applied]
            times += [i["_terminate_at"] for i in self.instances.values() if i.get("_terminate_at") is not None]
            times += [due for due, _, _ in self._metric_writes]
            times += [at for at, *_ in self.capacity_schedule]
            return min(times, default=None)

    def schedule_capacity(self, zone: str, machine_type: str, units: int, after_s: float) -> None:
        """In `after_s` virtual seconds the zone has `units` of the machine type (a VM elsewhere ended, DWS found
        room): a queued VM there may then be granted."""
        with self._lock:
            self.capacity_schedule.append((self.clock.now() + after_s, zone, machine_type, units))

    def run_due(self) -> None:
        with self._lock:
            self._settle()

    def _settle(self) -> None:
        """Apply what is due at the clock's present, earliest first."""
        now = self.clock.now()
        for write in [w for w in self._metric_writes if w[0] <= now]:
            self._metric_writes.remove(write)
            self._write_series(write[1], write[2], write[0])
        while True:
            pending = [(op.due, 0, op.body["name"]) for op in self.operations.values()
                       if not op.applied and op.due <= now]
            pending += [(i["_terminate_at"], 1, key) for key, i in self.instances.items()
                        if i.get("_terminate_at") is not None and i["_terminate_at"] <= now]
            pending += [(entry[0], 2, index) for index, entry in enumerate(self.capacity_schedule) if entry[0] <= now]
            if not pending:
                break
            _, kind, key = min(pending, key=lambda p: (p[0], p[1]))
            if kind == 0:
                self._apply(self.operations[key])
            elif kind == 1:
                self._run_out(key)
            else:
                _, zone, machine_type, units = self.capacity_schedule.pop(key)
                self.capacity[(zone, machine_type)] = units
            self._grant_queued()
        self._grant_queued()
        self._rebill()
        granted, self._granted = self._granted, []
        for instance in granted:
            if self.on_granted is not None:
                self.on_granted(_public(instance))

    # --- HTTP ---------------------------------------------------------------------------------------------------

    def _serve_http(self, request: Request) -> Response:
        return self._serve(request)

    def _serve(self, request: Request) -> Response:
        with self._lock:
            self._settle()
            query = parse_qs(request.query, keep_blank_values=True)
            auth = request.headers.get("Authorization") or request.headers.get("authorization") or ""
            authorized = auth == f"Bearer {TOKEN}"
            body: Any = request.body
            try:
                if not request.path.startswith("/upload/"):
                    body = self._json_body(body)
                if self.require_auth and not authorized and request.path != "/token":
                    # The standard answer of a Google API to a request without credentials.
                    raise ApiError(401, "Request is missing required authentication credential. Expected OAuth 2 "
                                        "access token, login cookie or other valid authentication credential. See "
                                        "https://developers.google.com/identity/sign-in/web/devconsole-project.",
                                   "required", "UNAUTHENTICATED")
                response = self._dispatch(request.method, request.path, query, body, request.headers)
            except ApiError as err:
                response = Response(err.code, err.body())
            except Exception as err:  # a bug of the fake: say so in the answer, where the failing test shows it
                import traceback

                response = Response(500, {"error": {"code": 500, "status": "INTERNAL", "message": (
                    f"the fake cloud failed: {err!r}\n{traceback.format_exc()}")}})
            self._settle()
            self.calls.append(Call(request.method, request.path, query, None if not request.body else body,
                                   response.status, authorized))
            return response

    @staticmethod
    def _json_body(raw: bytes) -> Any:
        """A request's JSON body ({} when empty); anything else is refused as Google refuses it."""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "Invalid JSON payload received.", "parseError", "INVALID_ARGUMENT") from None

    def _route_table(self) -> list[tuple[str, re.Pattern[str], Callable[..., Response]]]:
        c = r"/compute/(?P<version>v1|beta)/projects/(?P<project>[^/]+)"
        zone, region = r"/zones/(?P<zone>[^/]+)", r"/regions/(?P<region>[^/]+)"
        name = r"(?P<name>[^/]+)"
        v1 = "/v1/projects/(?P<project>[^/]+)"
        bucket, obj = "/storage/v1/b/(?P<bucket>[^/]+)", "/o/(?P<object>.+)"
        secret = f"{v1}/secrets/(?P<secret>[^/:]+)"
        monitoring = "/v[13]/projects/(?P<project>[^/]+)/(?P<collection>dashboards|alertPolicies)"
        v3 = "/v3/projects/(?P<project>[^/]+)"
        routes = [
            ("GET", f"{c}{zone}/instances", self._instances_list),
            ("POST", f"{c}{zone}/instances", self._instances_insert),
            ("GET", f"{c}{zone}/instances/{name}", self._instances_get),
            ("DELETE", f"{c}{zone}/instances/{name}", self._instances_delete),
            ("POST", f"{c}{zone}/instances/{name}/setMetadata", self._instances_set_metadata),
            ("POST", f"{c}{zone}/instances/{name}/setLabels", self._instances_set_labels),
            ("POST", f"{c}{zone}/instances/{name}/setTags", self._instances_set_tags),
            ("POST", f"{c}{zone}/instances/{name}/setMachineType", self._instances_set_machine_type),
            ("POST", f"{c}{zone}/instances/{name}/attachDisk", self._instances_attach_disk),
            ("POST", f"{c}{zone}/instances/{name}/detachDisk", self._instances_detach_disk),
            ("POST", f"{c}{zone}/instances/{name}/stop", self._instances_stop),
            ("POST", f"{c}{zone}/instances/{name}/start", self._instances_start),
            ("GET", f"{c}{zone}/instances/{name}/getGuestAttributes", self._instances_guest_attributes),
            ("GET", f"{c}{zone}/instances/{name}/serialPort", self._instances_serial_port),
            ("GET", f"{c}/aggregated/instances", self._instances_aggregated),
            ("GET", f"{c}{zone}/disks", self._disks_list),
            ("POST", f"{c}{zone}/disks", self._disks_insert),
            ("GET", f"{c}{zone}/disks/{name}", self._disks_get),
            ("DELETE", f"{c}{zone}/disks/{name}", self._disks_delete),
            ("POST", f"{c}{zone}/disks/{name}/resize", self._disks_resize),
            ("POST", f"{c}{zone}/disks/{name}/setLabels", self._disks_set_labels),
            ("GET", f"{c}/aggregated/disks", self._disks_aggregated),
            ("GET", f"{c}{zone}/machineTypes/{name}", self._machine_types_get),
            ("GET", f"{c}/zones", self._zones_list),
            ("GET", f"{c}{zone}", self._zones_get),
            ("GET", f"{c}{region}/routers", self._routers_list),
            ("POST", f"{c}{region}/routers", self._routers_insert),
            ("GET", f"{c}{region}/routers/{name}", self._routers_get),
            ("PATCH", f"{c}{region}/routers/{name}", self._routers_patch),
            ("DELETE", f"{c}{region}/routers/{name}", self._routers_delete),
            ("GET", f"{c}/aggregated/routers", self._routers_aggregated),
            ("GET", f"{c}/global/firewalls", self._firewalls_list),
            ("POST", f"{c}/global/firewalls", self._firewalls_insert),
            ("GET", f"{c}/global/firewalls/{name}", self._firewalls_get),
            ("PATCH", f"{c}/global/firewalls/{name}", self._firewalls_patch),
            ("DELETE", f"{c}/global/firewalls/{name}", self._firewalls_delete),
            ("GET", f"{c}/global/networks", self._networks_list),
            ("GET", f"{c}/global/networks/{name}", self._networks_get),
            ("GET", f"{c}{zone}/operations/{name}", self._operations_get),
            ("POST", f"{c}{zone}/operations/{name}/wait", self._operations_get),
            ("GET", f"{c}{region}/operations/{name}", self._operations_get),
            ("POST", f"{c}{region}/operations/{name}/wait", self._operations_get),
            ("GET", f"{c}/global/operations/{name}", self._operations_get),
            ("POST", f"{c}/global/operations/{name}/wait", self._operations_get),
            # Cloud Storage JSON API v1
            ("GET", "/storage/v1/b", self._buckets_list),
            ("POST", "/storage/v1/b", self._buckets_insert),
            ("GET", bucket, self._buckets_get),
            ("PATCH", bucket, self._buckets_patch),
            ("DELETE", bucket, self._buckets_delete),
            ("GET", f"{bucket}/o", self._objects_list),
            ("GET", f"/(?:download/)?{bucket[1:]}{obj}", self._objects_get),
            ("PATCH", f"{bucket}{obj}", self._objects_patch),
            ("DELETE", f"{bucket}{obj}", self._objects_delete),
            ("POST", f"/upload{bucket}/o", self._objects_upload),
            # IAM, Secret Manager, Monitoring, and what preflight asks
            ("GET", f"{v1}/serviceAccounts", self._accounts_list),
            ("POST", f"{v1}/serviceAccounts", self._accounts_create),
            ("GET", f"{v1}/serviceAccounts/(?P<account>[^/:]+)", self._accounts_get),
            ("DELETE", f"{v1}/serviceAccounts/(?P<account>[^/:]+)", self._accounts_delete),
            ("GET", f"{v1}/secrets", self._secrets_list),
            ("POST", f"{v1}/secrets", self._secrets_create),
            ("GET", secret, self._secrets_get),
            ("DELETE", secret, self._secrets_delete),
            ("POST", f"{secret}:addVersion", self._secrets_add_version),
            ("GET", f"{secret}/versions", self._versions_list),
            ("GET", f"{secret}/versions/(?P<version>[^/:]+)", self._versions_get),
            ("GET", f"{secret}/versions/(?P<version>[^/:]+):access", self._versions_access),
            ("GET", monitoring, self._monitoring_list),
            ("POST", monitoring, self._monitoring_create),
            ("GET", f"{monitoring}/(?P<id>[^/]+)", self._monitoring_get),
            ("DELETE", f"{monitoring}/(?P<id>[^/]+)", self._monitoring_delete),
            ("PATCH", f"{v3}/alertPolicies/(?P<id>[^/]+)", self._alert_policies_patch),
            ("GET", f"{v3}/metricDescriptors/(?P<metric_type>.+)", self._metric_descriptors_get),
            ("POST", f"{v3}/timeSeries", self._time_series_create),
            ("GET", f"{v3}/timeSeries", self._time_series_list),
            ("GET", "/v1/projects/(?P<project>[^/:]+)", self._project_get),
            ("POST", "/v1/projects/(?P<project>[^/:]+):testIamPermissions", self._test_permissions),
            ("GET", f"{v1}/services:batchGet", self._services_batch_get),
            ("GET", f"{v1}/locations/global/services/compute.googleapis.com/quotaInfos/(?P<quota>[^/]+)",
             self._quota_info),
            ("POST", r"/token", self._token),
        ]
        return [(method, _compiled(pattern), handler) for method, pattern, handler in routes]

    def _dispatch(self, method: str, path: str, query: dict[str, list[str]], body: Any,
                  headers: Mapping[str, str]) -> Response:
        for route_method, pattern, handler in self._routes:
            match = pattern.fullmatch(path)
            if match and route_method == method:
                args = {key: unquote(value) for key, value in match.groupdict().items() if value is not None}
                if args.get("project") in _PROJECTS_BY_NUMBER:
                    args["project"] = _PROJECTS_BY_NUMBER[args["project"]]
                if path.startswith("/compute/"):
                    self._compute_rate_limit(method, path, args["project"])
                response = handler(query=query, body=body, headers=headers, **args)
                if args.get("version", "v1") != "v1":
                    response.body = _version(response.body, args["version"])
                return response
        raise ApiError(404, f"The fake cloud serves no {method} {path}", "notFound", "NOT_FOUND")

    # --- Compute: shared pieces -----------------------------------------------------------------------------

    @staticmethod
    def _link(project: str, *parts: str) -> str:
        return "https://www.googleapis.com/compute/v1/projects/" + "/".join((project, *parts))

    def _compute_rate_limit(self, method: str, path: str, project: str) -> None:
        """Per project and clock minute, per group (https://cloud.google.com/compute/docs/api-rate-limits)."""
        group = "default" if method != "GET" and not path.endswith("/wait") else (
            "read" if re.search(r"/(instances|disks|routers|firewalls|networks|machineTypes|operations|zones)/[^/]+"
                                r"(/wait|/getGuestAttributes|/serialPort)?$", path) else "list")
        limit = self.rate_limits.compute_per_minute.get(group)
        if limit is None:
            return
        window = (project, group, int(self.clock.now() // 60))
        self._rate_windows[window] = self._rate_windows.get(window, 0) + 1
        if self._rate_windows[window] > limit:
            metric = {"default": "Queries", "read": "Read requests", "list": "List requests"}[group]
            # The standard quota-exceeded message of Google APIs ("Quota exceeded for quota metric 'Read requests'
            # and limit 'Read requests per minute' of service '...' for consumer 'project_number:N'.").
            raise ApiError(self.rate_limits.compute_status,
                           f"Quota exceeded for quota metric '{metric}' and limit '{metric} per minute' of service "
                           f"'compute.googleapis.com' for consumer 'project_number:{project_number(project)}'.",
                           "rateLimitExceeded", "RESOURCE_EXHAUSTED", domain="usageLimits")

    def _operation(self, project: str, scope: tuple[str, str], operation_type: str, target: str, target_id: str,
                   effect: Callable[[], dict[str, Any] | None] | None, seconds: float | None = None,
                   ) -> Response:
        """Start an Operation (https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations): RUNNING
        now; `effect` runs when `seconds` (default `operation_seconds`) of virtual time have passed, and returns
        the operation's `error` ({"errors": [...], "_http": (httpErrorStatusCode, httpErrorMessage)}) when it
        fails."""
        now = self.clock.now()
        name = f"operation-{int(now * 1000)}-{hashlib.sha256(str(next(_ids)).encode()).hexdigest()[:13]}"
        kind, where = scope
        body: dict[str, Any] = {
            "kind": "compute#operation", "id": _numeric_id(name), "name": name, "operationType": operation_type,
            "targetLink": target, "targetId": target_id, "status": "RUNNING", "user": "fake-cloud@example.com",
            "progress": 0, "insertTime": compute_time(now), "startTime": compute_time(now),
            "selfLink": self._link(project, *((kind, where) if where else (kind,)), "operations", name)}
        if kind == "zones":
            body["zone"] = self._link(project, "zones", where)
        elif kind == "regions":
            body["region"] = self._link(project, "regions", where)
        op = _Operation(body, project, now + (self.operation_seconds if seconds is None else seconds),
                        self.operation_polls, effect)
        self.operations[name] = op
        started = dict(body)
        self._settle()
        if op.polls_needed == 0 and op.applied:  # operation_polls=0: a finished operation says so at once
            return Response(200, {**op.body, "status": "DONE"})
        return Response(200, started)

    def _apply(self, op: _Operation) -> None:
        op.applied = True
        outcome = op.effect() if op.effect else None
        now = self.clock.now()
        op.body.update(progress=100, endTime=compute_time(max(now, op.due)))
        if outcome:
            code, status = outcome.pop("_http", (400, "BAD REQUEST"))
            op.body.update(error=outcome, httpErrorStatusCode=code, httpErrorMessage=status)

    def _operations_get(self, project: str, name: str, **_: Any) -> Response:
        op = self.operations.get(name)
        if op is None or op.project != project:
            raise not_found(f"projects/{project}/operations/{name}")
        op.polls += 1
        body = dict(op.body)
        body["status"] = "DONE" if op.applied and op.polls >= op.polls_needed else "RUNNING"
        if body["status"] != "DONE":
            for key in ("error", "httpErrorStatusCode", "httpErrorMessage", "endTime"):
                body.pop(key, None)
            body["progress"] = 0
        return Response(200, body)

    def _list(self, kind: str, items: list[dict[str, Any]], self_link: str, query: dict[str, list[str]],
              ) -> Response:
        """A list (https://cloud.google.com/compute/docs/reference/rest/v1/instances/list): `items` absent when
        there are none, `nextPageToken` while more remain."""
        if query.get("filter", [""])[0]:
            matches = parse_filter(query["filter"][0])
            items = [i for i in items if matches(i)]
        page, token = _page(sorted(items, key=lambda i: i["name"]), query, 500)
        body: dict[str, Any] = {"kind": f"compute#{kind}List", "id": self_link.split("/compute/v1/")[-1],
                                "selfLink": self_link}
        if page:
            body["items"] = [_public(i) for i in page]
        if token:
            body["nextPageToken"] = token
        return Response(200, body)

    def _aggregated(self, kind: str, plural: str, scoped: Mapping[str, list[dict[str, Any]]], project: str,
                    query: dict[str, list[str]]) -> Response:
        """aggregatedList (https://cloud.google.com/compute/docs/reference/rest/v1/disks/aggregatedList): items
        keyed `zones/Z` (`regions/R`), a scope without matches carrying a NO_RESULTS_ON_PAGE warning."""
        matches = parse_filter(query["filter"][0]) if query.get("filter", [""])[0] else (lambda item: True)
        items: dict[str, Any] = {}
        for scope in sorted(scoped):
            found = [_public(i) for i in sorted(scoped[scope], key=lambda i: i["name"]) if matches(i)]
            items[scope] = {plural: found} if found else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope '{scope}' on this page.",
                "data": [{"key": "scope", "value": scope}]}}
        return Response(200, {"kind": f"compute#{kind}AggregatedList", "id": f"projects/{project}/aggregated/"
                                                                            f"{plural}", "items": items,
                              "selfLink": self._link(project, "aggregated", plural)})

    def _zones(self) -> set[str]:
        known = set(self.tpu_zones) | {z for z, _ in self.capacity} | set(self.create_delay_s)
        known |= {z for _, z, _ in self.instances} | {z for _, z, _ in self.disks}
        return known | {"us-west1-a", "europe-west8-a"}

    def _regions(self) -> set[str]:
        return {region_of(z) for z in self._zones()} | {r for _, r, _ in self.routers} | set(self.quota)

    def _zones_list(self, project: str, query: dict[str, list[str]], **_: Any) -> Response:
        items = [self._zone_body(project, z) for z in sorted(self._zones())]
        return self._list("zone", items, self._link(project, "zones"), query)

    def _zones_get(self, project: str, zone: str, **_: Any) -> Response:
        return Response(200, self._zone_body(project, zone))

    def _zone_body(self, project: str, zone: str) -> dict[str, Any]:
        # https://cloud.google.com/compute/docs/reference/rest/v1/zones
        return {"kind": "compute#zone", "id": _numeric_id(zone), "name": zone, "status": "UP",
                "region": self._link(project, "regions", region_of(zone)), "description": zone,
                "selfLink": self._link(project, "zones", zone)}

    def _machine_types_get(self, project: str, zone: str, name: str, **_: Any) -> Response:
        """https://cloud.google.com/compute/docs/reference/rest/v1/machineTypes; a zone that does not offer the
        type answers 404 (tests/fakes/google_fakes.py)."""
        shape = MACHINE_TYPES.get(name)
        if shape is None or (shape.chips and zone not in self.tpu_zones):
            raise not_found(f"projects/{project}/zones/{zone}/machineTypes/{name}")
        return Response(200, {"kind": "compute#machineType", "id": _numeric_id(name), "name": name, "zone": zone,
                              "guestCpus": shape.vcpus, "memoryMb": int(shape.memory_gib * 1024),
                              "isSharedCpu": False, "description": f"{shape.vcpus} vCPUs, {shape.memory_gib} GB RAM",
                              "selfLink": self._link(project, "zones", zone, "machineTypes", name)})

    def _network_link(self, project: str, value: Any) -> str:
        text = str(value or "global/networks/default")
        name = last_segment(text)
        owner = re.search(r"projects/([^/]+)/", text)
        return self._link(owner[1] if owner else project, "global", "networks", name)

    def _networks_list(self, project: str, query: dict[str, list[str]], **_: Any) -> Response:
        return self._list("network", [self._network_body(project, "default")],
                          self._link(project, "global", "networks"), query)

    def _networks_get(self, project: str, name: str, **_: Any) -> Response:
        if name != "default":
            raise not_found(f"projects/{project}/global/networks/{name}")
        return Response(200, self._network_body(project, name))

    def _network_body(self, project: str, name: str) -> dict[str, Any]:
        # https://cloud.google.com/compute/docs/reference/rest/v1/networks: every project's auto-mode `default`.
        return {"kind": "compute#network", "id": _numeric_id(project, name), "name": name,
                "autoCreateSubnetworks": True, "routingConfig": {"routingMode": "REGIONAL"},
                "selfLink": self._link(project, "global", "networks", name)}

    # --- Compute: instances -----------------------------------------------------------------------------------

    def _instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        found = self.instances.get((project, zone, name))
        if found is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return found

    def _zonal_list(self, kind: str, store: Mapping[tuple[str, str, str], dict[str, Any]], project: str,
                    zone: str, query: dict[str, list[str]]) -> Response:
        items = [i for (p, z, _), i in store.items() if p == project and z == zone]
        return self._list(kind, items, self._link(project, "zones", zone, f"{kind}s"), query)

    def _zonal_aggregated(self, kind: str, store: Mapping[tuple[str, str, str], dict[str, Any]], project: str,
                          query: dict[str, list[str]]) -> Response:
        scoped: dict[str, list[dict[str, Any]]] = {f"zones/{z}": [] for z in self._zones()}
        for (p, z, _), item in store.items():
            if p == project:
                scoped[f"zones/{z}"].append(item)
        return self._aggregated(kind, f"{kind}s", scoped, project, query)

    def _instances_list(self, project: str, zone: str, query: dict[str, list[str]], **_: Any) -> Response:
        return self._zonal_list("instance", self.instances, project, zone, query)

    def _instances_aggregated(self, project: str, query: dict[str, list[str]], **_: Any) -> Response:
        return self._zonal_aggregated("instance", self.instances, project, query)

    def _instances_get(self, project: str, zone: str, name: str, **_: Any) -> Response:
        return Response(200, _public(self._instance(project, zone, name)))

    def _units_used(self, zone: str, machine_type: str) -> int:
        return sum(i["_units"] for (_, z, _), i in self.instances.items()
                   if z == zone and i["_machine_type"] == machine_type and i["_holds_capacity"])

    def _chips_used(self, project: str, region: str) -> int:
        return sum(i["_chips"] for (p, z, _), i in self.instances.items()
                   if p == project and region_of(z) == region and i["_holds_capacity"])

    def _admission_error(self, project: str, zone: str, machine_type: str) -> dict[str, Any] | None:
        """Quota first (the project may not), then capacity (the zone cannot): the errors a TPU create's operation
        ends with."""
        shape = MACHINE_TYPES.get(machine_type, MachineType(0, 0))
        region = region_of(zone)
        if shape.chips and region in self.quota and self._chips_used(project, region) + shape.chips > \
                self.quota[region]:
            limit = float(self.quota[region])
            message = QUOTA_MESSAGE.format(limit=limit, region=region)
            return {"errors": [{"code": "QUOTA_EXCEEDED", "message": message, "errorDetails": [{"quotaInfo": {
                "metricName": QUOTA_METRIC, "limitName": QUOTA_LIMIT_NAME, "limit": limit,
                "dimensions": {"region": region, "tpu_family": TPU_FAMILY}}}]}], "_http": (403, "FORBIDDEN")}
        units = shape.chips or 1
        free = self.capacity.get((zone, machine_type))
        if free is None or self._units_used(zone, machine_type) + units <= free:
            return None
        resource = f"projects/{project}/zones/{zone}"
        elsewhere = sorted(z for (z, mt), cap in self.capacity.items()
                           if mt == machine_type and z != zone and self._units_used(z, mt) + units <= cap)
        if not elsewhere:
            return {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                                "message": STOCKOUT_MESSAGE.format(resource=resource)}],
                    "_http": (503, "SERVICE UNAVAILABLE")}
        localized = STOCKOUT_LOCALIZED.format(machine_type=machine_type, zone=zone,
                                              zones_available=", ".join(elsewhere))
        return {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                            "message": STOCKOUT_DETAILED_MESSAGE.format(resource=resource), "errorDetails": [
                                {"errorInfo": {"reason": "resource_availability", "domain": "compute.googleapis.com",
                                               "metadatas": {"zone": zone, "vmType": machine_type,
                                                             "zonesAvailable": ",".join(elsewhere)}}},
                                {"help": {"links": [{"description": STOCKOUT_HELP[0], "url": STOCKOUT_HELP[1]}]}},
                                {"localizedMessage": {"locale": "en-US", "message": localized}}]}],
                "_http": (503, "SERVICE UNAVAILABLE")}

    def _disk_key(self, project: str, zone: str, source: str) -> tuple[str, str, str]:
        owner = re.search(r"projects/([^/]+)/zones/([^/]+)/disks/", source)
        return (owner[1], owner[2], last_segment(source)) if owner else (project, zone, last_segment(source))

    def _in_use(self, disk: dict[str, Any], instance_link: str) -> ApiError | None:
        others = [u for u in disk.get("users", []) if u != instance_link]
        if others:
            # kubernetes/kubernetes#26795 and the provider's logs: "The disk resource '...' is already being used
            # by '...'" (reason resourceInUseByAnotherResource; code RESOURCE_IN_USE_BY_ANOTHER_RESOURCE on an op).
            return ApiError(400, f"The disk resource '{disk['selfLink'].split('/compute/v1/')[-1]}' is already being "
                                 f"used by '{others[0].split('/compute/v1/')[-1]}'", "resourceInUseByAnotherResource")
        return None

    def _instances_insert(self, project: str, zone: str, body: dict[str, Any], **_: Any) -> Response:
        """instances.insert (https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert). The
        instance is listed at once (PROVISIONING) and RUNNING when its operation is done; a create the project's
        quota or the zone's capacity cannot take fails on its operation and leaves nothing. With a wait time it
        queues instead (_queue_insert)."""
        name = check_name(body.get("name"))
        link = self._link(project, "zones", zone, "instances", name)
        if (project, zone, name) in self.instances:
            raise already_exists(f"projects/{project}/zones/{zone}/instances/{name}")
        machine_type = last_segment(body.get("machineType"))
        shape = MACHINE_TYPES.get(machine_type)
        if shape is None or (shape.chips and zone not in self.tpu_zones):
            # gruntwork-io/terratest#1132 via tests/fakes/provider_errors.py NO_MACHINE_TYPE
            raise invalid(f"Invalid value for field 'resource.machineType': 'zones/{zone}/machineTypes/"
                          f"{machine_type}'. Machine type with name '{machine_type}' does not exist in zone "
                          f"'{zone}'.")
        disks_in = list(body.get("disks") or [])
        boot_names = [d.get("initializeParams", {}).get("diskName") or name for d in disks_in
                      if d.get("initializeParams")]
        for disk_name in boot_names:
            if (project, zone, disk_name) in self.disks:
                raise already_exists(f"projects/{project}/zones/{zone}/disks/{disk_name}")
        wait = float(((body.get("params") or {}).get("requestValidForDuration") or {}).get("seconds") or 0)
        if wait >= QUEUE_MIN_S and (body.get("scheduling") or {}).get("provisioningModel") == "FLEX_START":
            return self._queue_insert(project, zone, name, link, body, machine_type, shape, wait)
        delay = self.create_delay_s.get(zone)
        refusal = self._admission_error(project, zone, machine_type) or self._disk_refusal(project, zone, link, body)
        if refusal is not None:
            return self._operation(project, ("zones", zone), "insert", link, _numeric_id(name), lambda: refusal,
                                   seconds=delay)
        instance = self._new_instance(project, zone, name, link, body, machine_type, shape)
        attached = self._attach_requested(instance, body)
        self.instances[(project, zone, name)] = instance
        self._ledger("instance", project, zone, instance)

        def started() -> None:
            if self.instances.get((project, zone, name)) is not instance:
                return
            self._start_running(instance)
            self._disks_ready(project, zone, attached)

        return self._operation(project, ("zones", zone), "insert", link, instance["id"], started, seconds=delay)

    def _disk_refusal(self, project: str, zone: str, link: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """An attached disk that does not exist, or that another VM holds read-write: the operation's error."""
        for entry in body.get("disks") or []:
            if entry.get("source"):
                held = self.disks.get(self._disk_key(project, zone, entry["source"]))
                if held is None:
                    return {"errors": [{"code": "RESOURCE_NOT_FOUND", "message": not_found(
                        entry["source"].split("/compute/v1/")[-1]).message}], "_http": (404, "NOT FOUND")}
                if (busy := self._in_use(held, link)) is not None and entry.get("mode") != "READ_ONLY":
                    return {"errors": [{"code": "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", "message": busy.message}],
                            "_http": (400, "BAD REQUEST")}
        return None

    def _queue_insert(self, project: str, zone: str, name: str, link: str, body: dict[str, Any], machine_type: str,
                      shape: MachineType, wait: float) -> Response:
        """A flex-start insert with a wait time: "it enters the PENDING state ... Compute Engine attempts to acquire
        the necessary resources to start your compute instance until its wait time ends. If Compute Engine acquires
        the resources within this time and you have sufficient quota for those resources, then the compute instance
        state changes to PROVISIONING. Otherwise, you encounter an error and Compute Engine deletes the compute
        instance" (https://cloud.google.com/compute/docs/instances/instance-lifecycle). Google documents neither
        that error's text nor whether the insert operation stays RUNNING meanwhile: here it does, and ends with the
        zone's stockout error at the deadline (the client reads neither: it follows the instance)."""
        # A disk that does not exist fails at once; one another VM holds only holds the grant back.
        missing = [entry for entry in body.get("disks") or [] if entry.get("source") and
                   self.disks.get(self._disk_key(project, zone, entry["source"])) is None]
        refusal = self._disk_refusal(project, zone, link, {"disks": missing})
        if refusal is not None:
            return self._operation(project, ("zones", zone), "insert", link, _numeric_id(name), lambda: refusal)
        instance = self._new_instance(project, zone, name, link, body, machine_type, shape)
        instance.update(status="PENDING", _holds_capacity=False)
        self.instances[(project, zone, name)] = instance
        self._ledger("instance", project, zone, instance)
        resource = f"projects/{project}/zones/{zone}"

        def ended() -> dict[str, Any] | None:
            if self.instances.get((project, zone, name)) is not instance or instance["status"] != "PENDING":
                return None  # granted (or deleted by its owner) before the wait ended
            self._remove_instance((project, zone, name))
            return {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                                "message": STOCKOUT_MESSAGE.format(resource=resource)}],
                    "_http": (503, "SERVICE UNAVAILABLE")}

        response = self._operation(project, ("zones", zone), "insert", link, instance["id"], ended, seconds=wait)
        instance["_queued"] = {"body": body, "op": response.body["name"]}
        self._settle()  # granted at once when the zone has room now
        return response

    def _grant_queued(self) -> None:
        """Queued VMs that quota and capacity now admit start, oldest request first."""
        for key, instance in sorted(((k, i) for k, i in self.instances.items() if i.get("_queued") is not None),
                                    key=lambda item: item[1]["_queued_at"]):
            project, zone, _ = key
            queued = instance["_queued"]
            if self._admission_error(project, zone, instance["_machine_type"]) is not None or \
                    self._disk_refusal(project, zone, instance["selfLink"], queued["body"]) is not None:
                continue
            instance["_queued"] = None
            attached = self._attach_requested(instance, queued["body"])
            self._start_running(instance)
            self._disks_ready(project, zone, attached)
            op = self.operations.get(queued["op"])
            if op is not None:
                op.due = self.clock.now()  # its operation ends now, without an error
            self._granted.append(instance)

    def _new_instance(self, project: str, zone: str, name: str, link: str, body: dict[str, Any],
                      machine_type: str, shape: MachineType) -> dict[str, Any]:
        """The instance resource of an insert, PROVISIONING, its disks not yet attached (_attach_requested)."""
        now = self.clock.now()
        scheduling = dict(body.get("scheduling") or {})
        scheduling.setdefault("onHostMaintenance", "TERMINATE" if shape.chips else "MIGRATE")
        scheduling.setdefault("automaticRestart", not shape.chips)
        scheduling.setdefault("preemptible", False)
        scheduling.setdefault("provisioningModel", "STANDARD")
        nics = []
        for index, nic in enumerate(body.get("networkInterfaces") or [{}]):
            out = {"kind": "compute#networkInterface", "name": f"nic{index}",
                   "network": self._network_link(project, nic.get("network")),
                   "subnetwork": self._link(project, "regions", region_of(zone), "subnetworks",
                                            last_segment(nic.get("subnetwork") or "default")),
                   "networkIP": f"10.{len(self.instances) % 250}.0.{2 + index}", "stackType": "IPV4_ONLY"}
            if nic.get("accessConfigs"):
                out["accessConfigs"] = [{"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT",
                                         "name": "External NAT", "networkTier": "PREMIUM",
                                         "natIP": f"34.{len(self.instances) % 250}.1.{2 + index}"}
                                        for _ in nic["accessConfigs"]]
            nics.append(out)
        metadata_items = list((body.get("metadata") or {}).get("items") or [])
        labels = dict(body.get("labels") or {})
        tags = list((body.get("tags") or {}).get("items") or [])
        instance: dict[str, Any] = {
            "kind": "compute#instance", "id": _numeric_id(project, zone, name), "creationTimestamp": compute_time(now),
            "name": name, "description": body.get("description", ""), "zone": self._link(project, "zones", zone),
            "machineType": self._link(project, "zones", zone, "machineTypes", machine_type),
            "status": "PROVISIONING", "selfLink": link, "labels": labels, "labelFingerprint": fingerprint(labels),
            "metadata": {"kind": "compute#metadata", "fingerprint": fingerprint(metadata_items),
                         "items": metadata_items},
            "tags": {"items": tags, "fingerprint": fingerprint(tags)}, "disks": [],
            "networkInterfaces": nics, "serviceAccounts": list(body.get("serviceAccounts") or []),
            "scheduling": scheduling, "deletionProtection": bool(body.get("deletionProtection", False)),
            "reservationAffinity": body.get("reservationAffinity", {"consumeReservationType": "ANY_RESERVATION"}),
            "cpuPlatform": "Unknown CPU Platform", "startRestricted": False, "fingerprint": fingerprint([name, now]),
            "_machine_type": machine_type, "_chips": shape.chips, "_units": shape.chips or 1,
            "_holds_capacity": True, "_terminate_at": None, "_queued": None, "_queued_at": now,
            "_key": (project, zone, name)}
        if not labels:
            instance.pop("labels")
        return instance

    def _attach_requested(self, instance: dict[str, Any], body: dict[str, Any]) -> list[dict[str, Any]]:
        """Create the boot disk an insert asks for and attach it and the existing ones; returns the attachments."""
        project, zone, name, link = instance["_key"] + (instance["selfLink"],)
        attached: list[dict[str, Any]] = []
        for index, entry in enumerate(body.get("disks") or []):
            params = entry.get("initializeParams")
            if params:
                disk_name = params.get("diskName") or name
                disk_type = last_segment(params.get("diskType") or "pd-standard")
                size = int(params.get("diskSizeGb") or 10)
                disk = self._new_disk(project, zone, {
                    "name": disk_name, "sizeGb": str(size), "type": f"zones/{zone}/diskTypes/{disk_type}",
                    "labels": dict(params.get("labels") or {}), "sourceImage": params.get("sourceImage", ""),
                    **{k: params[k] for k in ("provisionedIops", "provisionedThroughput") if k in params}})
                disk["users"] = [link]
                self.disks[(project, zone, disk_name)] = disk
                source = disk["selfLink"]
            else:
                disk = self.disks[self._disk_key(project, zone, entry["source"])]
                disk["users"] = [*disk.get("users", []), link]
                source = disk["selfLink"]
            attached.append({"kind": "compute#attachedDisk", "type": "PERSISTENT",
                             "mode": entry.get("mode", "READ_WRITE"), "source": source,
                             "deviceName": entry.get("deviceName") or (f"persistent-disk-{index}" if params else
                                                                       last_segment(source)),
                             "index": index, "boot": bool(entry.get("boot", index == 0 and params is not None)),
                             "autoDelete": bool(entry.get("autoDelete", params is not None)),
                             "interface": entry.get("interface", "NVME"), "diskSizeGb": disk["sizeGb"]})
            self._ledger("disk", project, zone, disk)
        instance["disks"] = attached
        return attached

    def _disks_ready(self, project: str, zone: str, attached: list[dict[str, Any]]) -> None:
        for entry in attached:
            held = self.disks.get(self._disk_key(project, zone, entry["source"]))
            if held is not None:
                held["status"] = "READY"
                held["lastAttachTimestamp"] = compute_time(self.clock.now())

    def _start_running(self, instance: dict[str, Any]) -> None:
        """RUNNING from now; a time limit (scheduling.maxRunDuration, or terminationTime) sets the planned end,
        reported read-only as resourceStatus.scheduling.terminationTimestamp (the field Compute fills whenever a
        VM with a time limit enters RUNNING: https://cloud.google.com/compute/docs/instances/limit-vm-runtime;
        ResourceStatusScheduling in the API reference)."""
        now = self.clock.now()
        instance["status"] = "RUNNING"
        instance["lastStartTimestamp"] = compute_time(now)
        instance["_holds_capacity"] = True
        scheduling = instance["scheduling"]
        ends = []
        if scheduling.get("maxRunDuration"):
            ends.append(now + float(scheduling["maxRunDuration"].get("seconds", 0)))
        if scheduling.get("terminationTime"):
            ends.append(parse_time(scheduling["terminationTime"]))
        if ends:
            instance["_terminate_at"] = min(ends)
            instance["resourceStatus"] = {"scheduling": {"terminationTimestamp": compute_time(min(ends))}}

    def _run_out(self, key: tuple[str, str, str]) -> None:
        """The time limit is reached: instanceTerminationAction DELETE deletes the VM (flex-start: "After that
        time, Compute Engine automatically stops or deletes the VMs based on the termination action",
        https://cloud.google.com/compute/docs/instances/about-flex-start-vms), STOP stops it."""
        instance = self.instances[key]
        instance["_terminate_at"] = None
        if instance["scheduling"].get("instanceTerminationAction", "STOP") == "DELETE":
            self._remove_instance(key)
        else:
            self._stop(instance)

    def _stop(self, instance: dict[str, Any]) -> None:
        instance.update(status="TERMINATED", lastStopTimestamp=compute_time(self.clock.now()),
                        _holds_capacity=False, _terminate_at=None)
        instance.pop("resourceStatus", None)

    def _remove_instance(self, key: tuple[str, str, str]) -> None:
        """Gone, with what it owned: disks with autoDelete go too, the others are detached (users, and
        lastDetachTimestamp) and stay."""
        project, zone, _ = key
        instance = self.instances.pop(key)
        now = compute_time(self.clock.now())
        for entry in instance["disks"]:
            disk_key = self._disk_key(project, zone, entry["source"])
            disk = self.disks.get(disk_key)
            if disk is None:
                continue
            disk["users"] = [u for u in disk.get("users", []) if u != instance["selfLink"]]
            if not disk["users"]:
                disk.pop("users")
            disk["lastDetachTimestamp"] = now
            if entry.get("autoDelete") and not disk.get("users"):
                del self.disks[disk_key]
        self.guest_attributes.pop(key, None)

    def _instances_delete(self, project: str, zone: str, name: str, **_: Any) -> Response:
        instance = self._instance(project, zone, name)
        if instance.get("deletionProtection"):
            raise invalid(f"Invalid resource usage: 'Resource cannot be deleted if it's protected against "
                          f"deletion.'.")
        instance["status"] = "STOPPING"
        queued, instance["_queued"] = instance.get("_queued"), None
        if queued is not None and queued["op"] in self.operations:  # a queued VM its owner no longer waits for
            self.operations[queued["op"]].due = self.clock.now()

        def deleted() -> None:
            if self.instances.get((project, zone, name)) is instance:
                self._remove_instance((project, zone, name))

        return self._operation(project, ("zones", zone), "delete", instance["selfLink"], instance["id"], deleted)

    def _instances_set_metadata(self, project: str, zone: str, name: str, body: dict[str, Any], **_: Any,
                                ) -> Response:
        """instances.setMetadata with optimistic locking: a stale or missing fingerprint answers 412
        conditionNotMet, "Supplied fingerprint does not match current metadata fingerprint." (the text
        terraform-provider-google retries on: FINGERPRINT_FAIL_ERRORS, with gerr.Code == 412)."""
        instance = self._instance(project, zone, name)
        if body.get("fingerprint") != instance["metadata"]["fingerprint"]:
            raise ApiError(412, "Supplied fingerprint does not match current metadata fingerprint.",
                           "conditionNotMet", "FAILED_PRECONDITION")
        items = list(body.get("items") or [])
        instance["metadata"]["fingerprint"] = fingerprint([items, self.clock.now(), next(_ids)])

        def applied() -> None:
            instance["metadata"]["items"] = items

        return self._operation(project, ("zones", zone), "setMetadata", instance["selfLink"], instance["id"],
                               applied)

    def _instances_set_labels(self, project: str, zone: str, name: str, body: dict[str, Any], **_: Any,
                              ) -> Response:
        instance = self._instance(project, zone, name)
        return self._set_labels(project, zone, instance, body)

    def _set_labels(self, project: str, zone: str, item: dict[str, Any], body: dict[str, Any]) -> Response:
        """setLabels (instances and disks): labelFingerprint must match, else 412 "Labels fingerprint either invalid
        or resource labels have changed" (kubernetes/cloud-provider-gcp's test of the googleapi error)."""
        if body.get("labelFingerprint") != item.get("labelFingerprint"):
            raise ApiError(412, "Labels fingerprint either invalid or resource labels have changed",
                           "conditionNotMet", "FAILED_PRECONDITION")
        labels = dict(body.get("labels") or {})
        item["labelFingerprint"] = fingerprint([labels, next(_ids)])

        def applied() -> None:
            if labels:
                item["labels"] = labels
            else:
                item.pop("labels", None)

        return self._operation(project, ("zones", zone), "setLabels", item["selfLink"], item["id"], applied)

    def _instances_set_tags(self, project: str, zone: str, name: str, body: dict[str, Any], **_: Any) -> Response:
        instance = self._instance(project, zone, name)
        if body.get("fingerprint") != instance["tags"]["fingerprint"]:
            raise ApiError(412, "Supplied fingerprint does not match current metadata fingerprint.",
                           "conditionNotMet", "FAILED_PRECONDITION")
        items = list(body.get("items") or [])
        instance["tags"] = {"items": items, "fingerprint": fingerprint([items, next(_ids)])}
        return self._operation(project, ("zones", zone), "setTags", instance["selfLink"], instance["id"], None)

    def _instances_set_machine_type(self, project: str, zone: str, name: str, body: dict[str, Any], **_: Any,
                                    ) -> Response:
        """setMachineType: "Changes the machine type for a stopped instance"
        (https://cloud.google.com/compute/docs/reference/rest/v1/instances/setMachineType); on one that runs the
        API answers "Instance is starting or running." (the message googleapis/nodejs-compute's vm.resize matches
        to stop the VM first; the status code and reason here are this fake's, not quoted)."""
        instance = self._instance(project, zone, name)
        if instance["status"] in ("PROVISIONING", "STAGING", "RUNNING", "STOPPING"):
            raise ApiError(400, "Instance is starting or running.", "resourceNotReady", "FAILED_PRECONDITION")
        machine_type = last_segment(body.get("machineType"))
        shape = MACHINE_TYPES.get(machine_type)
        if shape is None or (shape.chips and zone not in self.tpu_zones):
            raise invalid(f"Invalid value for field 'machineType': 'zones/{zone}/machineTypes/{machine_type}'. "
                          f"Machine type with name '{machine_type}' does not exist in zone '{zone}'.")

        def applied() -> None:
            instance.update(machineType=self._link(project, "zones", zone, "machineTypes", machine_type),
                            _machine_type=machine_type, _chips=shape.chips, _units=shape.chips or 1)

        return self._operation(project, ("zones", zone), "setMachineType", instance["selfLink"], instance["id"],
                               applied)

    def _instances_attach_disk(self, project: str, zone: str, name: str, body: dict[str, Any], **_: Any,
                               ) -> Response:
        instance = self._instance(project, zone, name)
        disk_key = self._disk_key(project, zone, str(body.get("source", "")))
        disk = self.disks.get(disk_key)
        if disk is None:
            raise not_found(f"projects/{disk_key[0]}/zones/{disk_key[1]}/disks/{disk_key[2]}")
        device = body.get("deviceName") or disk["name"]

        def attached() -> dict[str, Any] | None:
            busy = self._in_use(disk, instance["selfLink"])
            if busy is not None and body.get("mode", "READ_WRITE") == "READ_WRITE":
                return {"errors": [{"code": "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", "message": busy.message}],
                        "_http": (400, "BAD REQUEST")}
            disk["users"] = [*disk.get("users", []), instance["selfLink"]]
            disk["lastAttachTimestamp"] = compute_time(self.clock.now())
            instance["disks"].append({"kind": "compute#attachedDisk", "type": "PERSISTENT",
                                      "mode": body.get("mode", "READ_WRITE"), "source": disk["selfLink"],
                                      "deviceName": device, "index": len(instance["disks"]), "boot": False,
                                      "autoDelete": bool(body.get("autoDelete", False)),
                                      "interface": body.get("interface", "NVME"), "diskSizeGb": disk["sizeGb"]})
            return None

        return self._operation(project, ("zones", zone), "attachDisk", instance["selfLink"], instance["id"], attached)

    def _instances_detach_disk(self, project: str, zone: str, name: str, query: dict[str, list[str]], **_: Any,
                               ) -> Response:
        instance = self._instance(project, zone, name)
        device = query.get("deviceName", [""])[0]
        entry = next((d for d in instance["disks"] if d["deviceName"] == device), None)
        if entry is None:
            raise invalid(f"Invalid value for field 'deviceName': '{device}'. No attached disk with that device "
                          f"name.")

        def detached() -> None:
            if entry in instance["disks"]:
                instance["disks"].remove(entry)
            disk = self.disks.get(self._disk_key(project, zone, entry["source"]))
            if disk is not None:
                disk["users"] = [u for u in disk.get("users", []) if u != instance["selfLink"]]
                if not disk["users"]:
                    disk.pop("users")
                disk["lastDetachTimestamp"] = compute_time(self.clock.now())

        return self._operation(project, ("zones", zone), "detachDisk", instance["selfLink"], instance["id"], detached)

    def _instances_stop(self, project: str, zone: str, name: str, **_: Any) -> Response:
        """stop: TERMINATED, its capacity released and its planned termination cleared ("The termination timestamp
        is automatically cleared whenever a VM is stopped", limit-vm-runtime). Starting again asks for capacity and
        quota anew, like a create."""
        instance = self._instance(project, zone, name)
        instance["status"] = "STOPPING" if instance["status"] == "RUNNING" else instance["status"]

        def stopped() -> None:
            if self.instances.get((project, zone, name)) is instance:
                self._stop(instance)

        return self._operation(project, ("zones", zone), "stop", instance["selfLink"], instance["id"], stopped)

    def _instances_start(self, project: str, zone: str, name: str, **_: Any) -> Response:
        instance = self._instance(project, zone, name)
        if instance["status"] != "TERMINATED":
            return self._operation(project, ("zones", zone), "start", instance["selfLink"], instance["id"], None)
        refusal = self._admission_error(project, zone, instance["_machine_type"])
        if refusal is None:
            instance.update(status="STAGING", _holds_capacity=True)

        def started() -> dict[str, Any] | None:
            if refusal is not None:
                return refusal
            if self.instances.get((project, zone, name)) is instance:
                self._start_running(instance)
            return None

        return self._operation(project, ("zones", zone), "start", instance["selfLink"], instance["id"], started)

    def _instances_guest_attributes(self, project: str, zone: str, name: str, query: dict[str, list[str]],
                                    **_: Any) -> Response:
        """getGuestAttributes (https://cloud.google.com/compute/docs/reference/rest/v1/instances/
        getGuestAttributes): `queryPath=ns/` answers queryValue.items; `variableKey=ns/key` one value; 404 while
        nothing matches (what tpuserve.gce reads as "none yet")."""
        self._instance(project, zone, name)
        held = self.guest_attributes.get((project, zone, name), {})
        link = self._link(project, "zones", zone, "instances", name, "guestAttributes")
        if query.get("variableKey"):
            ns, _, key = query["variableKey"][0].partition("/")
            if (ns, key) not in held:
                raise not_found(f"projects/{project}/zones/{zone}/instances/{name}/guestAttributes/{ns}/{key}")
            return Response(200, {"kind": "compute#guestAttributes", "variableKey": f"{ns}/{key}",
                                  "variableValue": held[(ns, key)], "selfLink": link})
        path = query.get("queryPath", [""])[0]
        ns, _, prefix = path.partition("/")
        items = [{"namespace": n, "key": k, "value": v} for (n, k), v in sorted(held.items())
                 if (not ns or n == ns) and k.startswith(prefix)]
        if not items:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}/guestAttributes/{path}")
        return Response(200, {"kind": "compute#guestAttributes", "queryPath": path, "queryValue": {"items": items},
                              "selfLink": link})

    def _instances_serial_port(self, project: str, zone: str, name: str, query: dict[str, list[str]], **_: Any,
                               ) -> Response:
        self._instance(project, zone, name)
        contents = self.serial_output.get((project, zone, name), "")
        start = int(query.get("start", ["0"])[0] or 0)
        return Response(200, {"kind": "compute#serialPortOutput", "contents": contents[start:], "start": str(start),
                              "next": str(len(contents)),
                              "selfLink": self._link(project, "zones", zone, "instances", name, "serialPort")})

    # --- Compute: disks ---------------------------------------------------------------------------------------

    def _disk(self, project: str, zone: str, name: str) -> dict[str, Any]:
        found = self.disks.get((project, zone, name))
        if found is None:
            raise not_found(f"projects/{project}/zones/{zone}/disks/{name}")
        return found

    def _image_link(self, source: str) -> str:
        """The image a disk records as sourceImage: a family resolves to its current build ("the latest image that is
        not deprecated", https://cloud.google.com/compute/docs/images/image-families-best-practices), named as the
        family's builds are (ubuntu-os-accelerator-images: ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e-v20260803)."""
        found = re.search(r"projects/([^/]+)/global/images/(family/)?([^/]+)$", source)
        if found is None:
            return source
        project, family, name = found.groups()
        image = f"{name}-{self.image_build}" if family else name
        return f"https://www.googleapis.com/compute/v1/projects/{project}/global/images/{image}"

    def _new_disk(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        """A Disk (https://cloud.google.com/compute/docs/reference/rest/v1/disks), CREATING until its operation
        is done; Hyperdisk Balanced gets the free baseline performance when none is asked for."""
        name = check_name(body.get("name"))
        disk_type = last_segment(body.get("type") or "pd-standard")
        labels = dict(body.get("labels") or {})
        disk: dict[str, Any] = {
            "kind": "compute#disk", "id": _numeric_id(project, zone, name),
            "creationTimestamp": compute_time(self.clock.now()), "name": name,
            "description": body.get("description", ""), "sizeGb": str(int(body.get("sizeGb") or 10)),
            "zone": self._link(project, "zones", zone), "status": "CREATING",
            "selfLink": self._link(project, "zones", zone, "disks", name),
            "type": self._link(project, "zones", zone, "diskTypes", disk_type),
            "labelFingerprint": fingerprint(labels), "physicalBlockSizeBytes": "4096"}
        if labels:
            disk["labels"] = labels
        if body.get("sourceImage"):
            disk["sourceImage"] = self._image_link(body["sourceImage"])
        if disk_type.startswith("hyperdisk"):
            disk["provisionedIops"] = str(body.get("provisionedIops") or 3000)
            disk["provisionedThroughput"] = str(body.get("provisionedThroughput") or 140)
        return disk

    def _disks_list(self, project: str, zone: str, query: dict[str, list[str]], **_: Any) -> Response:
        return self._zonal_list("disk", self.disks, project, zone, query)

    def _disks_aggregated(self, project: str, query: dict[str, list[str]], **_: Any) -> Response:
        return self._zonal_aggregated("disk", self.disks, project, query)

    def _disks_get(self, project: str, zone: str, name: str, **_: Any) -> Response:
        return Response(200, _public(self._disk(project, zone, name)))

    def _disks_insert(self, project: str, zone: str, body: dict[str, Any], **_: Any) -> Response:
        name = check_name(body.get("name"))
        if (project, zone, name) in self.disks:
            raise already_exists(f"projects/{project}/zones/{zone}/disks/{name}")
        disk = self._new_disk(project, zone, body)
        self.disks[(project, zone, name)] = disk
        self._ledger("disk", project, zone, disk)

        def created() -> None:
            disk["status"] = "READY"

        return self._operation(project, ("zones", zone), "insert", disk["selfLink"], disk["id"], created)

    def _disks_delete(self, project: str, zone: str, name: str, **_: Any) -> Response:
        """disks.delete; refused at once while an instance uses the disk (400 resourceInUseByAnotherResource)."""
        disk = self._disk(project, zone, name)
        busy = self._in_use(disk, "")
        if busy is not None:
            raise busy
        disk["status"] = "DELETING"

        def deleted() -> None:
            if self.disks.get((project, zone, name)) is disk:
                del self.disks[(project, zone, name)]

        return self._operation(project, ("zones", zone), "delete", disk["selfLink"], disk["id"], deleted)

    def _disks_resize(self, project: str, zone: str, name: str, body: dict[str, Any], **_: Any) -> Response:
        """disks.resize grows only: "New disk size '1' GiB must be larger than existing size '2' GiB." (the API's
        answer quoted in a public gcloud note; 400)."""
        disk = self._disk(project, zone, name)
        size, current = int(body.get("sizeGb") or 0), int(disk["sizeGb"])
        if size <= current:
            raise invalid(f"New disk size '{size}' GiB must be larger than existing size '{current}' GiB.")

        def resized() -> None:
            disk["sizeGb"] = str(size)

        return self._operation(project, ("zones", zone), "resize", disk["selfLink"], disk["id"], resized)

    def _disks_set_labels(self, project: str, zone: str, name: str, body: dict[str, Any], **_: Any) -> Response:
        return self._set_labels(project, zone, self._disk(project, zone, name), body)

    # --- Compute: routers and their NATs ----------------------------------------------------------------------

    def _router(self, project: str, region: str, name: str) -> dict[str, Any]:
        found = self.routers.get((project, region, name))
        if found is None:
            raise not_found(f"projects/{project}/regions/{region}/routers/{name}")
        return found

    def _check_nats(self, project: str, region: str, router: str, network: str, nats: list[dict[str, Any]],
                    existing: Iterable[str]) -> None:
        """A network takes one NAT covering all its subnetworks per region: a new one next to it answers 400
        (google/osv.dev#5629: "Error 400: Invalid value for field 'resource.nats[0].sourceSubnetworkIpRangesToNat':
        'ALL_SUBNETWORKS_ALL_IP_RANGES'. Can not create new Nats since a Nat with option
        ALL_SUBNETWORKS_ALL_IP_RANGES exists., invalid")."""
        option = "ALL_SUBNETWORKS_ALL_IP_RANGES"
        held = [n["name"] for (p, r, name), other in self.routers.items()
                if p == project and r == region and name != router and other["network"] == network
                for n in other.get("nats", []) if n.get("sourceSubnetworkIpRangesToNat") == option]
        existing = set(existing)
        for index, nat in enumerate(nats):
            if nat.get("sourceSubnetworkIpRangesToNat") != option:
                continue
            if held and nat.get("name") not in existing:
                raise invalid(f"Invalid value for field 'resource.nats[{index}].sourceSubnetworkIpRangesToNat': "
                              f"'{option}'. Can not create new Nats since a Nat with option {option} exists.")
            held.append(nat.get("name"))

    def _routers_list(self, project: str, region: str, query: dict[str, list[str]], **_: Any) -> Response:
        items = [r for (p, reg, _), r in self.routers.items() if p == project and reg == region]
        return self._list("router", items, self._link(project, "regions", region, "routers"), query)

    def _routers_aggregated(self, project: str, query: dict[str, list[str]], **_: Any) -> Response:
        scoped: dict[str, list[dict[str, Any]]] = {f"regions/{r}": [] for r in self._regions()}
        for (p, r, _), item in self.routers.items():
            if p == project:
                scoped.setdefault(f"regions/{r}", []).append(item)
        return self._aggregated("router", "routers", scoped, project, query)

    def _routers_get(self, project: str, region: str, name: str, **_: Any) -> Response:
        return Response(200, _public(self._router(project, region, name)))

    def _routers_insert(self, project: str, region: str, body: dict[str, Any], **_: Any) -> Response:
        """routers.insert (https://cloud.google.com/compute/docs/reference/rest/v1/routers): the Router holds its
        NATs in `nats[]` (what the provider's RouterNat resource patches)."""
        name = check_name(body.get("name"))
        if (project, region, name) in self.routers:
            raise already_exists(f"projects/{project}/regions/{region}/routers/{name}")
        network = self._network_link(project, body.get("network"))
        nats = [dict(n) for n in body.get("nats") or []]
        self._check_nats(project, region, name, network, nats, ())
        link = self._link(project, "regions", region, "routers", name)
        router = {"kind": "compute#router", "id": _numeric_id(project, region, name),
                  "creationTimestamp": compute_time(self.clock.now()), "name": name,
                  "description": body.get("description", ""), "region": self._link(project, "regions", region),
                  "network": network, "selfLink": link, "nats": nats,
                  **({"bgp": body["bgp"]} if "bgp" in body else {})}

        def created() -> None:
            self.routers[(project, region, name)] = router
            self._ledger("router", project, region, router)

        return self._operation(project, ("regions", region), "insert", link, router["id"], created)

    def _routers_patch(self, project: str, region: str, name: str, body: dict[str, Any], **_: Any) -> Response:
        router = self._router(project, region, name)
        nats = [dict(n) for n in body.get("nats", router.get("nats", []))]
        self._check_nats(project, region, name, router["network"], nats,
                         (n.get("name") for n in router.get("nats", [])))

        def patched() -> None:
            router.update({k: v for k, v in body.items() if k not in ("name", "network", "region", "nats")})
            router["nats"] = nats

        return self._operation(project, ("regions", region), "patch", router["selfLink"], router["id"], patched)

    def _routers_delete(self, project: str, region: str, name: str, **_: Any) -> Response:
        router = self._router(project, region, name)

        def deleted() -> None:
            self.routers.pop((project, region, name), None)

        return self._operation(project, ("regions", region), "delete", router["selfLink"], router["id"], deleted)

    # --- Compute: firewalls -----------------------------------------------------------------------------------

    def _firewall(self, project: str, name: str) -> dict[str, Any]:
        found = self.firewalls.get((project, name))
        if found is None:
            raise not_found(f"projects/{project}/global/firewalls/{name}")
        return found

    def _firewalls_list(self, project: str, query: dict[str, list[str]], **_: Any) -> Response:
        items = [f for (p, _), f in self.firewalls.items() if p == project]
        return self._list("firewall", items, self._link(project, "global", "firewalls"), query)

    def _firewalls_get(self, project: str, name: str, **_: Any) -> Response:
        return Response(200, _public(self._firewall(project, name)))

    def _firewalls_insert(self, project: str, body: dict[str, Any], **_: Any) -> Response:
        """firewalls.insert (https://cloud.google.com/compute/docs/reference/rest/v1/firewalls); firewalls carry
        no labels."""
        name = check_name(body.get("name"))
        if (project, name) in self.firewalls:
            raise already_exists(f"projects/{project}/global/firewalls/{name}")
        link = self._link(project, "global", "firewalls", name)
        firewall = {"kind": "compute#firewall", "id": _numeric_id(project, name),
                    "creationTimestamp": compute_time(self.clock.now()), "name": name,
                    "description": body.get("description", ""),
                    "network": self._network_link(project, body.get("network")),
                    "priority": int(body.get("priority", 1000)), "direction": body.get("direction", "INGRESS"),
                    "disabled": bool(body.get("disabled", False)), "selfLink": link,
                    **{k: body[k] for k in ("sourceRanges", "sourceTags", "sourceServiceAccounts", "targetTags",
                                            "targetServiceAccounts", "allowed", "denied", "logConfig")
                       if k in body}}

        def created() -> None:
            self.firewalls[(project, name)] = firewall
            self._ledger("firewall", project, "global", firewall)

        return self._operation(project, ("global", ""), "insert", link, firewall["id"], created)

    def _firewalls_patch(self, project: str, name: str, body: dict[str, Any], **_: Any) -> Response:
        firewall = self._firewall(project, name)

        def patched() -> None:
            firewall.update({k: v for k, v in body.items() if k not in ("name", "network")})

        return self._operation(project, ("global", ""), "patch", firewall["selfLink"], firewall["id"], patched)

    def _firewalls_delete(self, project: str, name: str, **_: Any) -> Response:
        firewall = self._firewall(project, name)

        def deleted() -> None:
            self.firewalls.pop((project, name), None)

        return self._operation(project, ("global", ""), "delete", firewall["selfLink"], firewall["id"], deleted)

    # --- Cloud Storage ------------------------------------------------------------------------------------------

    def _bucket(self, name: str) -> dict[str, Any]:
        found = self.buckets.get(name)
        if found is None:
            # https://cloud.google.com/storage/docs/json_api/v1/status-codes (404 notFound)
            raise ApiError(404, "The specified bucket does not exist.", "notFound")
        return found

    @staticmethod
    def _precondition(query: Mapping[str, list[str]], generation: int | None, metageneration: int | None) -> None:
        """ifGenerationMatch (0: must not exist), ifGenerationNotMatch, ifMetagenerationMatch,
        ifMetagenerationNotMatch (https://cloud.google.com/storage/docs/request-preconditions); a failed one
        answers 412 conditionNotMet "Precondition Failed" (the JSON API's body quoted in mco-gh/gcslock#14, a
        lock built on ifGenerationMatch=0)."""
        def value(key: str) -> int | None:
            return int(query[key][0]) if query.get(key, [""])[0] != "" else None

        failed = False
        if (want := value("ifGenerationMatch")) is not None:
            failed |= (generation or 0) != want
        if (want := value("ifGenerationNotMatch")) is not None:
            failed |= (generation or 0) == want
        if (want := value("ifMetagenerationMatch")) is not None:
            failed |= metageneration != want
        if (want := value("ifMetagenerationNotMatch")) is not None:
            failed |= metageneration == want
        if failed:
            raise ApiError(412, "Precondition Failed", "conditionNotMet",
                           extra={"locationType": "header", "location": "If-Match"})

    def _write_rate(self, key: tuple[str, ...], interval: float | None, message: str) -> None:
        if interval is None:
            return
        now, last = self.clock.now(), self._last_write.get(key)
        if last is not None and now - last < interval:
            raise ApiError(429, message, "rateLimitExceeded", domain="usageLimits")
        self._last_write[key] = now

    def _buckets_list(self, query: dict[str, list[str]], **_: Any) -> Response:
        """buckets.list (https://cloud.google.com/storage/docs/json_api/v1/buckets/list): `project` required,
        `items` absent when empty."""
        project = query.get("project", [""])[0]
        if not project:
            raise ApiError(400, "Required parameter: project", "required")
        prefix = query.get("prefix", [""])[0]
        items = [b for name, b in sorted(self.buckets.items()) if b["_project"] == project and name.startswith(prefix)]
        page, token = _page(items, query, 1000)
        body: dict[str, Any] = {"kind": "storage#buckets"}
        if page:
            body["items"] = [_public(b) for b in page]
        if token:
            body["nextPageToken"] = token
        return Response(200, body)

    def _buckets_insert(self, query: dict[str, list[str]], body: dict[str, Any], **_: Any) -> Response:
        """buckets.insert (https://cloud.google.com/storage/docs/json_api/v1/buckets/insert). Names are global:
        409 conflict "Your previous request to create the named bucket succeeded and you already own it."
        (gitpod-io/gitpod#15578) for this project's own, "The requested bucket name is not available. ..."
        (GoogleCloudPlatform/mlops-with-vertex-ai#26) for another project's."""
        project = query.get("project", [""])[0]
        if not project:
            raise ApiError(400, "Required parameter: project", "required")
        name = str(body.get("name", ""))
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]", name) or ".." in name:
            raise ApiError(400, f"Invalid bucket name: '{name}'", "invalid")
        held = self.buckets.get(name)
        if held is not None:
            if held["_project"] == project:
                raise ApiError(409, "Your previous request to create the named bucket succeeded and you already own "
                                    "it.", "conflict")
            raise ApiError(409, "The requested bucket name is not available. The bucket namespace is shared by all "
                                "users of the system. Please select a different name and try again.", "conflict")
        self._write_rate(("bucket-op", project), self.rate_limits.gcs_bucket_op_interval_s,
                         "The project exceeded the rate limit for creating and deleting buckets.")
        now = zulu_time(self.clock.now())
        location = str(body.get("location") or "US").upper()
        bucket = {"kind": "storage#bucket", "id": name, "selfLink": f"https://www.googleapis.com/storage/v1/b/{name}",
                  "projectNumber": project_number(project), "name": name, "timeCreated": now, "updated": now,
                  "metageneration": "1", "location": location,
                  "locationType": "multi-region" if location in ("US", "EU", "ASIA") else "region",
                  "storageClass": body.get("storageClass", "STANDARD"), "etag": "CAE=", "rpo": "DEFAULT",
                  "iamConfiguration": body.get("iamConfiguration", {
                      "uniformBucketLevelAccess": {"enabled": False}, "publicAccessPrevention": "inherited"}),
                  **({"labels": dict(body["labels"])} if body.get("labels") else {}), "_project": project}
        self.buckets[name] = bucket
        self._ledger("bucket", project, location, bucket)
        return Response(200, _public(bucket))

    def _buckets_get(self, bucket: str, **_: Any) -> Response:
        return Response(200, _public(self._bucket(bucket)))

    def _buckets_patch(self, bucket: str, query: dict[str, list[str]], body: dict[str, Any], **_: Any) -> Response:
        """buckets.patch: labels merge (a null value removes a key), metageneration + 1."""
        held = self._bucket(bucket)
        self._precondition({k: v for k, v in query.items() if "etageneration" in k}, None,
                           int(held["metageneration"]))
        for key, value in body.items():
            if key == "labels":
                labels = {**held.get("labels", {}), **value}
                held["labels"] = {k: v for k, v in labels.items() if v is not None}
            elif key not in ("name", "location", "projectNumber", "id"):
                held[key] = value
        held.update(metageneration=str(int(held["metageneration"]) + 1), updated=zulu_time(self.clock.now()))
        return Response(200, _public(held))

    def _buckets_delete(self, bucket: str, query: dict[str, list[str]], **_: Any) -> Response:
        """buckets.delete: 409 conflict "The bucket you tried to delete was not empty." while objects remain
        (crossplane-contrib/provider-gcp#295, and gsutil's gcs_json_api.py matching that text)."""
        held = self._bucket(bucket)
        self._precondition(query, None, int(held["metageneration"]))
        if any(b == bucket for b, _ in self.objects):
            raise ApiError(409, "The bucket you tried to delete was not empty.", "conflict")
        self._write_rate(("bucket-op", held["_project"]), self.rate_limits.gcs_bucket_op_interval_s,
                         "The project exceeded the rate limit for creating and deleting buckets.")
        del self.buckets[bucket]
        return Response(204, b"")

    def _object(self, bucket: str, name: str) -> dict[str, Any]:
        self._bucket(bucket)
        found = self.objects.get((bucket, name))
        if found is None:
            # "No such object: bucket/name" (GCS JSON API 404, quoted in pulibrary/figgy's stubs)
            raise ApiError(404, f"No such object: {bucket}/{name}", "notFound")
        return found

    def _objects_list(self, bucket: str, query: dict[str, list[str]], **_: Any) -> Response:
        """objects.list (https://cloud.google.com/storage/docs/json_api/v1/objects/list): prefix, delimiter
        (-> prefixes[]), pagination; `items` absent when empty."""
        self._bucket(bucket)
        prefix, delimiter = query.get("prefix", [""])[0], query.get("delimiter", [""])[0]
        names = sorted(n for b, n in self.objects if b == bucket and n.startswith(prefix))
        items, prefixes = [], set()
        for name in names:
            rest = name[len(prefix):]
            if delimiter and delimiter in rest:
                prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
            else:
                items.append(self.objects[(bucket, name)]["meta"])
        page, token = _page(items, query, 1000)
        body: dict[str, Any] = {"kind": "storage#objects"}
        if page:
            body["items"] = [dict(m) for m in page]
        if prefixes:
            body["prefixes"] = sorted(prefixes)
        if token:
            body["nextPageToken"] = token
        return Response(200, body)

    def _objects_get(self, bucket: str, object: str, query: dict[str, list[str]], **_: Any) -> Response:
        """objects.get: the metadata, or with alt=media the bytes (headers x-goog-generation and
        x-goog-metageneration, as the JSON API's media download sends them)."""
        held = self._object(bucket, object)
        meta = held["meta"]
        self._precondition(query, int(meta["generation"]), int(meta["metageneration"]))
        if query.get("alt", [""])[0] == "media":
            return Response(200, held["data"], {"Content-Type": meta.get("contentType", "application/octet-stream"),
                                                "x-goog-generation": meta["generation"],
                                                "x-goog-metageneration": meta["metageneration"]})
        return Response(200, dict(meta))

    def _objects_upload(self, bucket: str, query: dict[str, list[str]], body: Any, headers: Mapping[str, str],
                        **_: Any) -> Response:
        """Simple upload (https://cloud.google.com/storage/docs/uploading-objects, uploadType=media): a new
        generation each write, preconditions checked against the live one, at most one write per second per
        object name when that limit is on (429: "The object B/N exceeded the rate limit for object mutation
        operations (create, update, and delete). Please reduce your request rate. See
        https://cloud.google.com/storage/docs/gcs429.", as logged in public issues)."""
        bucket_body = self._bucket(bucket)
        if query.get("uploadType", [""])[0] != "media":
            raise ApiError(400, "The fake cloud takes uploadType=media only", "invalid")
        name = query.get("name", [""])[0]
        if not name:
            raise ApiError(400, "Required parameter: name", "required")
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        live = self.objects.get((bucket, name))
        self._precondition(query, int(live["meta"]["generation"]) if live else 0,
                           int(live["meta"]["metageneration"]) if live else None)
        self._object_write_rate(bucket, name)
        content_type = headers.get("Content-Type") or headers.get("content-type") or "application/octet-stream"
        generation = max(int(self.clock.now() * 1e6), int(live["meta"]["generation"]) + 1 if live else 0)
        now = zulu_time(self.clock.now())
        meta = {"kind": "storage#object", "id": f"{bucket}/{name}/{generation}",
                "selfLink": f"https://www.googleapis.com/storage/v1/b/{bucket}/o/{quote(name, safe='')}",
                "mediaLink": f"https://storage.googleapis.com/download/storage/v1/b/{bucket}/o/"
                             f"{quote(name, safe='')}?generation={generation}&alt=media",
                "name": name, "bucket": bucket, "generation": str(generation), "metageneration": "1",
                "contentType": content_type, "storageClass": bucket_body["storageClass"], "size": str(len(data)),
                "md5Hash": base64.b64encode(hashlib.md5(data).digest()).decode(),
                "etag": base64.b64encode(str(generation).encode()).decode()[:12], "timeCreated": now, "updated": now,
                "timeStorageClassUpdated": now}
        self.objects[(bucket, name)] = {"meta": meta, "data": data}
        return Response(200, dict(meta))

    def _object_write_rate(self, bucket: str, name: str) -> None:
        self._write_rate(("object", bucket, name), self.rate_limits.gcs_object_write_interval_s,
                         f"The object {bucket}/{name} exceeded the rate limit for object mutation operations "
                         "(create, update, and delete). Please reduce your request rate. See "
                         "https://cloud.google.com/storage/docs/gcs429.")

    def _objects_patch(self, bucket: str, object: str, query: dict[str, list[str]], body: dict[str, Any], **_: Any,
                       ) -> Response:
        """objects.patch: custom `metadata` merges (null removes), metageneration + 1; a mutation."""
        held = self._object(bucket, object)
        meta = held["meta"]
        self._precondition(query, int(meta["generation"]), int(meta["metageneration"]))
        self._object_write_rate(bucket, object)
        for key, value in body.items():
            if key == "metadata":
                merged = {**meta.get("metadata", {}), **value}
                meta["metadata"] = {k: v for k, v in merged.items() if v is not None}
            elif key in ("contentType", "cacheControl", "contentDisposition", "contentEncoding", "customTime"):
                meta[key] = value
        meta.update(metageneration=str(int(meta["metageneration"]) + 1), updated=zulu_time(self.clock.now()))
        return Response(200, dict(meta))

    def _objects_delete(self, bucket: str, object: str, query: dict[str, list[str]], **_: Any) -> Response:
        held = self._object(bucket, object)
        self._precondition(query, int(held["meta"]["generation"]), int(held["meta"]["metageneration"]))
        self._object_write_rate(bucket, object)
        del self.objects[(bucket, object)]
        return Response(204, b"")

    # --- IAM service accounts -----------------------------------------------------------------------------------

    def _account(self, project: str, account: str) -> dict[str, Any]:
        for (p, email), held in self.service_accounts.items():
            if p == project and account in (email, held["uniqueId"]):
                return held
        # `gcloud iam service-accounts describe` of a missing account: "NOT_FOUND: Unknown service account"
        raise ApiError(404, "Unknown service account", status="NOT_FOUND")

    def _accounts_list(self, project: str, query: dict[str, list[str]], **_: Any) -> Response:
        """projects.serviceAccounts.list (https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts
        /list): `accounts` absent when there are none."""
        items = [a for (p, _), a in sorted(self.service_accounts.items()) if p == project]
        page, token = _page(items, {"maxResults": query.get("pageSize", ["100"]), **query}, 100)
        return Response(200, {**({"accounts": _public(page)} if page else {}),
                              **({"nextPageToken": token} if token else {})})

    def _accounts_create(self, project: str, body: dict[str, Any], **_: Any) -> Response:
        """projects.serviceAccounts.create: accountId 6-30 characters matching [a-z]([-a-z0-9]*[a-z0-9])
        (the reference's words); a wrong length answers 400 'The account ID "X" does not have a length between 6
        and 30.' (DataDog/stratus-red-team#294), a duplicate 409 ALREADY_EXISTS "Service account X already exists
        within project projects/P." with a ResourceInfo detail (hashicorp/terraform-provider-google logs)."""
        account_id = str(body.get("accountId", ""))
        if not 6 <= len(account_id) <= 30:
            raise ApiError(400, f'The account ID "{account_id}" does not have a length between 6 and 30.',
                           "badRequest", "INVALID_ARGUMENT")
        if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])", account_id):
            # hashicorp/terraform-provider-google#793 quotes the API's answer to an invalid id
            raise ApiError(400, "Request contains an invalid argument.", "badRequest", "INVALID_ARGUMENT")
        email = f"{account_id}@{project}.iam.gserviceaccount.com"
        if (project, email) in self.service_accounts:
            raise ApiError(409, f"Service account {account_id} already exists within project projects/{project}.",
                           "alreadyExists", "ALREADY_EXISTS", details=[{
                               "@type": "type.googleapis.com/google.rpc.ResourceInfo",
                               "resourceName": f"projects/{project}/serviceAccounts/{email}"}])
        spec = body.get("serviceAccount") or {}
        unique_id = str(10**20 + int(hashlib.sha256(email.encode()).hexdigest(), 16) % (9 * 10**20))
        account = {"name": f"projects/{project}/serviceAccounts/{email}", "projectId": project, "uniqueId": unique_id,
                   "email": email, "displayName": spec.get("displayName", ""),
                   "description": spec.get("description", ""), "etag": "MDEwMjE5MjA=", "oauth2ClientId": unique_id,
                   "_display": email, "_created": self.clock.now()}
        self.service_accounts[(project, email)] = account
        self._ledger("serviceAccount", project, "global", account)
        return Response(200, _public(account))

    def _accounts_get(self, project: str, account: str, **_: Any) -> Response:
        return Response(200, _public(self._account(project, account)))

    def _accounts_delete(self, project: str, account: str, **_: Any) -> Response:
        held = self._account(project, account)
        del self.service_accounts[(project, held["email"])]
        return Response(200, {})

    # --- Secret Manager -----------------------------------------------------------------------------------------

    def _secret(self, project: str, secret: str) -> dict[str, Any]:
        found = self.secrets.get((project, secret))
        if found is None:
            # tests/fakes/google_fakes.py (secrets.get of a missing secret)
            raise ApiError(404, f"Secret [projects/{project_number(project)}/secrets/{secret}] not found or has no "
                                "versions.", status="NOT_FOUND")
        return found

    def _secrets_list(self, project: str, **_: Any) -> Response:
        items = [s["secret"] for (p, _), s in sorted(self.secrets.items()) if p == project]
        return Response(200, {**({"secrets": [dict(s) for s in items]} if items else {}), "totalSize": len(items)})

    def _secrets_create(self, project: str, query: dict[str, list[str]], body: dict[str, Any], **_: Any,
                        ) -> Response:
        """projects.secrets.create (https://cloud.google.com/secret-manager/docs/reference/rest/v1/
        projects.secrets/create); resource names carry the project number, as the real API writes them."""
        secret_id = query.get("secretId", [""])[0]
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,255}", secret_id):
            raise ApiError(400, "Secret ID must be 1-255 characters of letters, digits, _ and -.",
                           status="INVALID_ARGUMENT")
        name = f"projects/{project_number(project)}/secrets/{secret_id}"
        if (project, secret_id) in self.secrets:
            raise ApiError(409, f"Secret [{name}] already exists.", status="ALREADY_EXISTS")
        secret = {"name": name, "replication": body.get("replication", {"automatic": {}}),
                  "createTime": zulu_time(self.clock.now()), "etag": f'"{fingerprint(name)}"',
                  **({"labels": dict(body["labels"])} if body.get("labels") else {})}
        self.secrets[(project, secret_id)] = {"secret": secret, "versions": [], "_display": secret_id}
        self._ledger("secret", project, "global", self.secrets[(project, secret_id)])
        return Response(200, dict(secret))

    def _secrets_get(self, project: str, secret: str, **_: Any) -> Response:
        return Response(200, dict(self._secret(project, secret)["secret"]))

    def _secrets_delete(self, project: str, secret: str, **_: Any) -> Response:
        self._secret(project, secret)
        del self.secrets[(project, secret)]
        return Response(200, {})

    def _secrets_add_version(self, project: str, secret: str, body: dict[str, Any], **_: Any) -> Response:
        held = self._secret(project, secret)
        number = len(held["versions"]) + 1
        version = {"name": f"{held['secret']['name']}/versions/{number}", "createTime": zulu_time(self.clock.now()),
                   "state": "ENABLED", "replicationStatus": {"automatic": {}}, "etag": f'"{fingerprint(number)}"',
                   "_data": (body.get("payload") or {}).get("data", "")}
        held["versions"].append(version)
        return Response(200, _public(version))

    def _version(self, project: str, secret: str, version: str) -> dict[str, Any]:
        held = self._secret(project, secret)
        enabled = [v for v in held["versions"] if v["state"] == "ENABLED"]
        found = (enabled[-1] if enabled else None) if version == "latest" else next(
            (v for v in held["versions"] if v["name"].endswith(f"/versions/{version}")), None)
        if found is None:
            raise ApiError(404, f"Secret [{held['secret']['name']}] not found or has no versions.",
                           status="NOT_FOUND")
        return found

    def _versions_list(self, project: str, secret: str, **_: Any) -> Response:
        versions = self._secret(project, secret)["versions"]
        return Response(200, {**({"versions": _public(versions[::-1])} if versions else {}),
                              "totalSize": len(versions)})

    def _versions_get(self, project: str, secret: str, version: str, **_: Any) -> Response:
        return Response(200, _public(self._version(project, secret, version)))

    def _versions_access(self, project: str, secret: str, version: str, **_: Any) -> Response:
        found = self._version(project, secret, version)
        return Response(200, {"name": found["name"], "payload": {"data": found["_data"]}})

    # --- Cloud Monitoring -------------------------------------------------------------------------------------

    # collection -> (store, inventory kind, resource name): dashboards are named by project number
    # (https://cloud.google.com/monitoring/api/ref_v3/rest/v1/projects.dashboards), alert policies by project id
    # (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies).
    def _monitoring(self, collection: str) -> tuple[dict[tuple[str, str], dict[str, Any]], str, str]:
        if collection == "dashboards":
            return self.dashboards, "dashboard", "projects/{number}/dashboards/{id}"
        return self.alert_policies, "alertPolicy", "projects/{project}/alertPolicies/{id}"

    def _monitoring_item(self, project: str, collection: str, id: str) -> dict[str, Any]:
        found = self._monitoring(collection)[0].get((project, id))
        if found is None:
            raise ApiError(404, "Requested entity was not found.", status="NOT_FOUND")
        return found

    def _monitoring_list(self, project: str, collection: str, **_: Any) -> Response:
        items = [_public(d) for (p, _), d in sorted(self._monitoring(collection)[0].items()) if p == project]
        return Response(200, {collection: items} if items else {})

    def _monitoring_create(self, project: str, collection: str, body: dict[str, Any], **_: Any) -> Response:
        store, kind, name = self._monitoring(collection)
        if collection == "alertPolicies":
            self._check_metrics(project, body)
        resource_id = hashlib.sha256(f"{project}/{kind}/{next(_ids)}".encode()).hexdigest()[:20]
        item = {**body, "name": name.format(number=project_number(project), project=project, id=resource_id),
                "etag": fingerprint([resource_id]), "_created": self.clock.now(),
                "_display": body.get("displayName", resource_id)}
        store[(project, resource_id)] = item
        self._ledger(kind, project, "global", item)
        return Response(200, _public(item))

    def _monitoring_get(self, project: str, collection: str, id: str, **_: Any) -> Response:
        return Response(200, _public(self._monitoring_item(project, collection, id)))

    def _monitoring_delete(self, project: str, collection: str, id: str, **_: Any) -> Response:
        self._monitoring_item(project, collection, id)
        del self._monitoring(collection)[0][(project, id)]
        return Response(200, {})

    def _alert_policies_patch(self, project: str, id: str, body: dict[str, Any], query: dict[str, list[str]],
                              **_: Any) -> Response:
        """alertPolicies.patch (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies/patch):
        the fields `updateMask` names, or the whole policy without one; checked as a create is."""
        item = self._monitoring_item(project, "alertPolicies", id)
        mask = [f for f in query.get("updateMask", [""])[0].split(",") if f]
        updated = {**item, **({f: body[f] for f in mask if f in body} if mask else
                              {k: v for k, v in body.items() if k != "name"})}
        self._check_metrics(project, updated)
        updated["_display"] = updated.get("displayName", item["_display"])
        self.alert_policies[(project, id)] = updated
        return Response(200, _public(updated))

    def _check_metrics(self, project: str, policy: dict[str, Any]) -> None:
        """Refuse a policy whose conditions name a metric Cloud Monitoring does not know yet, with the error
        hashicorp/terraform-provider-google#11102 quotes (a threshold condition; superserve-ai/sandbox#369/#370 report
        the PromQL validator refusing metrics "that have not emitted yet", without the text). A PromQL series name
        resolves to its Managed Prometheus types (`_bucket` -> `/histogram`, `_total` -> `/counter`, #369)."""
        now = self.clock.now()
        for condition in policy.get("conditions") or []:
            wanted: list[list[str]] = []
            query = (condition.get("conditionPrometheusQueryLanguage") or {}).get("query", "")
            for series in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*[{\[]", query):
                base = re.sub(r"_(bucket|sum|count)$", "", series)
                wanted.append([f"prometheus.googleapis.com/{base}/histogram"] if base != series else
                              [f"prometheus.googleapis.com/{series}/{kind}"
                               for kind in (("counter",) if series.endswith("_total") else
                                            ("gauge", "unknown", "counter", "summary"))])
            for key in ("conditionThreshold", "conditionAbsent"):
                wanted += [[t] for t in re.findall(r'metric\.type\s*=\s*"([^"]+)"',
                                                   (condition.get(key) or {}).get("filter", ""))]
            for types in wanted:
                known = [self.metric_descriptors.get((project, t)) for t in types]
                if not any(d is not None and d["_created"] + self.metric_visibility_s <= now for d in known):
                    raise ApiError(404, f'Cannot find metric(s) that match type = "{types[0]}". If a metric was '
                                        "created recently, it could take up to 10 minutes to become available. "
                                        "Please try again soon.", status="NOT_FOUND")

    def _metric_descriptors_get(self, project: str, metric_type: str, **_: Any) -> Response:
        # https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.metricDescriptors/get; the 404's message is
        # not documented (AIP-193's shape): clients go by the status
        if self.monitoring_unavailable:  # AIP-193's 503 (https://google.aip.dev/193)
            raise ApiError(503, "The service is currently unavailable.", status="UNAVAILABLE")
        found = self.metric_descriptors.get((project, metric_type))
        if found is None:
            raise ApiError(404, f"Could not find descriptor for metric '{metric_type}'.", status="NOT_FOUND")
        return Response(200, _public(found))

    def _time_series_create(self, project: str, body: dict[str, Any], **_: Any) -> Response:
        """timeSeries.create (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.timeSeries/create):
        "If successful, the response body is empty"; the first write of a type creates its descriptor."""
        series = body.get("timeSeries") or []
        if not series or any(not (item.get("metric") or {}).get("type") for item in series):
            raise ApiError(400, "Field timeSeries[0].metric.type had an invalid value: a metric type is required.",
                           status="INVALID_ARGUMENT")
        self._write_series(project, series, self.clock.now())
        return Response(200, {})

    def _time_series_list(self, project: str, query: dict[str, list[str]], **_: Any) -> Response:
        """timeSeries.list (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.timeSeries/list): the
        series of the filter's one `metric.type` with points in `interval`; `{}` when none (proto3 JSON omits empty
        fields); HEADERS without the points; `pageSize` of them."""
        if self.monitoring_unavailable:
            raise ApiError(503, "The service is currently unavailable.", status="UNAVAILABLE")
        wanted = re.findall(r'metric\.type\s*=\s*"([^"]+)"', query.get("filter", [""])[0])
        if len(wanted) != 1 or "interval.endTime" not in query:
            raise ApiError(400, "The filter must specify a single metric type and the request an interval.endTime.",
                           status="INVALID_ARGUMENT")
        end = parse_time(query["interval.endTime"][0])
        start = parse_time(query["interval.startTime"][0]) if "interval.startTime" in query else end
        found = []
        for (p, metric_type, labels), points in sorted(self.time_series.items()):
            inside = [point for point in points if start <= point["_t"] <= end]
            if p == project and metric_type == wanted[0] and inside:
                header = {"metric": {"type": metric_type, "labels": json.loads(labels)},
                          "resource": {"type": "prometheus_target"},
                          **{k: v for k, v in self.metric_descriptors[(p, metric_type)].items()
                             if k in ("metricKind", "valueType")}}
                found.append(header if query.get("view", ["FULL"])[0] == "HEADERS" else
                             {**header, "points": _public(inside)})
        size = int(query.get("pageSize", ["100000"])[0] or 100000)
        return Response(200, {"timeSeries": found[:size]} if found else {})

    def _write_series(self, project: str, series: list[dict[str, Any]], at: float) -> None:
        for item in series:
            metric_type = item["metric"]["type"]
            labels = dict((item.get("metric") or {}).get("labels") or {})
            kind = metric_type.rsplit("/", 1)[-1]
            self.metric_descriptors.setdefault((project, metric_type), {
                "name": f"projects/{project}/metricDescriptors/{metric_type}", "type": metric_type,
                "labels": [{"key": key} for key in sorted(labels)],
                "metricKind": item.get("metricKind") or ("CUMULATIVE" if kind in ("counter", "histogram") else "GAUGE"),
                "valueType": item.get("valueType") or ("DISTRIBUTION" if kind == "histogram" else "DOUBLE"),
                "monitoredResourceTypes": [(item.get("resource") or {}).get("type", "prometheus_target")],
                "_created": at})
            key = (project, metric_type, json.dumps(labels, sort_keys=True))
            self.time_series.setdefault(key, []).extend(
                {**point, "_t": at} for point in item.get("points") or [{"interval": {"endTime": zulu_time(at)},
                                                                         "value": {"doubleValue": 0.0}}])

    # --- what preflight asks ---------------------------------------------------------------------------------------

    def _project_get(self, project: str, **_: Any) -> Response:
        # Resource Manager v1 Project (shape of tests/fakes/google_fakes.py)
        return Response(200, {"projectNumber": project_number(project), "projectId": project,
                              "lifecycleState": "ACTIVE", "name": project, "createTime": "2025-01-09T12:00:00.000Z"})

    def _test_permissions(self, project: str, body: dict[str, Any], **_: Any) -> Response:
        granted = [p for p in body.get("permissions", []) if p not in self.denied_permissions]
        return Response(200, {"permissions": granted} if granted else {})

    def _services_batch_get(self, project: str, query: dict[str, list[str]], **_: Any) -> Response:
        """Service Usage v1 services.batchGet (https://cloud.google.com/service-usage/docs/reference/rest/v1/services/
        batchGet): `{"services": [Service]}`, each `{name, parent, config, state}` with state ENABLED or DISABLED
        (https://cloud.google.com/service-usage/docs/reference/rest/v1/services); `disabled_apis` holds the state. "A
        single request can get a maximum of 30 services at a time": more is refused (the 400's message is the
        reference's sentence; the API's own words were not found)."""
        number = project_number(project)
        if len(query.get("names", [])) > 30:
            raise invalid("A single request can get a maximum of 30 services at a time.")
        return Response(200, {"services": [
            {"name": f"projects/{number}/services/{last_segment(n)}", "parent": f"projects/{number}",
             "config": {"name": last_segment(n)},
             "state": "DISABLED" if last_segment(n) in self.disabled_apis else "ENABLED"}
            for n in query.get("names", [])]})

    def _quota_info(self, project: str, quota: str, **_: Any) -> Response:
        """Cloud Quotas QuotaInfo (builders of tests/fakes/google_fakes.py) from `quota`: both the preemptible v6e quota
        a flex-start VM draws and the TPU-family quota report the chips `quota[region]` allows; an unlisted region
        is unlimited here (reported as 1536, Google's default preemptible v6e limit in tests/fakes/google_fakes.py)."""
        from tests.fakes.google_fakes import dimensions_info, quota_info

        if "cloudquotas.googleapis.com" in self.disabled_apis:
            raise ApiError(403, f"Cloud Quotas API has not been used in project {project_number(project)} before or "
                                "it is disabled.", status="PERMISSION_DENIED")
        regions = sorted(self._regions() - set(self.quota))
        if quota == "PREEMPTIBLE-TPU-V6E-per-project-region":
            infos = [dimensions_info(limit, [r], region=r) for r, limit in sorted(self.quota.items())]
            infos.append(dimensions_info(1536, regions))
            return Response(200, quota_info(quota, "compute.googleapis.com/preemptible_tpu_v6e", infos, ["region"]))
        if quota == "TPUS-PER-TPU-FAMILY-per-project-region":
            infos = [dimensions_info(limit, [r], region=r, tpu_family=TPU_FAMILY)
                     for r, limit in sorted(self.quota.items())]
            infos += [dimensions_info(1536, [r], region=r, tpu_family=TPU_FAMILY) for r in regions]
            return Response(200, quota_info(quota, QUOTA_METRIC, infos, ["region", "tpu_family"]))
        raise ApiError(404, f"QuotaInfo {quota} not found.", status="NOT_FOUND")

    def _token(self, **_: Any) -> Response:
        """An OAuth token endpoint (https://developers.google.com/identity/protocols/oauth2), for credentials whose
        token_uri can point here (service-account style)."""
        return Response(200, {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"})

    # --- inventory and billing ------------------------------------------------------------------------------

    def _ledger(self, kind: str, project: str, location: str, item: dict[str, Any]) -> None:
        """Open the billing record of a resource that now exists, once (a new resource of the same name is a
        new record, and a new line on the bill)."""
        if "_ledger" not in item:
            item["_ledger"] = f"{kind}-{next(_ids)}"
            self._ledgers[item["_ledger"]] = _Ledger(kind, item.get("_display", item.get("name", "")), project,
                                                     location)

    def _live(self) -> dict[str, tuple[float | None, str]]:
        """ledger key -> (USD per hour now, price keys) of everything that exists."""
        rates: dict[str, tuple[float | None, str]] = {}
        for (project, zone, _), instance in self.instances.items():
            if instance.get("_ledger"):
                rates[instance["_ledger"]] = self._instance_rate(instance)
        for disk in self.disks.values():
            if disk.get("_ledger"):
                rates[disk["_ledger"]] = self._disk_rate(disk)
        for bucket in self.buckets.values():
            stored = sum(len(o["data"]) for (b, _), o in self.objects.items() if b == bucket["name"])
            rates[bucket["_ledger"]] = (stored / 2**30 * PRICES["gcs-standard"].usd / HOURS_PER_MONTH,
                                        "gcs-standard")
        for (project, region, _), router in self.routers.items():
            rates[router["_ledger"]] = (0.0, "")
            for nat in router.get("nats", []):
                nat_key = f"{router['_ledger']}/nat/{nat.get('name')}"
                if nat_key not in self._ledgers:
                    self._ledgers[nat_key] = _Ledger("nat", str(nat.get("name")), project, region)
                rates[nat_key] = self._nat_rate(project, region, router["network"])
        for item in [*self.firewalls.values(), *self.service_accounts.values(), *self.dashboards.values(),
                     *self.alert_policies.values()]:
            rates[item["_ledger"]] = (0.0, "")
        for held in self.secrets.values():
            active = sum(v["state"] == "ENABLED" for v in held["versions"])
            rates[held["_ledger"]] = (active * PRICES["secret-version"].usd / HOURS_PER_MONTH, "secret-version")
        return rates

    @staticmethod
    def _instance_rate(instance: dict[str, Any]) -> tuple[float | None, str]:
        if instance["status"] != "RUNNING":
            return 0.0, ""
        return machine_price_per_hour(instance["_machine_type"],
                                      instance["scheduling"].get("provisioningModel", "STANDARD"))

    @staticmethod
    def _disk_rate(disk: dict[str, Any]) -> tuple[float | None, str]:
        disk_type = last_segment(disk["type"])
        price = PRICES.get(disk_type)
        if price is None:
            return None, ""
        return int(disk["sizeGb"]) * price.usd / HOURS_PER_MONTH, disk_type

    def _nat_users(self, project: str, region: str, network: str) -> list[str]:
        """VMs a NAT gateway serves: RUNNING, in its region and network, without an external IP."""
        return [i["name"] for (p, z, _), i in sorted(self.instances.items())
                if p == project and region_of(z) == region and i["status"] == "RUNNING"
                and any(n["network"] == network and not n.get("accessConfigs") for n in i["networkInterfaces"])]

    def _nat_rate(self, project: str, region: str, network: str) -> tuple[float, str]:
        """https://cloud.google.com/nat/pricing: $0.0014 per VM-hour up to 32 VMs, $0.044/hour beyond, plus
        $0.005/hour per external IP the gateway uses (one here while it serves any VM)."""
        users = len(self._nat_users(project, region, network))
        if not users:
            return 0.0, ""
        gateway = PRICES["nat-gateway-max"].usd if users > 32 else users * PRICES["nat-vm"].usd
        return gateway + PRICES["nat-ip"].usd, "nat-vm+nat-ip"

    def _rebill(self) -> None:
        """Close and open billing periods where a rate changed (a VM started or stopped, a disk grew, objects came
        or went, a NAT gained a VM) or a resource is gone."""
        now = self.clock.now()
        live = self._live()
        for key, ledger in self._ledgers.items():
            current = ledger.periods[-1] if ledger.periods and ledger.periods[-1].end is None else None
            rate = live.get(key)
            if rate is None:
                if current is not None:
                    current.end = now
                continue
            if current is not None and (current.usd_per_hour, current.prices) == rate:
                continue
            if current is not None:
                current.end = now
            ledger.periods.append(_Period(now, None, rate[0], rate[1]))

    def _compute_inventory(self) -> Iterable[Resource]:
        live = self._live()
        for (project, zone, name), i in self.instances.items():
            rate = live.get(i.get("_ledger", ""), (0.0, ""))[0]
            yield Resource("instance", name, project, zone, dict(i.get("labels", {})), i["creationTimestamp"],
                           i["status"], bool(rate) or rate is None, rate,
                           tuple(last_segment(d["source"]) for d in i["disks"]),
                           {"machineType": i["_machine_type"], "chips": i["_chips"],
                            "provisioningModel": i["scheduling"].get("provisioningModel"),
                            "terminationTimestamp": i.get("resourceStatus", {}).get("scheduling", {}).get(
                                "terminationTimestamp")})
        for (project, zone, name), d in self.disks.items():
            rate = live.get(d.get("_ledger", ""), (0.0, ""))[0]
            yield Resource("disk", name, project, zone, dict(d.get("labels", {})), d["creationTimestamp"],
                           d["status"], bool(rate) or rate is None, rate,
                           tuple(last_segment(u) for u in d.get("users", [])),
                           {"sizeGb": int(d["sizeGb"]), "type": last_segment(d["type"]),
                            "lastAttachTimestamp": d.get("lastAttachTimestamp"),
                            "lastDetachTimestamp": d.get("lastDetachTimestamp")})
        for (project, region, name), r in self.routers.items():
            yield Resource("router", name, project, region, {}, r["creationTimestamp"], "READY", False, 0.0,
                           (), {"network": last_segment(r["network"])})
            for nat in r.get("nats", []):
                rate = live.get(f"{r['_ledger']}/nat/{nat.get('name')}", (0.0, ""))[0]
                yield Resource("nat", str(nat.get("name")), project, region, {}, r["creationTimestamp"], "READY",
                               bool(rate), rate, (name,),
                               {"sourceSubnetworkIpRangesToNat": nat.get("sourceSubnetworkIpRangesToNat"),
                                "vms": tuple(self._nat_users(project, region, r["network"]))})
        for (project, name), f in self.firewalls.items():
            yield Resource("firewall", name, project, "global", {}, f["creationTimestamp"], "READY", False, 0.0, (),
                           {"network": last_segment(f["network"]), "targetTags": tuple(f.get("targetTags", ()))})

    def _other_inventory(self) -> Iterable[Resource]:
        live = self._live()
        for name, b in self.buckets.items():
            rate = live[b["_ledger"]][0]
            objects = [o for (bucket, _), o in self.objects.items() if bucket == name]
            yield Resource("bucket", name, b["_project"], b["location"], dict(b.get("labels", {})), b["timeCreated"],
                           "READY", bool(rate), rate, (),
                           {"objects": len(objects), "bytes": sum(len(o["data"]) for o in objects)})
        for (project, email), a in self.service_accounts.items():
            yield Resource("serviceAccount", email, project, "global", {}, zulu_time(a["_created"]), "ENABLED", False,
                           0.0, (), {"uniqueId": a["uniqueId"], "displayName": a["displayName"]})
        for (project, secret_id), s in self.secrets.items():
            active = sum(v["state"] == "ENABLED" for v in s["versions"])
            rate = active * PRICES["secret-version"].usd / HOURS_PER_MONTH
            yield Resource("secret", secret_id, project, "global", dict(s["secret"].get("labels", {})),
                           s["secret"]["createTime"], "ENABLED", bool(rate), rate, (), {"versions": active})
        for kind, store in (("dashboard", self.dashboards), ("alertPolicy", self.alert_policies)):
            for (project, _), item in store.items():
                yield Resource(kind, item["_display"], project, "global", dict(item.get("userLabels", {})),
                               zulu_time(item["_created"]), "ENABLED", False, 0.0, (), {"name": item["name"]})
