"""A fake `pulumi` executable for `tpuserve up` and `tpuserve preflight`, which tests put first on PATH.

It keeps a stack's config, outputs and state in files under $FAKE_PULUMI_HOME and answers the commands the toolkit
runs (`config --json`, `config set/rm`, `stack output --json`, `stack export`, `refresh`, `up`) in their real output
shapes (`pulumi config --json`: key -> {"value", "secret"[, "objectValue"]}). `up` reads the stack's current `zone`
and plays the scenario for it: the output to print (the provider's real error texts, tests/provider_errors.py), the
exit code (255 for a failed update, as the CLI), how long to take, and whether the VM was created (a gate failure
happens after the create). On SIGINT it stops the way the CLI does and exits 255. Every call is logged as JSON.
"""

from __future__ import annotations

import json
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPT = """#!{python} -S
import json, os, signal, sys, time
from pathlib import Path

home = Path(os.environ["FAKE_PULUMI_HOME"])
argv = sys.argv[1:]
with open(home / "calls.jsonl", "a") as log:
    log.write(json.dumps(argv) + "\\n")
read = lambda name, default: json.loads((home / name).read_text()) if (home / name).exists() else default
write = lambda name, value: (home / name).write_text(json.dumps(value, indent=1))
config = read("config.json", {{}})
words = [a for a in argv if not a.startswith("-")]
if "--stack" in argv:
    words.remove(argv[argv.index("--stack") + 1])

if words[:1] == ["config"] and len(words) == 1:
    print(json.dumps(config))
elif words[:2] == ["config", "set"]:
    config["tpu-serve:" + words[2]] = {{"value": words[3], "secret": False}}
    write("config.json", config)
elif words[:2] == ["config", "rm"]:
    config.pop("tpu-serve:" + words[2], None)
    write("config.json", config)
elif words[:2] == ["stack", "output"]:
    print(json.dumps(read("outputs.json", {{}})))
elif words[:2] == ["stack", "export"]:
    print(json.dumps(read("state.json", {{"version": 3, "deployment": {{"resources": []}}}})))
elif words[:1] == ["refresh"]:
    print("Refreshing (dev):\\nResources:\\n    5 unchanged\\n\\nDuration: 3s")
elif words[:1] == ["up"]:
    zone = config.get("tpu-serve:zone", {{}}).get("value", "")
    play = read("scenario.json", {{}}).get(zone) or read("scenario.json", {{}}).get("*") or {{"rc": 0}}

    def interrupted(*_):
        print("^C received; cancelling the current operation. Press ^C again to forcibly exit.", flush=True)
        print("error: update canceled", flush=True)
        sys.exit(255)

    signal.signal(signal.SIGINT, interrupted)
    print(f"Updating ({{os.environ.get('FAKE_STACK', 'dev')}}):", flush=True)
    time.sleep(play.get("seconds", 0))
    if play.get("creates"):
        project = config["tpu-serve:project"]["value"]
        write("state.json", {{"version": 3, "deployment": {{"resources": [{{
            "urn": "urn:pulumi:dev::tpu-serve::gcp:compute/instance:Instance::tpu-serve-dev",
            "type": "gcp:compute/instance:Instance",
            "id": f"projects/{{project}}/zones/{{zone}}/instances/tpu-serve-dev"}}]}}}})
        write("outputs.json", {{"target": "gcp", "zone": zone, "instanceName": "tpu-serve-dev", "project": project,
            "iapTunnelCommand": f"gcloud compute start-iap-tunnel tpu-serve-dev 8000 --local-host-port=localhost:8000 "
                                f"--zone={{zone}} --project={{project}}"}})
    sys.stdout.write(play.get("output", "Resources:\\n    + 9 created\\n\\nDuration: 9m12s\\n"))
    sys.exit(play.get("rc", 0))
else:
    print(f"error: the fake pulumi does not know {{argv}}", file=sys.stderr)
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

    def state(self, state: dict[str, Any]) -> None:
        (self.home / "state.json").write_text(json.dumps(state))

    def calls(self) -> list[list[str]]:
        log = self.home / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def commands(self) -> list[str]:
        """Each call as `command [zone]`: 'config set zone us-east5-a', 'up', 'refresh', ..."""
        return [" ".join(a for a in call if not a.startswith("--") and a not in ("dev",)) for call in self.calls()]


def install(bin_dir: Path, home: Path) -> FakePulumi:
    """Write the executable into `bin_dir` (put it first on PATH, and FAKE_PULUMI_HOME=home, in the environment)."""
    bin_dir.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    script = bin_dir / "pulumi"
    script.write_text(SCRIPT.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return FakePulumi(home)
