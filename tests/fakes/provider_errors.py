"""Real error texts of a failed TPU VM create, and `pulumi up` output around them, for the classifier and the sweep.

Each message is quoted from a public source (noted beside it); names of projects and zones are sometimes changed to
this stack's, never the wording. `pulumi_failed` wraps a provider message the way the Pulumi CLI prints a failed
resource (layout from pulumi/pulumi-command#32 and a recorded pulumi-gcp Cloud Run failure): a Diagnostics block
with `error:` before the message, continuation lines indented, the bridged provider's `sdk-v2/provider2.go:NNN:
sdk.helper_schema:` prefix. The terraform-based GCP provider prints an operation error as its message, then
(after a blank line) the first localized message and the first help link, or for QUOTA_EXCEEDED the quota's metric,
limit and dimensions (terraform-provider-google, google/services/compute/compute_operation.go, writeOperationError).
"""

from __future__ import annotations

PROJECT = "my-ml-sandbox"
VM = "tpu-serve-dev"


def pulumi_failed(message: str, resource: str = "gcp:compute:Instance", name: str = VM, stack: str = "dev",
                  bridged: bool = True) -> str:
    """`pulumi up` output (non-interactive) for one resource whose create failed with `message`."""
    prefix = "sdk-v2/provider2.go:572: sdk.helper_schema: " if bridged else ""
    body = "\n    ".join(f"{prefix}{message}".splitlines())
    return (f"Updating ({stack}):\n"
            f"     Type                     Name                Status                  Info\n"
            f" +   pulumi:pulumi:Stack      tpu-serve-{stack}       **creating failed**     1 error\n"
            f" +   └─ {resource:<21} {name:<19} **creating failed**     1 error\n"
            f"\n"
            f"Diagnostics:\n"
            f"  pulumi:pulumi:Stack (tpu-serve-{stack}):\n"
            f"    error: update failed\n"
            f"\n"
            f"  {resource} ({name}):\n"
            f"    error:   {body}\n"
            f"\n"
            f"Resources:\n"
            f"    + 6 created\n"
            f"\n"
            f"Duration: 41s\n")


# --- zone out of capacity --------------------------------------------------------------------------------------

# terraform-google-forseti#631 (terraform-provider-google output); the message Google's troubleshooting page lists
# (https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability).
STOCKOUT = (f"Error waiting for instance to create: The zone 'projects/{PROJECT}/zones/us-east5-a' does not have "
            "enough resources available to fulfill the request.  Try a different zone, or try again later.")

# kubernetes/k8s.io#9834 (message, localized message and help link of ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS),
# laid out as writeOperationError prints them; machine type and zones changed to this stack's.
STOCKOUT_WITH_SUGGESTION = (
    f"Error waiting for instance to create: The zone 'projects/{PROJECT}/zones/us-east5-b' does not have enough "
    "resources available to fulfill the request.\n\n\n"
    "A ct6e-standard-1t VM instance is currently unavailable in the us-east5-b zone. Consider trying your request in "
    "the europe-west4-a, us-central1-b zone(s), which currently has capacity to accommodate your request. "
    "Alternatively, you can try your request again with a different VM hardware configuration or at a later time. "
    "For more information, see the troubleshooting documentation.\n\n\n"
    "Troubleshooting documentation\nhttps://cloud.google.com/compute/docs/resource-error\n")

# cockroachdb/cockroach pkg/roachprod/vm/gce/gcloud_test.go TestParseGCECapacityError (gcloud's YAML, wrapped).
GCLOUD_STOCKOUT = """ERROR: (gcloud.compute.instances.create) Could not fetch resource:
---
code: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS
errorDetails:
- localizedMessage:
    locale: en-US
    message: A t2a-standard-8 VM instance is currently unavailable in the us-central1-a
      zone. Consider trying your request in the us-central1-f zone(s), which currently
      has capacity to accommodate your request.
- errorInfo:
    domain: compute.googleapis.com
    metadatas:
      vmType: t2a-standard-8
      zone: us-central1-a
      zonesAvailable: us-central1-f
    reason: resource_availability
message: The zone 'projects/cockroach-ephemeral/zones/us-central1-a' does not have
  enough resources available to fulfill the request."""

# skypilot-org/skypilot sky/backends/cloud_vm_ray_backend.py, FailoverCloudErrorHandlerV2._gcp_handler (Cloud TPU
# API, error code 8).
TPU_API_STOCKOUT = ('There is no more capacity in the zone "europe-west4-a"; you can try in another zone where Cloud '
                    'TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1bc8f9d790be9142]')

