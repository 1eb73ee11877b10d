"""A fake `pulumi` executable for `tpuserve up` and `tpuserve preflight`, which tests put first on PATH.

It keeps a stack's config, outputs and state in files under $FAKE_PULUMI_HOME and answers the commands the toolkit
runs (`config --json`, `config set/rm`, `stack output --json`, `stack export`, `refresh`, `up [--config k=v]`) in their
real output shapes (`pulumi config --json`: key -> {"value", "secret"[, "objectValue"]}). `up` saves the config it is
given, reads the stack's `zone` and plays the scenario for it: the output to print (the provider's real error texts,
tests/fakes/provider_errors.py), the exit code (255 for a failed update, as the CLI), how long to take, and whether the VM
was created (a gate failure happens after the create). On SIGINT it stops the way the CLI does and exits 255. Every
call is logged as JSON.

With FAKE_CLOUD_URL (the stateful fake cloud, tests/fakes/fake_cloud.py), `up` also makes the stack's Cloud Routers and
NATs there, in the regions its program would (its config's createCloudNat, externalIp, region or zone,
cloudNatSkipRegions), before its VM, and keeps them in state.json under the provider's ids; `destroy` deletes
them. A NAT the cloud refuses (a second all-subnetworks NAT in a region) fails the update with the provider's error.
"""

from __future__ import annotations

