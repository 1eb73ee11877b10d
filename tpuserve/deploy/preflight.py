"""`tpuserve preflight`: what would stop a deploy, found in seconds through Google's APIs, before anything is created.
Each check is ok, warning or fail with the fix; zones it rules out are dropped. The checks: docs/design/preflight.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

import requests

from tpuserve import cli, exits
from tpuserve.cli import echo_json
from tpuserve.client import error_message
from tpuserve.deploy import nat
from tpuserve.gce import COMPUTE_URL, ComputeApiError, ComputeClient
from tpuserve.gcs import STORAGE_URL
from tpuserve.names import stack_labels
from tpuserve.zones import region_of
from tpuserve.facts import V6E_ZONES, VLLM_TPU_IMAGE
from tpuserve.registry import ABSENT, OK as IMAGE_OK, RegistryError, locate
from tpuserve.serving import tpu_chips

OK, WARNING, FAIL = "ok", "warning", "fail"
DEFAULT_MACHINE_TYPE = "ct6e-standard-1t"
TIMEOUT_S = 20.0
# The APIs the stack uses (sources: docs/design/preflight.md); Cloud Storage is two: both off fails, one off warns
REQUIRED_APIS = ("compute.googleapis.com", "secretmanager.googleapis.com", "iam.googleapis.com",
                 "monitoring.googleapis.com", "logging.googleapis.com")
STORAGE_APIS = ("storage.googleapis.com", "storage-api.googleapis.com")
QUOTAS_API = "cloudquotas.googleapis.com"
PREEMPTIBLE_QUOTA = "PREEMPTIBLE-TPU-V6E-per-project-region"
FAMILY_QUOTA = "TPUS-PER-TPU-FAMILY-per-project-region"
TPU_FAMILY = "CT6E"
# What `pulumi up` does to the stack's resources, and `tpuserve up` and the gate to the VM.
PERMISSIONS = (
    "compute.instances.create", "compute.instances.delete", "compute.instances.get", "compute.instances.list",
    "compute.instances.setMetadata", "compute.instances.setLabels", "compute.instances.setTags",
    "compute.instances.setServiceAccount", "compute.instances.getGuestAttributes",
    "compute.instances.getSerialPortOutput", "compute.disks.create", "compute.disks.list", "compute.disks.delete",
    "compute.machineTypes.get", "compute.networks.get", "compute.networks.updatePolicy", "compute.subnetworks.use",
    "compute.firewalls.create", "compute.firewalls.delete", "compute.firewalls.get", "compute.routers.list",
    "compute.routers.create", "compute.routers.delete", "compute.routers.get", "compute.routers.update",
    "iam.serviceAccounts.create", "iam.serviceAccounts.delete", "iam.serviceAccounts.get", "iam.serviceAccounts.actAs",
    "resourcemanager.projects.getIamPolicy", "resourcemanager.projects.setIamPolicy",
    "secretmanager.secrets.getIamPolicy", "secretmanager.secrets.setIamPolicy",
)
SECRET_CREATE_PERMISSIONS = ("secretmanager.secrets.create", "secretmanager.secrets.delete",
                             "secretmanager.versions.add")


@dataclass(frozen=True)
class Endpoints:
    """API roots; tests point them at fakes on 127.0.0.1."""

    compute: str = COMPUTE_URL
    serviceusage: str = "https://serviceusage.googleapis.com"
    cloudresourcemanager: str = "https://cloudresourcemanager.googleapis.com"
    secretmanager: str = "https://secretmanager.googleapis.com"
    cloudquotas: str = "https://cloudquotas.googleapis.com"
    storage: str = STORAGE_URL  # the buckets
    iam: str = "https://iam.googleapis.com"
    monitoring: str = "https://monitoring.googleapis.com"  # the alert policies' metrics (tpuserve/ops/alerts.py)
    registry: str = ""  # a container registry's root for every image (tests); empty: the image's own registry

    @classmethod
    def parse(cls, pairs: Iterable[str]) -> Endpoints:
        """`--endpoint compute=http://127.0.0.1:8080` ... into Endpoints."""
        overrides = {}
        for pair in pairs:
            name, _, url = pair.partition("=")
            if name not in cls.__dataclass_fields__ or not url:
                raise click.BadParameter(f"{pair!r}: expected SERVICE=URL with SERVICE one of "
                                         f"{', '.join(cls.__dataclass_fields__)}", param_hint="--endpoint")
            overrides[name] = url.rstrip("/")
        return cls(**overrides)


@dataclass(frozen=True)
class Target:
    """What the stack would deploy, as far as preflight cares."""

    project: str
    zones: tuple[str, ...]
    machine_type: str = DEFAULT_MACHINE_TYPE
    secret: str = ""  # hfTokenSecretId: an id or projects/P/secrets/S; empty when the stack creates the secret
    creates_secret: bool = False  # hfToken is set: the stack makes the secret itself
    # Cloud NAT (check_nat): whose, in which regions (none: not checked), made where none serves, held in its state
    stack: str = ""
    network: str = "default"
    subnetwork: str = ""
    nat_regions: tuple[str, ...] = ()
    makes_nat: bool = True
    own_nats: frozenset[tuple[str, str, str]] = frozenset()
    image: str = ""  # containerImage (the default pin when unset); empty: not checked
    bucket: bool = True  # compileCacheBucket: the stack keeps a Cloud Storage bucket

    @property
    def chips(self) -> int:
        return tpu_chips(self.machine_type) or 1

    @property
    def secret_path(self) -> str:
        return self.secret if self.secret.startswith("projects/") else f"projects/{self.project}/secrets/{self.secret}"

    def nat_plan(self, nats: Iterable[nat.Nat]) -> nat.NatPlan:
        """Which of `nats` serves each of the target's regions."""
        return nat.plan(nats, self.stack, self.nat_regions, self.network, self.subnetwork, set(self.own_nats),
                        self.makes_nat)


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"check": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # zone -> why the sweep will not try it
    zones: tuple[str, ...] = ()  # the candidates, in order
    nat: nat.NatPlan | None = None  # what serves Cloud NAT where, when the routers could be listed
    # region -> the larger of its preemptible and standard TPU v6e chip limits (-1 unlimited), where read
    tpu_limits: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(check.status == FAIL for check in self.checks)

    @property
    def usable_zones(self) -> list[str]:
        return [zone for zone in self.zones if zone not in self.skipped]

    def skip_region(self, region: str, why: str) -> None:
        for zone in self.zones:
            if region_of(zone) == region:
                self.skipped.setdefault(zone, why)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": not self.failed, "checks": [check.as_dict() for check in self.checks],
                "zones": self.usable_zones, "skipped": self.skipped}


