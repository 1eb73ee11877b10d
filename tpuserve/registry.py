"""Container images on their registry (OCI distribution API): a tag pinned to the digest it names now, and whether
a pinned image still resolves (docs/design/core.md#container-images).

    python -m tpuserve.registry vllm/vllm-tpu:nightly     # prints the pinned reference (a deliberate update)
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the config's digest check (serving.py) imports this module, and needs no HTTP client
    import requests

DOCKER_HUB = "registry-1.docker.io"
MANIFEST_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json",
                  "application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
TIMEOUT_S = 30.0
# OCI image-spec descriptor.md "Digests": lowercase hex of these lengths; refused at config time, not into a boot.
DIGEST_HEX = {"sha256": 64, "sha512": 128}
# distribution-spec "Error Codes": what a registry says when the image is not there (a pull cannot succeed).
ABSENT_CODES = ("MANIFEST_UNKNOWN", "NAME_UNKNOWN")
OK, ABSENT, UNKNOWN = "ok", "absent", "unknown"
CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(RuntimeError):
    """The registry could not say what the tag names; the message is one line for the user."""


def digest_problem(digest: str) -> str | None:
    """Why `digest` is not one docker can pull by, in words; None when it is one."""
    algorithm, colon, encoded = digest.partition(":")
    if not colon or algorithm not in DIGEST_HEX:
        return f"{digest!r} is not sha256:<64 hex digits> (or sha512:<128>)"
    want = DIGEST_HEX[algorithm]
    if len(encoded) != want:
        return f"{algorithm} takes {want} hex digits, got {len(encoded)}"
    if re.fullmatch(r"[0-9a-fA-F]+", encoded) and encoded != encoded.lower():
        return f"{algorithm} digits must be lowercase hex (the OCI image spec forbids A-F)"
    if not re.fullmatch(r"[0-9a-f]+", encoded):
        return f"{algorithm} takes hex digits (0-9, a-f) only"
    return None


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port]
    repository: str
    tag: str = ""
    digest: str = ""

    @classmethod
    def parse(cls, text: str) -> Reference:
        name, at, digest = text.partition("@")
        first, slash, rest = name.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, rest
        else:
            registry, path = DOCKER_HUB, name
        repository, _, tag = path.rpartition(":") if ":" in path else (path, "", "")
        if registry == DOCKER_HUB and "/" not in repository:
            repository = f"library/{repository}"
        if not repository:
            raise RegistryError(f"{text!r} is not an image reference like vllm/vllm-tpu:nightly or "
                                "vllm/vllm-tpu@sha256:<64 hex>")
        problem = digest_problem(digest) if at else None
        if problem:
            raise RegistryError(f"{text!r} has a malformed digest: {problem}; use the digest as the registry prints "
                                "it (`docker buildx imagetools inspect IMAGE`)")
        return cls(registry, repository, tag or ("" if digest else "latest"), digest)

    def pinned(self, digest: str, original: str) -> str:
        """The reference as given, with `@digest`: the tag stays readable, docker pulls by the digest."""
        return f"{original.partition('@')[0]}@{digest}"


def bearer_token(session: requests.Session, challenge: str, repository: str) -> str:
    """An anonymous pull token from the realm a 401's WWW-Authenticate names."""
    scheme, _, params = challenge.partition(" ")
    if scheme.lower() != "bearer":
        raise RegistryError(f"the registry asks for {scheme or 'an unknown'} authentication, which needs "
                            "credentials: pin containerImage to a digest yourself (image@sha256:...)")
    fields = dict(CHALLENGE_PARAM.findall(params))
    if "realm" not in fields:
        raise RegistryError("the registry's 401 names no token realm")
    query = {"service": fields.get("service", ""), "scope": fields.get("scope", f"repository:{repository}:pull")}
    response = session.get(fields["realm"], params=query, timeout=TIMEOUT_S)
    if response.status_code != 200:
        raise RegistryError(f"the token service {fields['realm']} answered HTTP {response.status_code}: a private "
                            "image needs credentials; pin containerImage to a digest yourself (image@sha256:...)")
    body = response.json()
    token = body.get("token") or body.get("access_token")
    if not token:
        raise RegistryError(f"the token service {fields['realm']} gave no token")
    return str(token)


def registry_errors(response: requests.Response) -> list[dict[str, Any]]:
    """The `errors` of a distribution-spec error body; [] for any other body."""
    try:
        errors = response.json().get("errors") or []
    except (ValueError, AttributeError):
        return []
    return [error for error in errors if isinstance(error, dict)]