import json
import marshal
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The program behind the executable. It runs hundreds of times per test file and Python's start-up is most of its
# cost (≈ 11 ms with -S), so it imports only what the interpreter has loaded already (sys, time, _signal), os
# (≈ 1.5 ms) and json's own C accelerator, `_json` (≈ 0.5 ms): `import json` would take ≈ 20 ms more (it imports
# re, which imports enum), pathlib ≈ 10 ms, signal (enum again) ≈ 8 ms. `dumps`/`loads` call `_json` as json.dumps
# and json.loads do (json/encoder.py: `c_make_encoder(markers, default, encoder, indent, key_separator,
# item_separator, sort_keys, skipkeys, allow_nan)`; json/decoder.py hands `c_make_scanner` an object with the
# attributes of Decoder).
PROGRAM = r"""
import _json, _signal, os, sys, time


class Decoder:
    strict, object_hook, object_pairs_hook, parse_float, parse_int, parse_constant = True, None, None, float, int, float


def loads(text):
    return _json.make_scanner(Decoder)(text.strip(), 0)[0]


def dumps(value):
    return "".join(_json.make_encoder(None, None, _json.encode_basestring_ascii, None, ": ", ", ", False, False,
                                      True)(value, 0))


root = os.environ["FAKE_PULUMI_HOME"]
argv = sys.argv[1:]
with open(os.path.join(root, "calls.jsonl"), "a") as log:
    log.write(dumps(argv) + "\n")
# The flags that take a value; every other argument not starting with "-" is a word of the command.
VALUED = ("--stack", "--config", "-c")
flags = {flag: argv[index + 1] for index, flag in enumerate(argv[:-1]) if flag in VALUED}
words = [arg for index, arg in enumerate(argv) if not arg.startswith("-") and (index == 0 or argv[index - 1]
                                                                                   not in VALUED)]
stack = flags.get("--stack", "dev")


home = root


def read(name, default, where=None):
    path = os.path.join(where or home, name)
    if not os.path.exists(path):
        return default
    with open(path) as file:
        return loads(file.read())


def write(name, value):
    # Whole or not at all, as the CLI's own state writes: another process may read this file at any moment, and
    # must never see it half-written.
    path = os.path.join(home, name)
    with open(f"{path}.{os.getpid()}.tmp", "w") as file:
        file.write(dumps(value))
    os.replace(f"{path}.{os.getpid()}.tmp", path)


config = read("config.json", {})


def value(key, default=""):
    return config.get("tpu-serve:" + key, {}).get("value", default)


NAT_TYPES = ("gcp:compute/router:Router", "gcp:compute/routerNat:RouterNat")


def nat_regions():
    # The regions this stack's program makes Cloud NAT in, decided from its config as the program does
    # (components/network.py and components/deployment.py, TpuConfig.makes_nat_in; pinned by tests/components/test_stack.py).
    zone = value("zone")
    if value("createCloudNat", "true").lower() == "false" or value("externalIp", "false").lower() == "true":
        return []
    regions = [value("region") or zone.rsplit("-", 1)[0]]
    skip = loads(value("cloudNatSkipRegions", "[]"))
    return [r for index, r in enumerate(regions) if r not in regions[:index] and r not in skip]


def cloud_nat(project):
    # With FAKE_CLOUD_URL (tests/fakes/fake_cloud.py), make the stack's Routers and NATs there as the provider would
    # (routers.insert, then the RouterNat's routers.patch of `nats[]`; a region change deletes the old ones first) and
    # keep them in state.json with the provider's ids. The update's failure output when the cloud refuses one.
    url = os.environ.get("FAKE_CLOUD_URL")
    if not url:
        return None
    import _socket  # not urllib.request (≈ 0.3 s to import) nor socket (enum): HTTP/1.0 by hand

    host, _, port = url.split("//", 1)[1].partition(":")

    def call(method, path, body=None):
        data = b"" if body is None else dumps(body).encode()
        connection = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        connection.connect((host, int(port)))
        connection.sendall(f"{method} /compute/v1/projects/{project}/{path} HTTP/1.0\r\nHost: {host}\r\n"
                           f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                           "Connection: close\r\n\r\n".encode() + data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
        connection.close()
        head, _, payload = b"".join(chunks).partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), loads(payload.decode()) if payload.strip() else {}

    base = "tpu-serve-" + "".join(c if c.isalnum() else "-" for c in stack.lower())
    state = read("state.json", {"version": 3, "deployment": {"resources": []}})
    resources = state["deployment"]["resources"]
    routers = {r["id"].rsplit("/", 3)[1]: r["id"].rsplit("/", 1)[1] for r in resources if r["type"] == NAT_TYPES[0]}
    wanted = nat_regions()
    failure = None
    for region, router in routers.items():
        if region not in wanted:  # delete-before-replace: the old region's go first
            call("DELETE", f"regions/{region}/routers/{router}")
            resources[:] = [r for r in resources if f"/{region}/" not in r["id"] or r["type"] not in NAT_TYPES]
    for region in wanted:
        if region in routers:
            continue
        router, nat = f"{base}-router", f"{base}-nat"
        call("POST", f"regions/{region}/routers", {
            "name": router, "network": f"global/networks/{value('network', 'default')}",
            "description": f"tpu-serve stack {stack}: Cloud NAT for the VMs of the region without an external IP"})
        resources.append({"urn": f"urn:pulumi:{stack}::tpu-serve::{NAT_TYPES[0]}::{router}", "type": NAT_TYPES[0],
                          "id": f"projects/{project}/regions/{region}/routers/{router}"})
        status, body = call("PATCH", f"regions/{region}/routers/{router}", {"nats": [{
            "name": nat, "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES",
            "natIpAllocateOption": "AUTO_ONLY", "logConfig": {"enable": True, "filter": "ERRORS_ONLY"}}]})
        if status != 200:
            # The bridged provider's error, as tests/fakes/provider_errors.py pulumi_failed lays it out.
            failure = (f"Diagnostics:\n  pulumi:pulumi:Stack (tpu-serve-{stack}):\n    error: update failed\n\n"
                       f"  gcp:compute:RouterNat ({nat}):\n    error:   sdk-v2/provider2.go:572: sdk.helper_schema: "
                       f"Error creating RouterNat: googleapi: Error {status}: {body['error']['message']}, invalid\n"
                       "\nResources:\n    + 1 created\n\nDuration: 12s\n")
            break
        resources.append({"urn": f"urn:pulumi:{stack}::tpu-serve::{NAT_TYPES[1]}::{nat}", "type": NAT_TYPES[1],
                          "id": f"{project}/{region}/{router}/{nat}"})
    write("state.json", state)
    return failure


def save_settings():
    # `--config key=value` (also -c): saved in the stack's config, plaintext, before the update (or preview) starts
    # (pulumi/pulumi pkg/cmd/pulumi/operations/up.go and preview.go, parseAndSaveConfigArray: split at the first "=",
    # a key without a namespace gets the project's).
    settings = [argv[index + 1] for index, flag in enumerate(argv[:-1]) if flag in ("--config", "-c")]
    for setting in settings:
        key, _, text = setting.partition("=")
        config[key if ":" in key else "tpu-serve:" + key] = {"value": text, "secret": False}
    if settings:
        write("config.json", config)


engine = read("engine.json", None, root)
if engine is not None and words[:1] in (["up"], ["preview"], ["destroy"], ["refresh"]):
    # Stateful mode (tests/fakes/fake_engine.py): the engine in the test process runs the program and the providers.
    if words[0] in ("up", "preview"):
        save_settings()
    import socket

    connection = socket.create_connection(("127.0.0.1", engine["port"]))
    stream = connection.makefile("rw", encoding="utf-8")
    # The program's environment: what tpuserve sets for one `pulumi` (TPUSERVE_*) reaches the engine's program run.
    env = {key: value for key, value in os.environ.items() if key.startswith("TPUSERVE_")}
    stream.write(dumps({"argv": argv, "home": home, "stack": stack, "env": env}) + "\n")
    stream.flush()

    def forward_interrupt(*_):
        print("^C received; cancelling the current operation. Press ^C again to forcibly exit.", flush=True)
        connection.sendall(b"INT\n")

    _signal.signal(_signal.SIGINT, forward_interrupt)
    for line in stream:
        message = loads(line)
        if "out" in message:
            print(message["out"], flush=True)
        else:
            sys.exit(message["rc"])
    sys.exit(255)
if words[:1] == ["destroy"]:
    if os.environ.get("FAKE_CLOUD_URL"):
        config["tpu-serve:createCloudNat"] = {"value": "false"}  # nothing is wanted any more: every NAT goes
        cloud_nat(value("project"))
    for name in ("state.json", "outputs.json"):
        if os.path.exists(os.path.join(home, name)):
            os.unlink(os.path.join(home, name))
    print(f"Destroying ({stack}):\nResources:\n    - 9 deleted\n\nDuration: 1m2s")
elif words[:1] == ["config"] and len(words) == 1:
    print(dumps(config))
elif words[:2] == ["config", "set"]:
    config["tpu-serve:" + words[2]] = {"value": words[3], "secret": False}
    write("config.json", config)
elif words[:2] == ["config", "rm"]:
    config.pop("tpu-serve:" + words[2], None)
    write("config.json", config)
elif words[:2] == ["stack", "output"] and len(words) > 2:
    # One output (`pulumi stack output NAME --json [--show-secrets]`): its value as JSON, or the CLI's refusal.
    outputs = read("outputs.json", {})
    if words[2] not in outputs:
        print(f"error: current stack does not have output property '{words[2]}'", file=sys.stderr)
        sys.exit(255)
    print(dumps(outputs[words[2]]))
elif words[:2] == ["stack", "output"]:
    print(dumps(read("outputs.json", {})))
elif words[:2] == ["stack", "export"]:
    print(dumps(read("state.json", {"version": 3, "deployment": {"resources": []}})))
elif words[:1] == ["refresh"]:
    print("Refreshing (dev):\nResources:\n    5 unchanged\n\nDuration: 3s")
elif words[:1] == ["preview"]:
    save_settings()
    # `preview --json`: the digest (pulumi/pulumi pkg/display/json.go PreviewDigest) the test wrote, else one with
    # nothing to do; exit 255 with it when the test says the preview fails.
    play = read("preview.json", {"digest": {"steps": [], "changeSummary": {"same": 24}}, "rc": 0})
    print(dumps(play["digest"]))
    sys.exit(play.get("rc", 0))
elif words[:1] == ["up"]:
    save_settings()
    zone = value("zone")
    scenario = read("scenario.json", {}, root)
    play = scenario.get(zone) or scenario.get("*") or {"rc": 0}

    def interrupted(*_):
        print("^C received; cancelling the current operation. Press ^C again to forcibly exit.", flush=True)
        print("error: update canceled", flush=True)
        sys.exit(255)

    _signal.signal(_signal.SIGINT, interrupted)  # `signal` is this with enums, which cost an import of enum
    print(f"Updating ({stack}):", flush=True)
    time.sleep(play.get("seconds", 0))
    project = value("project")
    failed = cloud_nat(project)  # made before the VM, which depends on its network (NAT included)
    if failed:
        sys.stdout.write(failed)
        sys.exit(255)
    if play.get("creates"):
        vm = f"tpu-serve-{stack}"
        kept = [r for r in read("state.json", {}).get("deployment", {}).get("resources", []) if r["type"] in NAT_TYPES]
        write("state.json", {"version": 3, "deployment": {"resources": [*kept, {
            "urn": f"urn:pulumi:{stack}::tpu-serve::gcp:compute/instance:Instance::{vm}",
            "type": "gcp:compute/instance:Instance",
            "id": f"projects/{project}/zones/{zone}/instances/{vm}"}]}})
        write("outputs.json", {"target": "gcp", "zone": zone, "instanceName": vm, "project": project,
            "endpoint": "http://10.164.0.10:8000/v1", "model": value("model", "google/gemma-4-E2B-it"),
            "configHash": "c0ffee", "maxRunSeconds": 14400,
            "iapTunnelCommand": f"gcloud compute start-iap-tunnel {vm} 8000 --local-host-port=localhost:8000 "
                                f"--zone={zone} --project={project}"})
    sys.stdout.write(play.get("output", "Resources:\n    + 9 created\n\nDuration: 9m12s\n"))
    sys.exit(play.get("rc", 0))
else:
    print(f"error: the fake pulumi does not know {argv}", file=sys.stderr)
    sys.exit(2)
"""


