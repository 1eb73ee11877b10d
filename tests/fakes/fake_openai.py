"""A fake OpenAI-compatible server (on tests/httpfake.FakeServer) answering like vLLM 0.32 does.

Bodies follow the shapes vLLM returns (choices[0].message with content, reasoning_content, tool_calls with ids
`chatcmpl-tool-…` and JSON-string arguments; OpenAI-style error bodies). Knobs select behaviours the probes must tell
apart: a schema-enforcing server vs one that silently ignores `response_format`, a reasoning parser that keeps a
thinking answer in `reasoning_content`, a vision server whose first image request gets 422, a text-only server.
Tests that use this module are labelled "fake server".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.fakes.httpfake import FakeServer, Request, Response
from tpuserve.images import image_data_uri

FAKE_MODEL = "fake/gemma-4-E2B-it"
TEXT_ONLY_MESSAGE = "gemma4 is not a multimodal model; image inputs are not supported"  # vLLM-style 400 message
BOOT_422_MESSAGE = "Failed to load the multimodal processor"
# Recorded answers of a capable vision model to the shipped probe images.
IMAGE_ANSWERS = {image_data_uri("squares-3.png"): "There are 3 squares.", image_data_uri("squares-5.png"): "5",
                 image_data_uri("red-square.png"): "Red."}


def completion(content: str | None = None, *, tool_calls: list[dict[str, Any]] | None = None,
               reasoning: str | None = None, finish_reason: str = "stop") -> dict[str, Any]:
    """A vLLM-shaped chat completion body."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning,
                               "tool_calls": tool_calls or []}
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1780000000, "model": FAKE_MODEL,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if tool_calls else finish_reason}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}}


