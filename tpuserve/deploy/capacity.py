"""What a failed `pulumi up` of the TPU VM means for the capacity sweep, from its error text alone: rules tried in
order, first match wins (docs/design/capacity.md#the-classifier; a real text per rule in tests/cli/test_capacity.py)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable

from tpuserve.deploy.sweep import REGION, STOP, ZONE, Failure
from tpuserve.flex_start import CAPACITY
from tpuserve.zones import REGION_NAME, ZONE_NAME, region_of

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
REASON_MAX_CHARS = 300
# Where a provider message starts inside a line of `pulumi up` output, and noise before it.
MESSAGE_STARTS = ("error: ", "Error: ", "* ", "message: ", " - ")
MESSAGE_ENDS = (" Resources: ", " Duration: ", " error: ")
PREFIXES = re.compile(r"^(?:sdk-v2/provider2\.go:\d+: )?(?:sdk\.helper_schema: )?")

GATE_FAILED = re.compile(r"exit status \d+: running .{0,400}?-m tpuserve gate")
GATE_VERDICT = re.compile(r'\{"ready": false, .*?"reason": ("(?:[^"\\]|\\.)*")\}')
# Another update holds the stack: the CLI's two texts (docs/design/capacity.md#the-classifier).
LOCKED = re.compile(r"the stack is currently locked by|\[409\] Conflict: Another update is currently in progress")
POLICY = re.compile(r"Policy Violations:|\[mandatory\]|Constraint '?constraints/[\w.]+'? violated")
PROGRAM = re.compile(r"Program failed with an unhandled exception|\bConfigError\b|"
                     r"an unhandled error occurred: Program exited with non-zero exit code")
CREDENTIALS = re.compile(r"Attempted to load application default credentials|could not find default credentials|"
                         r"invalid_grant|Reauthentication failed")
SUGGESTED = re.compile(r"Consider trying your request in the (.+?) zone\(s\)|zonesAvailable: ([a-z0-9, -]+)")
QUOTA = re.compile(rf"Quota '(?P<metric>\w+)' (?:exceeded\.?\s*Limit:?|exhausted\.\s*Limit) (?P<limit>[0-9.]+) "
                   rf"(?:in region (?P<region>{REGION_NAME})|in zone (?P<zone>{ZONE_NAME})|(?P<globally>globally))")
QUOTA_CODE = re.compile(r"QUOTA_EXCEEDED|quotaExceeded")
UNAVAILABLE = re.compile(r"Machine type with name '[^']+' does not exist in zone|machineTypes/[^'\s]+' was not found|"
                         r"Unknown zone|is not found or access is unauthorized")
API_DISABLED = re.compile(r"has not been used in project \S+ before or it is disabled|accessNotConfigured|"
                          r"SERVICE_DISABLED")
API_NAME = re.compile(r"apis/api/([a-z0-9.-]+\.googleapis\.com)")
PERMISSION = re.compile(r"Required '[\w.]+' permission for|IAM_PERMISSION_DENIED|PERMISSION_DENIED|Error 403\b|"
                        r"\bforbidden\b|Permission '[\w.]+' denied")
PROJECT = re.compile(r"Failed to find project|The resource 'projects/[^/']+' was not found|"
                     r"Invalid value for project")
INVALID = re.compile(r"Invalid value for field|Error 400\b|\bbadRequest\b|INVALID_ARGUMENT|, invalid\b")
TIMEOUT = re.compile(r"timeout while waiting for state to become 'DONE'")
TRANSIENT = re.compile(r"Operation rate exceeded for resource|RESOURCE_OPERATION_RATE_EXCEEDED|rateLimitExceeded|"
                       r"Rate Limit Exceeded|Error 50[023]\b|backendError|Internal error|UNSUPPORTED_OPERATION|"
                       r"RESOURCE_NOT_READY")


def normalize(text: str) -> str:
    """One line: no colour codes, every run of whitespace (gcloud and Pulumi wrap and indent) a single space."""
    return " ".join(ANSI.sub("", text).split())


def excerpt(text: str, match: re.Match[str]) -> str:
    """The sentence of the provider's message around `match`, without Pulumi's and the provider's prefixes."""
    starts = [found + len(marker) for marker in (". ", *MESSAGE_STARTS)
              if (found := text.rfind(marker, 0, match.start())) >= 0]
    ends = [found + (marker == ". ") for marker in (". ", *MESSAGE_ENDS)
            if (found := text.find(marker, match.end())) >= 0]
    line = PREFIXES.sub("", text[max(starts, default=0):min(ends, default=len(text))].strip())
    return line if len(line) <= REASON_MAX_CHARS else line[:REASON_MAX_CHARS - 1] + "…"


