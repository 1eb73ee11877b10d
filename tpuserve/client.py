"""A small client for an OpenAI-compatible chat endpoint (vLLM) whose structured output is validated, never
trusted (docs/design/core.md#structured-output)."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import requests

from tpuserve.urls import server_root

API_KEY_ENV = "TPUSERVE_API_KEY"  # the one variable every command reads the server's key from (--api-key-env: another)
DEFAULT_TIMEOUT_S = 120.0
REASONING_FIELDS = ("reasoning_content", "reasoning")  # where vLLM's reasoning parsers put the text, by version
ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


def api_base(url: str) -> str:
    """The OpenAI base URL of a server: its root and /v1."""
    return f"{server_root(url)}/v1"


class EndpointError(RuntimeError):
    """An HTTP error, or a 200 that is no chat completion; with `url` the line names the address asked."""

    def __init__(self, status: int, message: str, latency_s: float, url: str = ""):
        super().__init__(f"{url} answered HTTP {status}: {message}" if url else f"HTTP {status}: {message}")
        self.status, self.message, self.latency_s, self.url = status, message, latency_s, url


class StructuredOutputError(ValueError):
    """A 200 answer that is not the JSON that was asked for; `text` is what came back, from `field`."""

    def __init__(self, message: str, reply: ChatReply, field: str, text: str):
        super().__init__(message)
        self.reply, self.field, self.text = reply, field, text


class SchemaNotEnforced(StructuredOutputError):
    """The server returned 200 but did not constrain the output to the schema (the silent skip)."""


class OutputTruncated(StructuredOutputError):
    """The output hit max_tokens while still a valid JSON prefix: the schema may be enforced but the answer is cut."""


@dataclass(frozen=True)
class ChatReply:
    """One 200 chat completion and how long it took."""

    body: dict[str, Any]
    latency_s: float

    @property
    def message(self) -> dict[str, Any]:
        return self.body["choices"][0]["message"]

    @property
    def finish_reason(self) -> str | None:
        return self.body["choices"][0].get("finish_reason")

    @property
    def content(self) -> str:
        return self.message.get("content") or ""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []

    @property
    def reasoning_field(self) -> str | None:
        return next((f for f in REASONING_FIELDS if (self.message.get(f) or "").strip()), None)

    @property
    def reasoning(self) -> str:
        return self.message[self.reasoning_field] if self.reasoning_field else ""

    @property
    def full_text(self) -> str:
        """Reasoning then content: everything the model generated, however a reasoning parser split it."""
        return self.reasoning + self.content

    def answer(self) -> tuple[str, str]:
        """(field, text): the content, or the reasoning text when a reasoning parser left the content empty."""
        if self.content.strip():
            return "content", self.content
        return (self.reasoning_field, self.reasoning) if self.reasoning_field else ("content", "")


def error_message(response: requests.Response) -> str:
    """The human part of an OpenAI-style error body, or the raw text."""
    try:
        body = response.json()
    except ValueError:
        return " ".join(response.text.split())[:500]
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)
    return str(error)


HTML_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
NOT_VLLM = "is this a vLLM server?"


def html_page(response: requests.Response) -> str | None:
    """"an HTML page ('<title>')" when the body is a web page (no vLLM route answers one), else None."""
    text = response.text.lstrip()
    if "html" not in response.headers.get("Content-Type", "").lower() and not text.startswith("<"):
        return None
    title = HTML_TITLE.search(text)
    return f"an HTML page ('{' '.join(title.group(1).split())[:80]}')" if title else "an HTML page"


def response_error(response: requests.Response, latency_s: float, key_env: str = API_KEY_ENV) -> EndpointError:
    """The EndpointError for a non-200 answer; for a web page or a refused key it names the URL and what to check."""
    url = response.url
    page = html_page(response)
    if page:
        return EndpointError(response.status_code, f"{page}, not JSON: {NOT_VLLM}", latency_s, url)
    if response.status_code in (401, 403):  # a server that wants a key: say what to do about it
        started = "the key the server was started with"
        if response.request is not None and response.request.headers.get("Authorization"):
            hint = f"the key in ${key_env} was refused: set it to {started}"
        else:
            hint = f"no API key was sent (${key_env} is not set): export {key_env}=<{started}>"
        return EndpointError(response.status_code, f"{error_message(response)}; {hint} (vLLM's --api-key or "
                             "VLLM_API_KEY), or name another variable with --api-key-env", latency_s, url)
    return EndpointError(response.status_code, error_message(response), latency_s)


def json_or_none(response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def looks_cut_off(text: str) -> bool:
    """True when `text` is invalid JSON only because it ends too early (a prefix a grammar could have produced)."""
    try:
        json.loads(text)
    except json.JSONDecodeError as err:
        return err.pos >= len(text.rstrip()) or err.msg.startswith("Unterminated string")
    return False


def padding_hint(text: str) -> str:
    """Why a constrained answer never closed, when it is mostly whitespace (the grammar allowed any)."""
    if sum(ch.isspace() for ch in text) * 2 <= len(text):
        return ""
    return ("; it is mostly whitespace: serve with --structured-outputs-config "
            "'{\"disable_any_whitespace\": true}'")


def validated_json(reply: ChatReply, schema: dict[str, Any]) -> Any:
    """The answer's JSON if it conforms to `schema`; otherwise raise SchemaNotEnforced or OutputTruncated."""
    field, text = reply.answer()
    where = "" if field == "content" else f" (the answer was in {field!r}: a reasoning parser took it)"
    if field != "content" and reply.finish_reason == "length":
        raise OutputTruncated("the reasoning did not end within max_tokens (the schema applies after it): "
                              "raise max_tokens", reply, field, text)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        if reply.finish_reason == "length" and looks_cut_off(text):
            raise OutputTruncated(f"output hit max_tokens before the JSON closed{where}{padding_hint(text)}",
                                  reply, field, text) from err
        raise SchemaNotEnforced(f"schema not enforced: the 200 answer is not JSON ({err.msg} at char {err.pos})"
                                f"{where}", reply, field, text) from err
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(document), key=lambda e: list(e.path))
    if errors:
        location = "/".join(map(str, errors[0].path)) or "(root)"
        raise SchemaNotEnforced(f"schema not enforced: the 200 answer is JSON that breaks the schema at "
                                f"{location}: {errors[0].message}{where}", reply, field, text)
    return document