def tool_call(name: str, arguments: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return {"id": f"chatcmpl-tool-{index:04d}", "type": "function", "index": index,
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def error(status: int, message: str) -> Response:
    return Response(status, {"error": {"message": message, "type": "BadRequestError", "param": None,
                                       "code": status}})


# vLLM's API key check (vllm/entrypoints/serve/middleware/authenticate.py, AuthenticationMiddleware): a path under
# these prefixes needs "Authorization: Bearer <key>", else 401 {"error": "Unauthorized"}; /health, /metrics, /version
# and /tokenize stay open.
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def require_key(server: FakeServer, key: str) -> FakeServer:
    """`server` answering like a vLLM started with --api-key `key` (or VLLM_API_KEY); the refused requests are kept
    in `server.requests` like the others."""
    def guard(handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def checked(request: Request) -> Response:
            sent = {name.lower(): value for name, value in request.headers.items()}.get("authorization")
            return handler(request) if sent == f"Bearer {key}" else Response(401, {"error": "Unauthorized"})
        return checked

    server.routes = {route: guard(handler) if route[1].startswith(GUARDED_PREFIX) else handler
                     for route, handler in server.routes.items()}
    return server


def instance_of(schema: dict[str, Any]) -> Any:
    """The smallest document a grammar for `schema` would allow (first enum value, true, required keys)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        return {key: instance_of(schema.get("properties", {}).get(key, {})) for key in schema.get("required", [])}
    return {"boolean": True, "integer": 0, "number": 0, "string": "x", "array": []}.get(kind)


def last_user_text(body: dict[str, Any]) -> str:
    user_turns = [m for m in body["messages"] if m["role"] == "user"]
    content = user_turns[-1]["content"] if user_turns else ""
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)


def has_part(body: dict[str, Any], *kinds: str) -> bool:
    return any(isinstance(m.get("content"), list) and any(p.get("type") in kinds for p in m["content"])
               for m in body["messages"])


def has_image(body: dict[str, Any]) -> bool:
    return has_part(body, "image_url")


# vLLM 0.32's refusal of a modality limited to 0 (vllm/multimodal/processing/context.py validate_num_items).
LIMIT_0_MESSAGE = "At most 0 {}(s) may be provided in one prompt."


class FakeOpenAI(FakeServer):
    """A recording fake: `structured` is "enforced", "ignored", "reasoning-parser" (the tiny CPU model: thinking on
    never ends its reasoning) or "thinking-only" (the real Gemma 4: enforced only with thinking on); `vision` is "ok",
    "422-then-200" or "text-only"; `tools` False answers tool requests like a server without auto tool choice."""

    def __init__(self, *, structured: str = "enforced", vision: str = "ok", tools: bool = True,
                 reply_text: Callable[[str], str] = lambda prompt: f"Answer to: {prompt}"):
        super().__init__({("GET", "/v1/models"): self.models, ("POST", "/v1/chat/completions"): self.chat})
        self.structured, self.vision, self.tools, self.reply_text = structured, vision, tools, reply_text
        self.image_requests = 0

    def chat_bodies(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests if r.path == "/v1/chat/completions"]

    def models(self, request: Request) -> Response:
        return Response(200, {"object": "list", "data": [{"id": FAKE_MODEL, "object": "model"}]})

    def chat(self, request: Request) -> Response:
        body = request.json()
        if body.get("model") != FAKE_MODEL:
            return error(404, f"The model `{body.get('model')}` does not exist.")
        for kind, modality in (("input_audio", "audio"), ("video_url", "video")):  # limited to 0, as in prod
            if has_part(body, kind):
                return error(400, TEXT_ONLY_MESSAGE if self.vision == "text-only" else LIMIT_0_MESSAGE.format(modality))
        if has_image(body):
            return self.answer_image(body)
        if "response_format" in body:
            return self.answer_structured(body)
        if body.get("tools"):
            return self.answer_tools(body)
        return Response(200, completion(self.reply_text(last_user_text(body))))

    def answer_structured(self, body: dict[str, Any]) -> Response:
        response_format = body["response_format"]
        document = (instance_of(response_format["json_schema"]["schema"])
                    if response_format["type"] == "json_schema" else {"note": "any object"})
        thinking = body.get("chat_template_kwargs", {}).get("enable_thinking", False)
        if self.structured == "ignored":
            return Response(200, completion("Sure! The answer is yes, I am confident."))
        if self.structured == "thinking-only" and not thinking:
            # Measured on the real Gemma 4 E2B with vLLM's gemma4 reasoning parser (the reference deployment): with
            # thinking off the reasoning phase never starts or ends, so the grammar is never applied.
            return Response(200, completion("The sky is blue on a clear day, so the answer is yes."))
        if self.structured == "thinking-only":
            return Response(200, completion(json.dumps(document, separators=(",", ":")),
                                            reasoning="The user asks about the sky. Rayleigh scattering: yes."))
        if self.structured == "reasoning-parser" and thinking:
            # Measured on vLLM 0.32 + gemma4 reasoning parser: the model never ends its reasoning, so the grammar
            # never starts; the parser (no reasoning start token seen) returns the free text as content.
            return Response(200, completion(" no qu oud no tru yesParParPar", finish_reason="length"))
        return Response(200, completion(json.dumps(document, separators=(",", ":"))))

    def answer_tools(self, body: dict[str, Any]) -> Response:
        if not self.tools:
            return error(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
        if body["messages"][-1]["role"] == "tool":
            result = json.loads(body["messages"][-1]["content"])
            return Response(200, completion(f"It is {result['temperature']} °C and {result['conditions']} in "
                                            f"{result['city']}."))
        text = last_user_text(body)
        if "Paris and in Tokyo" in text:
            return Response(200, completion(None, tool_calls=[tool_call("get_weather", {"city": "Paris"}, 0),
                                                              tool_call("get_weather", {"city": "Tokyo"}, 1)]))
        if "weather in Paris" in text:
            return Response(200, completion(None, tool_calls=[tool_call("get_weather", {"city": "Paris"})]))
        if "convert some money" in text:
            return Response(200, completion("Sure: how much, and from which currency to which?"))
        return Response(200, completion("Because air scatters blue light more than red light."))

    def answer_image(self, body: dict[str, Any]) -> Response:
        self.image_requests += 1
        if self.vision == "text-only":
            return error(400, TEXT_ONLY_MESSAGE)
        if self.vision == "422-then-200" and self.image_requests == 1:
            return error(422, BOOT_422_MESSAGE)
        image = body["messages"][-1]["content"][0]["image_url"]["url"]
        return Response(200, completion(IMAGE_ANSWERS.get(image, "I cannot tell.")))