# --- quota --------------------------------------------------------------------------------------------------------

# The reference deployment's runbook ("Quota 'TPUS_PER_TPU_FAMILY' exceeded. Limit: 0.0", us-east5), with the
# provider's QUOTA_EXCEEDED block (writeOperationError; metric and limit names of the Cloud Quotas id
# TPUS-PER-TPU-FAMILY-per-project-region, dimension tpu_family=CT6E).
TPU_FAMILY_QUOTA = ("Error waiting for instance to create: Quota 'TPUS_PER_TPU_FAMILY' exceeded.  Limit: 0.0 in "
                    "region us-east5.\n"
                    "\tmetric name = compute.googleapis.com/tpus_per_tpu_family\n"
                    "\tlimit name = TPUS-PER-TPU-FAMILY-per-project-region\n"
                    "\tdimensions = map[region:us-east5 tpu_family:CT6E]\n")

# A preemptible quota (flex-start draws preemptible quota first), terraform-provider-google output quoted in a
# public Terraform file (text search: "Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded").
PREEMPTIBLE_QUOTA = ("Error waiting for instance to create: Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded.  Limit: 1.0 "
                     "in region us-central1.")

# skypilot-org/skypilot _gcp_handler comment ("Per region. Ex: Quota 'CPUS' exceeded. Limit: 24.0 in region
# us-west1.") in googleapi's synchronous error form ("googleapi: Error 403: <message>, <reason>", as in
# gruntwork-io/terratest#1132).
INSERT_QUOTA = ("Error creating instance: googleapi: Error 403: Quota 'CPUS' exceeded.  Limit: 24.0 in region "
                "us-west1., quotaExceeded")

# A global quota: terraform-provider-google output quoted in a public README (text search: "Quota
# 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally").
GLOBAL_QUOTA = ("Error waiting for instance to create: Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.\n"
                "\tmetric name = compute.googleapis.com/gpus_all_regions\n"
                "\tlimit name = GPUS-ALL-REGIONS-per-project\n"
                "\tdimensions = map[global:global]\n")

# skypilot-org/skypilot _gcp_handler comment (Cloud TPU API QuotaFailure).
TPU_API_QUOTA = ("Quota 'TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI' exhausted. Limit 32 in region "
                 "europe-west4")

# --- the machine type is not offered in the zone -------------------------------------------------------------------

# gruntwork-io/terratest#1132 (googleapi error of instances.insert), zone and machine type kept.
NO_MACHINE_TYPE = ("Error creating instance: googleapi: Error 400: Invalid value for field 'resource.machineType': "
                   "'zones/europe-west8-a/machineTypes/f1-micro'. Machine type with name 'f1-micro' does not exist "
                   "in zone 'europe-west8-a'., invalid")

# skypilot-org/skypilot _gcp_handler comment (a zone the project may not use).
LOCATION_UNAUTHORIZED = "Location us-east1-d is not found or access is unauthorized."

# --- stop at once -------------------------------------------------------------------------------------------------

# gcloud's wording of the denied create, quoted verbatim in many public READMEs (text search: "Required
# 'compute.instances.create' permission for"), in googleapi's synchronous error form.
PERMISSION_DENIED = ("Error creating instance: googleapi: Error 403: Required 'compute.instances.create' permission "
                     f"for 'projects/{PROJECT}/zones/europe-west4-a/instances/{VM}', forbidden")

# terraform-google-modules/cloud-foundation-training#17.
API_DISABLED = ("Error creating Network: googleapi: Error 403: Access Not Configured. Compute Engine API has not "
                "been used in project 1025699268247 before or it is disabled. Enable it by visiting "
                "https://console.developers.google.com/apis/api/compute.googleapis.com/overview?project=1025699268247 "
                "then retry. If you enabled this API recently, wait a few minutes for the action to propagate to our "
                "systems and retry., accessNotConfigured")

# terraform-provider-google google/transport/config.go (the ADC error), with google's "could not find default
# credentials" as the original error.
NO_CREDENTIALS = ("Attempted to load application default credentials since neither `credentials` nor `access_token` "
                  "was set in the provider block.  No credentials loaded. To use your gcloud credentials, run 'gcloud "
                  "auth application-default login'.  Original error: google: could not find default credentials. "
                  "See https://cloud.google.com/docs/authentication/external/set-up-adc for more information")