def error_words(response: requests.Response) -> str:
    words = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in registry_errors(response))
    return words or response.reason or f"HTTP {response.status_code}"


def manifest(reference: Reference, registry_url: str, session: requests.Session | None,
             get_after: Callable[[requests.Response], bool]) -> requests.Response:
    """HEAD the manifest (answering a token challenge), then GET it if `get_after` says so (a HEAD has no body).
    `registry_url` replaces https://<registry host> (a fake in tests)."""
    import requests

    base = (registry_url or f"https://{reference.registry}").rstrip("/")
    url = f"{base}/v2/{reference.repository}/manifests/{reference.digest or reference.tag}"
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    with contextlib.ExitStack() as owned:
        session = session or owned.enter_context(requests.Session())
        response = session.request("HEAD", url, headers=headers, timeout=TIMEOUT_S)
        if response.status_code == 401:
            token = bearer_token(session, response.headers.get("WWW-Authenticate", ""), reference.repository)
            headers["Authorization"] = f"Bearer {token}"
            response = session.request("HEAD", url, headers=headers, timeout=TIMEOUT_S)
        if get_after(response):
            response = session.get(url, headers=headers, timeout=TIMEOUT_S)
        return response


def resolve(image: str, registry_url: str = "", session: requests.Session | None = None) -> str:
    """`image` pinned to the digest its tag names now (an image already pinned is returned as it is)."""
    import requests

    reference = Reference.parse(image)
    if reference.digest:
        return image
    try:  # a HEAD without the digest header: the digest of the body
        response = manifest(reference, registry_url, session,
                            lambda head: head.status_code == 200 and not head.headers.get("Docker-Content-Digest"))
    except requests.RequestException as err:
        raise RegistryError(f"could not reach {reference.registry} to pin {image} ({type(err).__name__}); retry, "
                            "or pin containerImage to a digest yourself (image@sha256:...)") from err
    digest = response.headers.get("Docker-Content-Digest", "")
    if response.status_code == 200 and not digest:
        digest = "sha256:" + hashlib.sha256(response.content).hexdigest()
    if response.status_code == 404:
        raise RegistryError(f"{image}: no such tag or repository on {reference.registry}; check containerImage")
    if response.status_code != 200:
        raise RegistryError(f"{image}: {reference.registry} answered HTTP {response.status_code} "
                            f"({error_words(response)})")
    if digest_problem(digest):
        raise RegistryError(f"{image}: {reference.registry} gave no sha256 digest ({digest!r})")
    return reference.pinned(digest, image)


@dataclass(frozen=True)
class Located:
    """OK (a pull can start), ABSENT (a pull cannot succeed) or UNKNOWN (unreachable, private, off the spec)."""

    image: str
    status: str
    detail: str
    digest: str = ""  # what the registry names the manifest (the pin itself for a pinned image)


def locate(image: str, registry_url: str = "", session: requests.Session | None = None) -> Located:
    """Whether the image's registry holds its manifest; RegistryError only for a malformed reference."""
    import requests

    reference = Reference.parse(image)
    where = reference.registry
    try:  # a 404's error code comes with a GET
        response = manifest(reference, registry_url, session, lambda head: head.status_code == 404)
    except RegistryError as err:  # a private image's token realm refused us: no way to tell
        return Located(image, UNKNOWN, f"could not check on {where}: {err}")
    except requests.RequestException as err:
        return Located(image, UNKNOWN, f"could not reach {where} ({type(err).__name__}); a pull may still work")
    if response.status_code == 200:
        digest = reference.digest or response.headers.get("Docker-Content-Digest", "")
        named = f" (the tag names {digest} now)" if digest and not reference.digest else ""
        return Located(image, OK, f"resolves on {where}{named}", digest)
    if response.status_code == 404 and {str(e.get("code")) for e in registry_errors(response)} & set(ABSENT_CODES):
        what = "digest" if reference.digest else "tag"
        return Located(image, ABSENT, f"{where} has no such {what} or repository ({error_words(response)}): a pull "
                                      "cannot succeed")
    return Located(image, UNKNOWN, f"{where} answered HTTP {response.status_code} ({error_words(response)}); could "
                                   "not tell whether a pull would succeed")


def pin_for_deploy(configured: str, registry_url: str = "") -> str | None:
    """The stack's tag pinned to its digest now, for this deploy; None when it names no tag (or the default)."""
    if not configured or "@" in configured:
        return None
    return resolve(configured, registry_url)


if __name__ == "__main__":
    try:
        print(resolve(sys.argv[1]))
    except (RegistryError, IndexError) as err:
        sys.exit(f"Error: {err}")
