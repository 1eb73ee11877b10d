"""Docker commands on the VM over IAP ssh (no external IP), under sudo (OS Login users are not in the docker group);
`bench --remote` and `logs` use them."""

from __future__ import annotations

import shlex
from collections.abc import Sequence


def docker_over_iap(vm: str, zone: str | None, project: str | None, docker_args: Sequence[str]) -> list[str]:
    """gcloud argv running `sudo docker <docker_args>` on `vm` (no zone or project: gcloud's defaults)."""
    argv = ["gcloud", "compute", "ssh", vm]
    if zone:
        argv += ["--zone", zone]
    if project:
        argv += ["--project", project]
    return [*argv, "--tunnel-through-iap", "--command", shlex.join(["sudo", "docker", *docker_args])]
