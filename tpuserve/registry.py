"""A container image tag -> the digest it names now, from the registry itself (Docker Registry HTTP API v2).

`tpuserve up` pins a tag the user named (`containerImage: vllm/vllm-tpu:nightly`) to its digest before deploying,
so every boot of that deploy runs the same image although the tag moves daily; the default image is already a digest
(facts.VLLM_TPU_IMAGE). The protocol, from the registry specs (distribution/distribution docs/spec/api.md and
docs/spec/auth/token.md; Docker's reference/api/registry/auth):

- `HEAD /v2/<name>/manifests/<tag>` with an `Accept` of the manifest types (OCI index and manifest, Docker manifest
  list and v2 manifest: a multi-arch image answers with its index); the digest is the `Docker-Content-Digest` header.
- A `401` carries `WWW-Authenticate: Bearer realm="...",service="...",scope="repository:<name>:pull"`; an anonymous
  `GET realm?service=...&scope=...` gives `{"token": ...}` (Docker Hub; some registries say `access_token`), sent
  again as `Authorization: Bearer`.
- Errors are `{"errors": [{"code": "MANIFEST_UNKNOWN" | "NAME_UNKNOWN" | "UNAUTHORIZED" | ..., "message": ...}]}`.

Docker Hub names: an image without a registry host is on registry-1.docker.io, one without a namespace is
`library/<name>` (docker/distribution reference normalisation).

    python -m tpuserve.registry vllm/vllm-tpu:nightly     # prints the pinned reference (a deliberate update)
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass

import requests

DOCKER_HUB = "registry-1.docker.io"
MANIFEST_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json",
                  "application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
TIMEOUT_S = 30.0
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(RuntimeError):
    """The registry could not say what the tag names; the message is one line for the user."""


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port]
    repository: str
    tag: str = ""
    digest: str = ""

    @classmethod
    def parse(cls, text: str) -> Reference:
        name, _, digest = text.partition("@")
        first, slash, rest = name.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, rest
        else:
            registry, path = DOCKER_HUB, name
        repository, _, tag = path.rpartition(":") if ":" in path else (path, "", "")
        if registry == DOCKER_HUB and "/" not in repository:
            repository = f"library/{repository}"
        if not repository or (digest and not DIGEST.match(digest)):
            raise RegistryError(f"{text!r} is not an image reference like vllm/vllm-tpu:nightly or "
                                "vllm/vllm-tpu@sha256:<64 hex>")
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


def error_words(response: requests.Response) -> str:
    try:
        errors = response.json().get("errors") or []
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or response.reason
    except ValueError:
        return response.reason or f"HTTP {response.status_code}"


def resolve(image: str, registry_url: str = "", session: requests.Session | None = None) -> str:
    """`image` pinned to the digest its tag names now (an image already pinned is returned as it is).
    `registry_url` replaces https://<registry host> (tests point it at a fake on 127.0.0.1)."""
    reference = Reference.parse(image)
    if reference.digest:
        return image
    base = (registry_url or f"https://{reference.registry}").rstrip("/")
    url = f"{base}/v2/{reference.repository}/manifests/{reference.tag}"
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    owned = session is None
    session = session or requests.Session()
    try:
        response = session.head(url, headers=headers, timeout=TIMEOUT_S)
        if response.status_code == 401:
            token = bearer_token(session, response.headers.get("WWW-Authenticate", ""), reference.repository)
            headers["Authorization"] = f"Bearer {token}"
            response = session.head(url, headers=headers, timeout=TIMEOUT_S)
        digest = response.headers.get("Docker-Content-Digest", "")
        if response.status_code == 200 and not digest:  # HEAD without the header: the digest of the body
            response = session.get(url, headers=headers, timeout=TIMEOUT_S)
            digest = "sha256:" + hashlib.sha256(response.content).hexdigest() if response.status_code == 200 else ""
    except requests.RequestException as err:
        raise RegistryError(f"could not reach {reference.registry} to pin {image} ({type(err).__name__}); retry, "
                            "or pin containerImage to a digest yourself (image@sha256:...)") from err
    finally:
        if owned:
            session.close()
    if response.status_code == 404:
        raise RegistryError(f"{image}: no such tag or repository on {reference.registry}; check containerImage")
    if response.status_code != 200:
        raise RegistryError(f"{image}: {reference.registry} answered HTTP {response.status_code} "
                            f"({error_words(response)})")
    if not DIGEST.match(digest):
        raise RegistryError(f"{image}: {reference.registry} gave no sha256 digest ({digest!r})")
    return reference.pinned(digest, image)


def pin_for_deploy(configured: str, registry_url: str = "") -> str | None:
    """What `tpuserve up` sets containerImage to for this deploy: the tag the stack names, pinned to its digest now;
    None when there is nothing to pin (the default, already a digest, or an image given with its digest)."""
    if not configured or "@" in configured:
        return None
    return resolve(configured, registry_url)


if __name__ == "__main__":
    try:
        print(resolve(sys.argv[1]))
    except (RegistryError, IndexError) as err:
        sys.exit(f"Error: {err}")
