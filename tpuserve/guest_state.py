"""Read the boot's state out of a VM's guest attributes (the format: tpuserve/facts.py GUEST_STATE_*; the writer:
vm/guest_state.py), so the gate, `status` and `diagnose` read one flat shape."""

from __future__ import annotations

import json
from collections.abc import Mapping

from tpuserve.facts import GUEST_STATE_KEY


def expand(attributes: Mapping[str, str]) -> dict[str, str]:
    """Flat key -> value, the state's fields over keys written on their own (an older supervisor did); a state that
    does not parse (half-written) is ignored, not an error: the next poll reads it whole."""
    flat = {key: value for key, value in attributes.items() if key != GUEST_STATE_KEY}
    try:
        state = json.loads(attributes.get(GUEST_STATE_KEY) or "{}")
    except ValueError:
        state = {}
    if isinstance(state, dict):
        flat.update({str(key): str(value) for key, value in state.items()})
    return flat
