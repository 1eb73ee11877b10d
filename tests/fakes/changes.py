"""What a change of a resource's inputs does, as the Pulumi engine and its provider would decide it: the fake engine's
steps and the configuration reference's "a change" column (tests/fakes/config_changes.py) are planned with it.

Pure: no engine, no provider plugin, no network. The rules of each provider are data, read from its source by
scripts/provider_facts.py into tpuserve/data/provider-facts.json; this module applies them the way the code that
uses them does (sources in the facts file's `rules`):

- bridged Terraform providers (pulumi-gcp, pulumi-docker): Terraform plans a replacement when a ForceNew input
  changes (terraform-plugin-sdk helper/schema/schema.go), or a CustomizeDiff rule forces one; pulumi-terraform-bridge
  turns the plan into a detailed diff whose replace kinds follow the schema (pkg/tfbridge/detailed_diff.go) and into
  delete-before-replace (pkg/tfbridge/provider.go Diff);
- pulumi-kubernetes: the `forceNew` paths of the kind (provider/pkg/provider/diff.go), delete-before-replace when the
  name is explicit and unchanged (provider.go Diff);
- pulumi-command: `triggers` replaces; a Pulumi dynamic resource: its own provider's `diff`;
- the engine: `replaceOnChanges` (pkg/resource/deploy/step_generator.go applyReplaceOnChanges) and the
  `deleteBeforeReplace` option.

Inputs are what Pulumi mocks record (tests/fakes/pulumi_harness.py): camelCase names, integers as floats, secrets as
Pulumi's signature objects. Detailed-diff paths are `resource.PropertyPath` strings (pulumi/pulumi
sdk/go/common/resource/properties_path.go String: keys that are not identifiers are quoted in brackets).

Deliberate simplifications, each where the engine would need the provider's live state: inputs are compared with
inputs (the bridge compares planned and prior state, which adds computed outputs and provider defaults), and a set
element that changes shows as a removal and an addition at its own index.
"""

from __future__ import annotations

import base64
import difflib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from tpuserve.facts import provider_facts

ADD, ADD_REPLACE, DELETE, DELETE_REPLACE, UPDATE, UPDATE_REPLACE = (
    "add", "add-replace", "delete", "delete-replace", "update", "update-replace")
REPLACE_KINDS = frozenset({ADD_REPLACE, DELETE_REPLACE, UPDATE_REPLACE})
TO_REPLACE = {ADD: ADD_REPLACE, DELETE: DELETE_REPLACE, UPDATE: UPDATE_REPLACE}
TO_PLAIN = {v: k for k, v in TO_REPLACE.items()}
# pulumi/pulumi sdk/go/common/resource/properties.go: a secret is {SigKey: SecretSig, "value": ...}.
SIG_KEY, SECRET_SIG = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"
META_KEY = "__meta"  # the key the bridge marks when Terraform plans a replacement no detailed path shows
DYNAMIC = "pulumi-python:dynamic:Resource"

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class PropertyDiff:
    kind: str  # Pulumi's display kinds: "add" | "add-replace" | "delete" | "delete-replace" | "update" | ...
    input_diff: bool = True


@dataclass(frozen=True)
class ResourceChange:
    op: str  # "same" | "update" | "replace"
    diff_reasons: tuple[str, ...]  # top-level input keys that differ (Pulumi's diffReasons)
    replace_reasons: tuple[str, ...]  # top-level keys that force the replacement (Pulumi's replaceReasons)
    detailed_diff: Mapping[str, PropertyDiff]  # Pulumi property paths, e.g. 'metadata["tpu-serve-config"]'
    needs_stop: tuple[str, ...]  # changed paths the provider updates only on a stopped instance
    # True when the engine deletes the old resource before creating the new one: the provider asks for it (an
    # explicit name the bridge keeps, a DeleteBeforeReplace resource) or the deleteBeforeReplace option says so.
    delete_before_replace: bool
    # A replacement the engine creates first while the old resource still holds an explicit, unchanged name: the
    # create fails (Compute Engine: 409 alreadyExists) and nothing changes. It happens when only replaceOnChanges
    # asks for the replacement: the bridge answers delete-before-replace only for replacements the provider plans.
    create_conflicts: bool = False
    provider_replaces: bool = False  # the provider itself plans the replacement (not replaceOnChanges alone)
    # Top-level keys a provider rule outside the schema (a Terraform CustomizeDiff, a provider's DiffConfig) forces
    # the replacement on; the bridge's detailed diff cannot show them and reports `__meta` instead.
    forced_by: tuple[str, ...] = ()