def suggested_zones(text: str) -> tuple[str, ...]:
    found: list[str] = []
    for match in SUGGESTED.finditer(text):
        found += re.findall(ZONE_NAME, match.group(1) or match.group(2))
    return tuple(dict.fromkeys(found))


Rule = Callable[[str, str], "Failure | None"]


def _stop(kind: str, pattern: re.Pattern[str], hint: str) -> Rule:
    return _rule(kind, pattern, STOP, hint=hint)


def _rule(kind: str, pattern: re.Pattern[str], block: str = ZONE, lasting: bool = False, hint: str = "",
          suggest: bool = False) -> Rule:
    def rule(text: str, zone: str) -> Failure | None:
        match = pattern.search(text)
        return Failure(kind, block, excerpt(text, match), lasting=lasting, hint=hint,
                       suggested=suggested_zones(text) if suggest else ()) if match else None
    return rule


def _gate(text: str, zone: str) -> Failure | None:
    if not GATE_FAILED.search(text):
        return None
    reason = "the VM was created but the readiness gate failed"
    if verdicts := GATE_VERDICT.findall(text):  # the gate's own verdict (its JSON line)
        with contextlib.suppress(json.JSONDecodeError):
            reason = f"the VM never served: {json.loads(verdicts[-1])}"
    return Failure("not-ready", STOP, reason,
                   hint="a VM that boots but never serves fails the same way in every zone: read why with "
                        "`tpuserve diagnose --stack <stack>` (the VM runs, and bills, until destroyed or expired)")


def _quota(text: str, zone: str) -> Failure | None:
    match = QUOTA.search(text) or QUOTA_CODE.search(text)
    if not match:
        return None
    reason = excerpt(text, match)
    named = match.groupdict() if match.re is QUOTA else {}
    if named.get("globally"):
        return Failure("quota", STOP, reason, lasting=True,
                       hint=f"a global quota ({named['metric']}): request more in IAM & Admin > Quotas")
    if named.get("zone"):
        return Failure("quota", ZONE, reason, lasting=True)
    region = named.get("region") or region_of(zone)
    return Failure("quota", REGION, reason, lasting=True, region=region,
                   hint=f"no quota in {region}: request it (IAM & Admin > Quotas) to use this region")


def _api_disabled(text: str, zone: str) -> Failure | None:
    match = API_DISABLED.search(text)
    if not match:
        return None
    api = API_NAME.search(text)
    command = f"gcloud services enable {api.group(1)}" if api else "enable the API named above"
    return Failure("api-disabled", STOP, excerpt(text, match),
                   hint=f"{command}, wait a few minutes, then run `tpuserve preflight`")


RULES: tuple[Rule, ...] = (
    _gate,
    _stop("locked", LOCKED, "another update holds the stack: wait for it to end, or `pulumi cancel` a dead one"),
    _stop("policy", POLICY, "a policy forbids this change: fix the stack config (policy/config/<stack>.json "
                            "loosens a rule of the policy pack; an organization policy is your admin's)"),
    _stop("config", PROGRAM, "the program or the stack config failed before anything was created: fix the key "
                             "it names"),
    _stop("credentials", CREDENTIALS, "run `gcloud auth application-default login` (CI: Workload Identity "
                                      "Federation, see docs/pipelines-and-policy.md)"),
    _rule("capacity", CAPACITY, suggest=True),
    _quota,
    _rule("unavailable", UNAVAILABLE, lasting=True),
    _api_disabled,
    _stop("permission", PERMISSION, "grant the deploying identity the role it lacks (`tpuserve preflight` lists "
                                    "the permissions); IAM grants take 2-7 minutes to propagate"),
    _stop("project", PROJECT, "check the stack's `project` (its id, not its name or number)"),
    _stop("invalid", INVALID, "the request is invalid the same way in every zone: fix the setting it names"),
    _rule("timeout", TIMEOUT),
    _rule("transient", TRANSIENT),
)


def classify(output: str, zone: str) -> Failure:
    """What the output of a failed `pulumi up` in `zone` means for the sweep."""
    text = normalize(output)
    for rule in RULES:
        failure = rule(text, zone)
        if failure is not None:
            return failure
    last = next((line.strip() for line in reversed(ANSI.sub("", output).splitlines()) if "error" in line.lower()),
                text[-REASON_MAX_CHARS:])
    return Failure("unknown", STOP, last[:REASON_MAX_CHARS],
                   hint="not a failure the sweep knows how to route around: read the output above")
