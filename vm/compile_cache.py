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


class CacheError(RuntimeError):
    """A bucket call failed; the message names it."""


def entries(directory: Path) -> int:
    """Compiled programs in a cache directory (0 when it does not exist)."""
    if not directory.is_dir():
        return 0
    return sum(1 for path in directory.rglob("*") if path.is_file() and not path.name.endswith(ATIME_SUFFIX))


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
