"""A fleet's router (target `router`): LiteLLM's proxy on a small CPU VM in the VPC, balancing over the replicas.

`tpuserve fleet` (tpuserve/ops/fleet.py) runs one stack per replica, each a flex-start TPU VM like any gcp stack,
and this stack for the router. Its `routerReplicas` config names the replicas and their endpoints; from it the
stack generates the proxy config (tpuserve.deploy.litellm_config.fleet_config: one deployment per replica,
least-busy routing, retries, cooldown) and puts it in the VM's `litellm-config` metadata attribute. A metadata
change updates the VM in place; the agent on the VM (vm/router_agent.py) writes the new file and reloads the proxy
without dropping requests in flight, then reports the config's hash as a guest attribute. The readiness gate (the
same `tpuserve gate --instance ... --config-hash`) re-runs whenever the replica set changes, so `pulumi up` on this
stack returns only once the router serves the new set.

The stack also owns what the replicas share: Cloud NAT in every region a replica may be placed in (a network takes
one all-subnetworks NAT per region, so N replica stacks could not each make one; they run with createCloudNat
false), and the fleet's firewall on the tag every replica carries (components/network.py fleet_firewall): the
router, by its network tag, and IAP reach the replicas' vLLM port, no other source does (the default network's
default-allow-internal would admit every VM of the VPC). The replicas also take requests only with vLLM's API key
(vllmApiKeySecretId), which the VM reads from Secret Manager and the proxies present (os.environ/TPUSERVE_API_KEY).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pulumi
from pulumi_gcp import compute

from components.config import StackConfig
from components.deployment import base_name, fleet_tag, stack_labels
from components.identity import ServingIdentity, ServingIdentityArgs, full_secret_name
from components.network import ServingNetwork, ServingNetworkArgs, cloud_nat, fleet_firewall
from components.readiness import ReadinessGate, ReadinessGateArgs, instance_target
from components.startup_script import METADATA_URL, template_environment
from tpuserve.deploy.litellm_config import fleet_config
from tpuserve.deploy.nat import fleet_nat_regions
from tpuserve.facts import GUEST_ATTRIBUTE_NAMESPACE, IAM_PROPAGATION_WAIT_S, SECRET_ACCESSOR_ROLE
from tpuserve.names import service_account_id

ROUTER_PORT = 4000  # HAProxy's, in front of the LiteLLM proxies (vm/router_agent.py)
REDIS_PORT = 6379  # the router VM's own Redis, shared by its proxies (vm/router_agent.py REDIS_PORT)
ROUTER_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
ROUTER_DISK_GB = 20
CONFIG_ATTRIBUTE = "litellm-config"  # vm/router_agent.py ATTRIBUTE
VM_DIR = Path(__file__).resolve().parent.parent / "vm"


def router_config(cfg: StackConfig) -> str:
    """The proxy config as the VM receives it: JSON (YAML's subset, which LiteLLM loads; the agent needs no YAML)."""
    return json.dumps(fleet_config(cfg.replica_endpoints, cfg.serving.model), indent=1)


def config_digest(config: str) -> str:
    """vm/router_agent.py `digest`: what the router reports as `config-hash` once it serves `config`."""
    return hashlib.sha256(config.encode()).hexdigest()[:16]


def nat_regions(cfg: StackConfig) -> list[str]:
    """The router's region and every region of the zones the fleet's replicas may be placed in; the stack makes NAT
    in those no other stack's NAT serves (cloudNatSkipRegions)."""
    return fleet_nat_regions(cfg.router_vm_zone, cfg.zone, cfg.zones)


def embedded_source(name: str) -> str:
    """A vm/ file for the startup script's quoted here-document (which must not contain its end marker)."""
    source = (VM_DIR / name).read_text().rstrip("\n")
    if "\nSOURCE_END\n" in f"\n{source}\n":
        raise ValueError(f"vm/{name} contains the line SOURCE_END, which ends the here-document")
    return source


def render_router_script(image: str, secret_name: str, replica_key_secret: str, *, metadata_url: str = METADATA_URL,
                         iam_wait_s: int = IAM_PROPAGATION_WAIT_S, iam_poll_s: int = 15) -> str:
    return template_environment().get_template("router-startup.sh.j2").render(
        metadata_url=metadata_url, guest_namespace=GUEST_ATTRIBUTE_NAMESPACE, secret_name=secret_name,
        replica_key_secret=replica_key_secret,
        secret_role=SECRET_ACCESSOR_ROLE, image=image, port=ROUTER_PORT,
        iam_wait_s=iam_wait_s, iam_poll_s=iam_poll_s, redis_port=REDIS_PORT,
        secret_reader_source=embedded_source("hf_token.py"),
        agent_source=embedded_source("router_agent.py"))


class FleetRouter(pulumi.ComponentResource):
    """Identity (reads only the master key and the replicas' API key), IAP-only ingress on ssh and the proxy port,
    NAT per region, the fleet's firewall, the proxy VM (no external IP) and its readiness gate."""

    def __init__(self, name: str, cfg: StackConfig, stack: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:index:FleetRouter", name, None, opts)
        base = base_name(stack)
        labels = stack_labels(stack, dict(cfg.labels))
        child = pulumi.ResourceOptions(parent=self)
        zone, region = cfg.router_vm_zone, cfg.router_vm_zone.rsplit("-", 1)[0]
        config_text = router_config(cfg)
        digest = config_digest(config_text)
        secret = full_secret_name(cfg.project, cfg.router_master_key_secret_id)
        replica_key = full_secret_name(cfg.project, cfg.vllm_api_key_secret_id)

        identity = ServingIdentity(base, ServingIdentityArgs(
            project=cfg.project, account_id=service_account_id(base), existing_secret=cfg.router_master_key_secret_id,
            labels=labels, display_name="tpu-serve fleet router", readable_secrets=(replica_key,),
            description="Runs a tpu-serve fleet's LiteLLM proxy; reads only its master key and the replicas' API key."),
            opts=child)
        network = ServingNetwork(base, ServingNetworkArgs(
            project=cfg.project, region=region, network=cfg.network, target_tag=base, create_nat=False,
            ports=("22", str(ROUTER_PORT))), opts=child)
        nats = [cloud_nat(f"{base[:28]}-{nat_region}", cfg.project, nat_region, cfg.network, self)
                for nat_region in nat_regions(cfg) if cfg.makes_nat_in(nat_region)]
        # The fleet's firewall targets the tag all its replicas carry (fleet_tag): it never changes as they come
        # and go. The router stack is `<fleet>-router` (tpuserve/ops/fleet.py router_name).
        tag = fleet_tag(stack.removesuffix("-router"))
        fleet_firewall(base, cfg.project, cfg.network, base, tag, cfg.serving.port, self)

        vm = compute.Instance(
            base, name=base, project=cfg.project, zone=zone, machine_type=cfg.router_machine_type,
            boot_disk=compute.InstanceBootDiskArgs(auto_delete=True, initialize_params=(
                compute.InstanceBootDiskInitializeParamsArgs(image=ROUTER_IMAGE, size=ROUTER_DISK_GB,
                                                             type="pd-balanced", labels=dict(labels)))),
            network_interfaces=[compute.InstanceNetworkInterfaceArgs(network=cfg.network,
                                                                     subnetwork=cfg.subnetwork or None)],
            service_account=compute.InstanceServiceAccountArgs(
                email=identity.email, scopes=["https://www.googleapis.com/auth/cloud-platform"]),
            # Changing the replica set changes only `litellm-config`: an in-place metadata update, no new VM.
            metadata={"enable-guest-attributes": "TRUE", "enable-oslogin": "TRUE", CONFIG_ATTRIBUTE: config_text},
            metadata_startup_script=render_router_script(cfg.router_image, secret, replica_key),
            tags=[base], labels=dict(labels), allow_stopping_for_update=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[identity, network, *nats]))
        gate = ReadinessGate(f"{base}-ready", ReadinessGateArgs(
            target=vm.name.apply(lambda vm_name: instance_target(vm_name, zone, cfg.project, digest)),
            timeout_s=cfg.readiness_timeout_seconds, triggers=[vm.instance_id, digest]), opts=child)

        internal_ip = vm.network_interfaces.apply(lambda nics: nics[0].network_ip)
        self.outputs = {
            "target": cfg.target,
            "instanceName": vm.name,
            "zone": zone,
            "project": cfg.project,
            "internalIp": internal_ip,
            "endpoint": pulumi.Output.concat("http://", internal_ip, f":{ROUTER_PORT}/v1"),
            "iapTunnelCommand": vm.name.apply(
                lambda vm_name: f"gcloud compute start-iap-tunnel {vm_name} {ROUTER_PORT} "
                                f"--local-host-port=localhost:{ROUTER_PORT} --zone={zone} --project={cfg.project}"),
            "model": cfg.serving.model,
            "replicas": [replica for replica, _ in cfg.replica_endpoints],
            "routerConfigHash": digest,
            "masterKeySecret": secret,
            "replicaApiKeySecret": replica_key,
            "fleetTag": tag,
            "natRegions": [nat_region for nat_region in nat_regions(cfg) if cfg.makes_nat_in(nat_region)],
            "bootTimeline": gate.timeline,
        }
        self.register_outputs(self.outputs)