class Google:
    """GET/POST against one of the Endpoints with the session; errors carry Google's message."""

    def __init__(self, session: requests.Session, endpoints: Endpoints, project: str):
        self.session, self.endpoints, self.project = session, endpoints, project

    def call(self, api: str, path: str, *, params: Any = None, body: Any = None,
             bill_project: bool = False) -> dict[str, Any]:
        # User credentials need a quota project for Service Usage and Cloud Quotas: bill the stack's own.
        headers = {"x-goog-user-project": self.project} if bill_project else {}
        url = f"{getattr(self.endpoints, api)}{path}"
        if body is None:
            response = self.session.get(url, params=params, headers=headers, timeout=TIMEOUT_S)
        else:
            response = self.session.post(url, json=body, headers=headers, timeout=TIMEOUT_S)
        if not response.ok:
            raise ComputeApiError(response.status_code, error_message(response), api="")
        return dict(response.json())


def unreachable(name: str, err: Exception) -> Check:
    return Check(name, WARNING, f"could not check: {err}")


# --- checks -----------------------------------------------------------------------------------------------------

def check_project(google: Google) -> Check:
    try:
        project = google.call("cloudresourcemanager", f"/v1/projects/{google.project}")
    except ComputeApiError as err:
        return Check("project", FAIL, f"{google.project}: {err}",
                     "check `project` in the stack config (the project id) and that you may read it")
    except requests.RequestException as err:
        return unreachable("project", err)
    state = project.get("lifecycleState", "")
    if state != "ACTIVE":
        return Check("project", FAIL, f"{google.project} is {state or 'not active'}", "use an active project")
    return Check("project", OK, f"{google.project} (number {project.get('projectNumber', '?')}), active")


