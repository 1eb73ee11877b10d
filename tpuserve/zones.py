"""GCP zone and region names: their shape, and a zone's region."""

from __future__ import annotations

import re

ZONE_FORMAT = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z0-9]+$")
REGION_FORMAT = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")


def region_of(zone: str) -> str:
    """'europe-west4-a' -> 'europe-west4' (a zone's name is its region's plus one part)."""
    return zone.rsplit("-", 1)[0]
