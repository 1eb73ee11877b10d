"""The boot's state as one guest attribute (tpuserve/facts.py GUEST_STATE_*), written within Google's budget by two
writers sharing a state file under an flock: the startup script (the command line: `set K=V ...`) and the supervisor
(`GuestState`). Why: docs/design/supervisor.md#the-boot-state.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

FACTS = json.loads(Path(__file__).with_name("facts.json").read_text())  # scripts/vm_facts.py writes it
NAMESPACE, STATE_KEY = FACTS["GUEST_ATTRIBUTE_NAMESPACE"], FACTS["GUEST_STATE_KEY"]
FIELDS, TIMELINE_PREFIX = frozenset(FACTS["GUEST_STATE_FIELDS"]), FACTS["GUEST_STATE_TIMELINE_PREFIX"]
INTERVAL_S, REASSERT_S = FACTS["GUEST_WRITE_INTERVAL_S"], FACTS["GUEST_REASSERT_S"]
STATE_FILE, STAMP_FILE, LOCK_FILE = "state.json", "state.written", "state.lock"


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} tpu-serve-state: {message}", file=sys.stderr,
          flush=True)


def put(metadata_url: str, value: str, timeout_s: float = 5.0) -> bool:
    """PUT the state into the guest attribute; False on any failure (the next attempt repairs it)."""
    import urllib.request  # loaded by publish, only when a write is due

    url = f"{metadata_url.rstrip('/')}/computeMetadata/v1/instance/guest-attributes/{NAMESPACE}/{STATE_KEY}"
    request = urllib.request.Request(url, data=value.encode(), method="PUT", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - the metadata server
            return response.status == 200
    except OSError:  # urllib.error.URLError is one
        return False


class Store:
    """The state file, the stamp of the last write and the lock both writers take, in one run directory."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    @contextmanager
    def locked(self) -> Iterator[None]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield

    def _read(self, name: str) -> dict:
        try:
            value = json.loads((self.run_dir / name).read_text())
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def state(self) -> dict:
        return self._read(STATE_FILE)

    def stamp(self) -> dict:
        return self._read(STAMP_FILE)

    def _write(self, name: str, value: dict) -> None:
        partial = self.run_dir / f".{name}.new"
        partial.write_text(json.dumps(value, sort_keys=True))
        os.replace(partial, self.run_dir / name)

    def update(self, changes: Mapping[str, str], new_timeline: bool = False) -> dict:
        """Apply `changes` (None removes one; `new_timeline` drops at-<stage> fields first); seq bumped on change."""
        if unknown := sorted(key for key in changes if key not in FIELDS and not key.startswith(TIMELINE_PREFIX)):
            raise ValueError(f"not a boot-state field (tpuserve/facts.py GUEST_STATE_FIELDS): {', '.join(unknown)}")
        with self.locked():
            state = self.state()
            before = dict(state)
            if new_timeline:
                state = {k: v for k, v in state.items() if not k.startswith(TIMELINE_PREFIX)}
            for key, value in changes.items():
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = str(value)
            if state != before:
                state["seq"] = int(before.get("seq", 0)) + 1
                self._write(STATE_FILE, state)
            return state

    def publish(self, metadata_url: str, interval_s: float, clock: Callable[[], float] = time.time,
                force: bool = False) -> str:
        """Write the state if changed (`force`: anyway) and the budget allows: written, unchanged, failed, wait:<s>."""
        with self.locked():
            state, stamp = self.state(), self.stamp()
            now = clock()
            wait = float(stamp.get("at", 0)) + interval_s - now
            if not force and int(stamp.get("seq", -1)) == int(state.get("seq", 0)):
                return "unchanged"
            if wait > 0:
                return f"wait:{wait:.3f}"
            # Loaded only now: most of the startup script's calls never send (≈40 ms of CPU a start). Then the time
            # again: the budget counts from when the request leaves, not from before a slow import.
            import urllib.request  # noqa: F401 - put's
            now = clock()
            document = json.dumps({**state, "written": str(int(now))}, sort_keys=True, separators=(",", ":"))
            ok = put(metadata_url, document)
            # A failed write spends the budget too: the metadata server may have counted it.
            self._write(STAMP_FILE, {"at": now, "seq": int(state.get("seq", 0)) if ok else -1})
            return "written" if ok else "failed"


class GuestState:
    """The supervisor's writer: `update` changes the state file at once; a thread sends it within the budget."""

    def __init__(self, metadata_url: str, run_dir: Path, interval_s: float = INTERVAL_S,
                 reassert_s: float = REASSERT_S):
        self.metadata_url, self.interval_s, self.reassert_s = metadata_url, interval_s, reassert_s
        self.store = Store(run_dir)
        self.changed = threading.Condition()
        self.thread: threading.Thread | None = None

    def update(self, changes: Mapping[str, str | None], new_timeline: bool = False) -> None:
        self.store.update(changes, new_timeline)
        with self.changed:
            self.changed.notify_all()

    def start(self) -> GuestState:
        self.thread = threading.Thread(target=self.run, daemon=True, name="guest-state")
        self.thread.start()
        return self

    def run(self) -> None:
        last_write = time.monotonic()
        while True:
            force = time.monotonic() - last_write >= self.reassert_s
            outcome = self.store.publish(self.metadata_url, self.interval_s, force=force)
            if outcome in ("written", "failed"):
                last_write = time.monotonic()
                if outcome == "failed":
                    log("warning: could not write the guest attribute state; retrying")
            pause = float(outcome.split(":", 1)[1]) if outcome.startswith("wait:") else (
                self.interval_s if outcome == "failed" else self.reassert_s - (time.monotonic() - last_write))
            with self.changed:
                self.changed.wait(timeout=max(pause, 0.01))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Change the boot state; write it within the guest-attribute budget.")
    parser.add_argument("--metadata-url", required=True)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--interval-s", type=float, default=INTERVAL_S)
    sub = parser.add_subparsers(dest="command", required=True)
    setting = sub.add_parser("set", help="change fields (KEY=VALUE; KEY= empties one); write if the budget allows")
    setting.add_argument("--new-timeline", action="store_true", help="drop the earlier run's at-<stage> fields")
    setting.add_argument("--flush", action="store_true", help="wait for the budget and write (a failed boot's "
                         "last word: nobody else will send it)")
    setting.add_argument("assignments", nargs="*")
    args = parser.parse_args(argv)
    store = Store(args.run_dir)
    if bad := [pair for pair in args.assignments if pair.find("=") < 1]:  # no key
        raise SystemExit(f"guest_state.py: {bad[0]!r} is not KEY=VALUE")
    try:
        store.update(dict(pair.split("=", 1) for pair in args.assignments), args.new_timeline)
    except ValueError as err:
        raise SystemExit(f"guest_state.py: {err}") from None
    while True:
        outcome = store.publish(args.metadata_url, args.interval_s)
        if not (args.flush and outcome.startswith("wait:")):
            break
        time.sleep(float(outcome.split(":", 1)[1]))
    if outcome == "failed":
        log("warning: could not write the guest attribute state")
    return 0


if __name__ == "__main__":
    sys.exit(main())
