"""`tpuserve probe`: which capabilities really work on a deployment, with the evidence.

Each scenario ends in a verdict (pass, fail, skipped, or "schema not enforced": a 200 ignoring the schema) with its
latency and evidence. Exit 0 whenever the probe ran; with `--strict`, 1 when a scenario failed or was not enforced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import jsonschema
import requests
from rich.cells import cell_len
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from tpuserve import exits
from tpuserve.client import (ANY_OBJECT_SCHEMA, ChatClient, ChatReply, EndpointError, OutputTruncated,
                             SchemaNotEnforced, validated_json)
from tpuserve.cli import Failure, echo_json, json_option
from tpuserve.images import image_messages, modality_part
from tpuserve.serving import MODALITIES
from tpuserve.deploy.stack import (api_key_option, model_option, read_outputs, resolve_model, served_endpoint,
                                   stack_options, url_option)

PASS, FAIL, SKIPPED, NOT_ENFORCED = "pass", "fail", "skipped", "schema not enforced"
EXCERPT_CHARS = 300


@dataclass
class ScenarioResult:
    probe: str
    scenario: str
    verdict: str
    reason: str
    latency_s: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """The start of `text` with control characters escaped (random-weight output is full of them)."""
    shown = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text[:limit])
    return shown if len(text) <= limit else shown + f"… (+{len(text) - limit} chars)"


def reply_evidence(reply: ChatReply) -> dict[str, Any]:
    """What came back, short enough to print: finish reason, content, reasoning and tool calls."""
    evidence: dict[str, Any] = {"finish_reason": reply.finish_reason, "content": excerpt(reply.content)}
    field_name, text = reply.answer()
    if field_name != "content":
        evidence[field_name] = excerpt(text)
    if reply.tool_calls:
        evidence["tool_calls"] = [{"name": call["function"]["name"],
                                   "arguments": excerpt(call["function"]["arguments"])} for call in reply.tool_calls]
    return evidence


ERROR_REASONS = ("server error: ", "no answer: ")


def error_result(probe: str, scenario: str, err: Exception, request: dict[str, Any]) -> ScenarioResult:
    """A server error or timeout: an honest fail with the server's words, never a crash."""
    if isinstance(err, EndpointError):
        return ScenarioResult(probe, scenario, FAIL, f"{ERROR_REASONS[0]}{err}", err.latency_s,
                              {"request": request, "status": err.status})
    return ScenarioResult(probe, scenario, FAIL, f"{ERROR_REASONS[1]}{type(err).__name__}: {err}", None,
                          {"request": request})


# Tools
WEATHER_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"], "properties": {
        "city": {"type": "string", "minLength": 1, "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
CURRENCY_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "convert_currency", "description": "Convert an amount of money between two currencies.",
    "parameters": {"type": "object", "additionalProperties": False,
                   "required": ["amount", "from_currency", "to_currency"], "properties": {
                       "amount": {"type": "number", "exclusiveMinimum": 0},
                       "from_currency": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "ISO 4217 code"},
                       "to_currency": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "ISO 4217 code"}}}}}
TOOLS = [WEATHER_TOOL, CURRENCY_TOOL]
TOOL_SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
TOOLS_MAX_TOKENS = 200
# vLLM's words when the server was started without --enable-auto-tool-choice / a tool-call parser.
TOOLS_DISABLED = re.compile(r"tool.?choice|tool.?call.?parser|tools? (are|is) not supported", re.IGNORECASE)

WEATHER_CALL_ID = "call_weather_paris"
WEATHER_RESULT = {"city": "Paris", "temperature": 18, "unit": "celsius", "conditions": "sunny"}


class InvalidToolCall(ValueError):
    pass


