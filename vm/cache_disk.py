"""The cache disk: its ext4 grown online to a grown disk (`cache_disk.py grow DEVICE`, also the startup script's), and
a disk that went away noticed (the supervisor stops serving). Why: docs/design/supervisor.md#the-cache-disk."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GIB = 2**30
# Grown when this much smaller than its device (a fresh mkfs leaves less than a block group unused).
GROW_SLACK_BYTES = 128 * 2**20


class DiskError(RuntimeError):
    pass


def _run(argv: list[str], timeout_s: float = 120) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise DiskError(f"{argv[0]}: {err}") from err
    if done.returncode != 0:
        raise DiskError(f"{' '.join(argv[:2])} exited {done.returncode}: {' '.join(done.stderr.split())[:300]}")
    return done.stdout


def filesystem_bytes(device: str) -> int:
    """The ext4 filesystem's size, from its superblock (tune2fs -l reads it on a mounted filesystem too)."""
    text = _run(["tune2fs", "-l", device])
    count = re.search(r"^Block count:\s+(\d+)", text, re.MULTILINE)
    size = re.search(r"^Block size:\s+(\d+)", text, re.MULTILINE)
    if not (count and size):
        raise DiskError("tune2fs -l printed no Block count / Block size")
    return int(count.group(1)) * int(size.group(1))


def grow(device: str) -> str:
    """Grow the filesystem on `device` to the device's size when the device is bigger; what was done, or ''."""
    before, available = filesystem_bytes(device), int(_run(["blockdev", "--getsize64", device]).strip())
    if available <= before + GROW_SLACK_BYTES:
        return ""
    _run(["resize2fs", device], timeout_s=1800)
    after = filesystem_bytes(device)
    return f"filesystem grown online from {before / GIB:.0f} to {after / GIB:.0f} GB"


def lost(device: str, cache_root: Path) -> str:
    """Why the cache disk the boot mounted can no longer be served from, or ''."""
    if not Path(device).exists():
        return f"the cache disk {device} is gone (detached?) while mounted at {cache_root}"
    try:
        _run(["mountpoint", "-q", str(cache_root)], timeout_s=30)
    except DiskError:
        return f"{cache_root} is no longer mounted from the cache disk {device}"
    return ""


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "grow":
        print("usage: cache_disk.py grow DEVICE", file=sys.stderr)
        return 2
    try:
        said = grow(argv[1])
    except DiskError as err:
        print(f"could not grow the filesystem: {err}", file=sys.stderr)
        return 1
    print(said)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
