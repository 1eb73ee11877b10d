"""The `tpuserve` command line. Subcommands load on first use, so `tpuserve --help` stays fast."""

from __future__ import annotations

import importlib

import click

# name -> "module:attribute" of a click command; each module imports heavy libraries inside its commands only.
SUBCOMMANDS: dict[str, str] = {
    "bench": "tpuserve.bench:bench",
    "cost": "tpuserve.cost:cost",
    "diagnose": "tpuserve.logs:diagnose",
    "gate": "tpuserve.gate:gate",
    "litellm": "tpuserve.litellm_config:litellm",
    "logs": "tpuserve.logs:logs",
    "plan": "tpuserve.plan:plan",
    "probe": "tpuserve.probe:probe",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module, attribute = SUBCOMMANDS[name].split(":")
        return getattr(importlib.import_module(module), attribute)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tpu-serve")
def main() -> None:
    """Operate a vLLM endpoint on a flex-start Cloud TPU VM: gate, bench, cost, plan, probe."""