def check_apis(google: Google, target: Target) -> tuple[Check, set[str]]:
    """The state of every API the stack uses, in one batchGet; also every API found enabled (for Cloud Quotas)."""
    storage = STORAGE_APIS if target.bucket else ()
    wanted = (*REQUIRED_APIS, *storage)
    names = [f"projects/{google.project}/services/{api}" for api in (*wanted, QUOTAS_API)]
    try:
        body = google.call("serviceusage", f"/v1/projects/{google.project}/services:batchGet",
                           params={"names": names}, bill_project=True)
    except (ComputeApiError, requests.RequestException) as err:
        return unreachable("APIs", err), set(wanted)
    enabled = {service["name"].rsplit("/", 1)[-1] for service in body.get("services", [])
               if service.get("state") == "ENABLED"}
    disabled = [api for api in REQUIRED_APIS if api not in enabled]
    storage_off = [api for api in storage if api not in enabled]
    if storage_off and len(storage_off) == len(storage):
        disabled += storage_off
    enable = f"gcloud services enable {{}} --project {google.project}"
    if disabled:
        return Check("APIs", FAIL, f"not enabled: {', '.join(disabled)}", enable.format(" ".join(disabled))), enabled
    if storage_off:
        on = ", ".join(api for api in storage if api not in storage_off)
        detail = (f"not enabled: {', '.join(storage_off)} (while {on} is; which of the two Cloud Storage services "
                  "the bucket needs is not documented)")
        return Check("APIs", WARNING, detail, enable.format(" ".join(storage_off))), enabled
    return Check("APIs", OK, f"enabled: {', '.join(api.split('.')[0] for api in wanted)}"), enabled


def check_image(target: Target, registry_url: str) -> Check:
    """Whether the registry still holds the image the VM will pull; a fresh session keeps the Google token home."""
    name = "container image"
    try:
        with requests.Session() as session:
            found = locate(target.image, registry_url, session)
    except RegistryError as err:
        return Check(name, FAIL, str(err), "fix containerImage (pulumi config set containerImage IMAGE@sha256:...)")
    if found.status == IMAGE_OK:
        return Check(name, OK, f"{target.image}: {found.detail}")
    if found.status == ABSENT:
        fix = ("the pinned default is gone: update facts.VLLM_TPU_IMAGE (`python -m tpuserve.registry "
               "vllm/vllm-tpu:nightly` names today's), or set containerImage" if target.image == VLLM_TPU_IMAGE
               else "pulumi config set containerImage IMAGE (one `tpuserve images check --image IMAGE` finds)")
        return Check(name, FAIL, f"{target.image}: {found.detail}", fix)
    return Check(name, WARNING, f"{target.image}: {found.detail}")


def check_machine_type(google: Google, target: Target, report: Report) -> Check:
    compute = ComputeClient(google.session, google.endpoints.compute, TIMEOUT_S)
    offered, unknown = [], []
    for zone in target.zones:
        try:
            found = compute.machine_type(target.project, zone, target.machine_type)
        except (ComputeApiError, requests.RequestException) as err:
            unknown.append(f"{zone} ({err})")
            continue
        if found is None:
            report.skipped[zone] = f"does not offer {target.machine_type}"
        else:
            offered.append(zone)
    name = f"{target.machine_type} offered"
    if not offered and not unknown:
        return Check(name, FAIL, f"in none of {', '.join(target.zones)}",
                     "list zones that offer it: gcloud compute machine-types list "
                     f"--filter=name={target.machine_type} --format='value(zone)'")
    missing = [zone for zone in target.zones if zone in report.skipped]
    if missing or unknown:
        detail = f"in {', '.join(offered) or 'no zone checked'}"
        detail += f"; not in {', '.join(missing)} (skipped)" if missing else ""
        detail += f"; could not check {', '.join(unknown)}" if unknown else ""
        return Check(name, WARNING, detail)
    return Check(name, OK, f"in {', '.join(offered)}")


def quota_limit(info: Mapping[str, Any], region: str, dimensions: Mapping[str, str]) -> int | None:
    """A QuotaInfo's limit in `region` from its most specific DimensionsInfo; None: none applies, -1: unlimited."""
    wanted = {"region": region, **dimensions}
    best: tuple[int, int] | None = None
    for entry in info.get("dimensionsInfos", []):
        dims = entry.get("dimensions", {})
        if any(wanted.get(key) != value for key, value in dims.items()):
            continue
        locations = entry.get("applicableLocations") or []
        if locations and "global" not in locations and region not in locations:
            continue
        value = int(entry.get("details", {}).get("value", 0))
        if best is None or len(dims) > best[0]:
            best = (len(dims), value)
    return None if best is None else best[1]


