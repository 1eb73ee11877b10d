"""A Pulumi engine for tests: the real `__main__.py` under mocks, every registration planned and applied to the fake
cloud the way the engine and the providers would, so a stack's life (ups with changed config, failures, destroys)
leaves in the cloud exactly what a real one would.

How the real engine runs an update, and what this one copies (pulumi/pulumi pkg/resource/deploy/step_generator.go,
step_executor.go):
- the program registers resources; the engine answers a RegisterResource only once the resource's step is done, so
  a resource that depends on another (its inputs are that one's outputs, or `dependsOn`) is registered after that
  one exists. Under mocks the SDK calls `MockMonitor.RegisterResource` the same way, and this engine does the step
  there, one registration at a time;
- a step is planned from the old state's inputs and the new inputs: `same`, `update`, `replace` (the provider's
  diff: tests/fakes/changes.py from the provider's source, or a dynamic provider's own `diff`, or
  pulumi-command's triggers), create-before-delete unless the provider or the program says delete first
  (step_generator.go: the program's deleteBeforeReplace overrides the provider's);
- the first failed step stops the update: no new step starts, the state keeps what was done (a replaced resource
  whose successor failed stays), and nothing is deleted;
- after the program, resources it no longer declares and replaced ones are deleted in reverse dependency order,
  except those marked retainOnDelete, which only leave the state;
- a resource declared with `import_` whose state holds no resource of that id is read from the cloud (the
  provider's import), then diffed like any other: `same`, or an `update` in place; a change that would replace it
  fails the update with the engine's own words (pkg/resource/deploy/step_generator.go, #19339's import-then-update).
  When the state holds another resource under that URN, the import replaces it: the old one is deleted at the end,
  as a replaced one is (NewImportReplacementStep, which pends the original's deletion).

The CLI side (`pulumi up/preview/destroy/refresh` output and exit codes, `--config`, `stack export`) stays with
tests/fakes/fake_pulumi.py, which hands these commands to an EngineServer in the test process over 127.0.0.1 (the
provider SDKs are imported once per process, not once per command).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import runpy
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks

from tests.fakes import fake_providers as providers
from tests.fakes import provider_errors
from tests.fakes.changes import ResourceChange

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "tpu-serve"
STACK_TYPE = "pulumi:pulumi:Stack"
EXIT_FAILED = 255  # the CLI's exit code for a failed update


class Canceled(Exception):
    """The CLI got SIGINT: the update stops after the step in flight (`error: update canceled`)."""


class Stopped(Exception):
    """A step failed earlier: the engine starts no new step."""


@dataclass
class Registration:
    """What the program asked for in one RegisterResource call (the request's fields the engine acts on)."""

    urn: str
    type: str
    name: str
    custom: bool
    parent: str
    inputs: dict[str, Any]
    dependencies: list[str]
    delete_before_replace: bool | None
    retain_on_delete: bool
    replace_on_changes: list[str]
    ignore_changes: list[str]
    timeouts: dict[str, str]
    applied: dict[str, Any] = field(default_factory=dict)  # the inputs the provider gets: an autonamed name added
    import_id: str = ""  # the `import_` option's id


@dataclass
class Step:
    op: str  # same, create, update, replace, create-replacement, delete-replaced, delete
    urn: str
    type: str
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None
    change: ResourceChange | None = None
    status: str = "done"  # done, failed
    error: str = ""


@dataclass
class Run:
    """One command's work: the steps in the order they ran, the new state, the failure if any."""

    steps: list[Step] = field(default_factory=list)
    state: list[dict[str, Any]] = field(default_factory=list)
    failure: Step | None = None
    outputs: dict[str, Any] | None = None


def resource_state(reg: Registration, id_: str, outputs: Mapping[str, Any]) -> dict[str, Any]:
    """A state entry as `pulumi stack export` shows it (apitype.ResourceV3's camelCase fields)."""
    entry: dict[str, Any] = {"urn": reg.urn, "custom": reg.custom, "type": reg.type, "inputs": reg.inputs,
                             "outputs": dict(outputs), "dependencies": reg.dependencies}
    if reg.custom:
        entry["id"] = id_
    if reg.parent:
        entry["parent"] = reg.parent
    if reg.retain_on_delete:
        entry["retainOnDelete"] = True
    if reg.delete_before_replace:
        entry["deleteBeforeReplace"] = True
    if reg.replace_on_changes:
        entry["replaceOnChanges"] = reg.replace_on_changes
    return entry


class EngineMonitor(pulumi_mocks.MockMonitor):
    """The mock monitor, keeping each request's options for the step it makes (mocks see only the inputs)."""

    def __init__(self, mocks: EngineMocks) -> None:
        super().__init__(mocks)
        self.engine_mocks = mocks
        self.lock = threading.Lock()

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - the gRPC method's name
        with self.lock:  # one step at a time, in the order registrations arrive
            if request.type != STACK_TYPE:
                self.engine_mocks.current = Registration(
                    urn=self.make_urn(request.parent, request.type, request.name), type=request.type,
                    name=request.name, custom=bool(request.custom), parent=request.parent,
                    inputs={}, dependencies=list(request.dependencies),
                    delete_before_replace=request.deleteBeforeReplace if request.deleteBeforeReplaceDefined else None,
                    retain_on_delete=bool(request.retainOnDelete),
                    replace_on_changes=list(request.replaceOnChanges),
                    ignore_changes=list(request.ignoreChanges),
                    timeouts={"create": request.customTimeouts.create, "update": request.customTimeouts.update,
                              "delete": request.customTimeouts.delete},
                    import_id=request.importId)
            return super().RegisterResource(request)


class EngineMocks(pulumi.runtime.Mocks):
    """Plans and runs each registration's step against the providers (tests/fakes/fake_providers.py)."""

    def __init__(self, engine: Engine, old: Mapping[str, dict[str, Any]], preview: bool, run: Run) -> None:
        self.engine, self.old, self.preview, self.run = engine, dict(old), preview, run
        self.current: Registration | None = None
        self.registered: dict[str, Registration] = {}
        self.replaced: list[dict[str, Any]] = []  # old states whose successor exists: deleted after the program

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        reg = self.current
        assert reg is not None and reg.name == args.name
        reg.inputs = providers.plain(dict(args.inputs))
        reg.applied = dict(reg.inputs)
        self.registered[reg.urn] = reg
        if self.run.failure is not None:
            raise Stopped(f"not started: {self.run.failure.urn} failed")
        if self.engine.canceled.is_set():
            raise Canceled("update canceled")
        old = self.old.get(reg.urn)
        if not reg.custom:
            self.run.state.append(resource_state(reg, "", reg.inputs))
            return "", reg.inputs
        provider = self.engine.provider(reg)
        if reg.type in AUTONAMED and "name" not in reg.inputs:
            # pulumi-gcp autonames what the program does not name (SetAutonaming: the logical name, "-", 7 random
            # hex); an update keeps the name, a replacement gets a new one. Kept out of the inputs the diff sees.
            kept = (old or {}).get("outputs", {}).get("name")
            reg.applied["name"] = kept or autoname(reg.name, reg.urn, len(self.engine.names))
            self.engine.names.add(reg.applied["name"])
        if reg.import_id and (old is None or old.get("id") != reg.import_id):
            return self._import(reg, provider, old)
        if old is None:
            return self._step("create", reg, None, lambda: provider.create(reg))
        change = provider.diff(old, reg)
        if change.op == "same":
            self.run.state.append({**resource_state(reg, old["id"], old["outputs"])})
            self.run.steps.append(Step("same", reg.urn, reg.type, old, None, change))
            return old["id"], old["outputs"]
        if change.op == "update":
            return self._step("update", reg, old, lambda: provider.update(old, reg, change), change)
        delete_first = change.delete_before_replace if reg.delete_before_replace is None \
            else reg.delete_before_replace
        if delete_first:
            self._delete(old, "delete-replaced")
            if self.run.failure is not None:
                raise Stopped(self.run.failure.error)
            return self._step("replace", reg, old, lambda: provider.create(reg), change, logical=True)
        if reg.type in AUTONAMED and "name" not in reg.inputs:
            reg.applied["name"] = autoname(reg.name, reg.urn, len(self.engine.names))
            self.engine.names.add(reg.applied["name"])
        result = self._step("replace", reg, old, lambda: provider.create(reg), change, logical=True,
                            keep_old_on_failure=True)
        self.replaced.append(old)
        return result

    def _import(self, reg: Registration, provider: providers.Provider,
                original: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        """Read the resource `import_` names, then update it in place to the program's inputs, or fail."""
        step = Step("import", reg.urn, reg.type, original)
        self.run.steps.append(step)

        def fail(error: str) -> None:
            step.status, step.error = "failed", error
            self.run.failure = step
            if original is not None:
                self.run.state.append(original)
            raise providers.ProviderError(error)

        found = provider.import_(reg.import_id)
        if found is None:
            fail(f"resource '{reg.import_id}' does not exist")
        imported = {"id": reg.import_id, "inputs": found[0], "outputs": found[1]}
        change = provider.diff(imported, reg)
        step.change = change
        if change.op == "replace":
            diff = "\n".join(f"{key}: {found[0].get(key)!r} => {reg.inputs.get(key)!r}"
                             for key in change.replace_reasons)
            fail("previously-imported resources that still specify an ID may not be replaced; please remove the "
                 f"`import` declaration from your program;\n{diff}")
        if original is not None:
            self.replaced.append(original)  # the import replaces it: deleted at the end
        if change.op == "same" or self.preview:
            step.new = resource_state(reg, reg.import_id, provider.read({"inputs": reg.applied}) or found[1])
            self.run.state.append(step.new)
            return reg.import_id, step.new["outputs"]
        return self._step("update", reg, imported, lambda: provider.update(imported, reg, change), change)

    def _step(self, op: str, reg: Registration, old: dict[str, Any] | None,
              act: Callable[[], tuple[str, dict[str, Any]]], change: ResourceChange | None = None,
              logical: bool = False, keep_old_on_failure: bool = False) -> tuple[str, dict[str, Any]]:
        step = Step(op, reg.urn, reg.type, old, None, change)
        if logical:  # a replacement: its create-replacement step runs under the logical `replace`
            self.run.steps.append(Step("create-replacement", reg.urn, reg.type, old, None, change))
        self.run.steps.append(step)
        if self.preview:
            id_, outputs = (old["id"], old["outputs"]) if old is not None and op == "update" else \
                ("", providers.preview_outputs(reg))
            step.new = resource_state(reg, id_, outputs)
            self.run.state.append(step.new)
            return id_, outputs
        try:
            id_, outputs = act()
        except Exception as err:  # noqa: BLE001 - a provider's failure, whatever it raised, fails its step
            step.status, step.error = "failed", str(err) if isinstance(err, providers.ProviderError) else \
                f"Exception calling application: {err}" if reg.type.startswith("pulumi-python:dynamic") else repr(err)
            self.run.failure = step
            if old is not None and (keep_old_on_failure or op == "update"):
                self.run.state.append(old)  # the old resource is still there
            raise providers.ProviderError(step.error) from err
        step.new = resource_state(reg, id_, outputs)
        self.run.state.append(step.new)
        return id_, outputs

    def _delete(self, old: dict[str, Any], op: str) -> None:
        step = Step(op, old["urn"], old["type"], old)
        self.run.steps.append(step)
        if self.preview or old.get("retainOnDelete"):
            return
        try:
            self.engine.provider_for(old["type"], old["urn"]).delete(old)
        except providers.ProviderError as err:
            step.status, step.error = "failed", str(err)
            self.run.failure = step
            self.run.state.append(old)

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        return self.engine.invoke(args.token, dict(args.args))

    def finish(self) -> None:
        """After the program: delete what it no longer declares and what was replaced, dependents first."""
        if self.run.failure is not None:
            kept = {entry["urn"] for entry in self.run.state}
            self.run.state += [old for urn, old in self.old.items() if urn not in kept and urn not in self.registered]
            return
        gone = [old for urn, old in self.old.items() if urn not in self.registered]
        for old in reversed(dependency_order([*gone, *self.replaced])):
            op = "delete" if old["urn"] not in self.registered else "delete-replaced"
            self._delete(old, op)
            if self.run.failure is not None:
                return


AUTONAMED = frozenset({"gcp:compute/firewall:Firewall", "gcp:compute/router:Router",
                       "gcp:compute/routerNat:RouterNat"})


def autoname(logical: str, urn: str, salt: int) -> str:
    """`<logical name>-<7 hex>`, like pulumi's autonamer (random there; here derived, so runs repeat)."""
    import hashlib

    return f"{logical}-{hashlib.sha256(f'{urn}#{salt}'.encode()).hexdigest()[:7]}"


def dependency_order(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Resources ordered so that each comes after those it depends on (its parent and `dependencies`)."""
    by_urn = {entry["urn"]: entry for entry in resources}
    ordered, seen = [], set()

    def visit(entry: dict[str, Any]) -> None:
        if id(entry) in seen:
            return
        seen.add(id(entry))
        for urn in [entry.get("parent", ""), *entry.get("dependencies", [])]:
            if urn in by_urn and by_urn[urn] is not entry:
                visit(by_urn[urn])
        ordered.append(entry)

    for entry in resources:
        visit(entry)
    return ordered


class Engine:
    """Runs `up`, `preview`, `destroy` and `refresh` of one stack whose files live in a tests/fakes/fake_pulumi.py home."""

    def __init__(self, cloud: providers.Cloud) -> None:
        self.cloud = cloud
        self.canceled = threading.Event()
        self.lock = threading.Lock()  # mocks are process-global: one command at a time
        self.names: set[str] = set()  # autonamed names handed out
        self.locked_for = 0  # the next N updates meet the stack locked by another process (the diy backend's words)
        self.environments: list[dict[str, str]] = []  # the TPUSERVE_* environment of each program run

    def provider(self, reg: Registration) -> providers.Provider:
        return self.provider_for(reg.type, reg.urn)

    def provider_for(self, type_: str, urn: str) -> providers.Provider:
        return providers.for_resource(type_, urn, self.cloud)

    def invoke(self, token: str, args: dict[str, Any]) -> dict[str, Any]:
        return providers.invoke(token, args, self.cloud)

    # --- the program under mocks ----------------------------------------------------------------------------------

    def run_program(self, stack: str, config: Mapping[str, Any], old: Mapping[str, dict[str, Any]],
                    preview: bool) -> Run:
        run = Run()
        loop = asyncio.new_event_loop()  # the SDK runs the program on this thread's loop
        # A failed step fails every registration after it; the SDK leaves their futures unread.
        loop.set_exception_handler(lambda *_: None)
        asyncio.set_event_loop(loop)
        mocks = EngineMocks(self, old, preview, run)
        monitor = EngineMonitor(mocks)
        pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=preview, monitor=monitor)
        values, secrets = {}, []
        for key, entry in config.items():
            value = entry.get("objectValue", entry.get("value"))
            values[key] = value if isinstance(value, str) else json.dumps(value)
            if entry.get("secret"):
                secrets.append(key)
        pulumi.runtime.set_all_config(values, secrets)

        @pulumi.runtime.test
        def program() -> pulumi.Output:
            runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")
            root = pulumi.runtime.get_root_resource()
            exported = dict(getattr(root, "outputs", {}) or {})
            keys = list(exported)
            return pulumi.Output.all(*exported.values()).apply(
                lambda values: setattr(run, "outputs", dict(zip(keys, values))))

        with _no_stack_traces(), contextlib.suppress(providers.ProviderError, Stopped, Canceled):
            try:
                program()
            except Exception as err:  # noqa: BLE001 - a program error (a bad config) is the update's failure
                if run.failure is None and not isinstance(err, (providers.ProviderError, Stopped, Canceled)):
                    run.failure = Step("program", f"urn:pulumi:{stack}::{PROJECT}::{STACK_TYPE}::{PROJECT}-{stack}",
                                       STACK_TYPE, status="failed", error=str(err))
                elif isinstance(err, Canceled) and run.failure is None:
                    run.failure = Step("canceled", "", "", status="failed", error="update canceled")
        mocks.finish()
        return run

    # --- commands --------------------------------------------------------------------------------------------------

    def command(self, argv: list[str], home: Path, stack: str, out: Callable[[str], None],
                env: Mapping[str, str] | None = None) -> int:
        with self.lock:
            self.canceled.clear()
            words = [arg for arg in argv if not arg.startswith("-")]
            verb = words[0]
            if self.locked_for and verb in ("up", "destroy", "refresh"):
                self.locked_for -= 1
                out(provider_errors.LOCKED)
                return EXIT_FAILED
            state_file = home / "state.json"
            state = json.loads(state_file.read_text()) if state_file.exists() else \
                {"version": 3, "deployment": {"resources": []}}
            resources = state["deployment"].get("resources") or []
            config = json.loads((home / "config.json").read_text()) if (home / "config.json").exists() else {}
            project_config = {key: entry for key, entry in config.items() if key.startswith(f"{PROJECT}:")}
            if "--refresh" in argv or verb == "refresh":
                resources = self.refresh(resources)
            if verb == "refresh":
                self.save(state_file, state, resources)
                out(f"Refreshing ({stack}):\nResources:\n    {len(resources)} unchanged\n")
                return 0
            if verb == "destroy":
                return self.destroy(state_file, state, resources, home, stack, out)
            old = {entry["urn"]: entry for entry in resources if entry.get("type") != STACK_TYPE}
            preview = verb == "preview"
            with program_environment(env or {}):
                self.environments.append(dict(env or {}))
                run = self.run_program(stack, project_config, old, preview)
            if preview:
                out(json.dumps(digest(run, project_config), indent=4))
                return EXIT_FAILED if run.failure is not None and run.failure.op == "program" else 0
            self.save(state_file, state, [stack_resource(stack), *run.state])
            if run.failure is None and run.outputs is not None:
                write_whole(home / "outputs.json", run.outputs)
            out(update_text(stack, run))
            return 0 if run.failure is None else EXIT_FAILED

    def refresh(self, resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Read every custom resource back; one the cloud no longer has leaves the state."""
        kept = []
        for entry in resources:
            if not entry.get("custom") or entry.get("type") == STACK_TYPE:
                kept.append(entry)
                continue
            outputs = self.provider_for(entry["type"], entry["urn"]).read(entry)
            if outputs is not None:
                kept.append({**entry, "outputs": outputs})
        return kept

    def destroy(self, state_file: Path, state: dict[str, Any], resources: list[dict[str, Any]], home: Path,
                stack: str, out: Callable[[str], None]) -> int:
        left, deleted, failure = [], 0, ""
        for entry in reversed(dependency_order([r for r in resources if r.get("type") != STACK_TYPE])):
            if failure:
                left.append(entry)
                continue
            if entry.get("custom") and not entry.get("retainOnDelete"):
                try:
                    self.provider_for(entry["type"], entry["urn"]).delete(entry)
                except providers.ProviderError as err:
                    failure = f"  {entry['type']} ({entry['urn'].rsplit('::', 1)[-1]}):\n    error: {err}\n"
                    left.append(entry)
                    continue
            deleted += 1
        self.save(state_file, state, left)
        if not left:
            (home / "outputs.json").unlink(missing_ok=True)
        out(f"Destroying ({stack}):\n" + (f"\nDiagnostics:\n{failure}" if failure else "") +
            f"\nResources:\n    - {deleted} deleted\n\nDuration: 1m2s")
        return EXIT_FAILED if failure else 0

    @staticmethod
    def save(state_file: Path, state: dict[str, Any], resources: list[dict[str, Any]]) -> None:
        state["deployment"]["resources"] = resources
        write_whole(state_file, state)


@contextlib.contextmanager
def program_environment(env: Mapping[str, str]) -> Iterator[None]:
    """The environment the CLI's program would see: what tpuserve set for that one `pulumi` (TPUSERVE_*)."""
    import os

    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def write_whole(path: Path, value: Any) -> None:
    """Replace a stack file at once (another stack's process may read it meanwhile, as the CLI's writes allow)."""
    partial = path.with_name(f"{path.name}.{threading.get_ident()}.tmp")
    partial.write_text(json.dumps(value))
    partial.replace(path)


def stack_resource(stack: str) -> dict[str, Any]:
    return {"urn": f"urn:pulumi:{stack}::{PROJECT}::{STACK_TYPE}::{PROJECT}-{stack}", "custom": False,
            "type": STACK_TYPE}


# --- what the CLI prints ----------------------------------------------------------------------------------------

SYMBOLS = {"create": "+ ", "update": "~ ", "replace": "+-", "delete": "- ", "delete-replaced": "--",
           "create-replacement": "++", "import": "= "}


def update_text(stack: str, run: Run) -> str:
    """`pulumi up --yes --skip-preview --non-interactive` output: a line per step, the Diagnostics block of a failed
    one (the bridged provider's prefix, as tests/provider_errors.pulumi_failed lays it out), the summary."""
    lines = [f"Updating ({stack}):", "     Type                     Name                Status"]
    counts: dict[str, int] = {}
    for step in run.steps:
        counts[step.op] = counts.get(step.op, 0) + 1
        if step.op == "same" or step.op == "create-replacement":
            continue
        status = {"create": "created", "update": "updated", "replace": "replaced", "delete": "deleted",
                  "delete-replaced": "deleted original", "import": "imported"}.get(step.op, step.op)
        if step.status == "failed":
            status = f"**{step.op} failed**"
        lines.append(f" {SYMBOLS.get(step.op, '  ')}  {step.type:<24} {step.urn.rsplit('::', 1)[-1]:<19} {status}")
    failure = run.failure
    if failure is not None:
        body = "\n    ".join(f"{providers.error_prefix(failure.type)}{failure.error}".splitlines())
        lines += ["", "Diagnostics:", f"  {STACK_TYPE} ({PROJECT}-{stack}):", "    error: update failed", "",
                  f"  {failure.type} ({failure.urn.rsplit('::', 1)[-1]}):", f"    error:   {body}"]
    summary = [f"    + {counts['create']} created"] if counts.get("create") else []
    summary += [f"    ~ {counts['update']} updated"] if counts.get("update") else []
    summary += [f"    +-{counts['replace']} replaced"] if counts.get("replace") else []
    summary += [f"    - {counts['delete']} deleted"] if counts.get("delete") else []
    summary += [f"    {counts['same']} unchanged"] if counts.get("same") else []
    return "\n".join([*lines, "", "Resources:", *summary, "", "Duration: 41s", ""])


def digest(run: Run, config: Mapping[str, Any]) -> dict[str, Any]:
    """The `preview --json --show-replacement-steps` digest (pulumi/pulumi pkg/display/json.go PreviewDigest, steps
    as pkg/backend/display/json.go getPreviewMetadataStep fills them)."""
    steps, summary = [], {}
    for step in run.steps:
        if step.op not in ("create-replacement", "delete-replaced"):
            summary[step.op] = summary.get(step.op, 0) + 1
        if step.op == "same":
            continue
        entry: dict[str, Any] = {"op": step.op, "urn": step.urn, "detailedDiff": None}
        if step.old is not None and step.op != "create-replacement":
            entry["oldState"] = step.old
        elif step.old is not None:
            entry["oldState"] = step.old
        if step.new is not None:
            entry["newState"] = step.new
        if step.change is not None and step.op != "delete-replaced":
            entry["diffReasons"] = list(step.change.diff_reasons)
            if step.change.replace_reasons:
                entry["replaceReasons"] = list(step.change.replace_reasons)
            entry["detailedDiff"] = {path: {"kind": diff.kind, "inputDiff": diff.input_diff}
                                     for path, diff in step.change.detailed_diff.items()}
        steps.append(entry)
    diagnostics = []
    if run.failure is not None:
        diagnostics.append({"urn": run.failure.urn, "message": f"{run.failure.error}\n", "severity": "error"})
    return {"config": {key: "[secret]" if entry.get("secret") else str(entry.get("value"))
                       for key, entry in config.items()},
            "steps": steps, "diagnostics": diagnostics, "duration": 4210000000, "changeSummary": summary}


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """The SDK records each registration's Python stack for the engine; mocks never read it (tests/pulumi_harness)."""
    from pulumi.runtime import resource
    from pulumi.runtime.proto import source_pb2

    original = resource._get_stack_trace
    resource._get_stack_trace = source_pb2.StackTrace
    try:
        yield
    finally:
        resource._get_stack_trace = original


# --- the server tests/fakes/fake_pulumi.py talks to -----------------------------------------------------------------

class EngineServer:
    """One Engine behind a socket on 127.0.0.1: the fake `pulumi` sends {"argv", "home", "stack"} as a JSON line and
    gets back its output as {"out": line} lines and then {"rc": code}; a line "INT" from it cancels the update (the
    CLI's Ctrl-C)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> EngineServer:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.listener.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rw", encoding="utf-8") as stream:
            request = json.loads(stream.readline())

            def watch() -> None:
                for line in stream:
                    if line.strip() == "INT":
                        self.engine.canceled.set()

            def out(text: str) -> None:
                for line in text.splitlines():
                    stream.write(json.dumps({"out": line}) + "\n")
                stream.flush()

            threading.Thread(target=watch, daemon=True).start()
            try:
                code = self.engine.command(request["argv"], Path(request["home"]), request["stack"], out,
                                           request.get("env"))
            except Exception as err:  # noqa: BLE001 - the fake's own bug: say it where the test reads output
                import traceback

                out(f"fake engine error: {err!r}\n{traceback.format_exc()}")
                code = 2
            stream.write(json.dumps({"rc": code}) + "\n")
            stream.flush()
            time.sleep(0)
