"""`tpuserve destroy`: `pulumi destroy`, then what is left of the stack in the project and what it bills.

`pulumi destroy` deletes what the state holds. What it keeps on purpose (with `keepCaches`, the default: the cache
disks and the compile-cache bucket, for the next deployment) and what it never knew (a VM whose create timed out, a
disk a failed zone left) go on billing without a word in its output. So the inventory (deploy/inventory.py) closes
the run: each kept cache with its monthly price and the command that removes it, each orphan too; orphans that bill
are deleted once the user agrees (or with --yes), else the command exits 5.

Before anything is destroyed, the stack's own Cloud NATs are checked for VMs of other stacks that reach the internet
through them (one NAT per network and region, deploy/nat.py): destroying the owner takes their egress until their
next `tpuserve up` makes a NAT there. Such a destroy is refused unless the user agrees (or --despite-nat-users).

Exit codes: 0 destroyed, nothing billing left but what is kept on purpose; 1 the destroy failed; 2 nothing destroyed:
other stacks' VMs use the stack's Cloud NAT; 5 destroyed, but an orphan that bills is left.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tpuserve import cli, exits
from tpuserve.deploy.preflight import Endpoints, endpoint_option
from tpuserve.deploy.pulumi_cli import PulumiCli, PulumiError

DESTROY_TIMEOUT_S = 30 * 60.0


@click.command("destroy", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--stack", required=True, help="Pulumi stack to destroy.")
@click.option("--yes", is_flag=True, help="Delete orphans that bill without asking (kept caches stay).")
@click.option("--cwd", type=click.Path(file_okay=False, exists=True, path_type=Path), default=".",
              show_default=True, help="The Pulumi project directory.")
@click.option("--despite-nat-users", is_flag=True, help="Destroy even when VMs of other stacks reach the internet "
              "through this stack's Cloud NAT (they lose it until another stack makes one in their region).")
@click.option("--json", "as_json", is_flag=True, help="End with one JSON document: the outcome and the inventory.")
@endpoint_option
@click.argument("pulumi_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- PULUMI DESTROY FLAGS]")
def destroy(stack: str, yes: bool, cwd: Path, despite_nat_users: bool, as_json: bool, endpoints: tuple[str, ...],
            pulumi_args: tuple[str, ...]) -> None:
    """`pulumi destroy` a stack, then list what is left of it in the project (kept caches, orphans) and what it
    bills. Refused while VMs of other stacks use the stack's Cloud NAT, unless confirmed or --despite-nat-users.
    Exit 0 done, 1 the destroy failed, 2 nothing destroyed (NAT users), 5 an orphan that bills is left."""
    from rich.console import Console

    from tpuserve.deploy import inventory
    from tpuserve.gce import MissingCredentials, adc_session

    console = Console(stderr=True)

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    roots = Endpoints.parse(endpoints)
    try:
        pulumi = PulumiCli(stack, cwd, echo=lambda line: click.echo(f"  │ {line}", err=True))
        config = pulumi.config()
    except PulumiError as err:
        raise click.ClickException(str(err)) from err
    cloud = config.get("target", "gcp") != "local" and bool(config.get("project"))
    session = None
    if cloud:
        try:
            session = adc_session()
        except MissingCredentials as err:
            say(f"warning: no inventory and no Cloud NAT check ({err})")
    if session is not None and not despite_nat_users:
        users = nat_users(pulumi, stack, str(config["project"]), session, roots, say)
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
            clients = inventory.clients_for(session, roots)
            stock = inventory.stock_of(pulumi, clients, str(config["project"]),
                                       inventory.keep_caches(config))
            for line in inventory.summary_lines(stock):
                say(line)
            orphans = stock.billing_orphans
            if orphans and (yes or (sys.stdin.isatty() and click.confirm(
                    f"Delete these {len(orphans)} orphan(s)?", default=True, err=True))):
                for line in inventory.delete_items(clients, stock.project, orphans):
                    say(f"warning: could not delete {line}")
                stock = inventory.stock_of(pulumi, clients, str(config["project"]),
                                           inventory.keep_caches(config))
                for line in inventory.summary_lines(stock):
                    say(line)
        kept = [item for item in stock.items if item.status == inventory.KEPT] if stock else []
        if kept:
            say(f"kept on purpose (keepCaches): ${sum(i.per_month for i in kept):.2f}/month; to delete them too: "
                f"tpuserve cache rm --stack {stack} --project {config['project']} --bucket")
        if stock is not None and stock.billing_orphans and code == exits.OK:
            say(f"Error: {len(stock.billing_orphans)} orphan(s) that bill are left (above, each with the "
                "command that removes it); run again with --yes to delete them")
            code = exits.ORPHANS
    cli.finish(code, stack, {"inventory": None if stock is None else stock.as_dict()}, as_json)


def nat_users(pulumi: PulumiCli, stack: str, project: str, session: Any, roots: Endpoints,
              say: Callable[[str], None]) -> list[str]:
    """What `nat.reliance` says of the stack's own Cloud NATs: one line per NAT that VMs of other stacks use. Nothing
    when the stack holds no NAT; a warning and nothing when the state or the project cannot be read."""
    import requests

    from tpuserve.deploy import nat
    from tpuserve.gce import ComputeApiError
    from tpuserve.names import stack_labels

    try:
        found = nat.reliance_on(pulumi.export(), session, project, [stack_labels(stack)["stack"]], roots.compute)
    except (PulumiError, ComputeApiError, requests.RequestException, ValueError) as err:
        say(f"warning: could not tell which VMs use the stack's Cloud NAT ({err})")
        return []
    return found.lines(stack)