def enough(limit: int | None, chips: int) -> bool:
    return limit is not None and (limit == -1 or limit >= chips)


def check_quota(google: Google, target: Target, report: Report, apis: set[str]) -> Check:
    name = "TPU v6e quota"
    if QUOTAS_API not in apis:
        return Check(name, WARNING, "not checked: the Cloud Quotas API is not enabled",
                     f"gcloud services enable {QUOTAS_API} --project {target.project}")
    infos = {}
    for quota in (PREEMPTIBLE_QUOTA, FAMILY_QUOTA):
        try:
            infos[quota] = google.call("cloudquotas", f"/v1/projects/{target.project}/locations/global/services/"
                                                      f"compute.googleapis.com/quotaInfos/{quota}", bill_project=True)
        except ComputeApiError as err:
            if err.status != 404:  # an id the project does not have is no quota
                return unreachable(name, err)
            infos[quota] = {}
        except requests.RequestException as err:
            return unreachable(name, err)
    usable, lacking = [], []
    for region in dict.fromkeys(region_of(zone) for zone in target.zones if zone not in report.skipped):
        preemptible = quota_limit(infos[PREEMPTIBLE_QUOTA], region, {})
        standard = quota_limit(infos[FAMILY_QUOTA], region, {"tpu_family": TPU_FAMILY})
        known = [limit for limit in (preemptible, standard) if limit is not None]
        if known:
            report.tpu_limits[region] = -1 if -1 in known else max(known)
        if enough(preemptible, target.chips) or enough(standard, target.chips):
            usable.append(f"{region} (preemptible {fmt(preemptible)}, standard {fmt(standard)})")
            continue
        lacking.append(region)
        report.skip_region(region, f"no TPU v6e quota in {region} (preemptible {fmt(preemptible)}, "
                                   f"standard {fmt(standard)})")
    fix = (f"request {PREEMPTIBLE_QUOTA} (flex-start draws it first) or {FAMILY_QUOTA} with tpu_family={TPU_FAMILY} "
           f"of at least {target.chips} in {', '.join(lacking)}: IAM & Admin > Quotas") if lacking else ""
    if lacking and not usable:
        return Check(name, FAIL, f"no region has {target.chips} chip(s): {', '.join(lacking)}", fix)
    if lacking:
        return Check(name, WARNING, f"{', '.join(usable)}; none in {', '.join(lacking)} (skipped)", fix)
    return Check(name, OK, ", ".join(usable) or "no zone left to check")


def fmt(limit: int | None) -> str:
    return "unset" if limit is None else "unlimited" if limit == -1 else str(limit)


def check_secret(google: Google, target: Target) -> Check:
    name = "token secret"
    if target.creates_secret:
        return Check(name, OK, "the stack creates it from hfToken")
    if not target.secret:
        return Check(name, FAIL, "neither hfTokenSecretId nor hfToken is set",
                     "pulumi config set hfTokenSecretId <secret> (or --secret hfToken hf_...)")
    try:
        google.call("secretmanager", f"/v1/{target.secret_path}")
        version = google.call("secretmanager", f"/v1/{target.secret_path}/versions/latest")
    except ComputeApiError as err:
        return Check(name, FAIL, f"{target.secret_path}: {err}",
                     f"printf %s \"$HF_TOKEN\" | gcloud secrets create {target.secret_path.rsplit('/', 1)[-1]} "
                     f"--data-file=- --project {target.project} (or add a version to it)")
    except requests.RequestException as err:
        return unreachable(name, err)
    if version.get("state") != "ENABLED":
        return Check(name, FAIL, f"{version.get('name', target.secret_path)} is {version.get('state', 'not enabled')}",
                     "add a new version, or enable the latest one: gcloud secrets versions enable")
    return Check(name, OK, f"{version.get('name', target.secret_path)} enabled")


