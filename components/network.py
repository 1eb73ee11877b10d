"""How the VM is reached and how it reaches out: IAP-only ingress, Cloud NAT egress."""

from __future__ import annotations

import pulumi
from pulumi_gcp import compute

from tpuserve.names import router_description
from tpuserve.serving import DEFAULT_PORT

IAP_SOURCE_RANGE = "35.235.240.0/20"  # Google's Identity-Aware Proxy TCP forwarding range
INGRESS_PORTS = ("22", str(DEFAULT_PORT))  # ssh, and vLLM's OpenAI API


class ServingNetwork(pulumi.ComponentResource):
    """A firewall admitting only IAP (ssh, the vLLM port) to the VM's tag; a Router + NAT for egress."""

    def __init__(self, name: str, project: str, region: str, network: str, target_tag: str, create_nat: bool,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gcp:ServingNetwork", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.firewall = compute.Firewall(
            f"{name}-allow-iap", project=project, network=network, direction="INGRESS",
            description="tpu-serve: ssh and vLLM through IAP TCP forwarding only",
            source_ranges=[IAP_SOURCE_RANGE], target_tags=[target_tag],
            allows=[compute.FirewallAllowArgs(protocol="tcp", ports=list(INGRESS_PORTS))], opts=child)

        self.nat: compute.RouterNat | None = None
        if create_nat:  # a region change replaces Router and NAT, old ones first (docs/design/cloud-nat.md)
            self.nat = cloud_nat(name, project, region, network, pulumi.ResourceOptions(
                parent=self, replace_on_changes=["region"], delete_before_replace=True))

        self.register_outputs({"firewall": self.firewall.name})


def cloud_nat(name: str, project: str, region: str, network: str, opts: pulumi.ResourceOptions) -> compute.RouterNat:
    """`<name>-router` and `<name>-nat` in `region`; the description names the stack (docs/design/cloud-nat.md)."""
    router = compute.Router(f"{name}-router", project=project, region=region, network=network,
                            description=router_description(pulumi.get_stack()), opts=opts)
    return compute.RouterNat(
        f"{name}-nat", project=project, region=region, router=router.name, nat_ip_allocate_option="AUTO_ONLY",
        source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
        log_config=compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"), opts=opts)