@dataclass
class FakePulumi:
    home: Path

    def set_config(self, **values: Any) -> None:
        config = {}
        for key, value in values.items():
            secret = key == "hfToken"
            entry = {"value": "[secret]" if secret else json.dumps(value) if isinstance(value, list) else value,
                     "secret": secret}
            if isinstance(value, list):
                entry["objectValue"] = value
            config[f"tpu-serve:{key}"] = entry
        (self.home / "config.json").write_text(json.dumps(config))

    def config(self) -> dict[str, Any]:
        return json.loads((self.home / "config.json").read_text())

    def scenario(self, plays: dict[str, dict[str, Any]]) -> None:
        """zone -> {"output": str, "rc": int, "seconds": float, "creates": bool}; "*" for every other zone."""
        (self.home / "scenario.json").write_text(json.dumps(plays))

    def outputs(self) -> dict[str, Any]:
        path = self.home / "outputs.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def preview(self, steps: list[dict[str, Any]], rc: int = 0, diagnostics: list[dict[str, Any]] = ()) -> None:
        """What `pulumi preview --json` prints next: a digest of these steps (see preview_step)."""
        summary: dict[str, int] = {}
        for step in steps:
            if step["op"] not in ("create-replacement", "delete-replaced"):
                summary[step["op"]] = summary.get(step["op"], 0) + 1
        digest = {"config": {"tpu-serve:project": PROJECT_ID}, "steps": steps, "diagnostics": list(diagnostics),
                  "duration": 4210000000, "changeSummary": {"same": 20, **summary}}
        (self.home / "preview.json").write_text(json.dumps({"digest": digest, "rc": rc}))

    def state(self, state: dict[str, Any]) -> None:
        (self.home / "state.json").write_text(json.dumps(state))

    def calls(self) -> list[list[str]]:
        log = self.home / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def commands(self) -> list[str]:
        """Each call as `command [zone]`: 'config set zone us-east5-a', 'up', 'refresh', ..."""
        return [" ".join(a for a in call if not a.startswith("--") and a not in ("dev",)) for call in self.calls()]