def check_permissions(google: Google, target: Target) -> Check:
    name = "permissions"
    wanted = [*PERMISSIONS, *(SECRET_CREATE_PERMISSIONS if target.creates_secret else ())]
    try:
        body = google.call("cloudresourcemanager", f"/v1/projects/{target.project}:testIamPermissions",
                           body={"permissions": wanted})
    except (ComputeApiError, requests.RequestException) as err:
        return unreachable(name, err)
    missing = [permission for permission in wanted if permission not in set(body.get("permissions", []))]
    if missing:
        return Check(name, FAIL, f"missing {len(missing)} of {len(wanted)}: {', '.join(missing)}",
                     "grant the deploying identity roles that hold them (e.g. roles/compute.instanceAdmin.v1, "
                     "roles/iam.serviceAccountUser); a new grant takes 2-7 minutes to show")
    return Check(name, OK, f"all {len(wanted)} the stack needs")


def check_nat(google: Google, target: Target, report: Report) -> list[Check]:
    """Cloud NAT where the VMs may land (zones none can serve are skipped), and other stacks' VMs using this one's."""
    name = "Cloud NAT"
    try:
        nats = nat.list_nats(google.session, target.project, google.endpoints.compute, TIMEOUT_S)
    except (ComputeApiError, requests.RequestException) as err:
        return [Check(name, WARNING, f"could not list the routers ({err}); the stack makes NAT as its config says",
                      "grant compute.routers.list (roles/compute.networkViewer)")]
    report.nat = plan = target.nat_plan(nats)
    blocked = [r for r in plan.regions if r.blocked]
    for region in blocked:
        report.skip_region(region.region, f"no Cloud NAT can serve it ({region.blocking.label} serves other "
                                          "subnetworks only)" if region.blocking else "no Cloud NAT")
    unserved = [r for r in plan.regions if not target.makes_nat and r.serving is None and not r.blocked]
    status = FAIL if blocked and len(blocked) == len(plan.regions) else WARNING if blocked or unserved else OK
    fix = "set createCloudNat true, or externalIp true, or make a NAT for the network there" if unserved else ""
    checks = [Check(name, status, "; ".join(plan.lines()), fix)]
    if target.own_nats:
        try:
            vms = nat.list_vms(google.session, target.project, google.endpoints.compute, TIMEOUT_S)
        except (ComputeApiError, requests.RequestException) as err:
            return [*checks, unreachable("Cloud NAT users", err)]
        lines = nat.reliance(set(target.own_nats), nats, vms, [stack_labels(target.stack)["stack"]]).lines(target.stack)
        if lines:
            checks.append(Check("Cloud NAT users", WARNING, "; ".join(lines),
                                "destroy those stacks first, or deploy one of them (it then makes its own NAT)"))
    return checks


def preflight(session: requests.Session, target: Target, endpoints: Endpoints = Endpoints()) -> Report:
    google = Google(session, endpoints, target.project)
    report = Report(zones=target.zones)
    report.checks.append(project := check_project(google))
    if project.status == FAIL:
        return report
    apis_check, apis = check_apis(google, target)
    report.checks.append(apis_check)
    report.checks.append(check_machine_type(google, target, report))
    report.checks.append(check_quota(google, target, report, apis))
    report.checks.append(check_secret(google, target))
    report.checks.append(check_permissions(google, target))
    if target.image:
        report.checks.append(check_image(target, endpoints.registry))
    if target.nat_regions:
        report.checks += check_nat(google, target, report)
    if not report.usable_zones and not report.failed:  # e.g. quota unknown but every zone lacks the machine type
        report.checks.append(Check("zones", FAIL, "no candidate zone is left to try",
                                   "add zones: --zones or the stack's `zones`"))
    return report


# --- the stack and the command ------------------------------------------------------------------------------------

def setting_on(config: Mapping[str, Any], key: str, default: bool) -> bool:
    """A boolean setting as `pulumi config` gives it (a string, or a bool from the fake)."""
    value = config.get(key)
    return default if value is None else str(value).lower() == "true"


