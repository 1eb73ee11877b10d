"""Is this vLLM server ready? /health 200, the model listed, a chat completion with text: `tpuserve gate --url`'s
rules (tests/vm/test_readycheck.py). The gke readiness probe and the supervisor run it; `refusals` is the VM's
disabled-modality check. `python3 readycheck.py --url URL --model M`: exit 0 when ready, one line saying what was found.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

COMPLETION_MAX_TOKENS = 8
PROMPT = "Say hello."
REASONING_FIELDS = ("reasoning_content", "reasoning")  # where vLLM's reasoning parsers put the text


def request(url: str, timeout_s: float, body: dict[str, Any] | None = None, api_key: str = "") -> tuple[int, Any]:
    """(HTTP status, parsed JSON body or None). A refused or timed-out connection raises OSError."""
    data = None if body is None else json.dumps(body).encode()
    headers = {**({"Content-Type": "application/json"} if data else {}),
               **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - a URL we were given
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, None


def _error_text(body: Any) -> str:
    error = body.get("error", body) if isinstance(body, dict) else body
    return str(error.get("message") or error.get("detail") or error if isinstance(error, dict) else error)[:300]


def _health(root: str, model: str, timeout_s: float, api_key: str = "") -> tuple[bool, str]:
    status, _ = request(f"{root}/health", timeout_s)
    return status == 200, f"/health answered HTTP {status}"


def _models(root: str, model: str, timeout_s: float, api_key: str = "") -> tuple[bool, str]:
    status, body = request(f"{root}/v1/models", timeout_s, api_key=api_key)
    if status != 200:
        return False, f"/v1/models answered HTTP {status}"
    entries = body.get("data") if isinstance(body, dict) else None
    listed = [e.get("id") for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    return model in listed, f"/v1/models lists {listed or 'nothing'}, not {model!r}"


def _completion(root: str, model: str, timeout_s: float, api_key: str = "") -> tuple[bool, str]:
    status, body = request(f"{root}/v1/chat/completions", timeout_s, {
        "model": model, "max_tokens": COMPLETION_MAX_TOKENS,
        "messages": [{"role": "user", "content": PROMPT}]}, api_key=api_key)
    if status != 200:
        return False, f"chat completion answered HTTP {status}: {_error_text(body)}"
    try:
        message = body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        message = None
    if not isinstance(message, dict):
        return False, "chat completion answered HTTP 200 without a message"
    # content, or a reasoning field a reasoning parser moved the first tokens to (gate.has_text's rule)
    has_text = any((message.get(field) or "").strip() for field in ("content", *REASONING_FIELDS))
    return has_text, EMPTY_ANSWER


EMPTY_ANSWER = "chat completion returned empty content and no reasoning"


def _answers(root: str, model: str, timeout_s: float, api_key: str = "") -> tuple[bool, str]:
    """The engine answers a completion, whatever its text: an empty reply (random weights give them) is alive."""
    ok, detail = _completion(root, model, timeout_s, api_key)
    return ok or detail == EMPTY_ANSWER, detail


STAGES = (("health", _health), ("models", _models), ("completion", _completion))
ALIVE = (("health", _health), ("completion", _answers))  # after a disabled-modality request: still up, not judged


def check(base_url: str, model: str, timeout_s: float = 10.0, api_key: str = "",
          stages: tuple[tuple[str, Any], ...] = STAGES) -> tuple[bool, str]:
    """(ready, detail): stops at the first stage that fails, which `detail` names. `base_url` may end in /v1."""
    root = base_url.rstrip("/").removesuffix("/v1")
    for name, stage in stages:
        try:
            ok, detail = stage(root, model, timeout_s, api_key)
        except OSError as err:  # refused, reset, timed out (socket.timeout and URLError are OSErrors)
            ok, detail = False, f"no answer ({type(getattr(err, 'reason', err)).__name__})"
        if not ok:
            return False, f"{name}: {detail}"
    return True, f"ready: {model} answered at {root}"


def _refusal(root: str, model: str, modality: str, part: dict[str, Any], timeout_s: float,
             api_key: str = "") -> tuple[bool, str]:
    """(refused with a 4xx, what was answered)."""
    status, body = request(f"{root}/v1/chat/completions", timeout_s, {
        "model": model, "max_tokens": COMPLETION_MAX_TOKENS,
        "messages": [{"role": "user", "content": [part, {"type": "text", "text": "What is this?"}]}]}, api_key=api_key)
    if 400 <= status < 500:
        return True, f"{modality} refused with HTTP {status} ({_error_text(body)[:120]})"
    said = f" ({_error_text(body)[:200]})" if status >= 500 else ""
    return False, (f"a {modality} request, which this deployment cannot serve, answered HTTP {status}{said} instead "
                   "of a 4xx")


@dataclass(frozen=True)
class Refusals:
    """`serving`: it still serves after every request (else `detail` says why); `warnings`: not refused, still up."""

    serving: bool
    detail: str
    warnings: list[str] = field(default_factory=list)


def refusals(base_url: str, model: str, parts: dict[str, dict[str, Any]],
             timeout_s: float = 10.0, api_key: str = "") -> Refusals:
    """One request per disabled modality (`parts`: modality -> a chat content part); why: docs/design/supervisor.md."""
    root = base_url.rstrip("/").removesuffix("/v1")
    said, warnings = [], []
    for modality, part in parts.items():
        try:
            refused, detail = _refusal(root, model, modality, part, timeout_s, api_key)
        except OSError as err:
            refused = False
            detail = f"a {modality} request got no answer ({type(getattr(err, 'reason', err)).__name__})"
        if not refused:
            ready, after = check(root, model, timeout_s, api_key, ALIVE)
            if not ready:
                return Refusals(False, f"{detail}, and then the server no longer served ({after}): one such request "
                                       "can take the engine down")
            warnings.append(f"{detail}; the server still serves")
        said.append(detail)
    ready, detail = check(root, model, timeout_s, api_key, ALIVE)
    if not ready:
        return Refusals(False, f"after the {', '.join(parts)} request(s) the server no longer serves: {detail}")
    return Refusals(True, "; ".join(said) + "; still serving", warnings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One readiness check of a vLLM OpenAI-compatible server.")
    parser.add_argument("--url", required=True, help="server root or its /v1 base URL")
    parser.add_argument("--model", required=True, help="the model name the server must list and answer as")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")
    parser.add_argument("--api-key-env", default="", help="environment variable holding the server's API key")
    args = parser.parse_args(argv)
    ok, detail = check(args.url, args.model, args.timeout, os.environ.get(args.api_key_env, "") if args.api_key_env
                       else "")
    print(detail)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