PROJECT_ID = "my-ml-sandbox"
INSTANCE_URN = ("urn:pulumi:dev::tpu-serve::tpuserve:index:Deployment$tpuserve:gcp:FlexStartTpuVm$"
                "gcp:compute/instance:Instance::tpu-serve-dev")


def preview_step(op: str, old: dict[str, Any] | None, new: dict[str, Any] | None, urn: str = INSTANCE_URN,
                 diff: dict[str, str] | None = None, replace: tuple[str, ...] = ()) -> dict[str, Any]:
    """One entry of a preview digest's `steps` (pulumi/pulumi pkg/display/json.go PreviewStep, its state as
    apitype.ResourceV3): op, urn, provider, oldState/newState {urn, custom, type, inputs, ...}, diffReasons (the
    top-level keys of `diff`), replaceReasons and detailedDiff {path: {kind, inputDiff}}."""
    type_ = urn.split("::")[2].rsplit("$", 1)[-1]

    def state(inputs: dict[str, Any] | None) -> dict[str, Any] | None:
        if inputs is None:
            return None
        return {"urn": urn, "custom": True, "type": type_, "inputs": inputs, "outputs": inputs,
                "provider": "urn:pulumi:dev::tpu-serve::pulumi:providers:gcp::default_10_2_0::04da6b54"}

    step: dict[str, Any] = {"op": op, "urn": urn,
                            "provider": "urn:pulumi:dev::tpu-serve::pulumi:providers:gcp::default_10_2_0::04da6b54",
                            "detailedDiff": None}
    if old is not None:
        step["oldState"] = state(old)
    if new is not None:
        step["newState"] = state(new)
    if diff:
        step["diffReasons"] = list(dict.fromkeys(path.split(".")[0].split("[")[0] for path in diff))
        step["detailedDiff"] = {path: {"kind": kind, "inputDiff": True} for path, kind in diff.items()}
    if replace:
        step["replaceReasons"] = list(replace)
    return step


