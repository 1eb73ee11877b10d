"""How the VM is reached and how it reaches out: IAP-only ingress, Cloud NAT egress."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_gcp import compute

from tpuserve.deploy.nat import router_description
from tpuserve.serving import DEFAULT_PORT

IAP_SOURCE_RANGE = "35.235.240.0/20"  # Google's Identity-Aware Proxy TCP forwarding range
INGRESS_PORTS = ("22", str(DEFAULT_PORT))  # ssh, and vLLM's OpenAI API
# A fleet's replicas (fleet_firewall). The lowest number wins, and at equal priority a deny beats an allow
# (Compute API Firewall.priority); the default network's default-allow-internal admits the whole VPC (10.128.0.0/9)
# at 65534 (cloud.google.com/vpc/docs/firewalls, "Pre-populated rules in the default network"). The deny sits
# below 1000, GCP's default priority, so a custom allow-internal rule made with the default does not undo it; the
# two allows sit below the deny.
FLEET_ALLOW_PRIORITY = 900
FLEET_DENY_PRIORITY = 950
ANY_SOURCE = "0.0.0.0/0"


@dataclass(frozen=True)
class ServingNetworkArgs:
    project: str
    region: str
    network: str
    target_tag: str
    create_nat: bool
    ports: tuple[str, ...] = INGRESS_PORTS  # what IAP may reach on the VM (a fleet's router: ssh and its proxy)


class ServingNetwork(pulumi.ComponentResource):
    """Firewall admitting only IAP on ssh and the vLLM port, to the VM's tag alone; Router + NAT so a VM without an
    external IP can pull the image and the weights."""

    def __init__(self, name: str, args: ServingNetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gcp:ServingNetwork", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.firewall = compute.Firewall(
            f"{name}-allow-iap", project=args.project, network=args.network, direction="INGRESS",
            description="tpu-serve: ssh and vLLM through IAP TCP forwarding only",
            source_ranges=[IAP_SOURCE_RANGE], target_tags=[args.target_tag],
            allows=[compute.FirewallAllowArgs(protocol="tcp", ports=list(args.ports))], opts=child)

        self.nat: compute.RouterNat | None = None
        if args.create_nat:
            self.nat = cloud_nat(name, args.project, args.region, args.network, self)

        self.register_outputs({"firewall": self.firewall.name})


def cloud_nat(name: str, project: str, region: str, network: str, parent: pulumi.Resource) -> compute.RouterNat:
    """A Cloud Router and its NAT in `region`, for VMs without an external IP: `<name>-router`, `<name>-nat`.

    Router and NAT live in the VM's region, which follows the zone `tpuserve up` picks. A region change replaces
    both, old ones first: the NAT never outlives its region, even when the create in the new region then fails (the
    sweep moves on, and nothing is left behind in the region it left). A network takes one NAT covering all its
    subnetworks per region ("Can not create new Nats since a Nat with option ALL_SUBNETWORKS_ALL_IP_RANGES exists"),
    which is why a fleet's replicas leave NAT to the fleet's router stack (components/router.py), and why a stack
    makes none where another's serves (`cloudNatSkipRegions`, tpuserve/deploy/nat.py). The Router's description
    names the stack, so the others can say whose NAT serves them."""
    regional = pulumi.ResourceOptions(parent=parent, replace_on_changes=["region"], delete_before_replace=True)
    router = compute.Router(f"{name}-router", project=project, region=region, network=network,
                            description=router_description(pulumi.get_stack()), opts=regional)
    return compute.RouterNat(
        f"{name}-nat", project=project, region=region, router=router.name,
        nat_ip_allocate_option="AUTO_ONLY",
        source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
        log_config=compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"), opts=regional)


def fleet_firewall(name: str, project: str, network: str, router_tag: str, fleet_tag: str, port: int,
                   parent: pulumi.Resource) -> list[compute.Firewall]:
    """A fleet's replicas take requests on vLLM's port from the router and IAP only: allow the router's tag and the
    IAP range to the fleet's tag, deny every other source there. Source tags, not the router's service account:
    a rule with sourceServiceAccounts cannot target tags (terraform-provider-google-beta v7.45
    resource_compute_firewall.go, source_service_accounts ConflictsWith target_tags), and only the tag is stable
    across a fleet's replicas (each runs as its own account)."""
    child = pulumi.ResourceOptions(parent=parent)
    vllm = [str(port)]
    return [
        compute.Firewall(
            f"{name}-to-replicas", project=project, network=network, direction="INGRESS",
            priority=FLEET_ALLOW_PRIORITY, description="tpu-serve: the fleet's router to its replicas' vLLM port",
            source_tags=[router_tag], target_tags=[fleet_tag],
            allows=[compute.FirewallAllowArgs(protocol="tcp", ports=vllm)], opts=child),
        compute.Firewall(
            f"{name}-iap-to-replicas", project=project, network=network, direction="INGRESS",
            priority=FLEET_ALLOW_PRIORITY, description="tpu-serve: IAP TCP forwarding to the fleet's vLLM port",
            source_ranges=[IAP_SOURCE_RANGE], target_tags=[fleet_tag],
            allows=[compute.FirewallAllowArgs(protocol="tcp", ports=vllm)], opts=child),
        compute.Firewall(
            f"{name}-deny-replicas", project=project, network=network, direction="INGRESS",
            priority=FLEET_DENY_PRIORITY, description="tpu-serve: no other source reaches the fleet's vLLM port "
            "(default-allow-internal would admit the whole VPC)",
            source_ranges=[ANY_SOURCE], target_tags=[fleet_tag],
            denies=[compute.FirewallDenyArgs(protocol="tcp", ports=vllm)], opts=child),
    ]