# An organization policy, terraform-provider-google output quoted in a public README (text search: "violated for
# project").
ORG_POLICY = ("Error creating instance: googleapi: Error 412: Constraint constraints/compute.requireShieldedVm "
              "violated for project projects/jonchen-css-1004. Secure Boot is not enabled in the "
              "'shielded_instance_config' field. See https://cloud.google.com/resource-manager/docs/organization-"
              "policy/org-policy-constraints for more information., conditionNotMet")

# terraform-provider-google output for a project that does not exist, quoted in public write-ups (text search:
# "Error 404: Failed to find project"); the Compute API's wording.
BAD_PROJECT = "Error creating Network: googleapi: Error 404: Failed to find project my-ml-sandbx, notFound"

# cockroachdb/cockroach's Terraform acceptance harness (the comment above its resource-name regex in farmer_test).
INVALID_ARGUMENT = ("Error creating instance: googleapi: Error 400: Invalid value for field 'resource.name': "
                    "'Uprep-1to3-small-cockroach-1'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)', "
                    "invalid")

# Pulumi's policy-pack report (layout of https://www.pulumi.com/docs/iac/using-pulumi/crossguard/get-started/),
# with this repository's pack and rule.
POLICY_VIOLATION = """Previewing update (dev):

Policy Violations:
    [mandatory]  tpu-serve v0.1.0  no-external-ip (tpu-serve-dev: gcp:compute/instance:Instance)
    VMs get no external IP unless the stack opts in.
    networkInterfaces[0].accessConfigs gives the VM an external IP; use IAP and Cloud NAT, or set allowExternalIp \
in this stack's policy config

error: update failed
"""

# pulumi/pulumi pkg/backend/diy/lock.go, as quoted in mitodl's deployment tests.
LOCKED = ("error: the stack is currently locked by 1 lock(s). Either wait for the other process(es) to end or delete "
          "the lock file with `pulumi cancel`.\n"
          "  file:///work/.pulumi-state/.pulumi/locks/organization/tpu-serve/dev/22d8693a.json: created by ci@runner "
          "(pid 4242) at 2026-11-29T02:00:00Z\n")

# Pulumi Cloud's refusal while another update runs (pulumi/pulumi pkg/backend/httpstate/backend.go returns
# backenderr.ConflictingUpdateError, whose text adds the link; the Automation API matches its first line:
# sdk/python/lib/pulumi/automation/errors.py conflict_text).
LOCKED_CLOUD = ("error: [409] Conflict: Another update is currently in progress.\n"
                "To learn more about possible reasons and resolution, visit "
                "https://www.pulumi.com/docs/support/troubleshooting/common-issues/update-conflicts/\n")

# --- go on to the next zone ---------------------------------------------------------------------------------------

# The text of RESOURCE_OPERATION_RATE_EXCEEDED (which SkyPilot's handler blocks per zone), quoted in public logs
# (text search: "Operation rate exceeded for resource").
RATE_EXCEEDED = ("Error waiting for instance to create: Operation rate exceeded for resource "
                 f"'projects/{PROJECT}/global/images/tpu-serve-base'. Too frequent operations from the source "
                 "resource.")

# hashicorp/terraform-provider-google#8358 ("timeout while waiting for state to become 'DONE'"), with
# terraform-plugin-sdk's StateChangeConf timeout wording and this stack's 10 min create timeout.
CREATE_TIMEOUT = ("Error waiting for instance to create: timeout while waiting for state to become 'DONE' "
                  "(last state: 'RUNNING', timeout: 10m0s)")


# --- the readiness gate --------------------------------------------------------------------------------------------

def gate_failed(reason: str) -> str:
    """The command provider's error for a failed `tpuserve gate` (pulumi/pulumi-command: `%w: running %q:\\n%s`,
    the command's own output last), wrapped as Pulumi prints it."""
    command = ('\\"${TPUSERVE_PYTHON:-.venv/bin/python}\\" -m tpuserve gate --instance tpu-serve-dev --zone '
               'europe-west4-a --project my-ml-sandbox --config-hash 5e1f0c0f --timeout 1500')
    output = ("✓ installing-docker  at     0.0 s\n"
              "✓ pulling-image      at    21.0 s\n"
              f"not ready: {reason}\n"
              '{"ready": false, "elapsed_s": 301.7, "stages": {"installing-docker": 0.0, "pulling-image": 21.0}, '
              f'"reason": "{reason}"}}')
    return pulumi_failed(f'exit status 1: running "{command}":\n{output}', resource="command:local:Command",
                         name="tpu-serve-dev-ready", bridged=False)