class UnknownResourceType(KeyError):
    pass


@cache
def facts() -> dict[str, Any]:
    return provider_facts()


def resource_facts(type_token: str) -> dict[str, Any]:
    try:
        return facts()["resources"][type_token]
    except KeyError:
        raise UnknownResourceType(f"{type_token}: not in tpuserve/data/provider-facts.json (rerun "
                                  "scripts/provider_facts.py after adding a resource type)") from None


# --- Property paths --------------------------------------------------------------------------------------------------

def format_path(path: Path) -> str:
    """pulumi/pulumi properties_path.go PropertyPath.String: `a.b[0]`, `metadata["tpu-serve-config"]`."""
    out = []
    for i, key in enumerate(path):
        if isinstance(key, int):
            out.append(f"[{key}]")
        elif all(c.isascii() and (c.isalnum() or c == "_") for c in key):
            out.append(key if i == 0 else f".{key}")
        else:
            escaped = key.replace('"', '\\"')
            out.append(f'["{escaped}"]')
    return "".join(out)


def format_kubernetes_path(path: Path) -> str:
    """pulumi-kubernetes provider.go addPatchValueToDiff: a key is quoted only when it holds `."[]`."""
    out = ""
    for key in path:
        if isinstance(key, int):
            out += f"[{key}]"
        elif any(c in key for c in '."[]'):
            escaped = key.replace('"', '\\"')
            out += f'["{escaped}"]'
        else:
            out += f".{key}" if out else key
    return out


def parse_path(text: str) -> Path:
    """pulumi/pulumi properties_path.go parsePropertyPath (non-strict): names up to '.' or '[', ["quoted"], [0], [*]."""
    elements: list[str | int] = []
    i = 0
    if text.startswith("."):
        raise ValueError(f"{text!r}: a property path starts with a name or an index")
    while i < len(text):
        c = text[i]
        if c == ".":
            i += 1
            if i == len(text):
                raise ValueError(f"{text!r}: a property path ends with a name or an index")
        elif c == "[":
            if text[i + 1:i + 2] == '"':
                j, key = i + 2, ""
                while True:
                    if j >= len(text):
                        raise ValueError(f"{text!r}: missing closing quote")
                    if text[j] == '"':
                        j += 1
                        break
                    if text[j] == "\\" and text[j + 1:j + 2] == '"':
                        key, j = key + '"', j + 2
                    else:
                        key, j = key + text[j], j + 1
                if text[j:j + 1] != "]":
                    raise ValueError(f"{text!r}: missing closing bracket")
                elements.append(key)
                i = j + 1
            else:
                j = text.find("]", i)
                if j == -1:
                    raise ValueError(f"{text!r}: missing closing bracket")
                segment = text[i + 1:j]
                elements.append("*" if segment == "*" else int(segment))
                i = j + 1
        else:
            j = i
            while j < len(text) and text[j] not in ".[":
                j += 1
            elements.append(text[i:j])
            i = j
    return tuple(elements)


def contains(pattern: Path, path: Path) -> bool:
    """properties_path.go Contains: `pattern` is a prefix of `path`, `*` matching any one key or index."""
    if len(path) < len(pattern):
        return False
    for want, got in zip(pattern, path):
        if want == "*":
            continue
        if isinstance(want, int) != isinstance(got, int) or want != got:
            return False
    return True


def matches(pattern: Path, path: Path) -> bool:
    """A facts path (`[*]` for any list element) names exactly `path`."""
    return len(pattern) == len(path) and contains(pattern, path)


@cache
def _pattern(text: str) -> Path:
    return parse_path(text)


# --- Values ----------------------------------------------------------------------------------------------------------

def unwrap(value: Any) -> Any:
    """Drop Pulumi's secret wrappers (the bridge strips secrets before it diffs: detailed_diff.go)."""
    if isinstance(value, Mapping):
        if value.get(SIG_KEY) == SECRET_SIG and "value" in value:
            return unwrap(value["value"])
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [unwrap(v) for v in value]
    return value