def replacement(old: dict[str, Any], new: dict[str, Any], diff: dict[str, str], replace: tuple[str, ...],
                delete_first: bool = False, urn: str = INSTANCE_URN) -> list[dict[str, Any]]:
    """A replacement as `preview --json --show-replacement-steps` lists it: the logical `replace`, and the
    create-replacement/delete-replaced steps in the order the engine runs them (delete first when it must)."""
    create = preview_step("create-replacement", old, new, urn, diff, replace)
    delete = preview_step("delete-replaced", old, None, urn)
    logical = preview_step("replace", old, new, urn, diff, replace)
    return [delete, logical, create] if delete_first else [create, logical, delete]


def install(bin_dir: Path, home: Path) -> FakePulumi:
    """Write the executable into `bin_dir` (put it first on PATH, and FAKE_PULUMI_HOME=home, in the environment)."""
    bin_dir.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    # The executable runs PROGRAM as compiled here, once (compiling it would cost ≈ 2 ms a call); its source sits
    # beside it for tracebacks.
    source, code = bin_dir / "fake-pulumi-program.py", bin_dir / "fake-pulumi-program.code"
    source.write_text(PROGRAM)
    code.write_bytes(marshal.dumps(compile(PROGRAM, str(source), "exec")))
    script = bin_dir / "pulumi"
    script.write_text(f"#!{sys.executable} -S\nimport marshal\nexec(marshal.loads(open({str(code)!r}, 'rb').read()))\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return FakePulumi(home)