def parse_tool_call(call: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(tool name, arguments) of one call, the arguments checked against the tool's JSON schema."""
    name = call.get("function", {}).get("name", "")
    if name not in TOOL_SCHEMAS:
        raise InvalidToolCall(f"called unknown tool {name!r}")
    try:
        arguments = json.loads(call["function"].get("arguments") or "{}")
    except json.JSONDecodeError as err:
        raise InvalidToolCall(f"{name}: arguments are not JSON ({err.msg})") from err
    try:
        jsonschema.validate(arguments, TOOL_SCHEMAS[name])
    except jsonschema.ValidationError as err:
        raise InvalidToolCall(f"{name}: arguments break the tool schema: {err.message}") from err
    return name, arguments


def judge_weather_calls(reply: ChatReply, expected: set[str]) -> tuple[str, str]:
    """Pass when the turn holds exactly one valid get_weather call per expected city."""
    if not reply.tool_calls:
        return FAIL, f"no tool call (answered in text: '{excerpt(reply.content, 80)}')"
    cities = []
    try:
        for call in reply.tool_calls:
            name, arguments = parse_tool_call(call)
            if name != "get_weather":
                raise InvalidToolCall(f"called {name} where get_weather was needed")
            cities.append(arguments["city"].strip().lower())
    except InvalidToolCall as err:
        return FAIL, str(err)
    if sorted(cities) != sorted(expected):
        return FAIL, f"get_weather called for {cities}, expected {sorted(expected)}"
    return PASS, f"{len(cities)} valid get_weather call(s): {', '.join(cities)}"


def judge_text(reply: ChatReply, must_contain: str = "") -> tuple[str, str]:
    """Pass when the model answered in text (containing `must_contain`) without calling a tool."""
    if reply.tool_calls:
        names = [call.get("function", {}).get("name") for call in reply.tool_calls]
        return FAIL, f"called {names} where a text answer was expected"
    if not reply.content.strip():
        return FAIL, "empty text answer"
    if must_contain and must_contain not in reply.content:
        return FAIL, f"answer lacks {must_contain!r}: '{excerpt(reply.content, 80)}'"
    return PASS, f"answered in text: '{excerpt(reply.content, 80)}'"


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


SYNTHESIS_MESSAGES = [
    *user("What is the weather in Paris right now?"),
    {"role": "assistant", "content": None, "tool_calls": [{"id": WEATHER_CALL_ID, "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
    {"role": "tool", "tool_call_id": WEATHER_CALL_ID, "name": "get_weather", "content": json.dumps(WEATHER_RESULT)},
]

TOOL_SCENARIOS: list[tuple[str, list[dict[str, Any]], Callable[[ChatReply], tuple[str, str]]]] = [
    ("simple call", user("What is the weather in Paris right now?"),
     lambda reply: judge_weather_calls(reply, {"paris"})),
    ("result synthesis", SYNTHESIS_MESSAGES, lambda reply: judge_text(reply, must_contain="18")),
    ("no-tool restraint", user("In one sentence: why is the sky blue?"), judge_text),
    ("parallel calls", user("What is the weather in Paris and in Tokyo? Check both cities at once."),
     lambda reply: judge_weather_calls(reply, {"paris", "tokyo"})),
    ("underspecified", user("Please convert some money for me."), lambda reply: judge_text(reply, must_contain="?")),
]


def run_tools(client: ChatClient, max_tokens: int | None = None) -> list[ScenarioResult]:
    results = []
    for scenario, messages, judge in TOOL_SCENARIOS:
        request = {"last_message": messages[-1], "tools": list(TOOL_SCHEMAS), "temperature": 0}
        try:
            reply = client.chat(messages, tools=TOOLS, tool_choice="auto", temperature=0,
                                max_tokens=max_tokens or TOOLS_MAX_TOKENS)
        except (EndpointError, requests.Timeout) as err:
            if isinstance(err, EndpointError) and err.status == 400 and TOOLS_DISABLED.search(err.message):
                skipped = f"tool calling is off on this server: {err.message}"
                return [ScenarioResult("tools", name, SKIPPED, skipped) for name, _, _ in TOOL_SCENARIOS]
            results.append(error_result("tools", scenario, err, request))
            continue
        verdict, reason = judge(reply)
        results.append(ScenarioResult("tools", scenario, verdict, reason, reply.latency_s,
                                      {"request": request, "response": reply_evidence(reply)}))
    return results


# Structured output
# Enums and booleans only: under an enforced grammar free text cannot appear (docs/design/measuring.md#probe).
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["answer", "confident"],
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "confident": {"type": "boolean"}}}
STRUCTURED_PROMPT = user('Is the sky blue on a clear day? Reply with JSON: {"answer": "yes" or "no", '
                         '"confident": true or false}.')
STRUCTURED_MAX_TOKENS = 512  # room for a real model's reasoning before the JSON
# (scenario, schema or None for json_object mode, enable_thinking)
STRUCTURED_SCENARIOS: list[tuple[str, dict[str, Any] | None, bool]] = [
    ("json_schema thinking=off", ANSWER_SCHEMA, False),
    ("json_schema thinking=on", ANSWER_SCHEMA, True),
    ("json_object", None, False),
]


def run_structured(client: ChatClient, max_tokens: int | None = None) -> list[ScenarioResult]:
    results = []
    for scenario, schema, thinking in STRUCTURED_SCENARIOS:
        request = {"response_format": "json_object" if schema is None else "json_schema",
                   "chat_template_kwargs": {"enable_thinking": thinking}, "last_message": STRUCTURED_PROMPT[-1]}
        try:
            reply = client.structured_reply(STRUCTURED_PROMPT, schema, thinking=thinking, temperature=0,
                                            max_tokens=max_tokens or STRUCTURED_MAX_TOKENS)
        except (EndpointError, requests.Timeout) as err:
            results.append(error_result("structured", scenario, err, request))
            continue
        try:
            document = validated_json(reply, ANY_OBJECT_SCHEMA if schema is None else schema)
            verdict, reason = PASS, f"enforced: {json.dumps(document)[:80]}"
        except SchemaNotEnforced as err:
            verdict, reason = NOT_ENFORCED, str(err)
        except OutputTruncated as err:
            verdict, reason = FAIL, str(err)
        results.append(ScenarioResult("structured", scenario, verdict, reason, reply.latency_s,
                                      {"request": request, "response": reply_evidence(reply)}))
    return results


def enforcement_summary(results: list[ScenarioResult]) -> str:
    """One line: the configurations that enforced the schema, those that did not, and those not judged."""
    structured = [r for r in results if r.probe == "structured"]

    def named(*verdicts: str) -> str:
        return ", ".join(r.scenario for r in structured if r.verdict in verdicts)

    if not structured:
        return ""
    unjudged = named(FAIL, SKIPPED)
    return (f"schema enforced with: {named(PASS) or 'none'}; not enforced with: {named(NOT_ENFORCED) or 'none'}"
            + (f"; not judged (failed or skipped): {unjudged}" if unjudged else ""))


def structured_hint(results: list[ScenarioResult]) -> str:
    """What the thinking=off/on verdicts mean with a reasoning parser (docs/design/measuring.md#probe)."""
    verdicts = {r.scenario: r for r in results if r.probe == "structured"}
    off, on = verdicts.get("json_schema thinking=off"), verdicts.get("json_schema thinking=on")
    if off and on and off.verdict == NOT_ENFORCED and on.verdict == PASS:
        return ("hint: as measured on Gemma 4 with the gemma4 reasoning parser, the schema is enforced with "
                "enable_thinking on and ignored with it off: send chat_template_kwargs {\"enable_thinking\": true} "
                "with response_format")
    if on and on.verdict in (NOT_ENFORCED, FAIL) and on.evidence.get("response", {}).get("finish_reason") == "length":
        return ("hint: with thinking on the grammar starts only after the reasoning, and this answer hit max_tokens "
                "first: raise --max-tokens (on Gemma 4 with the gemma4 reasoning parser the schema was enforced with "
                "thinking on once the reasoning ended)")
    return ""


# Vision
# (scenario, image file, question, accepted answers: any one found as a word in the reply passes)
VISION_SCENARIOS: list[tuple[str, str, str, tuple[str, ...]]] = [
    ("count 3 squares", "squares-3.png", "How many colored squares are in this image? Answer with one number.",
     ("3", "three")),
    ("count 5 squares", "squares-5.png", "How many colored squares are in this image? Answer with one number.",
     ("5", "five")),
    ("describe color", "red-square.png", "What color is the square in this image? Answer with one word.", ("red",)),
]
VISION_MAX_TOKENS = 32
# How vLLM refuses images on a text-only deployment (a text-only model, or --language-model-only / a 0 image limit).
TEXT_ONLY_ERROR = re.compile(r"not a multi-?modal model|at most 0 image|limit.mm.per.prompt|language.model.only|"
                             r"image.{0,40}not (be )?supported|does not support (image|vision)", re.IGNORECASE)


def chat_retrying_422(client: ChatClient, messages: list[dict[str, Any]], **params: Any) -> tuple[ChatReply, str]:
    """A 422 right after boot is common for the first multimodal request: retry once, and say so."""
    try:
        return client.chat(messages, **params), ""
    except EndpointError as err:
        if err.status != 422:
            raise
        return client.chat(messages, **params), f"first attempt HTTP 422 ({excerpt(err.message, 120)}), retried"


def run_vision(client: ChatClient, max_tokens: int | None = None) -> list[ScenarioResult]:
    results: list[ScenarioResult] = []
    for index, (scenario, image, question, answers) in enumerate(VISION_SCENARIOS):
        request = {"image": f"{image} (data URI)", "question": question, "temperature": 0}
        try:
            reply, retry_note = chat_retrying_422(client, image_messages(image, question), temperature=0,
                                                  max_tokens=max_tokens or VISION_MAX_TOKENS)
        except (EndpointError, requests.Timeout) as err:
            if isinstance(err, EndpointError) and err.status in (400, 422) and TEXT_ONLY_ERROR.search(err.message):
                reason = f"server is text-only: {excerpt(err.message, 160)}"
                results.append(ScenarioResult("vision", scenario, SKIPPED, reason, err.latency_s,
                                              {"request": request, "status": err.status}))
                return results + [ScenarioResult("vision", name, SKIPPED, reason)
                                  for name, *_ in VISION_SCENARIOS[index + 1:]]
            results.append(error_result("vision", scenario, err, request))
            continue
        passed = bool(set(answers) & set(re.findall(r"[a-z0-9]+", reply.content.lower())))
        reason = (f"answered '{excerpt(reply.content.strip(), 60)}'"
                  + ("" if passed else f", expected one of {list(answers)}")
                  + (f"; {retry_note}" if retry_note else ""))
        results.append(ScenarioResult("vision", scenario, PASS if passed else FAIL, reason, reply.latency_s,
                                      {"request": request, "response": reply_evidence(reply), "retry": retry_note}))
    return results


PROBES: dict[str, Callable[[ChatClient, int | None], list[ScenarioResult]]] = {
    "tools": run_tools, "structured": run_structured, "vision": run_vision}


# Refusals: a modality the deployment cannot serve must be refused, and the server must still serve after it
REFUSAL_MAX_TOKENS = 8
DEFAULT_REFUSED = ("audio", "video")  # what no TPU deployment of Gemma 4 on its JAX model serves


def disabled_modalities(vllm_args: list[str] | None) -> tuple[str, ...] | None:
    """The modalities a stack's argv limits to 0 (its `vllmArgs` output), or None without one."""
    if not vllm_args or "--limit-mm-per-prompt" not in vllm_args:
        return None
    limits = json.loads(vllm_args[vllm_args.index("--limit-mm-per-prompt") + 1])
    return tuple(modality for modality in MODALITIES if limits.get(modality, 999) == 0)


def still_serving(client: ChatClient) -> str | None:
    """None when a plain completion still answers, else what went wrong."""
    try:
        client.chat(user("Say hello."), max_tokens=REFUSAL_MAX_TOKENS)
    except EndpointError as err:
        return f"HTTP {err.status}: {excerpt(err.message, 160)}"
    except requests.RequestException as err:
        return f"no answer ({type(err).__name__})"
    return None


def run_refusals(client: ChatClient, modalities: tuple[str, ...]) -> list[ScenarioResult]:
    """Pass on a 4xx with the server still answering afterwards (the rules of vm/readycheck.py `refusals`)."""
    results = []
    for modality in modalities:
        scenario = f"{modality} refused"
        part = modality_part(modality)
        request = {"modality": modality, "part": part["type"]}
        messages = [{"role": "user", "content": [part, {"type": "text", "text": "What is this?"}]}]
        try:
            reply = client.chat(messages, max_tokens=REFUSAL_MAX_TOKENS)
        except EndpointError as err:
            if not 400 <= err.status < 500:
                verdict, reason = FAIL, (f"HTTP {err.status} instead of a 4xx: the request reached the engine "
                                         f"({excerpt(err.message, 160)})")
            elif (broken := still_serving(client)) is None:
                verdict, reason = PASS, f"HTTP {err.status}: {excerpt(err.message, 120)}; still serving"
            else:
                verdict, reason = FAIL, f"HTTP {err.status}, but the server stopped answering: {broken}"
            results.append(ScenarioResult("refusals", scenario, verdict, reason, err.latency_s,
                                          {"request": request, "status": err.status}))
            continue
        except requests.RequestException as err:
            results.append(error_result("refusals", scenario, err, request))
            continue
        results.append(ScenarioResult("refusals", scenario, FAIL, f"answered HTTP 200: the {modality} limit is not "
                                      "applied, so any client can send it", reply.latency_s,
                                      {"request": request, "response": reply_evidence(reply)}))
    return results


# KV-cache comparison
# Greedy prompts whose answers differ visibly when the KV cache loses precision (long, structured, exact).
KV_PROMPTS: dict[str, str] = {
    "explanation": "Explain in three sentences how a hash table finds a value.",
    "code": "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "listing": "List the twelve months of the year, one per line.",
    "translation": "Translate into French: The old cat sleeps on the warm windowsill every afternoon.",
    "arithmetic": "What is 17 multiplied by 23? Show each step.",
    "summarization": ("Summarize in one sentence: The city council met on Tuesday to discuss the new bicycle lanes. "
                      "After two hours of debate, members voted seven to two to build lanes on three main streets, "
                      "starting next spring, paid for by a state transport grant."),
}
KV_MAX_TOKENS = 128
KV_SEED = 0
RUN_FILE = "run.json"
CONTEXT_BYTES = 24


@dataclass(frozen=True)
class OutputComparison:
    prompt: str
    identical: bool
    first_difference: int | None  # byte offset of the first differing byte (UTF-8), None when identical
    bytes_a: int
    bytes_b: int
    context_a: str = ""  # the text from the first difference on, a few bytes of it
    context_b: str = ""


def save_outputs(directory: Path, outputs: dict[str, str], run: dict[str, Any]) -> None:
    """One `<prompt>.txt` per answer (diffable by hand) plus run.json with the parameters."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in outputs.items():
        (directory / f"{name}.txt").write_text(text, encoding="utf-8")
    (directory / RUN_FILE).write_text(json.dumps({**run, "prompts": KV_PROMPTS}, indent=2) + "\n")


def load_outputs(directory: Path) -> dict[str, str]:
    missing = [name for name in KV_PROMPTS if not (directory / f"{name}.txt").is_file()]
    if missing:
        raise click.BadParameter(f"{directory} lacks {', '.join(f'{name}.txt' for name in missing)}")
    return {name: (directory / f"{name}.txt").read_text(encoding="utf-8") for name in KV_PROMPTS}


def first_difference(a: bytes, b: bytes) -> int | None:
    """Offset of the first differing byte; the shorter length when one is a prefix of the other; None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def context_after(data: bytes, offset: int, length: int = CONTEXT_BYTES) -> str:
    return data[offset:offset + length].decode("utf-8", errors="replace")


def compare_outputs(a: dict[str, str], b: dict[str, str]) -> list[OutputComparison]:
    comparisons = []
    for name in KV_PROMPTS:
        bytes_a, bytes_b = a[name].encode(), b[name].encode()
        offset = first_difference(bytes_a, bytes_b)
        contexts = () if offset is None else (context_after(bytes_a, offset), context_after(bytes_b, offset))
        comparisons.append(OutputComparison(name, offset is None, offset, len(bytes_a), len(bytes_b), *contexts))
    return comparisons


# Command line
VERDICT_STYLE = {PASS: "green", FAIL: "red", SKIPPED: "yellow", NOT_ENFORCED: "bold red"}


def could_not_run(results: list[ScenarioResult]) -> str | None:
    """Why the probe could not run at all (every scenario got a server error or no answer), or None."""
    judged = [r for r in results if r.verdict != SKIPPED]
    errors = [r for r in judged if r.verdict == FAIL and r.reason.startswith(ERROR_REASONS)]
    if judged and len(errors) == len(judged):
        return f"every scenario got an error, the first: {excerpt(errors[0].reason, 200)}"
    return None


RESULT_HEADERS = ("scenario", "verdict", "latency", "reason (--json has the evidence)")
TABLE_FRAME = 13  # a 4-column rich table's borders and padding


def result_widths(cells: list[list[str]], width: int) -> list[int] | None:
    """Widths that fit `width` keeping the first three columns and every word of the reason whole, else None."""
    natural = [max(cell_len(text) for text in [header, *(row[i] for row in cells)])
               for i, header in enumerate(RESULT_HEADERS[:3])]
    longest_word = max(cell_len(word) for row in cells for word in [*row[3].split(), "evidence)"])
    reason = min(max(cell_len(row[3]) for row in cells), width - TABLE_FRAME - sum(natural))
    return [*natural, max(reason, cell_len("evidence)"))] if reason >= longest_word else None


def print_results(results: list[ScenarioResult], as_json: bool) -> None:
    summary, hint = enforcement_summary(results), structured_hint(results)
    if as_json:
        echo_json({"results": [asdict(r) for r in results], "structured_summary": summary,
                   "structured_hint": hint})
        return
    console = Console()
    for probe_name in dict.fromkeys(r.probe for r in results):
        rows = [r for r in results if r.probe == probe_name]
        cells = [[r.scenario, r.verdict, "-" if r.latency_s is None else f"{r.latency_s:.2f} s", r.reason]
                 for r in rows]
        widths = result_widths(cells, console.width)
        if widths is None:  # a block per scenario: its line, then the reason wrapped below it
            console.print(Text(f"{probe_name} (--json has the evidence)", style="italic"))
            for r, row in zip(rows, cells):
                console.print(Text.assemble(Text(row[0], style="bold"), "  ",
                                            Text(r.verdict, style=VERDICT_STYLE[r.verdict]), f"  {row[2]}"))
                console.print(Padding(Text(r.reason), (0, 0, 0, 2)))
            continue
        table = Table(title=probe_name, title_justify="left")
        for header, width in zip(RESULT_HEADERS, widths):
            table.add_column(header, width=width)
        for r, row in zip(rows, cells):
            table.add_row(row[0], Text(r.verdict, style=VERDICT_STYLE[r.verdict]), row[2],
                          Text(r.reason))  # Text: a reason quoting model output is not markup
        console.print(table)
    for line in filter(None, (summary, hint)):
        console.print(line, markup=False)


def failed(results: list[ScenarioResult]) -> bool:
    return any(r.verdict in (FAIL, NOT_ENFORCED) for r in results)


@click.group()
def probe() -> None:
    """Probe a deployment's capabilities: tools, structured output, vision, refused modalities; compare KV-cache
    settings.

    Exit 0 when the probe ran, whatever the verdicts; with --strict, 1 when a scenario failed or was not enforced.
    """


def endpoint_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options every capability probe takes."""
    options = [
        url_option(), model_option(), stack_options, api_key_option(),
        click.option("--timeout", default=120.0, show_default=True, type=click.FloatRange(min=1),
                     help="Seconds per request."),
        click.option("--max-tokens", type=click.IntRange(min=1), help=f"Token budget per answer (default: tools "
                     f"{TOOLS_MAX_TOKENS}, structured {STRUCTURED_MAX_TOKENS}, vision {VISION_MAX_TOKENS})."),
        json_option,
        click.option("--strict", is_flag=True, help="Exit 1 when any scenario failed or was not enforced."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def add_probe_command(name: str, probe_names: list[str], help_text: str, *options: Callable[..., Any]) -> None:
    def command(url: str | None, model: str | None, stack: str | None, stack_outputs: Path | None, api_key_env: str,
                timeout: float, max_tokens: int | None, as_json: bool, strict: bool, modalities: str | None = None
                ) -> None:
        outputs = read_outputs(stack, stack_outputs)
        # --modalities, else those the stack's argv limits to 0, else DEFAULT_REFUSED
        refused = (tuple(m.strip() for m in modalities.split(",") if m.strip()) if modalities else
                   disabled_modalities((outputs or {}).get("vllmArgs")) or DEFAULT_REFUSED)
        if unknown := [m for m in refused if m not in MODALITIES]:
            raise click.BadParameter(f"{', '.join(unknown)}: choose from {', '.join(MODALITIES)}",
                                     param_hint="--modalities")
        with served_endpoint(url, model, outputs, api_key_env) as served:
            client = served.client(timeout)
            results = [result for name in probe_names for result in (
                run_refusals(client, refused) if name == "refusals" else PROBES[name](client, max_tokens))]
        finish(results, served, as_json, strict)

    for option in (*options, endpoint_options):
        command = option(command)
    probe.command(name, help=help_text)(command)


def finish(results: list[ScenarioResult], served: Any, as_json: bool, strict: bool) -> None:
    """Print the verdicts; exit 1 when the probe could not run at all, or under --strict when a scenario failed."""
    reason = could_not_run(results)
    why = f"the probe could not run against {served.url} ({served.model}): {reason}"
    if reason and as_json:  # one document: the error, with the results as evidence
        raise Failure(why, {"results": [asdict(r) for r in results]})
    print_results(results, as_json)
    if reason:
        raise click.ClickException(why)
    if strict and failed(results):
        raise click.exceptions.Exit(exits.FAILED)


add_probe_command("tools", ["tools"], "Tool calling: simple call, result synthesis, restraint, parallel calls, "
                  "underspecified request; arguments validated against each tool's schema.")
add_probe_command("structured", ["structured"], "Structured output: json_schema with thinking off and on, "
                  "json_object; reports whether the server enforced the schema.")
add_probe_command("vision", ["vision"], "Vision: count and describe shipped images sent as data URIs.")
add_probe_command("all", [*PROBES, "refusals"], "Every capability probe: tools, structured, vision, and the "
                  "refusals of disabled modalities (those the stack's argv limits to 0, else "
                  f"{','.join(DEFAULT_REFUSED)}).")
add_probe_command("refusals", ["refusals"], "Disabled modalities: one request of each must answer 4xx and leave the "
                  "server serving (one that reaches the engine can take it down).",
                  click.option("--modalities", help="Comma-separated modalities the deployment must refuse (default: "
                               f"those the stack's argv limits to 0, else {','.join(DEFAULT_REFUSED)})."))


def side_outputs(side: str, url: str | None, directory: Path | None, model: str | None, api_key_env: str,
                 timeout: float, max_tokens: int, save_dir: Path | None) -> dict[str, str]:
    """One side of a comparison: run the prompts against --a/--b, or read --a-dir/--b-dir."""
    if directory is not None:
        return load_outputs(directory)
    served = resolve_model(url, model, api_key_env)
    client = served.client(timeout)
    try:
        outputs = {name: client.chat(user(prompt), temperature=0, seed=KV_SEED, max_tokens=max_tokens).full_text
                   for name, prompt in KV_PROMPTS.items()}
    except EndpointError as err:
        raise click.ClickException(f"--{side} {url}: {err}") from err
    if save_dir is not None:
        save_outputs(save_dir / side, outputs, {"url": url, "model": client.model, "max_tokens": max_tokens,
                                                "temperature": 0, "seed": KV_SEED})
    return outputs


@probe.command("kv-compare")
@url_option("URL of deployment A (e.g. bf16 KV cache): host:port or http(s)://host:port[/v1].", "--a", "url_a")
@click.option("--a-dir", type=click.Path(file_okay=False, path_type=Path), help="Saved outputs of A (see --save).")
@url_option("URL of deployment B (e.g. fp8 KV cache).", "--b", "url_b")
@click.option("--b-dir", type=click.Path(file_okay=False, path_type=Path), help="Saved outputs of B.")
@click.option("--model", help="Served model name on both; default: the first each server lists.")
@click.option("--max-tokens", default=KV_MAX_TOKENS, show_default=True, type=click.IntRange(min=1))
@click.option("--save", "save_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also write the outputs fetched from URLs to DIR/a and DIR/b.")
@api_key_option()
@click.option("--timeout", default=120.0, show_default=True, type=click.FloatRange(min=1), help="Seconds per request.")
@json_option
@click.option("--strict", is_flag=True, help="Exit 1 unless every output is byte-identical.")
def kv_compare(url_a: str | None, a_dir: Path | None, url_b: str | None, b_dir: Path | None, model: str | None,
               max_tokens: int, save_dir: Path | None, api_key_env: str, timeout: float, as_json: bool,
               strict: bool) -> None:
    """Greedy answers to fixed prompts on two deployments (or saved runs): byte-identical or first difference."""
    for side, url, directory in (("a", url_a, a_dir), ("b", url_b, b_dir)):
        if (url is None) == (directory is None):
            raise click.UsageError(f"give exactly one of --{side} URL or --{side}-dir DIR")
    outputs_a = side_outputs("a", url_a, a_dir, model, api_key_env, timeout, max_tokens, save_dir)
    outputs_b = side_outputs("b", url_b, b_dir, model, api_key_env, timeout, max_tokens, save_dir)
    comparisons = compare_outputs(outputs_a, outputs_b)
    identical = sum(c.identical for c in comparisons)
    if as_json:
        echo_json({"identical": identical, "total": len(comparisons),
                   "comparisons": [asdict(c) for c in comparisons]})
    else:
        table = Table("prompt", "identical", "first diff (byte)", "bytes A/B", "A from there", "B from there")
        for c in comparisons:
            table.add_row(c.prompt, "[green]yes[/]" if c.identical else "[red]no[/]",
                          "-" if c.first_difference is None else str(c.first_difference), f"{c.bytes_a}/{c.bytes_b}",
                          repr(c.context_a) if c.context_a else "", repr(c.context_b) if c.context_b else "")
        Console().print(table, f"byte-identical: {identical}/{len(comparisons)}")
    if strict and identical < len(comparisons):
        raise click.exceptions.Exit(exits.FAILED)
