"""GCP zone and region names: their shape, and a zone's region."""

from __future__ import annotations

import re

REGION_NAME = r"[a-z]+-[a-z]+[0-9]+"  # us-east5
ZONE_NAME = rf"{REGION_NAME}-[a-z0-9]+"  # us-east5-b
ZONE_FORMAT = re.compile(rf"^{ZONE_NAME}$")
REGION_FORMAT = re.compile(rf"^{REGION_NAME}$")


def region_of(zone: str) -> str:
    """'europe-west4-a' -> 'europe-west4' (a zone's name is its region's plus one part)."""
    return zone.rsplit("-", 1)[0]
