"""The probe media shipped with tpuserve, as chat messages and one content part per modality (why they are real
media: docs/design/core.md#probe-media). Standard library only: the VM's renderer and the gate use them."""

from __future__ import annotations

import base64
import io
import wave
from importlib import resources
from typing import Any

IMAGE_DIR = "data/probe-images"
REFUSAL_IMAGE = "red-square.png"
AUDIO_RATE_HZ = 16000
AUDIO_SECONDS = 0.25


def image_bytes(name: str) -> bytes:
    return resources.files("tpuserve").joinpath(IMAGE_DIR, name).read_bytes()


def image_data_uri(name: str) -> str:
    """A shipped probe image as a base64 data URI (external image URLs make probes flaky)."""
    return "data:image/png;base64," + base64.b64encode(image_bytes(name)).decode()


def image_messages(image: str, question: str) -> list[dict[str, Any]]:
    """One user turn asking `question` about the shipped `image`."""
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_data_uri(image)}},
                                         {"type": "text", "text": question}]}]


def silent_wav(seconds: float = AUDIO_SECONDS, rate_hz: int = AUDIO_RATE_HZ) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate_hz)
        wav.writeframes(b"\0\0" * int(seconds * rate_hz))
    return out.getvalue()


def modality_part(modality: str) -> dict[str, Any]:
    """One chat content part carrying `modality` (image, audio or video)."""
    if modality == "image":
        return {"type": "image_url", "image_url": {"url": image_data_uri(REFUSAL_IMAGE)}}
    if modality == "audio":
        return {"type": "input_audio", "input_audio": {"data": base64.b64encode(silent_wav()).decode(),
                                                       "format": "wav"}}
    if modality == "video":
        frame = base64.b64encode(image_bytes(REFUSAL_IMAGE)).decode()
        return {"type": "video_url", "video_url": {"url": f"data:video/jpeg;base64,{frame},{frame}"}}
    raise ValueError(f"no probe media for modality {modality!r}")
