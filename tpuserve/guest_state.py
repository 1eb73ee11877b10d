"""Read the boot's state out of a VM's guest attributes: the one place that knows how the VM writes it.

The VM keeps its whole state in one attribute, `tpu-serve/state` (facts.GUEST_STATE_KEY), a JSON object whose
fields are the names readers always used: stage, config-hash, since, reason, at-<stage>, cache, image, weights,
compile-cache, restarts, supervisor, ops-agent, warning, engines, plus `seq` and `written` (vm/guest_state.py writes it within
Google's guest-attribute budget). `expand` turns the attributes the Compute API returns into that flat mapping, so
the gate, `status` and `diagnose` read one shape. Keys written on their own (an older supervisor did) are kept; the
state's fields win over them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from tpuserve.facts import GUEST_STATE_KEY


def expand(attributes: Mapping[str, str]) -> dict[str, str]:
    """Flat key -> value; a state attribute that does not parse (half-written) is ignored, not an error: the next
    poll reads it whole."""
    flat = {key: value for key, value in attributes.items() if key != GUEST_STATE_KEY}
    try:
        state = json.loads(attributes.get(GUEST_STATE_KEY) or "{}")
    except ValueError:
        state = {}
    if isinstance(state, dict):
        flat.update({str(key): str(value) for key, value in state.items()})
    return flat
