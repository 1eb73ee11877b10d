"""The `tpuserve` command line. Subcommands load on first use, so `tpuserve --help` stays fast."""

from __future__ import annotations

import importlib

import click

# name -> ("module:attribute" of a click command, its short help). The help is repeated here so listing the
# commands imports none of them (tests/test_cli.py keeps it equal to each command's own); each module imports
# heavy libraries inside its commands only.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("tpuserve.measure.bench:bench",
              "Measure an endpoint with `vllm bench serve` and report throughput, latency and $ per million tokens."),
    "cost": ("tpuserve.measure.cost:cost",
             "Breakeven throughput against an API price, the cost of a cold start, and what a session yields."),
    "diagnose": ("tpuserve.observe.logs:diagnose", ("Ask a model why a deployment failed, from its logs and the gate's "
                                            "stage and reason (tokens redacted).")),
    "fleet": ("tpuserve.ops.fleet:fleet",
              "Replicas across zones behind a LiteLLM router, renewed before flex-start deletes them: up, status, renew."),
    "gate": ("tpuserve.observe.gate:gate", "Wait until a deployment really serves; exit 0 only then."),
    "litellm": ("tpuserve.deploy.litellm_config:litellm",
                "Print a LiteLLM proxy config mapping the aliases to the deployment (`> litellm_config.yaml`)."),
    "logs": ("tpuserve.observe.logs:logs", "Print the VM's serial console and the vLLM container's logs."),
    "plan": ("tpuserve.measure.plan:plan",
             "KV bytes per token, resident KV tokens and how many full-length contexts fit in HBM."),
    "preflight": ("tpuserve.deploy.preflight:preflight_command",
                  "Check what would stop a deploy: APIs, machine type per zone, TPU quota, token secret, permissions."),
    "probe": ("tpuserve.measure.probe:probe",
              "Probe a deployment's capabilities: tools, structured output, vision; compare KV-cache settings."),
    "up": ("tpuserve.ops.up:up",
           "Deploy a stack: find a zone with TPU capacity (preflight, then `pulumi up` zone by zone), clean up."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module, attribute = SUBCOMMANDS[name][0].split(":")
        return getattr(importlib.import_module(module), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's command list, from SUBCOMMANDS: click's own would import every command for its help."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        with formatter.section("Commands"):
            formatter.write_dl([(name, click.Command(name, help=SUBCOMMANDS[name][1]).get_short_help_str(limit))
                                for name in names])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tpu-serve")
def main() -> None:
    """Operate a vLLM endpoint on a flex-start Cloud TPU VM: up, gate, bench, cost, plan, probe."""
