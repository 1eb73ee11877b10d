"""What changing each config key does to a deployment, derived: the stack of the key's target runs under mocks with
its defaults and again with one changed, valid value; every resource's inputs are diffed by name with
tests.fakes.changes.plan_change (the providers' rules, tpuserve/data/provider-facts.json), and the outcome is
said in a few words. The words are the "a change" column of docs/configuration.md (scripts/config_docs.py reads them
from tpuserve/data/config-changes.json); tests/components/test_config_changes.py fails when that file is stale.

    .venv/bin/python -m tests.fakes.config_changes      # rewrite tpuserve/data/config-changes.json, then
    .venv/bin/python scripts/config_docs.py             # the page

The only hand-written part is CHANGES: a changed value per key (with any key the change needs beside it to stay
valid) or, for a key that cannot change a stack on its own, the reason.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi

from tests.fakes.pulumi_harness import ROOT, RecordingMocks, StackRun, run_stack, stack_file_config
from tests.components.test_gke_stack import EXISTING as EXISTING_CLUSTER  # an existing cluster as getCluster returns it
from tests.fakes.changes import DYNAMIC, META_KEY, ResourceChange, plan_change
from tpuserve.facts import SERVED_CONFIG_KEY

OUT = ROOT / "tpuserve" / "data" / "config-changes.json"
INSTANCE = "gcp:compute/instance:Instance"
SERVED_CONFIG = f'metadata["{SERVED_CONFIG_KEY}"]'

# Every stack the project ships, as (stack name, stack file, settings beside the file's), plus the settings that add
# resource types of their own: an hfToken (a new Secret and its version).
VARIANTS = {
    "dev": ("dev", "dev", {}),
    "prod": ("prod", "prod", {}),
    "gke": ("gke", "gke", {}),
    "gke-gateway": ("gke", "gke", {"gkeRouter": "inference-gateway"}),
    "dev-4t": ("dev", "dev", {"machineType": "ct6e-standard-4t"}),  # four engines of the default model
    "local": ("local", "local", {}),
    "dev-token": ("dev", "dev", {"hfTokenSecretId": "", "hfToken": "hf_not_a_real_token"}),
}
BASES = {"gcp": "dev", "local": "local", "gke": "gke"}  # where each target's keys change
@dataclass(frozen=True)
class Case:
    """One key's change: `value` (as `pulumi config set` stores it) on the `base` target's stack (or a VARIANTS
    stack), `also` set beside it when the change alone would not be valid; or no value and `why` it cannot change a
    stack by itself."""

    value: str | None
    base: str = "gcp"
    also: Mapping[str, str] = field(default_factory=dict)
    why: str = ""


CHANGES: dict[str, tuple[Case, ...]] = {
    "target": (Case("gke", also={"zone": "us-east5-b"}),),
    "project": (Case("my-ml-other"),),
    "zone": (Case("us-east5-a"),),
    "zones": (Case(json.dumps(["us-east5-a", "europe-west4-a"]),
                   why="`tpuserve up` alone reads it (the zones it tries when the stack's zone has no capacity)"),),
    "region": (Case("europe-west4", why="it must contain the zone, so on its own it can only name the zone's region "
                                        "(a zone change moves Router and NAT)"),),
    "machineType": (Case("ct6e-standard-4t"),),
    "bootImage": (Case("projects/ubuntu-os-accelerator-images/global/images/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e-"
                       "v20260801"),),
    "bootDiskSizeGb": (Case("300"),),
    "bootDiskType": (Case(None, why="a v6e boot disk must be hyperdisk-balanced, the default"),),
    "cacheDiskSizeGb": (Case("200"), Case("0")),
    "cacheDiskThroughputMibps": (Case("600"),),
    "cacheDiskIops": (Case("6000"),),
    "compileCacheBucket": (Case("false"),),
    "keepCaches": (Case("false"),),  # retainOnDelete of the disk and bucket: no input changes
    "maxRunDuration": (Case("8h"),),
    "vmSlot": (Case("b"),),
    "replaceOrder": (Case("delete-first"),),
    "hfTokenSecretId": (Case("hf-token-2"),),
    "hfToken": (Case("hf_not_a_real_token", also={"hfTokenSecretId": ""}),),
    "network": (Case("ml-vpc"),),
    "subnetwork": (Case("ml-subnet"),),
    "externalIp": (Case("true"),),
    "createCloudNat": (Case("false"),),
    "cloudNatSkipRegions": (Case(json.dumps(["europe-west4"])),),
    "labels": (Case(json.dumps({"env": "dev", "team": "ml-platform"})),),
    "pricePerChipHour": (Case("1.5"),),
    "readinessTimeout": (Case("40m"),),
    "alertNotificationChannels": (Case(json.dumps(["projects/my-ml-sandbox/notificationChannels/1234567890"])),),
    "alertDownAfter": (Case("20m"),),
    "alertTtftP99Seconds": (Case("10"),),
    "alertQueueDepth": (Case("16"),),
    "localGpus": (Case("device=0,1", base="local"),),
    "localModelCache": (Case("/data/hf-cache", base="local"),),
    "localPort": (Case("8001", base="local"),),
    "gkeCluster": (Case("ml-shared", base="gke"),),
    "gkeClusterLocation": (Case("us-east5", base="gke", also={"gkeCluster": "ml-shared"}),),
    "gkeMaxNodes": (Case("4", base="gke"),),
    "gkeMinReplicas": (Case("0", base="gke"),),
    "gkeNamespace": (Case("ml-serving", base="gke"),),
    "gkeZones": (Case(json.dumps(["us-east5-b"]), base="gke"),),
    "gkeSurgeNode": (Case("false", base="gke"),),
    "gkeRouter": (Case("inference-gateway", base="gke"),),
    "gkeProxySubnetRange": (Case("10.130.0.0/23", base="gke-gateway"),),
    "vllmApiKeySecretId": (Case("vllm-api-key"),),
    "model": (Case("google/gemma-4-E4B-it"),),
    "containerImage": (Case("vllm/vllm-tpu@sha256:" + "a" * 64),),
    "maxModelLen": (Case("32768"),),
    "gpuMemoryUtilization": (Case("0.85"),),
    "maxNumBatchedTokens": (Case("8192"),),
    "enableAutoToolChoice": (Case("false"),),
    "toolCallParser": (Case("", also={"enableAutoToolChoice": "false"}),),
    "reasoningParser": (Case(""),),
    "multimodalLimits": (Case(json.dumps({"image": 4, "audio": 0, "video": 0})),),
    "modelImpl": (Case("vllm"),),
    "kvCacheDtype": (Case("bfloat16"),),
    "extraArgs": (Case(json.dumps(["--enable-prefix-caching"])),),
    "allowKnownBrokenModel": (Case("true", why="it only lets validation pass a model known not to load"),),
    "tensorParallelSize": (Case("2", base="dev-4t"),),
}


# --- Running the stacks ----------------------------------------------------------------------------------------------

@dataclass
class Run:
    resources: dict[tuple[str, str], dict[str, Any]]  # (type, name) -> inputs
    options: dict[tuple[str, str], pulumi.ResourceOptions]
    outputs: dict[str, Any]
    providers: dict[tuple[str, str], tuple[str, str]]  # resource -> the explicit provider resource it uses


def run(variant: str, config: Mapping[str, str] | None = None) -> Run:
    """A variant's stack under mocks, `config` set beside its settings; each distinct run happens once per process
    (test_changes, test_config_changes and the maintenance scripts share them: callers must not mutate a Run)."""
    return _run(variant, tuple(sorted((config or {}).items())))


@functools.cache
def _run(variant: str, config: tuple[tuple[str, str], ...]) -> Run:
    stack, file, overrides = VARIANTS[variant]
    full = {**_stack_file(file), **overrides, **dict(config)}
    options: dict[tuple[str, str], pulumi.ResourceOptions] = {}
    keys: dict[int, tuple[str, str]] = {}
    recording = [True]

    def record(args: pulumi.ResourceTransformationArgs) -> None:
        # A stack transformation stays registered after its run (the SDK keeps them process-wide): a recorder of an
        # earlier run would record later runs' options.
        if recording[0]:
            options[(args.type_, args.name)] = args.opts
            keys[id(args.resource)] = (args.type_, args.name)

    result: StackRun = run_stack(full, stack, RecordingMocks(clusters={"ml-shared": EXISTING_CLUSTER}),
                                 transformation=record)
    recording[0] = False
    providers = {key: keys[id(opts.provider)] for key, opts in options.items()
                 if opts.provider is not None and id(opts.provider) in keys}
    return Run({(r.type, r.name): r.inputs for r in result.resources if r.custom}, options, result.outputs, providers)


@functools.cache
def _stack_file(file: str) -> dict[str, str]:
    return stack_file_config(file)  # parsing the YAML was an eighth of each run


def declared_resource_types() -> frozenset[str]:
    """Custom resource types (components excluded) of every variant."""
    return frozenset(type_ for variant in VARIANTS for type_, _ in run(variant).resources)


@dataclass(frozen=True)
class Touched:
    type: str
    name: str
    op: str  # create | delete | replace | update
    change: ResourceChange | None = None
    retained: bool = False  # a delete (or the old one of a replacement) only dropped from the state: retainOnDelete
    by_provider: bool = False  # replaced because its provider is


def compare(old: Run, new: Run) -> tuple[list[Touched], list[str], list[str]]:
    """(resources touched, outputs changed, resources whose options alone changed)."""
    touched: list[Touched] = []
    option_only: list[str] = []
    replaced_providers: set[tuple[str, str]] = set()
    # Providers first: the engine replaces every resource of a provider it replaces.
    for key in sorted(set(old.resources) | set(new.resources),
                      key=lambda k: (not k[0].startswith("pulumi:providers:"), k)):
        type_, name = key
        if key not in old.resources:
            touched.append(Touched(type_, name, "create"))
            continue
        if key not in new.resources:
            opts = old.options.get(key)
            touched.append(Touched(type_, name, "delete", retained=bool(opts and opts.retain_on_delete)))
            continue
        opts = new.options.get(key) or pulumi.ResourceOptions()
        change = plan_change(type_, old.resources[key], new.resources[key],
                             replace_on_changes=opts.replace_on_changes or (),
                             delete_before_replace=opts.delete_before_replace, ignore_changes=opts.ignore_changes or ())
        if change.op == "replace" and type_.startswith("pulumi:providers:"):
            replaced_providers.add(key)
        if new.providers.get(key) in replaced_providers:
            touched.append(Touched(type_, name, "replace", change, by_provider=True))
        elif change.op != "same":
            retained = bool((old.options.get(key) or opts).retain_on_delete)
            touched.append(Touched(type_, name, change.op, change, retained=retained and change.op == "replace"))
        elif bool((old.options.get(key) or opts).retain_on_delete) != bool(opts.retain_on_delete):
            option_only.append(role(Touched(type_, name, "same"), ""))
    outputs = sorted(k for k in set(old.outputs) | set(new.outputs) if old.outputs.get(k) != new.outputs.get(k))
    return touched, outputs, option_only


# --- Saying it -------------------------------------------------------------------------------------------------------

def role(t: Touched, target: str) -> str:
    """What a resource is, in the words of the docs."""
    kind = t.type.rsplit(":", 1)[-1]
    if t.type == INSTANCE:
        return "the VM"
    if t.type == DYNAMIC:
        return "the cache disk" if t.name.endswith("-disk") else "the alerts' metrics check" \
            if t.name.endswith("-metrics") else "the cache bucket"
    if t.type.startswith("pulumi:providers:"):
        return "the Kubernetes provider"
    if t.type.startswith("kubernetes:"):
        return f"the {kind}"
    if t.type == "gcp:container/nodePool:NodePool":
        return "the TPU node pool" if t.name.endswith("-tpu") else "the system node pool"
    names = {"Router": "Router", "RouterNat": "NAT", "Firewall": "the firewall rule", "Account": "the service account",
             "Secret": "the token's secret", "SecretVersion": "its version", "Dashboard": "the dashboard",
             "AlertPolicy": "the alert policies", "Command": "the readiness gate", "Cluster": "the GKE cluster",
             "Container": "the container", "RemoteImage": "the image", "Subnetwork": "the proxy-only subnet"}
    if kind in names:
        return names[kind]
    return {"gcp:projects/iAMMember:IAMMember": "the project grants",
            "gcp:secretmanager/secretIamMember:SecretIamMember": "the secret's grant",
            "gcp:storage/bucketIAMMember:BucketIAMMember": "the bucket's grant",
            "gcp:serviceaccount/iAMMember:IAMMember": "the Workload Identity grant"}.get(t.type, kind)


def join(names: list[str]) -> str:
    names = list(dict.fromkeys(names))
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def served_hash(inputs: Mapping[str, Any]) -> str:
    return json.loads(inputs["metadata"][SERVED_CONFIG_KEY])["config_hash"]


def vm_update(t: Touched, target: str, old_inputs: Mapping[str, Any], new_inputs: Mapping[str, Any]) -> list[str]:
    """An in-place update of a VM, path by path."""
    change, vm = t.change, role(t, target)
    said, rest = [], []
    if change.needs_stop:
        paths = join([f"`{p}`" for p in change.needs_stop])
        said.append(f"stops {vm}, changes {paths} and starts it again (allowStoppingForUpdate)"
                    if new_inputs.get("allowStoppingForUpdate") else
                    f"**fails**: the provider changes {paths} only on a stopped VM and refuses a running one, after "
                    "pushing any new metadata")
    for path, diff in change.detailed_diff.items():
        if path in change.needs_stop:
            continue
        if path == SERVED_CONFIG and served_hash(old_inputs) != served_hash(new_inputs):
            said.append("**in place** (setMetadata): the supervisor restarts vLLM with the new argv")
        elif path == SERVED_CONFIG:
            # vm/supervisor.py decide: a running container of the same config hash (image and argv) is kept.
            said.append("the served config in place (setMetadata): vLLM keeps serving, the supervisor uses it at "
                        "its next start")
        elif path == 'metadata["startup-script"]':
            said.append("updates the startup script in place (it runs at the next boot)")
        elif path.startswith("metadata["):
            said.append(f"updates the `{path[len('metadata[') + 1:-2]}` metadata in place (setMetadata)")
        elif path.startswith("attachedDisks") and diff.kind in ("delete", "add"):
            said.append("detaches the cache disk from the running VM" if diff.kind == "delete"
                        else "attaches a cache disk to the running VM")
        elif path == "bootDisk.initializeParams.size":
            said.append("grows the boot disk in place (the filesystem grows at the next boot)")
        elif path.startswith("networkInterfaces[0].accessConfigs"):
            said.append("adds an external IP in place" if diff.kind == "add" else "removes the external IP in place")
        elif ".labels" in path or path.startswith("labels"):
            rest.append("labels")
        elif path.startswith("tags"):
            rest.append("network tags")
        else:
            rest.append(f"`{path}`")
    if rest:
        said.append(f"updates {vm}'s {join(rest)} in place")
    return said


def vm_replace(t: Touched, target: str) -> str:
    c = t.change
    stop = [p for p in c.needs_stop if not c.provider_replaces]
    forced = [p for p, d in c.detailed_diff.items() if d.kind.endswith("replace") and p != META_KEY]
    if stop:
        why = f"the provider would change {join([f'`{p}`' for p in stop])} only on a stopped VM, after pushing the " \
              "new metadata"
    else:
        why = f"{join([f'`{p}`' for p in (list(c.forced_by) or forced or list(c.replace_reasons))])} cannot change " \
              "in place"
    if t.type != INSTANCE or not t.name.startswith("tpu-serve-dev"):
        order = "; old one first" if c.delete_before_replace else ""
    elif c.delete_before_replace:
        order = "; old one first"
    elif c.create_conflicts:  # a new VM under the name the old one holds: a bare `pulumi up` fails, changing nothing
        order = "; `tpuserve up` asks first and creates the new VM under the other vmSlot name while the old one serves"
    else:
        order = "; the new VM is created before the old one goes"
    return f"**replaces {role(t, target)}** ({why}){order}"


def describe(touched: list[Touched], outputs: list[str], option_only: list[str], target: str,
             old: Run | None = None, new: Run | None = None) -> str:
    if not touched:
        if option_only:
            return (f"no resource changes: only the stack's record of {join(option_only)} (whether `pulumi destroy` "
                    "deletes them: retainOnDelete)")
        return f"outputs only ({join([f'`{o}`' for o in outputs])})" if outputs else "nothing on the stack"
    parts: list[str] = []
    for t in (t for t in touched if t.type == INSTANCE):
        if t.op == "replace":
            parts.append(vm_replace(t, target))
        elif t.op == "update":
            parts += vm_update(t, target, old.resources[(t.type, t.name)], new.resources[(t.type, t.name)])
        else:
            parts.append(f"{'creates' if t.op == 'create' else 'deletes'} {role(t, target)}")
    others = [t for t in touched if t.type not in (INSTANCE, "command:local:Command") and not t.by_provider]
    if len(others) > 5 and all(t.op == "replace" for t in others) and new is not None and len(others) == sum(
            1 for type_, _ in new.resources if type_ not in (INSTANCE, "command:local:Command")):
        kept = [role(t, target).removeprefix("the ") for t in others if t.retained]
        parts.append("replaces every other resource" + (f" (the old {join(kept)} stay, out of the stack: "
                                                         "retainOnDelete)" if kept else ""))
        others = []
    for verb, op in (("replaces", "replace"), ("creates", "create"), ("deletes", "delete"), ("updates", "update")):
        group = [t for t in others if t.op == op and not t.retained]
        if group:
            parts.append(f"{verb} {join([role(t, target) for t in group])}" + (" in place" if op == "update" else ""))
    kept = [t for t in others if t.retained]
    if kept:
        verb = "replaces" if kept[0].op == "replace" else "deletes"
        parts.append(f"{verb} {join([role(t, target) for t in kept])} (the old ones stay, out of the stack: "
                     "retainOnDelete)" if verb == "replaces" else
                     f"leaves {join([role(t, target) for t in kept])} behind, out of the stack (retainOnDelete)")
    if any(t.by_provider for t in touched):
        parts.append("replaces every Kubernetes object (their provider now points at another cluster)")
    if any(t.type == "command:local:Command" for t in touched):
        parts.append("the readiness gate runs again")
    return "; ".join(parts)


def describe_target(touched: list[Touched], value: str) -> str:
    """Another target is another deployment: say how much of it changes."""
    counts = {op: sum(1 for t in touched if t.op == op) for op in ("create", "delete", "replace", "update")}
    return (f"another deployment (gcp to {value}: {counts['delete']} resources deleted, {counts['create']} created, "
            f"{counts['replace']} replaced, {counts['update']} updated)")


def derive() -> dict[str, Any]:
    """Every key's effect, with what it was derived from."""
    out: dict[str, Any] = {}
    for key, cases in CHANGES.items():
        effects = []
        for case in cases:
            if case.value is None:
                effects.append({"value": None, "effect": f"cannot change on its own: {case.why}"})
                continue

            variant = BASES.get(case.base, case.base)
            old = run(variant)
            new = run(variant, {**case.also, key: case.value})
            touched, outputs, option_only = compare(old, new)
            text = (describe_target(touched, case.value) if key == "target" else
                    describe(touched, outputs, option_only, case.base, old, new))
            if not touched and not outputs and not option_only and case.why:
                text = f"nothing on its own: {case.why}"
            effects.append({
                "value": case.value, **({"also": dict(case.also)} if case.also else {}), "stack": VARIANTS[variant][0],
                "effect": text,
                "resources": [{"name": t.name, "type": t.type, "op": t.op,
                               **({"replace_reasons": list(t.change.replace_reasons),
                                   "needs_stop": list(t.change.needs_stop),
                                   "delete_before_replace": t.change.delete_before_replace,
                                   "create_conflicts": t.change.create_conflicts}
                                  if t.change and t.op == "replace" else {}),
                               **({"paths": list(t.change.detailed_diff)} if t.change else {}),
                               **({"retained": True} if t.retained else {})} for t in touched],
                "outputs": outputs,
            })
        if len(effects) == 1:
            effect = effects[0]["effect"]
        elif len({case.base for case in cases}) > 1:
            effect = " ".join(f"On a {case.base} stack: {e['effect']}." for case, e in zip(cases, effects))
        else:
            effect = " ".join(f"To `{e['value']}`: {e['effect']}." for e in effects)
        out[key] = {"effect": effect, "cases": effects}
    return out


def render(data: dict[str, Any]) -> str:
    return json.dumps({"about": "Generated by `python -m tests.fakes.config_changes` (tests/fakes/config_changes.py) "
                                "from the stacks under mocks and tpuserve/data/provider-facts.json; do not edit by hand.",
                       "keys": data}, indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(derive()))
    print(f"wrote {OUT}", file=sys.stderr)
