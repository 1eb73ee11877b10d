"""The XLA compilation cache beside the cache disk: a copy in a bucket of the stack, restored and pushed back.

A cache disk can be lost (a new zone, a flex-start deletion that takes it along, `tpuserve cache rm`); the compile
cache is small, so the stack keeps a copy in a bucket. The pattern is tpu-inference's CI
(.buildkite/scripts/run_in_docker.sh): before the container starts, copy the bucket's entries onto the local
directory without overwriting any local file (no-clobber); push back only after a run that succeeded (here: after
`serving`), again without overwriting (an upload with `ifGenerationMatch=0` creates an object only where none exists;
https://cloud.google.com/storage/docs/request-preconditions). JAX's cache entries are content-addressed, so two VMs
pushing the same key at once is harmless.

Objects live under `xla/<key>/<relative path>`, the key being the VM's cache key (image digest + machine type).
Everything here is best effort: a failure is a warning and a colder boot, never a failed one.

Cloud Storage JSON API only (list, media download, media upload), standard library only; imports nothing from
tpuserve.
"""

from __future__ import annotations

import json
import os
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
# Beside the entries, one small file per served config (keyed like the directory, by image and machine type, and by
# the config hash): the KV block count its first boot allocated. The KV cache arrays are arguments of every jitted
# model program (tpu-inference runner/compilation_manager.py), and their block count follows the HBM left after the
# weights load (worker/tpu_worker.py): one block more or less than the boot that filled the cache misses every
# program. Pinning the count (--num-gpu-blocks-override) makes every boot of one config compile the same programs.
# It travels to the bucket and back with the entries. The block size needs no place in the key or the pin: tpu-inference
# derives it from max_model_len and max_num_seqs (tpuserve/measure/plan.py `tpu_block_size`), both in the argv the
# config hash covers, and JAX keys each cached program by its shapes (another block size is a miss, never a wrong hit).
PIN_PREFIX = "tpu-serve-kv-blocks-"
# A boot is warm when it compiled about nothing: at most this share of the entries it found, and at least one.
WARM_NEW_SHARE = 0.02


class CacheError(RuntimeError):
    """A bucket call failed; the message names it."""


def entries(directory: Path) -> int:
    """Compiled programs in a cache directory (0 when it does not exist)."""
    if not directory.is_dir():
        return 0
    return sum(1 for path in directory.rglob("*") if path.is_file() and not path.name.endswith(ATIME_SUFFIX)
               and not path.name.startswith(PIN_PREFIX))


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
    path = pin_path(directory, config_hash)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"blocks": blocks, "config_hash": config_hash, "source": source}))
    os.replace(partial, path)


def drop_pin(directory: Path, config_hash: str) -> None:
    pin_path(directory, config_hash).unlink(missing_ok=True)


def verdict(before: int, after: int, pinned: int | None, learned: int | None, restore_error: str = "") -> str:
    """'warm (N hits)' or 'cold (why)', then the counts: how `tpuserve gate` and `status` report the compile cache.
    JAX logs its persistent-cache hits only at DEBUG, so the hits are the entries the boot found and did not need
    to add to: a warm boot adds about none (at most WARM_NEW_SHARE of them)."""
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
    if not directory.is_dir():
        return []
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file())


def _request(method: str, url: str, token: str, data: bytes | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"}
    if data is not None:
        headers["Content-Type"] = "application/octet-stream"
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
        query = {"prefix": prefix, "fields": "items(name),nextPageToken"}
        if page:
            query["pageToken"] = page
        url = f"{storage_url}/storage/v1/b/{urllib.parse.quote(bucket)}/o?{urllib.parse.urlencode(query)}"
        status, body = _request("GET", url, token)
        if status != 200:
            raise CacheError(f"listing gs://{bucket}/{prefix} answered HTTP {status}: {body[:200]!r}")
        listing = json.loads(body or b"{}")
        names += [item["name"] for item in listing.get("items", [])]
        page = listing.get("nextPageToken", "")
        if not page:
            return names


def _object_url(storage_url: str, bucket: str, name: str) -> str:
    return (f"{storage_url}/storage/v1/b/{urllib.parse.quote(bucket)}/o/"
            f"{urllib.parse.quote(name, safe='')}?alt=media")


def restore(bucket: str, key: str, directory: Path, token: Callable[[], str],
            storage_url: str = STORAGE_URL) -> int:
    """Download the bucket's entries for `key` that `directory` lacks (no-clobber); returns how many."""
    prefix = f"xla/{key}/"
    bearer = token()
    local = set(_files(directory))
    missing = [name for name in remote_names(bucket, prefix, bearer, storage_url) if name[len(prefix):] not in local
               and not name.endswith("/")]

    def fetch(name: str) -> None:
        status, body = _request("GET", _object_url(storage_url, bucket, name), bearer)
        if status != 200:
            raise CacheError(f"downloading gs://{bucket}/{name} answered HTTP {status}")
        target = directory / name[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(body)
        os.replace(partial, target)

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(fetch, missing))
    return len(missing)


def push(bucket: str, key: str, directory: Path, token: Callable[[], str], storage_url: str = STORAGE_URL) -> int:
    """Upload the local entries the bucket lacks, never overwriting an object; returns how many were created."""
    prefix = f"xla/{key}/"
    bearer = token()
    remote = {name[len(prefix):] for name in remote_names(bucket, prefix, bearer, storage_url)}
    todo = [relative for relative in _files(directory) if relative not in remote and not relative.endswith(".partial")]

    def upload(relative: str) -> bool:
        query = urllib.parse.urlencode({"uploadType": "media", "name": prefix + relative, "ifGenerationMatch": "0"})
        status, body = _request("POST", f"{storage_url}/upload/storage/v1/b/{urllib.parse.quote(bucket)}/o?{query}",
                                bearer, (directory / relative).read_bytes())
        if status == 412:  # another VM created it first: the same content-addressed entry
            return False
        if status != 200:
            raise CacheError(f"uploading gs://{bucket}/{prefix}{relative} answered HTTP {status}: {body[:200]!r}")
        return True

    with ThreadPoolExecutor(WORKERS) as pool:
        return sum(pool.map(upload, todo))


# The object that says a cache disk holds a served cache: `disks/<zone>/<disk name>` in the stack's bucket, written
# after `serving` (tpuserve/deploy/inventory.py WARM_MARKER_PREFIX reads it: a disk is warm, kept on purpose, only
# with it and a lastAttachTimestamp).
MARKER_PREFIX = "disks/"


def mark_disk(bucket: str, disk: str, facts: dict, token: Callable[[], str], storage_url: str = STORAGE_URL) -> None:
    """Write (or rewrite) the marker of cache disk `disk` ("<zone>/<name>"), its body `facts` as JSON."""
    query = urllib.parse.urlencode({"uploadType": "media", "name": f"{MARKER_PREFIX}{disk}"})
    status, body = _request("POST", f"{storage_url}/upload/storage/v1/b/{urllib.parse.quote(bucket)}/o?{query}",
                            token(), json.dumps(facts, sort_keys=True).encode())
    if status != 200:
        raise CacheError(f"writing gs://{bucket}/{MARKER_PREFIX}{disk} answered HTTP {status}: {body[:200]!r}")
