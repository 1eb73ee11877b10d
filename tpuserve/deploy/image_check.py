"""`tpuserve images check`: does the container image a deploy would pull still resolve on its registry? Exit 1
when the registry says it is gone; a registry that cannot be asked is a warning, exit 0."""

from __future__ import annotations

from pathlib import Path

import click

from tpuserve import cli
from tpuserve.cli import Failure, echo_json, json_option
from tpuserve.deploy.preflight import Endpoints, endpoint_option
from tpuserve.facts import VLLM_TPU_IMAGE, VLLM_TPU_IMAGE_EVIDENCE, VLLM_TPU_IMAGE_VLLM
from tpuserve.registry import ABSENT, OK, UNKNOWN, Located, RegistryError, locate

LABEL = {OK: "ok", ABSENT: "fail", UNKNOWN: "warning"}


@click.group("images")
def images() -> None:
    """The vLLM TPU image: whether the pinned digest (or a stack's containerImage) still resolves."""


@images.command("check")
@click.option("--stack", help="Check this Pulumi stack's containerImage (the pinned default when it sets none).")
@click.option("--image", help="Check this image reference instead (a tag or IMAGE@sha256:...).")
@cli.cwd_option
@json_option
@endpoint_option
def check(stack: str | None, image: str | None, cwd: Path, as_json: bool, endpoints: tuple[str, ...]) -> None:
    """Ask the image's registry whether the image still resolves (default: the pinned one, with its evidence)."""
    if stack and image:
        raise click.UsageError("give --stack or --image, not both")
    from tpuserve.deploy.pulumi_cli import open_stack

    # a stack's image is the one its next deploy pulls: its containerImage, else the pinned default
    target = image or (str(open_stack(stack, cwd)[1].get("containerImage") or "") if stack else "") or VLLM_TPU_IMAGE
    try:
        found: Located = locate(target, Endpoints.parse(endpoints).registry)
    except RegistryError as err:
        raise click.UsageError(f"{'--image' if image else 'containerImage'}: {err}") from err
    pinned = target == VLLM_TPU_IMAGE
    document = {"ok": found.status != ABSENT, "image": target, "status": found.status, "detail": found.detail,
                "digest": found.digest or None,
                "evidence": {**VLLM_TPU_IMAGE_EVIDENCE, "vllm": VLLM_TPU_IMAGE_VLLM} if pinned else None}
    if found.status == ABSENT:
        raise Failure(f"{target}: {found.detail}", {k: v for k, v in document.items() if k != "ok"})
    if as_json:
        echo_json(document)
        return
    click.echo(f"{LABEL[found.status]:<8} {target}: {found.detail}")
    if pinned:
        e = VLLM_TPU_IMAGE_EVIDENCE
        click.echo(f"pinned for: {e['ran']} served on one {e['machine_type']} ({e['where']}), ready after "
                   f"{e['ready_s']} s, {e['date']}, vLLM {VLLM_TPU_IMAGE_VLLM}: {e['source']}")
