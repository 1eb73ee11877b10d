"""Write vm/facts.json: the facts of tpuserve/facts.py that code on the VM reads (it cannot import tpuserve).

    .venv/bin/python scripts/vm_facts.py           # rewrite vm/facts.json
    .venv/bin/python scripts/vm_facts.py --check   # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "vm" / "facts.json"
NAMES = ("GUEST_ATTRIBUTE_NAMESPACE", "GUEST_STATE_KEY", "GUEST_STATE_FIELDS", "GUEST_STATE_TIMELINE_PREFIX",
         "GUEST_WRITE_INTERVAL_S", "GUEST_REASSERT_S", "SERVED_CONFIG_KEY", "SUPERVISOR_KEY", "VM_INSTALL_DIR",
         "VM_RUN_DIR", "BOOT_HASH_FILE", "CACHE_DEVICE_FILE", "CONTAINER_HASH_LABEL",
         "OPS_AGENT_CONFIG_FILE", "APT_LOCK_TIMEOUT_S", "CACHE_ROOT",
         "XLA_CACHE_KEY_PLACEHOLDER", "SUPERVISOR_MAX_RESTARTS", "IAM_PROPAGATION_WAIT_S", "SECRET_ACCESSOR_ROLE",
         "IMAGE_PULL_FREE_GB")


def render() -> str:
    sys.path.insert(0, str(ROOT))
    from tpuserve import facts

    generated = {"_generated": "by scripts/vm_facts.py from tpuserve/facts.py: do not edit"}
    return json.dumps({**generated, **{name: getattr(facts, name) for name in NAMES}}, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when vm/facts.json differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run `.venv/bin/python scripts/vm_facts.py`", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
