"""Cloud NAT: which NAT serves a network in a region and which stack owns it (from its state, never its name), so
no stack makes a second one; and who relies on a stack's NAT. Why and how: docs/design/cloud-nat.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from tpuserve.gce import COMPUTE_URL, DEFAULT_TIMEOUT_S, ComputeClient, JsonApi
from tpuserve.names import ROUTER_DESCRIPTION
from tpuserve.zones import region_of

SKIP_KEY = "cloudNatSkipRegions"  # components/config.py TpuConfig.cloud_nat_skip_regions
ALL_RANGES = ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES")
LIST_OF_SUBNETWORKS = "LIST_OF_SUBNETWORKS"
NAT_TYPE = "gcp:compute/routerNat:RouterNat"


def last(link: Any) -> str:
    return str(link or "").rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Nat:
    """One NAT section of a Cloud Router."""

    region: str
    router: str
    name: str
    network: str  # the network's name
    ranges: str  # sourceSubnetworkIpRangesToNat
    subnetworks: tuple[str, ...] = ()  # the subnetworks' names, for LIST_OF_SUBNETWORKS
    owner: str = ""  # the stack its Router's description names; "" when it names none
    private: bool = False  # type PRIVATE (NAT between networks): no internet egress, not what a VM here needs

    @property
    def label(self) -> str:
        return f"{self.router}/{self.name}"

    @property
    def key(self) -> tuple[str, str, str]:
        return self.region, self.router, self.name

    def serves(self, subnetwork: str) -> bool:
        """Whether a VM on `subnetwork` (its name) gets internet egress through this NAT."""
        if self.private:
            return False
        return self.ranges in ALL_RANGES or (self.ranges == LIST_OF_SUBNETWORKS and subnetwork in self.subnetworks)

    def owned_by(self) -> str:
        return f"stack {self.owner}" if self.owner else "no tpu-serve stack named on its router"


def parse_routers(body: Mapping[str, Any]) -> list[Nat]:
    """The NATs of a routers.aggregatedList page (items keyed `regions/R`, each {"routers": [...]} or a warning)."""
    found = []
    for scope, scoped in (body.get("items") or {}).items():
        for router in scoped.get("routers", []):
            match = ROUTER_DESCRIPTION.match(str(router.get("description") or ""))
            for nat in router.get("nats") or []:
                found.append(Nat(
                    region=last(router.get("region")) or scope.removeprefix("regions/"), router=str(router["name"]),
                    name=str(nat.get("name", "")), network=last(router.get("network")),
                    ranges=str(nat.get("sourceSubnetworkIpRangesToNat", "")),
                    subnetworks=tuple(last(s.get("name")) for s in nat.get("subnetworks") or []),
                    owner=match["stack"] if match else "", private=nat.get("type") == "PRIVATE"))
    return found


def list_nats(session: requests.Session, project: str, compute_url: str = COMPUTE_URL,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Nat]:
    """Every NAT of the project's Cloud Routers, in every region (routers.aggregatedList, across pages)."""
    api = JsonApi(session, compute_url, timeout_s)
    url = f"{api.base_url}/compute/v1/projects/{project}/aggregated/routers"
    return [nat for body in api.pages(url, {"maxResults": "500"}) for nat in parse_routers(body)]


