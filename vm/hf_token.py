"""Copy the Hugging Face token from Secret Manager into a 0400 file as the workload's Google identity (the gke init
container: `--secret projects/P/secrets/S --out FILE`); the supervisor imports `read_secret`. The token is never
printed, in an argv, an environment variable or a Kubernetes object."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

METADATA_URL = "http://metadata.google.internal"
SECRET_MANAGER_URL = "https://secretmanager.googleapis.com"
TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
ATTEMPTS = 5
RETRY_DELAY_S = 2.0
# No amount of waiting fixes these: a bad name, no credentials, no permission, no such secret or version.
REFUSED = (400, 401, 403, 404)


class TokenError(RuntimeError):
    """Why the token could not be copied; never contains the token."""


def _get(url: str, headers: dict[str, str], timeout_s: float) -> tuple[int, Any]:
    """(status, JSON body or None); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:  # noqa: S310
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    except OSError:
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


def _message(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("message"))[:300] if isinstance(error, dict) and error.get("message") else "no message"


def _describe(status: int) -> str:
    return f"HTTP {status}" if status else "no answer"


def access_token(metadata_url: str, timeout_s: float = 10.0) -> tuple[int, str | None]:
    status, body = _get(metadata_url + TOKEN_PATH, {"Metadata-Flavor": "Google"}, timeout_s)
    token = body.get("access_token") if status == 200 and isinstance(body, dict) else None
    return (status, token) if token else (status or 0, None)


def duration(seconds: float) -> str:
    """'45 s' or '3 min'."""
    return f"{int(seconds)} s" if seconds < 60 else f"{int(seconds // 60)} min"


GKE_GRANT_HINT = ("does the pod's Google service account have roles/secretmanager.secretAccessor on it, is the "
                  "Kubernetes service account bound to it (Workload Identity), and does the secret have a version?")
GKE_TOKEN_HINT = "is Workload Identity enabled on the node pool (GKE_METADATA) and the service account annotated?"


def read_secret(secret: str, metadata_url: str = METADATA_URL, secret_manager_url: str = SECRET_MANAGER_URL,
                attempts: int = ATTEMPTS, retry_delay_s: float = RETRY_DELAY_S, *, iam_wait_s: float = 0.0,
                iam_poll_s: float = 15.0, on_wait: Callable[[str], None] | None = None,
                grant_hint: str = GKE_GRANT_HINT, token_hint: str = GKE_TOKEN_HINT) -> str:
    """The latest version's payload; a failure names the call that failed. Why: docs/design/supervisor.md."""
    delay, attempt, denied_at = retry_delay_s, 1, None
    while True:
        status, bearer = access_token(metadata_url)
        if bearer is not None:
            status, body = _get(f"{secret_manager_url}/v1/{secret}/versions/latest:access",
                                {"Authorization": f"Bearer {bearer}"}, 20.0)
            if status == 200:
                try:
                    value = base64.b64decode(body["payload"]["data"]).decode().strip()
                except (KeyError, TypeError, ValueError):
                    raise TokenError(f"Secret Manager returned an unreadable payload for {secret}") from None
                if not value:
                    raise TokenError(f"secret {secret} is empty")
                if denied_at is not None and on_wait:
                    on_wait(f"the secret grant propagated after {duration(time.monotonic() - denied_at)} of "
                            "HTTP 401/403")
                return value
            if status in (401, 403) and iam_wait_s > 0:
                denied_at = time.monotonic() if denied_at is None else denied_at
                waited = time.monotonic() - denied_at
                if waited >= iam_wait_s:
                    raise TokenError(f"Secret Manager still refuses {secret} with HTTP {status} after "
                                     f"{duration(waited)}: {grant_hint}")
                if on_wait:
                    on_wait(f"waiting for the secret grant to propagate (HTTP {status}, {duration(waited)})")
                time.sleep(iam_poll_s)
                continue
            if status in REFUSED:
                what = ("no such secret or no enabled version" if status in (400, 404) else _message(body))
                raise TokenError(f"Secret Manager refused {secret} with HTTP {status} ({what}): {grant_hint}")
        elif status in REFUSED or (status and status < 500 and status != 429):
            raise TokenError(f"the metadata server refused an access token with HTTP {status} "
                             f"({metadata_url + TOKEN_PATH}): {token_hint}")
        if attempt >= attempts:
            if bearer is None:
                raise TokenError(f"could not get an access token from the metadata server ({metadata_url + TOKEN_PATH}:"
                                 f" {_describe(status)} after {attempts} attempts); Secret Manager was not asked")
            raise TokenError(f"Secret Manager unavailable after {attempts} attempts (last {_describe(status)})")
        where = "the metadata server's access-token request" if bearer is None else "Secret Manager"
        print(f"hf_token: {where} answered {_describe(status)} (attempt {attempt}/{attempts}); retrying in "
              f"{delay:g}s", file=sys.stderr)
        time.sleep(delay)
        delay *= 2
        attempt += 1


def write_private(path: str, value: str) -> None:
    """Write `value` to `path` readable by its owner only (created 0400, never briefly wider)."""
    if os.path.exists(path):
        os.chmod(path, 0o600)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "w") as out:
        out.write(value)
    os.chmod(path, 0o400)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Copy a Secret Manager secret (the HF token) into a private file.")
    parser.add_argument("--secret", required=True, help="projects/P/secrets/S")
    parser.add_argument("--out", required=True, help="file to write (mode 0400)")
    parser.add_argument("--metadata-url", default=METADATA_URL)
    parser.add_argument("--secret-manager-url", default=SECRET_MANAGER_URL)
    parser.add_argument("--attempts", type=int, default=ATTEMPTS)
    parser.add_argument("--retry-delay", type=float, default=RETRY_DELAY_S)
    args = parser.parse_args(argv)
    try:
        write_private(args.out, read_secret(args.secret, args.metadata_url, args.secret_manager_url, args.attempts,
                                            args.retry_delay))
    except (TokenError, OSError) as err:
        print(f"hf_token: {err}", file=sys.stderr)
        return 1
    print(f"hf_token: wrote the latest version of {args.secret} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
