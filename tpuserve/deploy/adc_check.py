"""`python -m tpuserve.deploy.adc_check`: exit 0 when Google application-default credentials exist, else the fix
on one line and exit 1 (scripts/up.sh runs it before `pulumi up`; nothing is sent to Google)."""

from __future__ import annotations

import logging
import sys

from tpuserve import gce


def main() -> int:
    # google.auth warns for each place it looked: those lines would bury the one that says what to do
    logging.getLogger("google.auth").addHandler(logging.NullHandler())
    logging.getLogger("google.auth").propagate = False
    try:
        gce.adc_session()
    except gce.MissingCredentials as err:
        print(f"Error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