def own_nats(state: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    """(region, router, nat) of each RouterNat in a `pulumi stack export`."""
    owned = set()
    for resource in state.get("deployment", {}).get("resources") or []:
        parts = str(resource.get("id") or "").split("/")
        if resource.get("type") == NAT_TYPE and len(parts) == 4:
            owned.add((parts[1], parts[2], parts[3]))
    return owned


@dataclass(frozen=True)
class RegionNat:
    """What serves a stack's VMs in one region."""

    region: str
    serving: Nat | None = None  # the NAT the VMs there use (the stack's own or another's)
    own: bool = False  # `serving` is in the stack's state
    blocking: Nat | None = None  # a NAT that serves not the VMs' subnetwork yet rules out making one

    @property
    def skip(self) -> bool:
        """Another NAT serves the region: the stack makes none there."""
        return self.serving is not None and not self.own

    @property
    def blocked(self) -> bool:
        return self.serving is None and self.blocking is not None

    def describe(self, stack: str, makes_nat: bool = True) -> str:
        where = f"Cloud NAT in {self.region}"
        if self.serving is not None and self.own:
            return f"{where}: {self.serving.label} (this stack, {stack}) serves it"
        if self.serving is not None:
            return f"{where}: {self.serving.label} ({self.serving.owned_by()}) serves it; {stack} makes none there"
        if self.blocking is not None:
            return (f"{where}: none serves the VMs' subnetwork, and {self.blocking.label} "
                    f"({self.blocking.owned_by()}, {self.blocking.ranges} {', '.join(self.blocking.subnetworks)}) "
                    "rules out another; add the subnetwork to it, or use another region")
        return f"{where}: none yet; {stack} makes one" if makes_nat else \
            f"{where}: none, and {stack} makes none (createCloudNat false): its VMs there have no internet egress"


@dataclass(frozen=True)
class NatPlan:
    stack: str
    regions: tuple[RegionNat, ...]
    makes_nat: bool = True  # the stack makes NAT where none serves (createCloudNat and no external IP)

    def skip_regions(self) -> list[str]:
        """The stack's `cloudNatSkipRegions`: where another stack's NAT serves."""
        return sorted(r.region for r in self.regions if r.skip)

    def settings(self) -> dict[str, str]:
        """The config an update of the stack takes (`pulumi up --config`)."""
        import json

        return {SKIP_KEY: json.dumps(self.skip_regions())} if self.makes_nat else {}

    def lines(self) -> list[str]:
        return [r.describe(self.stack, self.makes_nat) for r in self.regions]

    def region(self, region: str) -> RegionNat | None:
        return next((r for r in self.regions if r.region == region), None)


def plan(nats: Iterable[Nat], stack: str, regions: Iterable[str], network: str, subnetwork: str = "",
         own: set[tuple[str, str, str]] | frozenset[tuple[str, str, str]] = frozenset(),
         makes_nat: bool = True) -> NatPlan:
    """Per region: the NAT serving `network`'s VMs on `subnetwork` (default: the network's), or the one blocking."""
    found = [n for n in nats if n.network == last(network) and not n.private]
    subnet = last(subnetwork) or last(network)
    decided = []
    for region in dict.fromkeys(regions):
        here = [n for n in found if n.region == region]
        serving = sorted((n for n in here if n.serves(subnet)), key=lambda n: (n.key not in own, n.key))
        if serving:
            decided.append(RegionNat(region, serving[0], serving[0].key in own))
        else:
            decided.append(RegionNat(region, blocking=here[0] if here else None))
    return NatPlan(stack, tuple(decided), makes_nat)


# --- who relies on a NAT ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Vm:
    name: str
    zone: str
    stack: str  # its `stack` label ("" when it has none)
    network: str
    subnetwork: str
    external_ip: bool

    @property
    def region(self) -> str:
        return region_of(self.zone)


def list_vms(session: requests.Session, project: str, compute_url: str = COMPUTE_URL,
             timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Vm]:
    """Every VM of the project that exists (instances.aggregatedList), with its first network interface."""
    vms = []
    for item in ComputeClient(session, compute_url, timeout_s).aggregated_instances(project):
        nic = (item.get("networkInterfaces") or [{}])[0]
        vms.append(Vm(str(item["name"]), last(item.get("zone")), str((item.get("labels") or {}).get("stack", "")),
                      last(nic.get("network")), last(nic.get("subnetwork")), bool(nic.get("accessConfigs"))))
    return vms


@dataclass
class Reliance:
    """The stack's own NATs that VMs of other stacks rely on."""

    by_nat: dict[Nat, list[Vm]] = field(default_factory=dict)

    def lines(self, stack: str) -> list[str]:
        out = []
        for nat, vms in self.by_nat.items():
            stacks = sorted({vm.stack or "unlabelled" for vm in vms})
            out.append(f"{nat.label} in {nat.region} (stack {stack}) also serves {len(vms)} VM(s) of "
                       f"{', '.join(stacks)} ({', '.join(vm.name for vm in vms)}): destroying {stack}, or moving it "
                       f"out of {nat.region}, takes their internet egress until another stack makes a NAT there")
        return out


def reliance(own: set[tuple[str, str, str]], nats: Iterable[Nat], vms: Iterable[Vm], besides: Iterable[str]
             ) -> Reliance:
    """Which of the stack's own NATs (`own_nats`) serve VMs of stacks other than `besides` (`stack` labels)."""
    vms, besides = list(vms), set(besides)
    found = Reliance()
    for nat in (nat for nat in nats if nat.key in own):
        using = [vm for vm in vms if vm.region == nat.region and vm.network == nat.network and not vm.external_ip
                 and nat.serves(vm.subnetwork or vm.network) and vm.stack not in besides]
        if using:
            found.by_nat[nat] = using
    return found


def reliance_on(state: Mapping[str, Any], session: requests.Session, project: str, besides: Iterable[str],
                compute_url: str = COMPUTE_URL) -> Reliance:
    """`reliance` for a stack's `pulumi stack export` (nothing listed when the state holds no NAT)."""
    own = own_nats(state)
    if not own:
        return Reliance()
    return reliance(own, list_nats(session, project, compute_url), list_vms(session, project, compute_url), besides)