def target_from_config(config: Mapping[str, Any], zones: Sequence[str], stack: str = "",
                       own_nats: frozenset[tuple[str, str, str]] = frozenset()) -> Target:
    """What the stack would deploy in `zones`; with `stack`, Cloud NAT checked in `region`, else each zone's region."""
    if not stack or config.get("target") == "local":
        regions: tuple[str, ...] = ()
    else:
        regions = (str(config["region"]),) if config.get("region") else \
            tuple(dict.fromkeys(region_of(str(zone)) for zone in zones))
    return Target(project=str(config.get("project", "")), zones=tuple(zones),
                  machine_type=str(config.get("machineType") or DEFAULT_MACHINE_TYPE),
                  secret=str(config.get("hfTokenSecretId") or ""), creates_secret="hfToken" in config,
                  stack=stack, network=str(config.get("network") or "default"),
                  subnetwork=str(config.get("subnetwork") or ""), nat_regions=regions,
                  makes_nat=setting_on(config, "createCloudNat", True) and not setting_on(config, "externalIp", False),
                  own_nats=own_nats, image=str(config.get("containerImage") or VLLM_TPU_IMAGE),
                  bucket=setting_on(config, "compileCacheBucket", True))


def configured_zones(config: Mapping[str, Any], outputs: Mapping[str, Any], explicit: str | None) -> list[str]:
    """--zones as given; else where the stack's VM is, its `zone`, then its `zones` (default: facts.V6E_ZONES)."""
    if explicit:
        zones = [zone.strip() for zone in explicit.split(",") if zone.strip()]
        if not zones:
            raise click.BadParameter("list at least one zone", param_hint="--zones")
        return list(dict.fromkeys(zones))
    listed = config.get("zones") or V6E_ZONES
    if isinstance(listed, str) or not isinstance(listed, (list, tuple)):
        raise click.UsageError(f"zones: expected a list of zones in the stack config, got {listed!r}")
    first = [str(zone) for zone in (outputs.get("zone"), config.get("zone")) if zone]
    return list(dict.fromkeys([*first, *map(str, listed)]))


def print_report(console: Any, report: Report) -> None:
    from rich.markup import escape

    colour = {OK: "green", WARNING: "yellow", FAIL: "red"}
    for check in report.checks:
        console.print(f"[{colour[check.status]}]{check.status:<8}[/] {check.name:<24} {escape(check.detail)}",
                      highlight=False, soft_wrap=True)
        if check.fix and check.status != OK:
            console.print(f"{'':<33}fix: {check.fix}", highlight=False, markup=False, soft_wrap=True)
    if report.skipped:
        console.print(f"zones skipped: {'; '.join(f'{z}: {why}' for z, why in report.skipped.items())}",
                      highlight=False, markup=False, soft_wrap=True)
    console.print(f"zones to try: {', '.join(report.usable_zones) or 'none'}", highlight=False, soft_wrap=True)


def adc_or_fail() -> requests.Session:
    """A session with the application-default credentials, or a ClickException saying how to get them."""
    from tpuserve import gce

    try:
        return gce.adc_session()
    except gce.MissingCredentials as err:
        raise click.ClickException(str(err)) from err


def endpoint_option(command: Any) -> Any:
    return click.option("--endpoint", "endpoints", multiple=True, hidden=True,
                        help="SERVICE=URL: another root for a Google API (tests).")(command)


@click.command("preflight")
@click.option("--stack", required=True, help="Pulumi stack to check (reads its config with the pulumi CLI).")
@click.option("--zones", help="Comma-separated zones to check, instead of the stack's.")
@cli.cwd_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line: the checks and the zones to try.")
@endpoint_option
def preflight_command(stack: str, zones: str | None, cwd: Path, as_json: bool, endpoints: tuple[str, ...]) -> None:
    """Check what would stop a deploy: APIs, machine type per zone, TPU quota, token secret, permissions, Cloud NAT.

    Also whether the container image still resolves on its registry."""
    from rich.console import Console

    from tpuserve.deploy.pulumi_cli import PulumiError, open_stack, require_project

    roots = Endpoints.parse(endpoints)
    pulumi, config = open_stack(stack, cwd)
    outputs = {} if zones else pulumi.outputs()
    require_project(config, stack)
    try:
        own = frozenset(nat.own_nats(pulumi.export()))
    except PulumiError:
        own = frozenset()  # a stack never deployed: it owns no NAT yet
    target = target_from_config(config, configured_zones(config, outputs, zones), stack, own)
    with adc_or_fail() as session:
        report = preflight(session, target, roots)
    print_report(Console(stderr=True), report)
    if as_json:
        echo_json(report.as_dict())
    raise click.exceptions.Exit(exits.FAILED if report.failed else exits.OK)
