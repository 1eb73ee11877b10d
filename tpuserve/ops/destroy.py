"""`tpuserve destroy`: `pulumi destroy`, then what is left of the stack in the project and what it bills.

`pulumi destroy` deletes what the state holds. What it keeps on purpose (with `keepCaches`, the default: the cache
disks and the compile-cache bucket, for the next deployment) and what it never knew (a VM whose create timed out, a
disk a failed zone left) go on billing without a word in its output. So the inventory (deploy/inventory.py) closes
the run: each kept cache with its monthly price and the command that removes it, each orphan too; orphans that bill
are deleted once the user agrees (or with --yes), else the command exits 5.

Exit codes: 0 destroyed, nothing billing left but what is kept on purpose; 1 the destroy failed; 5 destroyed, but
an orphan that bills is left.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tpuserve.deploy.preflight import Endpoints, endpoint_option
from tpuserve.deploy.pulumi_cli import PulumiCli, PulumiError

EXIT_OK, EXIT_FAILED, EXIT_ORPHANS = 0, 1, 5
DESTROY_TIMEOUT_S = 30 * 60.0


@click.command("destroy", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--stack", required=True, help="Pulumi stack to destroy.")
@click.option("--yes", is_flag=True, help="Delete orphans that bill without asking (kept caches stay).")
@click.option("--cwd", type=click.Path(file_okay=False, exists=True, path_type=Path), default=".",
              show_default=True, help="The Pulumi project directory.")
@click.option("--json", "as_json", is_flag=True, help="End with one JSON document: the outcome and the inventory.")
@endpoint_option
@click.argument("pulumi_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- PULUMI DESTROY FLAGS]")
def destroy(stack: str, yes: bool, cwd: Path, as_json: bool, endpoints: tuple[str, ...],
            pulumi_args: tuple[str, ...]) -> None:
    """`pulumi destroy` a stack, then list what is left of it in the project (kept caches, orphans) and what it
    bills. Exit 0 done, 1 the destroy failed, 5 an orphan that bills is left."""
    from rich.console import Console

    from tpuserve.deploy import inventory
    from tpuserve.deploy.gce import MissingCredentials, adc_session

    console = Console(stderr=True)

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    roots = Endpoints.parse(endpoints)
    try:
        pulumi = PulumiCli(stack, cwd, echo=lambda line: click.echo(f"  │ {line}", err=True))
        config = pulumi.config()
    except PulumiError as err:
        raise click.ClickException(str(err)) from err
    run = pulumi.stream(["destroy", "--yes", "--skip-preview", *pulumi_args], DESTROY_TIMEOUT_S)
    code = EXIT_OK if run.ok else EXIT_FAILED
    say(f"pulumi destroy -s {stack}: {'done' if run.ok else f'failed (exit {run.returncode})'}")
    stock = None
    if config.get("target", "gcp") != "local" and config.get("project"):
        try:
            session = adc_session()
        except MissingCredentials as err:
            say(f"warning: no inventory ({err})")
        else:
            with session:
                clients = inventory.clients_for(session, roots)
                stock = inventory.stock_of(pulumi, [stack], clients, str(config["project"]),
                                           inventory.keep_caches(config))
                for line in inventory.summary_lines(stock):
                    say(line)
                orphans = stock.billing_orphans
                if orphans and (yes or (sys.stdin.isatty() and click.confirm(
                        f"Delete these {len(orphans)} orphan(s)?", default=True, err=True))):
                    for line in inventory.delete_items(clients, stock.project, orphans):
                        say(f"warning: could not delete {line}")
                    stock = inventory.stock_of(pulumi, [stack], clients, str(config["project"]),
                                               inventory.keep_caches(config))
                    for line in inventory.summary_lines(stock):
                        say(line)
            kept = [item for item in stock.items if item.status == inventory.KEPT] if stock else []
            if kept:
                say(f"kept on purpose (keepCaches): ${sum(i.per_month for i in kept):.2f}/month; to delete them too: "
                    f"tpuserve cache rm --stack {stack} --project {config['project']} --bucket")
            if stock is not None and stock.billing_orphans and code == EXIT_OK:
                say(f"Error: {len(stock.billing_orphans)} orphan(s) that bill are left (above, each with the "
                    "command that removes it); run again with --yes to delete them")
                code = EXIT_ORPHANS
    if as_json:
        from tpuserve.cli import echo_json

        echo_json({"ok": code == EXIT_OK, "stack": stack, "exit": code,
                   "inventory": None if stock is None else stock.as_dict()})
    raise SystemExit(code)