class ChatClient:
    """Chat completions against one served model; the key defaults to $`key_env`, which a refused key's error names."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 session: requests.Session | None = None, key_env: str = API_KEY_ENV):
        self.base, self.model, self.timeout_s, self.key_env = api_base(url), model, timeout_s, key_env
        self.session = session or requests.Session()
        key = api_key if api_key is not None else os.environ.get(key_env)
        if key:
            self.session.headers["Authorization"] = f"Bearer {key}"

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> ChatReply:
        """POST /chat/completions; raise EndpointError on any non-200 answer."""
        payload = {"model": self.model, "messages": messages, **params}
        started = time.monotonic()
        response = self.session.post(f"{self.base}/chat/completions", json=payload, timeout=self.timeout_s)
        latency_s = time.monotonic() - started
        if response.status_code != 200:
            raise response_error(response, latency_s, self.key_env)
        reply = ChatReply(json_or_none(response), latency_s)
        try:
            if isinstance(reply.message, dict):
                return reply
        except (KeyError, IndexError, TypeError):
            pass
        raise EndpointError(200, f"a body without a message: {response.text[:200]}", latency_s)

    def structured(self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, *, name: str = "answer",
                   thinking: bool | None = None, **params: Any) -> Any:
        """The answer's JSON, validated (`json_object` mode when schema is None); `thinking`: enable_thinking."""
        return validated_json(self.structured_reply(messages, schema, name=name, thinking=thinking, **params),
                              ANY_OBJECT_SCHEMA if schema is None else schema)

    def structured_reply(self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, *,
                         name: str = "answer", thinking: bool | None = None, **params: Any) -> ChatReply:
        """The raw reply to a structured-output request (for callers that report on it, like the probes)."""
        if schema is not None:
            import jsonschema

            jsonschema.Draft202012Validator.check_schema(schema)
        if thinking is not None:
            params["chat_template_kwargs"] = {**params.get("chat_template_kwargs", {}), "enable_thinking": thinking}
        return self.chat(messages, response_format={"type": "json_object"} if schema is None else {
            "type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}, **params)

    def model_cards(self) -> list[dict[str, Any]]:
        """GET /models: vLLM's ModelCard has `id`, `root` (an HF id or a path) and `max_model_len`."""
        response = self.session.get(f"{self.base}/models", timeout=self.timeout_s)
        page = html_page(response)
        if response.status_code == 404 and not page:  # every vLLM serves it, from its first answer
            raise EndpointError(404, f"{error_message(response)}: vLLM serves /v1/models, so {NOT_VLLM}", 0.0,
                                response.url)
        if response.status_code != 200:
            raise response_error(response, 0.0, self.key_env)
        if page:
            raise EndpointError(200, f"{page}, not a model list: {NOT_VLLM}", 0.0, response.url)
        body = json_or_none(response)
        entries = body.get("data") if isinstance(body, dict) else None
        if not isinstance(entries, list):
            raise EndpointError(200, f"{self.base}/models: not a model list: {response.text[:200]}", 0.0)
        return [entry for entry in entries if isinstance(entry, dict) and isinstance(entry.get("id"), str)]


class ModelNotServed(ValueError):
    """The model asked for is not one the server lists; the message names what it serves."""


class NoModelServed(ModelNotServed):
    """The server lists no model at all."""


def pick_model(listed: list[str], wanted: str | None, where: str) -> str:
    """The one rule for `--model`: the wanted model if listed, the first listed if none; else ModelNotServed."""
    if not listed:
        raise NoModelServed(f"{where} lists no model")
    if wanted is None:
        return listed[0]
    if wanted not in listed:
        raise ModelNotServed(f"{wanted!r} is not served by {where}, which serves {', '.join(listed)}")
    return wanted


def served_card(url: str, wanted: str | None, api_key: str | None = None, timeout_s: float = 10,
                key_env: str = API_KEY_ENV) -> dict[str, Any]:
    """The /v1/models entry of `wanted` (or of the first model served when None); ModelNotServed otherwise."""
    cards = ChatClient(url, "", api_key=api_key, timeout_s=timeout_s, key_env=key_env).model_cards()
    chosen = pick_model([card["id"] for card in cards], wanted, f"{api_base(url)}/models")
    return next(card for card in cards if card["id"] == chosen)
