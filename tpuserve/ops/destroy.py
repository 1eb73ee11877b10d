"""`tpuserve destroy`: `pulumi destroy`, refused while other stacks' VMs use its Cloud NAT, then what is left of the
stack and what it bills (docs/design/inventory.md#tpuserve-destroy)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import requests

from tpuserve import cli, exits
from tpuserve.deploy import inventory, nat
from tpuserve.deploy.preflight import Endpoints, endpoint_option
from tpuserve.deploy.pulumi_cli import PulumiError, echo_indented, open_stack
from tpuserve.gce import ComputeApiError
from tpuserve.names import stack_labels
from tpuserve.ops.up import orphan_confirmation, stderr_console

DESTROY_TIMEOUT_S = 30 * 60.0


@click.command("destroy", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--stack", required=True, help="Pulumi stack to destroy.")
@click.option("--yes", is_flag=True, help="Delete orphans that bill without asking (kept caches stay).")
@cli.cwd_option
@click.option("--despite-nat-users", is_flag=True, help="Destroy even when VMs of other stacks reach the internet "
              "through this stack's Cloud NAT (they lose it until another stack makes one in their region).")
@click.option("--json", "as_json", is_flag=True, help="End with one JSON document: the outcome and the inventory.")
@endpoint_option
@click.argument("pulumi_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- PULUMI DESTROY FLAGS]")
def destroy(stack: str, yes: bool, cwd: Path, despite_nat_users: bool, as_json: bool, endpoints: tuple[str, ...],
            pulumi_args: tuple[str, ...]) -> None:
    """`pulumi destroy` a stack, then list what is left of it in the project (kept caches, orphans) and what it
    bills. Refused while VMs of other stacks use the stack's Cloud NAT, unless confirmed or --despite-nat-users.
    Exit 0 done, 1 the destroy failed, 6 nothing destroyed (NAT users), 5 an orphan that bills is left."""
    from tpuserve.gce import MissingCredentials, adc_session

    _, say = stderr_console()
    roots = Endpoints.parse(endpoints)
    pulumi, config = open_stack(stack, cwd, echo_indented)
    session = None
    if config.get("target", "gcp") != "local" and config.get("project"):
        try:
            session = adc_session()
        except MissingCredentials as err:
            say(f"warning: no inventory and no Cloud NAT check ({err})")
    if session is not None and not despite_nat_users:
        try:  # one line per NAT of the stack's own that VMs of other stacks use
            users = nat.reliance_on(pulumi.export(), session, str(config["project"]), [stack_labels(stack)["stack"]],
                                    roots.compute).lines(stack)
        except (PulumiError, ComputeApiError, requests.RequestException, ValueError) as err:
            say(f"warning: could not tell which VMs use the stack's Cloud NAT ({err})")
            users = []
        for line in users:
            say(f"warning: {line}")
        if users and not (sys.stdin.isatty() and click.confirm(f"Destroy {stack} anyway?", default=False, err=True)):
            raise cli.Failure(f"nothing destroyed: VMs of other stacks use {stack}'s Cloud NAT (above); destroy those "
                              "stacks first, or run again with --despite-nat-users",
                              {"stack": stack, "natUsers": users}, exits.NAT_USERS)
    run = pulumi.stream(["destroy", "--yes", "--skip-preview", *pulumi_args], DESTROY_TIMEOUT_S)
    code = exits.OK if run.ok else exits.FAILED
    say(f"pulumi destroy -s {stack}: {'done' if run.ok else f'failed (exit {run.returncode})'}")
    stock = None
    if session is not None:
        with session:
            code, stock = inventory.close_run(pulumi, config, session, roots, orphan_confirmation(yes), say, code,
                                              "tpuserve destroy")
        kept = [item for item in stock.items if item.status == inventory.KEPT] if stock else []
        if kept:
            say(f"kept on purpose (keepCaches): ${sum(i.per_month for i in kept):.2f}/month; to delete them too: "
                f"tpuserve cache rm --stack {stack} --project {config['project']} --bucket")
    cli.finish(code, stack, {"inventory": None if stock is None else stock.as_dict()}, as_json)

