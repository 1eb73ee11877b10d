"""After `tpuserve up` deployed: create the alert policies that waited for their metrics, within a bound; nothing
here fails the deploy (docs/design/alerts.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from tpuserve.alert_metrics import look
from tpuserve.deploy.pulumi_cli import PulumiCli

WAIT_S = 900.0  # the Ops Agent installs, exports, and its metrics settle (docs/design/alerts.md)
POLL_S = 30.0
UP_TIMEOUT_S = 900.0
sleep, monotonic = time.sleep, time.monotonic  # the fake cloud's clock in tests


def create_pending_alerts(pulumi: PulumiCli, stack: str, session: Any, monitoring_url: str, extra: Sequence[str],
                          say: Callable[[str], None]) -> dict[str, Any] | None:
    """The stack's `alerts` output after this step (None for a stack without alert policies)."""
    outputs = pulumi.outputs()
    alerts = outputs.get("alerts")
    if not isinstance(alerts, dict) or not alerts.get("pending"):
        return alerts if isinstance(alerts, dict) else None
    types = list(alerts.get("metrics") or ())
    say(f"alert policies {', '.join(alerts['pending'])} wait for their metrics ({alerts.get('reason') or 'unknown'});"
        f" waiting up to {WAIT_S / 60:.0f} min for the Ops Agent's samples to settle in Cloud Monitoring (Ctrl-C "
        "leaves them pending: a later `tpuserve up` creates them)")
    try:
        deadline = monotonic() + WAIT_S
        while True:
            presence = look(session, str(outputs.get("project", "")), types, monitoring_url)
            if set(types) <= set(presence.ready) or monotonic() + POLL_S > deadline:
                break
            sleep(POLL_S)
    except KeyboardInterrupt:
        return still_pending(alerts, "the wait was interrupted", stack, say)
    if not set(types) <= set(presence.ready):
        return still_pending(alerts, presence.reason, stack, say)
    say("the vLLM metrics are in Cloud Monitoring: pulumi up again, to create the alert policies")
    run = pulumi.up(extra, UP_TIMEOUT_S)
    after = pulumi.outputs().get("alerts") if run.ok else None
    if not isinstance(after, dict):
        errors = [line.strip() for line in run.output.splitlines()
                  if "error" in line.lower() and not line.strip().endswith("update failed")]
        return still_pending(alerts, f"pulumi up failed (exit {run.returncode}): "
                                     f"{errors[-1] if errors else 'see its output above'}", stack, say)
    if after.get("pending"):
        return still_pending(after, after.get("reason") or "", stack, say)
    say(f"alert policies created: {', '.join(after.get('created') or ())}")
    return after


def still_pending(alerts: dict[str, Any], reason: str, stack: str, say: Callable[[str], None]) -> dict[str, Any]:
    say(f"alerts pending ({', '.join(alerts.get('pending') or ())}): {reason}. The model serves; the next `tpuserve "
        f"up --stack {stack}` (or `pulumi up`) creates them once the vLLM metrics are in Cloud Monitoring")
    return {**alerts, "reason": reason}
