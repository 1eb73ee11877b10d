"""The XLA compilation cache: its key, its KV block pin, its copy in the stack's bucket (restored no-clobber before
the container starts, pushed after `serving`), best effort. Why: docs/design/supervisor.md#the-compile-cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

STORAGE_URL = "https://storage.googleapis.com"
WORKERS = 8
TIMEOUT_S = 60.0
# JAX's LRU cache writes `<key>-cache` plus an `<key>-atime` file per entry; only the former counts as an entry.
ATIME_SUFFIX = "-atime"
# Per served config: the KV block count its first boot allocated, which later boots pin (--num-gpu-blocks-override).
PIN_PREFIX = "tpu-serve-kv-blocks-"
# A boot is warm when it compiled about nothing: at most this share of the entries it found, and at least one.
WARM_NEW_SHARE = 0.02
# `disks/<zone>/<name>`: this disk served warm, kept on purpose (tpuserve/deploy/inventory.py WARM_MARKER_PREFIX).
MARKER_PREFIX = "disks/"
KEY_PATTERN = re.compile(r"^[0-9a-f]{16}-[a-z0-9-]+$")  # what xla_cache_key names


class CacheError(RuntimeError):
    """A bucket call failed; the message names it."""


def pinned_digest(image: str) -> str:
    """The sha256 digest an image reference pins (repo@sha256:...), or ''."""
    _, at, digest = image.partition("@")
    return digest if at and digest.startswith("sha256:") else ""


def xla_cache_key(image: str, machine_type: str, local_digest: str = "") -> str:
    """The cache folder's name, xla/<key> on the VM's disk, in the bucket and in a gke pod: the image digest (its JAX
    and libtpu) and the machine type (its TPU topology). An unpinned tag is keyed by the digest pulled, else (a pod:
    no node has pulled it yet) by the reference, one folder per tag (JAX's own keys tell its builds apart)."""
    digest = pinned_digest(image) or local_digest or "ref:" + hashlib.sha256(image.encode()).hexdigest()
    return f"{digest.partition(':')[2][:16]}-{re.sub(r'[^a-z0-9-]', '-', machine_type.lower())}"


def entries(directory: Path) -> int:
    """Compiled programs in a cache directory (0 when it does not exist)."""
    return sum(1 for path in directory.rglob("*") if path.is_file() and not path.name.endswith(ATIME_SUFFIX)
               and not path.name.startswith(PIN_PREFIX))


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write through a partial file renamed into place: a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(partial, path)


def pin_path(directory: Path, config_hash: str) -> Path:
    return directory / f"{PIN_PREFIX}{config_hash}.json"


def read_pin(directory: Path, config_hash: str) -> int | None:
    """The KV block count stored for this config, or None."""
    try:
        blocks = json.loads(pin_path(directory, config_hash).read_text())["blocks"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return blocks if isinstance(blocks, int) and blocks > 0 else None


def write_pin(directory: Path, config_hash: str, blocks: int, source: str) -> None:
    write_atomic(pin_path(directory, config_hash), json.dumps({"blocks": blocks, "config_hash": config_hash,
                                                                 "source": source}))


def drop_pin(directory: Path, config_hash: str) -> None:
    pin_path(directory, config_hash).unlink(missing_ok=True)


def verdict(before: int, after: int, pinned: int | None, learned: int | None, restore_error: str = "") -> str:
    """'warm (N hits)' or 'cold (why)', then the counts; hits: the entries found and not added to (the design)."""
    new = max(after - before, 0)
    pin = f"KV blocks pinned at {pinned:,}" if pinned else (
        f"KV blocks pinned at {learned:,} from now on" if learned else "KV blocks not pinned")
    counts = f"{before} entries before, {after} after; {pin}"
    if before > 0 and new <= max(1, int(before * WARM_NEW_SHARE)):
        return f"warm ({before} hits; {counts})"
    if before == 0:
        why = (f"nothing cached, the bucket could not be read: {restore_error}" if restore_error else
               "nothing cached yet for this image and machine type")
    elif not pinned:
        why = f"{new} programs compiled: the KV block count was not pinned yet, so it may differ from the cache's"
    else:
        why = f"{new} programs compiled though {before} were cached: this config's programs were not among them"
    return f"cold ({why}; {counts})"


def _files(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file())


def _request(method: str, url: str, token: str, data: bytes | None = None) -> tuple[int, bytes]:
    binary = {} if data is None else {"Content-Type": "application/octet-stream"}
    headers = {"Authorization": f"Bearer {token}", **binary}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310 - the storage API
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def remote_names(bucket: str, prefix: str, token: str, storage_url: str = STORAGE_URL) -> list[str]:
    """Object names under `prefix` (objects.list, following nextPageToken)."""
    names, page = [], ""
    while True:
        query = {"prefix": prefix, "fields": "items(name),nextPageToken", **({"pageToken": page} if page else {})}
        url = f"{storage_url}/storage/v1/b/{urllib.parse.quote(bucket)}/o?{urllib.parse.urlencode(query)}"
        status, body = _request("GET", url, token)
        if status != 200:
            raise CacheError(f"listing gs://{bucket}/{prefix} answered HTTP {status}: {body[:200]!r}")
        listing = json.loads(body or b"{}")
        names += [item["name"] for item in listing.get("items", [])]
        page = listing.get("nextPageToken", "")
        if not page:
            return names


def restore(bucket: str, key: str, directory: Path, token: Callable[[], str],
            storage_url: str = STORAGE_URL) -> int:
    """Download the bucket's entries for `key` that `directory` lacks (no-clobber); returns how many."""
    prefix = f"xla/{key}/"
    bearer = token()
    local = set(_files(directory))
    missing = [name for name in remote_names(bucket, prefix, bearer, storage_url) if name[len(prefix):] not in local
               and not name.endswith("/")]

    def fetch(name: str) -> None:
        url = f"{storage_url}/storage/v1/b/{urllib.parse.quote(bucket)}/o/{urllib.parse.quote(name, safe='')}?alt=media"
        status, body = _request("GET", url, bearer)
        if status != 200:
            raise CacheError(f"downloading gs://{bucket}/{name} answered HTTP {status}")
        write_atomic(directory / name[len(prefix):], body)

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(fetch, missing))
    return len(missing)


def _upload(bucket: str, name: str, body: bytes, bearer: str, storage_url: str, only_new: bool = False) -> bool:
    """Write one object; `only_new`: never overwrite (ifGenerationMatch=0), False when it already existed."""
    query = {"uploadType": "media", "name": name, **({"ifGenerationMatch": "0"} if only_new else {})}
    status, said = _request("POST", f"{storage_url}/upload/storage/v1/b/{urllib.parse.quote(bucket)}/o?"
                                    f"{urllib.parse.urlencode(query)}", bearer, body)
    if only_new and status == 412:  # another VM created it first: the same content-addressed entry
        return False
    if status != 200:
        raise CacheError(f"writing gs://{bucket}/{name} answered HTTP {status}: {said[:200]!r}")
    return True


def push(bucket: str, key: str, directory: Path, token: Callable[[], str], storage_url: str = STORAGE_URL) -> int:
    """Upload the local entries the bucket lacks, never overwriting an object; returns how many were created."""
    prefix = f"xla/{key}/"
    bearer = token()
    remote = {name[len(prefix):] for name in remote_names(bucket, prefix, bearer, storage_url)}
    todo = [relative for relative in _files(directory) if relative not in remote and not relative.endswith(".partial")]
    with ThreadPoolExecutor(WORKERS) as pool:
        return sum(pool.map(lambda relative: _upload(bucket, prefix + relative, (directory / relative).read_bytes(),
                                                     bearer, storage_url, only_new=True), todo))


def mark_disk(bucket: str, disk: str, facts: dict, token: Callable[[], str], storage_url: str = STORAGE_URL) -> None:
    """Write (or rewrite) the marker of cache disk `disk` ("<zone>/<name>"), its body `facts` as JSON."""
    _upload(bucket, f"{MARKER_PREFIX}{disk}", json.dumps(facts, sort_keys=True).encode(), token(), storage_url)
