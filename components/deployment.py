"""The whole deployment: identity, network, the flex-start VM, its readiness gate and its monitoring."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pulumi

from components.config import GcpConfig
from components.identity import ServingIdentity, ServingIdentityArgs, full_secret_name
from components.instance import FlexStartTpuVm, FlexStartTpuVmArgs, insert_body_output
from components.monitoring import ServingMonitoring
from components.network import ServingNetwork
from components.readiness import ReadinessGate, instance_gate_timeout_s, instance_target
from components.cache import ServingCache, ServingCacheArgs
from components.startup_script import API_KEY_ENV, render_startup_script, served_config, served_hash, \
    supervisor_bundle
from tpuserve.caches import bucket_name, disk_name
from tpuserve import flex_start
from tpuserve.facts import CACHE_DEVICE_NAME, CACHE_LABEL, SERVED_CONFIG_KEY, STARTUP_SCRIPT_KEY, SUPERVISOR_KEY
from tpuserve.names import base_name, stack_labels, stack_slug, vm_name
from tpuserve.serving import vllm_serve_args


def adopted_vm(project: str, zone: str, name: str) -> str:
    """The instance this run adopts (flex_start.ADOPT_VM_ENV), only ever this stack's VM in this zone and slot."""
    wanted = flex_start.adopted_id()
    if wanted and wanted != flex_start.instance_id(project, zone, name):
        raise ValueError(f"{flex_start.ADOPT_VM_ENV}: {wanted} is not this stack's VM "
                         f"({flex_start.instance_id(project, zone, name)}); unset it")
    return wanted


def expiry(creation_timestamp: str, seconds: int) -> str:
    return (datetime.fromisoformat(creation_timestamp) + timedelta(seconds=seconds)).isoformat()


