"""Docker commands on the VM over IAP ssh (the VM has no external IP); `bench --remote` and `logs` use them.

Docker on the VM comes from apt and OS Login users are not in the docker group, so every call runs under sudo.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence


def docker_over_iap(vm: str, zone: str | None, project: str | None, docker_args: Sequence[str]) -> list[str]:
    """gcloud argv that runs `sudo docker <docker_args>` on `vm`; one quoted --command survives the remote shell.
    Without zone or project, gcloud's configured defaults apply."""
    argv = ["gcloud", "compute", "ssh", vm]
    if zone:
        argv += ["--zone", zone]
    if project:
        argv += ["--project", project]
    return [*argv, "--tunnel-through-iap", "--command", shlex.join(["sudo", "docker", *docker_args])]
