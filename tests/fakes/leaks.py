"""Leak checks that catch a partial redaction: a log line holding a token's first 12 characters leaks it as surely
as one holding all of it."""

from __future__ import annotations

FRAGMENT = 12


def leaked(secret: str, text: str, size: int = FRAGMENT) -> list[str]:
    """Every `size`-character piece of `secret` that occurs in `text` (all of it, when shorter than `size`)."""
    if len(secret) <= size:
        return [secret] if secret in text else []
    return [secret[i:i + size] for i in range(len(secret) - size + 1) if secret[i:i + size] in text]