class TpuServeDeployment(pulumi.ComponentResource):
    """Everything one stack creates; `outputs` is what `__main__.py` exports."""

    def __init__(self, name: str, cfg: GcpConfig, stack: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:index:Deployment", name, None, opts)
        base = base_name(stack)
        labels = stack_labels(stack, dict(cfg.labels))
        child = pulumi.ResourceOptions(parent=self)
        api_key_secret = full_secret_name(cfg.project, cfg.vllm_api_key_secret_id) if cfg.vllm_api_key_secret_id \
            else ""
        serving_hash = served_hash(cfg.serving, {API_KEY_ENV: api_key_secret} if api_key_secret else None)

        identity = ServingIdentity(base, ServingIdentityArgs(
            project=cfg.project, existing_secret=cfg.hf_token_secret_id, hf_token=cfg.hf_token, labels=labels,
            readable_secrets=(api_key_secret,) if api_key_secret else ()), opts=child)
        network = ServingNetwork(base, cfg.project, cfg.effective_region, cfg.network, target_tag=base,
                                 create_nat=cfg.makes_nat_in(cfg.effective_region) and not cfg.external_ip, opts=child)
        name = vm_name(base, cfg.vm_slot)
        # The cache disk follows the VM's slot: a successor takes the other slot's disk, its predecessor's in use.
        cache_labels = {**labels, CACHE_LABEL: stack_slug(stack)}
        cache_disk_name = disk_name(base) if cfg.vm_slot == "a" else f"{disk_name(base)}-b"
        cache = ServingCache(f"{base}-cache", ServingCacheArgs(
            project=cfg.project, zone=cfg.zone, region=cfg.effective_region, disk_name=cache_disk_name,
            bucket_name=bucket_name(cfg.project, base), disk_gb=cfg.cache_disk_gb,
            bucket=cfg.compile_cache_bucket, disk_iops=cfg.cache_disk_iops,
            disk_throughput_mibps=cfg.cache_disk_throughput_mibps, keep=cfg.keep_caches,
            reader_email=identity.email, labels=cache_labels), opts=child)
        cache_disk = f"{cfg.zone}/{cache_disk_name}" if cfg.cache_disk_gb > 0 else ""
        served = pulumi.Output.all(identity.secret_name, cache.bucket_name).apply(lambda values: served_config(
            cfg.serving, values[0], machine_type=cfg.machine_type, compile_cache_bucket=values[1],
            ready_timeout_s=cfg.readiness_timeout_seconds, api_key_secret=api_key_secret, cache_disk=cache_disk))
        # The boot logic, what is served and the supervisor's code: a served-config change is applied in place.
        metadata = {STARTUP_SCRIPT_KEY: render_startup_script(cache_disk=cfg.cache_disk_gb > 0),
                    SERVED_CONFIG_KEY: served, SUPERVISOR_KEY: supervisor_bundle(serving=cfg.serving)}
        vm_args = FlexStartTpuVmArgs(
            project=cfg.project, zone=cfg.zone, machine_type=cfg.machine_type, boot_image=cfg.boot_image,
            boot_disk_gb=cfg.boot_disk_gb, boot_disk_type=cfg.boot_disk_type, max_run_seconds=cfg.max_run_seconds,
            network=cfg.network, subnetwork=cfg.subnetwork, external_ip=cfg.external_ip,
            service_account_email=identity.email, metadata=metadata, network_tags=(base,), labels=labels,
            cache_disk=cache.disk_source, cache_device_name=CACHE_DEVICE_NAME,
            delete_first=cfg.replace_order == "delete-first", logical_name=base, stack=stack,
            adopt_id=adopted_vm(cfg.project, cfg.zone, name))
        self.outputs: dict[str, Any] = {"target": cfg.target, "zone": cfg.zone, "project": cfg.project,
                                        "vmSlot": cfg.vm_slot, "cacheDisk": cache.disk_source or "",
                                        "cacheBucket": cache.bucket_name}
        if flex_start.withheld():
            # `tpuserve up` queues the VM itself (docs/getting-a-tpu.md) from this body: a secret, so that `pulumi up`
            # does not print its 140 kB of metadata.
            self.outputs["vmInsertBody"] = pulumi.Output.secret(insert_body_output(name, vm_args))
            self.register_outputs(self.outputs)
            return
        # The VM needs its token grant, its egress and its caches before the startup script runs.
        vm = FlexStartTpuVm(name, vm_args, opts=pulumi.ResourceOptions(parent=self,
                                                                       depends_on=[identity, network, cache]))
        gate = ReadinessGate(
            f"{base}-ready", vm.name.apply(lambda vm: instance_target(vm, cfg.zone, cfg.project, serving_hash)),
            # The VM's deadline (ready_timeout_s above) starts later than the gate's: the gate outlasts it.
            instance_gate_timeout_s(cfg.readiness_timeout_seconds), [vm.instance_id, serving_hash], opts=child)
        # After the gate: the "down" alert must not fire while the first boot is still under way.
        watch = ServingMonitoring(base, cfg, name, stack, labels, opts=pulumi.ResourceOptions(parent=self,
                                                                                         depends_on=[gate]))

        port = cfg.serving.port
        self.outputs.update({
            "instanceName": vm.name, "internalIp": vm.internal_ip, "vmUrn": vm.instance_urn,
            "endpoint": pulumi.Output.concat("http://", vm.internal_ip, f":{port}/v1"),
            "iapTunnelCommand": vm.name.apply(
                lambda vm_name: f"gcloud compute start-iap-tunnel {vm_name} {port} --local-host-port=localhost:{port} "
                                f"--zone={cfg.zone} --project={cfg.project}"),
            "sshCommand": vm.name.apply(
                lambda vm_name: f"gcloud compute ssh {vm_name} --zone={cfg.zone} --project={cfg.project} "
                                "--tunnel-through-iap"),
            "model": cfg.serving.model, "configHash": serving_hash,
            "vllmArgs": vllm_serve_args(cfg.serving),  # engine 0's; the others differ in --port only
            "engines": cfg.serving.engines, "tensorParallelSize": cfg.serving.tp,
            "maxRunSeconds": cfg.max_run_seconds, "worstCaseCostUsd": cfg.worst_case_cost_usd,
            "cacheMonthlyCostUsd": cfg.cache_disk_monthly_usd,
            "expectedExpiry": vm.creation_timestamp.apply(lambda ts: expiry(ts, cfg.max_run_seconds)),
            "bootTimeline": gate.timeline, "dashboardUrl": watch.dashboard_url,
            "alerts": watch.alerts,  # which alert policies exist, which wait for their metrics
        })
        self.register_outputs(self.outputs)
