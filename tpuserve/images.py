"""The probe images shipped with tpuserve, as chat messages; standard library only, so the VM's startup-script
renderer and the gate can use them without importing the probes."""

from __future__ import annotations

import base64
from importlib import resources
from typing import Any

IMAGE_DIR = "data/probe-images"


def image_data_uri(name: str) -> str:
    """A shipped probe image as a base64 data URI (external image URLs make probes flaky)."""
    data = resources.files("tpuserve").joinpath(IMAGE_DIR, name).read_bytes()
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image_messages(image: str, question: str) -> list[dict[str, Any]]:
    """One user turn asking `question` about the shipped `image`."""
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_data_uri(image)}},
                                         {"type": "text", "text": question}]}]