def present(value: Any) -> bool:
    return value is not None


def leaves(path: Path, value: Any) -> Iterator[Path]:
    """Every path inside a value, the value's own path first."""
    yield path
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from leaves((*path, key), item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves((*path, index), item)


@dataclass
class Change:
    path: Path
    kind: str  # add | delete | update
    old: Any
    new: Any


def changes(old: Any, new: Any, path: Path, sets: frozenset[Path]) -> Iterator[Change]:
    """The bridge's detailed diff walk (detailed_diff.go makePropDiff): objects by key, lists by element (scalar
    lists by a minimal edit script), a value that appears or goes as one change at its own path."""
    if not present(old) and not present(new):
        return
    if not present(old):
        yield Change(path, ADD, old, new)
        return
    if not present(new):
        yield Change(path, DELETE, old, new)
        return
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in sorted(set(old) | set(new)):
            yield from changes(old.get(key), new.get(key), (*path, key), sets)
        return
    if isinstance(old, list) and isinstance(new, list):
        generic = tuple("*" if isinstance(p, int) else p for p in path)
        if generic in sets:
            yield from _set_changes(old, new, path)
        elif all(not isinstance(v, (Mapping, list)) for v in (*old, *new)):
            yield from _scalar_list_changes(old, new, path)
        else:
            for index in range(max(len(old), len(new))):
                yield from changes(old[index] if index < len(old) else None,
                                   new[index] if index < len(new) else None, (*path, index), sets)
        return
    if old != new:
        yield Change(path, UPDATE, old, new)


def _scalar_list_changes(old: list, new: list, path: Path) -> Iterator[Change]:
    """detailed_diff.go makeListAttributeDiff: inserts at their new index, removals at their old one, both at one
    index an update."""
    kinds: dict[int, str] = {}
    values: dict[int, tuple[Any, Any]] = {}
    matcher = difflib.SequenceMatcher(a=[json.dumps(v) for v in old], b=[json.dumps(v) for v in new], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        for i in range(i1, i2):
            kinds[i] = UPDATE if i in kinds else DELETE
            values[i] = (old[i], values.get(i, (None, None))[1])
        for j in range(j1, j2):
            kinds[j] = UPDATE if j in kinds else ADD
            values[j] = (values.get(j, (None, None))[0], new[j])
    for index in sorted(kinds):
        yield Change((*path, index), kinds[index], *values[index])


def _set_changes(old: list, new: list, path: Path) -> Iterator[Change]:
    """detailed_diff.go makeSetDiff: elements removed (by old index) and added (by new index), both at one index an
    update."""
    old_keys = [json.dumps(v, sort_keys=True) for v in old]
    new_keys = [json.dumps(v, sort_keys=True) for v in new]
    removed = {i: old[i] for i, k in enumerate(old_keys) if k not in new_keys}
    added = {i: new[i] for i, k in enumerate(new_keys) if k not in old_keys}
    for index in sorted(set(removed) | set(added)):
        kind = UPDATE if index in removed and index in added else DELETE if index in removed else ADD
        yield Change((*path, index), kind, removed.get(index), added.get(index))


# --- Terraform (bridged) providers -----------------------------------------------------------------------------------

@dataclass
class BridgedSchema:
    force_new: dict[Path, dict[str, Any]]
    computed: frozenset[Path]
    sets: frozenset[Path]

    @classmethod
    @cache
    def of(cls, type_token: str) -> BridgedSchema:
        info = resource_facts(type_token)
        force_new = {_pattern(e["path"]): e for e in info["force_new"] if e["path"] is not None}
        computed = frozenset(_pattern(p) for p in info["computed"]) | {
            p for p, e in force_new.items() if e["computed"]}
        return cls(force_new, computed, frozenset(_pattern(p) for p in info["sets"]))

    def entry(self, path: Path) -> dict[str, Any] | None:
        generic = tuple("*" if isinstance(p, int) else p for p in path)
        return self.force_new.get(generic)

    def is_computed(self, path: Path) -> bool:
        return tuple("*" if isinstance(p, int) else p for p in path) in self.computed

    def path_triggers(self, path: Path) -> bool:
        """property_path.go propertyPathTriggersReplacement: the path is ForceNew, or its direct parent is a ForceNew
        list, set or map (a flattened block is a Terraform list too)."""
        if self.entry(path) is not None:
            return True
        if len(path) < 2:
            return False
        parent = self.entry(path[:-1])
        return parent is not None and parent["kind"] in ("list", "set", "map", "block")

    def value_triggers(self, path: Path, value: Any) -> bool:
        return any(self.path_triggers(p) for p in leaves(path, value))

    def requires_new(self, change: Change) -> bool:
        """Terraform's plan (schema.go): a ForceNew attribute that changes; a ForceNew collection whose element count
        changes, or whose primitive element changes; a block that appears or goes with a ForceNew attribute set."""
        entry = self.entry(change.path)
        if entry is not None and not (change.kind == DELETE and entry["computed"]):
            return True
        if len(change.path) >= 2:
            parent = self.entry(change.path[:-1])
            if parent is not None and parent["kind"] in ("list", "set", "map"):
                return True  # an element or key of a ForceNew collection
        if change.kind in (ADD, DELETE):
            value = change.new if change.kind == ADD else change.old
            for sub in leaves(change.path, value):
                found = self.entry(sub)
                if found is not None and not (change.kind == DELETE and found["computed"]):
                    return True
        return False


def _customize_diff_forces(type_token: str, old: Mapping, new: Mapping) -> list[str]:
    """Top-level keys whose CustomizeDiff rule forces a new resource (each rule as the facts file records it)."""
    forced = []
    for rule in resource_facts(type_token).get("customize_diff", []):
        if not rule["force_new"]:
            continue
        handler = CUSTOMIZE_DIFF[rule["function"]]
        if handler(old, new):
            forced += [str(parse_path(p)[0]) for p in rule["paths"] if p is not None]
    return forced


def _metadata_startup_script(old: Mapping, new: Mapping) -> bool:
    """customdiff.ForceNewIf("metadata_startup_script", isGracefulMetadataStartupSwitch): ForceNewIf forces a
    replacement when the script changes and the function returns true (it returns false only for the graceful
    switch to or from metadata['startup-script'])."""
    old_script, new_script = old.get("metadataStartupScript") or "", new.get("metadataStartupScript") or ""
    if old_script == new_script:
        return False
    old_md, new_md = old.get("metadata") or {}, new.get("metadata") or {}
    if not old_md and not new_md:
        return True
    if old_script == "":
        return "startup-script" not in old_md or new_script != old_md["startup-script"]
    if new_script == "":
        return "startup-script" not in new_md or old_script != new_md["startup-script"]
    return True


def _network_ip(old: Mapping, new: Mapping) -> bool:
    """forceNewIfNetworkIPNotUpdatable: an interface's networkIp changes to a non-empty value while its network,
    subnetwork and subnetworkProject stay (interface counts equal)."""
    old_nics, new_nics = old.get("networkInterfaces") or [], new.get("networkInterfaces") or []
    if len(old_nics) != len(new_nics):
        return False
    for before, after in zip(old_nics, new_nics):
        ip_old, ip_new = before.get("networkIp") or "", after.get("networkIp") or ""
        if ip_old != ip_new and ip_new and all(
                _resource_name(before.get(k)) == _resource_name(after.get(k)) for k in ("network", "subnetwork")) \
                and before.get("subnetworkProject") == after.get("subnetworkProject"):
            return True
    return False


def _resource_name(value: Any) -> str:
    """tpgresource.CompareSelfLinkOrResourceName: a self link and a bare name of one resource are equal."""
    return str(value or "").rsplit("/", 1)[-1]


def _turned_off(key: str) -> Any:
    def rule(old: Mapping, new: Mapping) -> bool:  # isBeenEnabled: old true, new false
        return old.get(key) is True and new.get(key) is False
    return rule


def _autopilot_dns(old: Mapping, new: Mapping) -> bool:
    get = lambda m: ((m.get("dnsConfig") or {}).get("additiveVpcScopeDnsDomain"))  # noqa: E731
    return bool(new.get("enableAutopilot")) and get(old) != get(new)


def _beta_apis_removed(old: Mapping, new: Mapping) -> bool:
    get = lambda m: set((m.get("enableK8sBetaApis") or {}).get("enabledApis") or [])  # noqa: E731
    return bool(get(old) - get(new)) and bool(get(new))


def _cidr_shrinks(old: Mapping, new: Mapping) -> bool:
    """IsShrinkageIpCidr: anything but an expansion (the new range holding the old one) forces a new subnetwork."""
    import ipaddress  # noqa: PLC0415

    before, after = old.get("ipCidrRange"), new.get("ipCidrRange")
    if before == after or not before or not after:
        return False
    try:
        old_net, new_net = ipaddress.ip_network(before, strict=False), ipaddress.ip_network(after, strict=False)
    except ValueError:
        return False  # the provider's ValidateFunc refuses it first
    return not (old_net.version == new_net.version and old_net.subnet_of(new_net))


def _secret_replication(old: Mapping, new: Mapping) -> bool:
    get = lambda m: (m.get("replication") or {}).get("auto")  # noqa: E731
    return get(old) != get(new)


CUSTOMIZE_DIFF = {
    "customdiff.ForceNewIf('metadata_startup_script', isGracefulMetadataStartupSwitch)": _metadata_startup_script,
    "forceNewIfNetworkIPNotUpdatable": _network_ip,
    "customdiff.ForceNewIfChange('enable_l4_ilb_subsetting', isBeenEnabled)": _turned_off("enableL4IlbSubsetting"),
    "customdiff.ForceNewIfChange('enable_fqdn_network_policy', isBeenEnabled)": _turned_off("enableFqdnNetworkPolicy"),
    "containerClusterAutopilotCustomizeDiff": _autopilot_dns,
    "containerClusterEnableK8sBetaApisCustomizeDiff": _beta_apis_removed,
    "secretManagerSecretAutoCustomizeDiff": _secret_replication,
    "customdiff.ForceNewIfChange('ip_cidr_range', IsShrinkageIpCidr)": _cidr_shrinks,
}


@dataclass
class ProviderDiff:
    """A provider's answer to Diff, as the engine receives it."""

    detailed: dict[str, PropertyDiff] | None
    changed_keys: list[str]
    replace_keys: list[str]
    delete_before_replace: bool
    changes: bool
    forced_by: list[str] = field(default_factory=list)


def _bridged_diff(type_token: str, old: Mapping, new: Mapping) -> ProviderDiff:
    schema = BridgedSchema.of(type_token)
    info = resource_facts(type_token)
    found: list[tuple[Change, str]] = []
    requires_new = False
    for change in changes(old, new, (), schema.sets):
        if change.kind == DELETE and schema.is_computed(change.path):
            continue  # an Optional+Computed input left out keeps its old value: no diff
        requires_new |= schema.requires_new(change)
        value = change.new if change.kind == ADD else change.old
        triggers = (schema.value_triggers(change.path, value) if change.kind in (ADD, DELETE)
                    else schema.path_triggers(change.path))
        found.append((change, TO_REPLACE[change.kind] if triggers else change.kind))
    forced = _customize_diff_forces(type_token, old, new)
    requires_new |= bool(forced)
    detailed = {format_path(c.path): PropertyDiff(kind if requires_new else TO_PLAIN.get(kind, kind))
                for c, kind in found}
    if requires_new and not any(d.kind in REPLACE_KINDS for d in detailed.values()):
        detailed[META_KEY] = PropertyDiff(UPDATE_REPLACE)  # MakeDetailedDiffV2's replaceOverride
    tops = sorted({_top(p) for p in detailed})
    replaces = sorted({_top(p) for p, d in detailed.items() if d.kind in REPLACE_KINDS})
    rule = info["delete_before_replace"]
    autonamed_set = any(present(new.get(str(parse_path(p)[0]))) for p in rule["autonamed"])
    return ProviderDiff(detailed, tops, replaces, bool(replaces) and (rule["explicit"] or autonamed_set),
                        bool(detailed), forced)


def _top(path_text: str) -> str:
    """pulumi-terraform-bridge provider.go Diff: a detailed-diff path's top-level property (up to the first . or [)."""
    if path_text.startswith("["):
        return str(parse_path(path_text)[0])
    return re.split(r"[.\[]", path_text, maxsplit=1)[0]


# --- Other providers -------------------------------------------------------------------------------------------------

def _kubernetes_diff(type_token: str, old: Mapping, new: Mapping) -> ProviderDiff:
    info = resource_facts(type_token)
    # openapi.PatchPropertiesChanged runs each path as a JSONPath over the patch of one change: it matches when the
    # changed value holds the path, at or below it. Merge patches carry arrays whole, so array positions are ignored.
    patterns = [tuple(p for p in parse_path(e["path"]) if p != "*") for e in info["force_new"]]
    detailed: dict[str, PropertyDiff] = {}
    for change in changes(old, new, (), frozenset()):
        value = change.new if present(change.new) else change.old
        forced = any(contains(p, tuple(k for k in sub if not isinstance(k, int)))
                     for sub in leaves(change.path, value) for p in patterns)
        detailed[format_kubernetes_path(change.path)] = PropertyDiff(TO_REPLACE[change.kind] if forced
                                                                     else change.kind)
    replaces = sorted({_top(p) for p, d in detailed.items() if d.kind in REPLACE_KINDS})
    meta_old, meta_new = old.get("metadata") or {}, new.get("metadata") or {}
    dbr = (bool(replaces) and present(meta_new.get("name")) and meta_new.get("name") == meta_old.get("name")
           and meta_new.get("namespace") == meta_old.get("namespace"))
    return ProviderDiff(detailed, sorted({_top(p) for p in detailed}), replaces, dbr, bool(detailed))


def _command_diff(type_token: str, old: Mapping, new: Mapping) -> ProviderDiff:
    forced = [parse_path(e["path"]) for e in resource_facts(type_token)["force_new"]]
    detailed = {}
    for change in changes(old, new, (), frozenset()):
        kind = TO_REPLACE[change.kind] if any(contains(p, change.path) for p in forced) else change.kind
        detailed[format_path(change.path)] = PropertyDiff(kind)
    replaces = sorted({_top(p) for p, d in detailed.items() if d.kind in REPLACE_KINDS})
    return ProviderDiff(detailed, sorted({_top(p) for p in detailed}), replaces, False, bool(detailed))


def _dynamic_diff(old: Mapping, new: Mapping) -> ProviderDiff:
    """pulumi/dynamic/__main__.py Diff: the resource's provider (dill-pickled in `__provider`) answers; the host sends
    changes, replaces and deleteBeforeReplace only (no detailed diff, no changed keys)."""
    import dill  # noqa: PLC0415 - the dynamic provider host's own serialiser (a dependency of pulumi)

    provider = dill.loads(base64.b64decode(new.get("__provider") or old["__provider"]))
    strip = lambda m: {k: v for k, v in m.items() if k != "__provider"}  # noqa: E731
    result = provider.diff("", strip(old), strip(new))
    replaces = list(result.replaces or [])
    return ProviderDiff(None, [], replaces, bool(result.delete_before_replace) and bool(replaces),
                        bool(result.changes))


def _kubernetes_provider_diff(type_token: str, old: Mapping, new: Mapping) -> ProviderDiff:
    """pulumi-kubernetes DiffConfig: replaced when the kubeconfig's active cluster changes."""
    rule = resource_facts(type_token)["active_cluster"]
    detailed = {format_path(c.path): PropertyDiff(c.kind) for c in changes(old, new, (), frozenset())}
    replaces = [key for key in rule["keys"] if key == "kubeconfig" and _active_cluster(old) != _active_cluster(new)
                or key != "kubeconfig" and old.get(key) != new.get(key)]
    for key in replaces:
        detailed = {p: PropertyDiff(TO_REPLACE.get(d.kind, d.kind)) if _top(p) == key else d
                    for p, d in detailed.items()}
    return ProviderDiff(detailed, sorted({_top(p) for p in detailed}), replaces, False, bool(detailed), replaces)


def _active_cluster(inputs: Mapping) -> Any:
    try:
        config = json.loads(inputs.get("kubeconfig") or "{}")
    except ValueError:
        return inputs.get("kubeconfig")
    contexts = {c.get("name"): c.get("context", {}) for c in config.get("contexts") or []}
    current = contexts.get(config.get("current-context"), {}).get("cluster")
    clusters = {c.get("name"): c.get("cluster") for c in config.get("clusters") or []}
    return clusters.get(current, clusters.get(next(iter(clusters), None)))


# --- The engine ------------------------------------------------------------------------------------------------------

def plan_change(type_token: str, old_inputs: Mapping, new_inputs: Mapping, *, replace_on_changes: Sequence[str] = (),
                delete_before_replace: bool | None = None, old_state: Mapping | None = None,
                ignore_changes: Sequence[str] = ()) -> ResourceChange:
    """What `pulumi up` does to one resource whose inputs go from `old_inputs` to `new_inputs`. `old_state` (the
    outputs the provider last read) is compared where the provider diffs an input against what it read back
    (STATE_COMPARED); `ignore_changes` paths keep their old value and show no diff (the engine copies old inputs,
    step_generator.go processIgnoreChanges; the bridge drops them from Terraform's plan, tfshim/sdk-v2
    instance_diff.go processIgnoreChanges)."""
    old, new = unwrap(dict(old_inputs)), unwrap(dict(new_inputs))
    for path, suppress in STATE_COMPARED.get(type_token, {}).items():
        read_back, wanted = _get(unwrap(dict(old_state or {})), path), _get(new, path)
        if read_back is not None and wanted is not None:
            old = _put(old, path, wanted if suppress(str(read_back), str(wanted)) else read_back)
    for text in ignore_changes:
        path = parse_path(text)
        new = _put(new, path, _get(old, path))
    if type_token == DYNAMIC:
        diff = _dynamic_diff(old, new)
    else:
        provider = resource_facts(type_token)["provider"]
        if provider in ("google-beta", "docker"):
            diff = _bridged_diff(type_token, old, new)
        elif provider == "pulumi-kubernetes":
            diff = _kubernetes_diff(type_token, old, new)
        elif provider == "pulumi-command":
            diff = _command_diff(type_token, old, new)
        elif provider == "pulumi-kubernetes-provider":
            diff = _kubernetes_provider_diff(type_token, old, new)
        else:
            raise UnknownResourceType(f"{type_token}: provider {provider!r} has no rules here")
    if not diff.changes:
        return ResourceChange("same", (), (), {}, (), False)
    provider_replaces = bool(diff.replace_keys)
    # applyReplaceOnChanges: detailed paths a replaceOnChanges path contains become replaces, and the changed top-level
    # keys it contains join the replace keys (a nested path such as `scheduling.maxRunDuration` contains no top-level
    # key: the step is a replace whose replaceReasons lack it, as the real engine reports).
    patterns = [parse_path(p) for p in replace_on_changes]
    detailed = dict(diff.detailed or {})
    for text, prop in list(detailed.items()):
        if text != META_KEY and any(contains(p, parse_path(text)) for p in patterns):
            detailed[text] = PropertyDiff(TO_REPLACE.get(prop.kind, prop.kind), prop.input_diff)
    replace_keys = list(diff.replace_keys)
    replace_keys += [key for key in diff.changed_keys if key not in replace_keys
                     and any(contains(p, (key,)) for p in patterns)]
    replaced = any(d.kind in REPLACE_KINDS for d in detailed.values()) or bool(replace_keys)
    dbr = diff.delete_before_replace if delete_before_replace is None else delete_before_replace
    conflicts = replaced and not dbr and _keeps_name(type_token, old, new)
    return ResourceChange(
        op="replace" if replaced else "update",
        diff_reasons=tuple(diff.changed_keys),
        replace_reasons=tuple(replace_keys) if replaced else (),
        detailed_diff=dict(sorted(detailed.items())),
        needs_stop=_needs_stop(type_token, new, detailed),
        delete_before_replace=replaced and dbr,
        create_conflicts=conflicts,
        provider_replaces=provider_replaces,
        forced_by=tuple(diff.forced_by) if replaced else (),
    )


def _get(value: Any, path: Path) -> Any:
    for key in path:
        if isinstance(value, Mapping) and key in value:
            value = value[key]
        elif isinstance(value, list) and isinstance(key, int) and key < len(value):
            value = value[key]
        else:
            return None
    return value


def _put(value: Any, path: Path, leaf: Any) -> Any:
    """A copy of `value` with `leaf` at `path` (maps only: the paths this is used for), or without it for None."""
    if not path:
        return leaf
    copy = dict(value) if isinstance(value, Mapping) else {}
    inner = _put(copy.get(path[0]), path[1:], leaf)
    if inner is None:
        copy.pop(path[0], None)
    else:
        copy[path[0]] = inner
    return copy


# --- DiskImageDiffSuppress (terraform-provider-google-beta v7.45.0 services/compute/resource_compute_disk.go L117-255
# and image.go L38-48): the boot disk's image as Read records it (the dated image a family resolved to) against the
# configured one. Ported: the link, project/global/family forms and diskImageFamilyEquals' arm64/amd64 rule; the
# vendor special cases after it (Canonical, Fedora, SUSE, COS, Windows) are not, and count as different images.
_PROJECT, _NAME = r"(?:(?:[-a-z0-9]*\.)*[-a-z0-9]*:)?[-a-z0-9]+", r"[-_a-zA-Z0-9]+"
_IMAGE_LINK = re.compile(rf"^https://www\.googleapis\.com/compute/[a-z0-9]+/projects/({_PROJECT})/global/images/"
                         rf"({_NAME})")
_PROJECT_FAMILY = re.compile(rf"projects/({_PROJECT})/global/images/family/({_NAME})$")
_PROJECT_IMAGE = re.compile(rf"projects/({_PROJECT})/global/images/({_NAME})$")
_GLOBAL_FAMILY = re.compile(rf"^(?:global/images/)?family/({_NAME})$")


def disk_image_family_equals(image: str, family: str) -> bool:
    """diskImageFamilyEquals' first two rules: `debian-11-bullseye-v20220719` is of family `debian-11`; an -amd64
    image is of a family only if the family ends in -amd64 (so `ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e-v20260803`
    is NOT of family `ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e`, whose -amd64 is in the middle)."""
    if "-arm64" not in image and family.removesuffix("-amd64") in image:
        return family.endswith("-amd64") if "-amd64" in image else not family.endswith("-amd64")
    if family.removesuffix("-arm64") in image:
        return family.endswith("-arm64") if "-arm64" in image else not family.endswith("-arm64")
    return False


def disk_image_diff_suppress(read_back: str, configured: str) -> bool:
    """Whether the provider sees no change between the image it read back and the configured one."""
    if read_back == configured:
        return True
    linked = _IMAGE_LINK.match(read_back)
    if linked is None:
        return False
    project, name = linked.groups()
    if found := _PROJECT_FAMILY.search(configured):
        return found[1] == project and disk_image_family_equals(name, found[2])
    if found := _PROJECT_IMAGE.search(configured):
        return found[1] == project and found[2] == name
    if found := _GLOBAL_FAMILY.match(configured):
        return disk_image_family_equals(name, found[1])
    return configured in (name, f"global/images/{name}")


STATE_COMPARED: dict[str, dict[Path, Any]] = {
    "gcp:compute/instance:Instance": {("bootDisk", "initializeParams", "image"): disk_image_diff_suppress}}


def _keeps_name(type_token: str, old: Mapping, new: Mapping) -> bool:
    """The replacement would be created under the name the old resource still holds."""
    if type_token == DYNAMIC:
        return False
    info = resource_facts(type_token)
    if info["provider"] == "pulumi-kubernetes":
        get = lambda m: (m.get("metadata") or {}).get("name")  # noqa: E731
        return present(get(new)) and get(new) == get(old)
    keys = [str(parse_path(p)[0]) for p in info.get("delete_before_replace", {}).get("autonamed", [])]
    # A zonal or regional name is unique only in its zone or region (Compute Engine: an instance name per zone), so
    # a replacement elsewhere can hold the same name.
    for scope in ("zone", "region"):
        if present(new.get(scope)) and new.get(scope) != old.get(scope):
            return False
    return any(present(new.get(k)) and new.get(k) == old.get(k) for k in keys)


def _needs_stop(type_token: str, new: Mapping, detailed: Mapping[str, PropertyDiff]) -> tuple[str, ...]:
    update = resource_facts(type_token).get("update")
    if not update:
        return ()
    out = []
    for text in detailed:
        if text == META_KEY:
            continue
        path = parse_path(text)
        for entry in update["needs_stop"]:
            if entry["path"] is None or (entry.get("only_if") and not new.get(entry["only_if"])):
                continue
            if contains(_pattern(entry["path"]), path) or contains(path, _pattern(entry["path"])):
                out.append(text)
                break
    return tuple(out)
