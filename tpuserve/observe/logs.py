"""`tpuserve logs` and `tpuserve diagnose`: what the VM said (serial console, `docker logs` over IAP ssh, Cloud
Logging), and a model's reading of why a deployment failed, from an excerpt of those logs and the gate's stage and
reason. Everything sent is passed through `redact` first: tokens and keys in the logs never leave the machine."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from tpuserve.cli import echo_json, json_option
from tpuserve import gce
from tpuserve.deploy import stack as pulumi_stack
from tpuserve.client import API_KEY_ENV, EndpointError, json_or_none
from tpuserve.facts import CONTAINER_HASH_LABEL, GUEST_ATTRIBUTE_NAMESPACE
from tpuserve.deploy.cloud_logging import LOGGING_URL, LoggingApiError, LoggingClient
from tpuserve.gce import COMPUTE_URL, ComputeApiError, ComputeClient, Instance
from tpuserve.serving import CONTAINER_NAME, engine_container
from tpuserve.deploy.vmssh import docker_over_iap
from tpuserve.urls import server_root

DEFAULT_TAIL = 200
EXCERPT_TAIL_LINES = 60
EXCERPT_CONTEXT_LINES = 2
EXCERPT_MAX_CHARS = 12_000
DIAGNOSIS_MAX_TOKENS = 300
MIN_EXCERPT_CHARS = 200  # less log than this diagnoses nothing
FIT_TRIES = 4  # excerpts sized to the server's context before one is sent as it is
REDACTED = "[REDACTED]"

# Anything that looks like a credential. Order matters: specific formats first, then `name=value` pairs, then
# long mixed-case alphanumerics (hex digests such as image sha256s are all one case and survive).
REDACTIONS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL), REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{10,}"), REDACTED),  # Hugging Face tokens
    (re.compile(r"\bya29\.[A-Za-z0-9._\-]+"), REDACTED),  # Google OAuth access tokens
    (re.compile(r"\b1//[A-Za-z0-9_\-]{20,}"), REDACTED),  # Google OAuth refresh tokens
    (re.compile(r"\bAIza[A-Za-z0-9_\-]{30,}"), REDACTED),  # Google API keys
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{16,}"), REDACTED),  # OpenAI/LiteLLM-style keys
    (re.compile(r"\beyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*"), REDACTED),  # JWTs
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{8,}"), rf"\1 {REDACTED}"),
    (re.compile(r"(?i)((?:api[_-]?key|access[_-]?token|auth[_-]?token|token|secret|password|passwd|"
                r"authorization|private[_-]?key)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;]+"), rf"\1{REDACTED}"),
    (re.compile(r"\b(?=[A-Za-z0-9_\-]*[0-9])(?=[A-Za-z0-9_\-]*[a-z])(?=[A-Za-z0-9_\-]*[A-Z])[A-Za-z0-9_\-]{32,}"),
     REDACTED),
]
# Lines worth showing a model even when they are far from the end of the log.
NOTABLE_LINE = re.compile(r"(?i)error|exception|traceback|failed|fatal|killed|out of memory|\boom\b|"
                          r"resource_exhausted|denied|forbidden|unauthori[sz]ed|not found|timed? ?out|stage")

DIAGNOSIS_SYSTEM_PROMPT = (
    "You diagnose failed deployments of vLLM on a Google Cloud TPU VM (startup script -> docker -> vllm serve). "
    "Answer in at most five short lines: the most likely cause, the log line that shows it, and the fix. "
    "If the logs do not show the cause, say so and name what to check next.")


def redact(text: str) -> str:
    """`text` with everything token- or key-like replaced by [REDACTED]."""
    for pattern, replacement in REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


def relevant_excerpt(log: str, tail_lines: int = EXCERPT_TAIL_LINES, context: int = EXCERPT_CONTEXT_LINES,
                     max_chars: int = EXCERPT_MAX_CHARS) -> str:
    """The last `tail_lines` lines plus notable earlier ones with context, gaps marked '…', cut to `max_chars` from
    the end (a failed boot explains itself last). Redact first: a cut through a token hides it from the patterns."""
    lines = log.splitlines()
    keep = set(range(max(0, len(lines) - tail_lines), len(lines)))
    for index, line in enumerate(lines):
        if NOTABLE_LINE.search(line):
            keep.update(range(max(0, index - context), min(len(lines), index + context + 1)))
    excerpt: list[str] = []
    for index in sorted(keep):
        if excerpt and index - 1 not in keep:
            excerpt.append("…")
        excerpt.append(lines[index])
    return last_lines_within("\n".join(excerpt), max_chars)


def last_lines_within(text: str, max_chars: int) -> str:
    """The end of `text` in whole lines of `max_chars` at most, after a '…' line (a longer last line: its end)."""
    if len(text) <= max_chars:
        return text
    kept: list[str] = []
    size = 0
    for line in reversed(text.splitlines()):
        size += len(line) + 1
        if size > max_chars:
            break
        kept.append(line)
    return "\n".join(["…", *reversed(kept)]) if kept else "…" + text[-max_chars:]


def diagnosis_messages(log_excerpt: str, stage: str | None, reason: str | None) -> list[dict[str, str]]:
    """The chat sent to the diagnosing model; redacted as a whole, so no field can leak a token."""
    report = (f"Readiness gate stage: {stage or 'unknown'}\nGate reason: {reason or 'none given'}\n\n"
              f"Log excerpt:\n{log_excerpt}")
    return [{"role": "system", "content": DIAGNOSIS_SYSTEM_PROMPT}, {"role": "user", "content": redact(report)}]


def docker_logs(tail: int, follow: bool, container: str) -> list[str]:
    return ["logs", "--tail", str(tail), *(["--follow"] if follow else []), container]


def docker_logs_argv(vm: Instance, tail: int, follow: bool, container: str = CONTAINER_NAME) -> list[str]:
    """`docker logs` of a vLLM container on the VM."""
    return docker_over_iap(vm.name, vm.zone, vm.project, docker_logs(tail, follow, container))


def vm_container(outputs: Mapping[str, Any] | None, engine: int | None) -> str:
    """The container `--engine` names among the stack's `engines` (default the first; no outputs: vllm-N)."""
    engines = int((outputs or {}).get("engines") or (2 if engine is not None else 1))
    if engine is not None and engine >= engines:
        raise click.BadParameter(f"the VM runs {engines} engine(s): 0 to {engines - 1}", param_hint="--engine")
    return engine_container(engines, engine or 0)


# The local target labels its container with the serving-config hash (components/local.py), which the stack
# exports as `configHash`: that finds the container without knowing the stack's name.
@dataclass(frozen=True)
class LocalContainer:
    """A local-target stack's vLLM container on this Docker host: no VM, no serial console, just `docker logs`."""

    config_hash: str

    def describe(self) -> str:
        return f"the container labelled {CONTAINER_HASH_LABEL}={self.config_hash}"


def instance_from(outputs: Mapping[str, Any] | None, instance: str | None, zone: str | None,
                  project: str | None) -> Instance | LocalContainer:
    """The VM from --instance/--zone/--project, else the stack outputs'; a local-target stack's container."""
    if outputs is not None:
        if outputs.get("target") == "local" and not instance:
            if not outputs.get("configHash"):
                raise click.UsageError("a local-target stack's logs are its container's (`docker logs "
                                       "tpu-serve-<stack>` on the Docker host), but these stack outputs lack "
                                       "configHash to find it by")
            return LocalContainer(str(outputs["configHash"]))
        instance = instance or outputs.get("instanceName")
        zone, project = zone or outputs.get("zone"), project or outputs.get("project")
    missing = [option for option, value in (("--instance", instance), ("--zone", zone), ("--project", project))
               if not value]
    if missing:
        raise click.UsageError(f"missing {', '.join(missing)} (or give --stack / --stack-outputs)")
    return Instance(str(project), str(zone), str(instance))


def local_container_name(target: LocalContainer) -> str:
    """The running (or exited) container's name, from `docker ps -a` filtered by the config-hash label."""
    docker = shutil.which("docker")
    if docker is None:
        raise click.ClickException(f"a local-target stack's logs are `docker logs` of {target.describe()} on its "
                                   "Docker host, and docker is not on PATH here")
    listed = subprocess.run([docker, "ps", "-a", "--filter", f"label={CONTAINER_HASH_LABEL}={target.config_hash}",
                             "--format", "{{.Names}}"], capture_output=True, text=True, check=False)
    names = listed.stdout.split()
    if listed.returncode != 0 or not names:
        why = listed.stderr.strip() or "no such container (destroyed, or another Docker host?)"
        raise click.ClickException(f"cannot find {target.describe()}: {' '.join(why.split())}")
    return names[0]


def instance_options(command: Callable[..., None]) -> Callable[..., None]:
    """Options that name the VM, directly or through the stack's outputs."""
    for option in reversed([
            pulumi_stack.stack_options,
            click.option("--instance", help="VM name."),
            click.option("--zone", help="Zone of the VM."),
            click.option("--project", help="Project of the VM."),
            click.option("--compute-url", default=COMPUTE_URL, show_default=True, help="Compute API root."),
            click.option("--logging-url", default=LOGGING_URL, show_default=True, help="Cloud Logging API root.")]):
        command = option(command)
    return command


@click.command()
@instance_options
@click.option("--source", type=click.Choice(["serial", "docker", "cloud", "both"]), default="both",
              show_default=True, help="Serial console (Compute API), `sudo docker logs vllm` (IAP ssh), the "
              "container's logs the Ops Agent shipped to Cloud Logging (no ssh; from `serving` on), or both = "
              "serial and docker.")
@click.option("--tail", default=DEFAULT_TAIL, show_default=True, type=click.IntRange(min=1),
              help="Lines from the end of each log.")
@click.option("--follow", is_flag=True, help="Keep streaming `docker logs` (implies --source docker).")
@click.option("--engine", type=click.IntRange(min=0), help="On a VM of several engines, whose container logs "
              "(--source docker): 0, 1, ...; default the first.")
@json_option
def logs(stack: str | None, stack_outputs: Path | None, instance: str | None, zone: str | None,
         project: str | None, compute_url: str, logging_url: str, source: str, tail: int, follow: bool,
         engine: int | None, as_json: bool) -> None:
    """Print the VM's serial console and the vLLM container's logs.

    A local-target stack's logs are its container's `docker logs`. --json prints {"target", "serial", "docker",
    "cloud"}, each log as text or null."""
    outputs = pulumi_stack.read_outputs(stack, stack_outputs)
    vm = instance_from(outputs, instance, zone, project)
    if follow and as_json:
        raise click.UsageError("--follow streams; --json prints one document: give one of them")
    if follow and source == "cloud":
        raise click.UsageError("--follow streams `docker logs` over ssh; Cloud Logging is read once (--source cloud)")
    source = "docker" if follow else source
    if isinstance(vm, LocalContainer):
        if source in ("serial", "cloud"):
            raise click.UsageError(f"a local-target stack has no {'serial console' if source == 'serial' else 'Cloud Logging'}"
                                   ": its logs are the container's (--source docker)")
        argv = ["docker", *docker_logs(tail, follow, local_container_name(vm))]
        if as_json:
            echo_json({"target": "local", "serial": None, "docker": captured(argv), "cloud": None})
        elif subprocess.run(argv, check=False).returncode != 0:
            raise click.ClickException(f"`{' '.join(argv)}` failed")
        return
    cloud = cloud_container_log(vm, compute_url, logging_url, tail) if source == "cloud" else None
    container = vm_container(outputs, engine) if source != "cloud" else CONTAINER_NAME
    serial = None
    if source in ("serial", "both"):
        try:  # no credentials: one line (cli.translate)
            serial = "\n".join(ComputeClient(gce.adc_session(), compute_url).serial_output(vm).splitlines()[-tail:])
        except ComputeApiError as err:
            raise click.ClickException(f"serial console of {vm.name}: {err}") from err
    docker = source in ("docker", "both")
    if as_json:
        captured_docker = captured(docker_logs_argv(vm, tail, False, container)) if docker else None
        echo_json({"target": vm.name, "serial": serial, "docker": captured_docker, "cloud": cloud})
        return
    if source == "cloud":
        click.echo(f"== {CONTAINER_NAME} container logs of {vm.name} in Cloud Logging (last {tail} lines) ==",
                   err=True)
        click.echo(cloud or "(none shipped yet: the VM's Ops Agent ships them from `serving` on)")
    if serial is not None:
        click.echo(f"== serial console of {vm.name} (last {tail} lines) ==", err=True)
        click.echo(serial)
    if docker:
        click.echo(f"== docker logs {container} on {vm.name} ==", err=True)
        try:
            code = subprocess.run(docker_logs_argv(vm, tail, follow, container), check=False).returncode
        except FileNotFoundError as err:
            raise click.ClickException("gcloud not found: install the Google Cloud CLI for `docker logs`") from err
        if code != 0:
            raise click.ClickException(f"`gcloud compute ssh` exited with {code}")


def cloud_container_log(vm: Instance, compute_url: str, logging_url: str, lines: int) -> str:
    """The container's last `lines` lines from Cloud Logging, for this VM (its numeric id, from the Compute API)."""
    session = gce.adc_session()
    try:
        instance_id = str(ComputeClient(session, compute_url).instance(vm).get("id", ""))
        return LoggingClient(session, logging_url).container_log(vm.project, instance_id, lines)
    except ComputeApiError as err:
        raise click.ClickException(f"{vm.name}: {err}") from err
    except LoggingApiError as err:
        raise click.ClickException(f"container logs of {vm.name}: {err}") from err


def captured(argv: list[str]) -> str:
    """What a log command printed (stdout and stderr, as `docker logs` splits the container's streams)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError as err:
        raise click.ClickException(f"{argv[0]} not found: it is needed for `docker logs`") from err
    if done.returncode != 0:
        raise click.ClickException(f"`{argv[0]} ...` exited with {done.returncode}: {' '.join(done.stderr.split())}")
    return done.stdout + done.stderr


Messages = list[dict[str, str]]


def prompt_tokens(url: str, model: str, messages: Messages, api_key: str | None) -> int | None:
    """How many tokens the server counts for `messages` (vLLM's POST /tokenize answers {"count", ...}), or None."""
    import requests

    try:
        response = requests.post(f"{server_root(url)}/tokenize", json={"model": model, "messages": messages},
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {}, timeout=30)
    except requests.RequestException:
        return None
    body = json_or_none(response) if response.status_code == 200 else None
    count = body.get("count") if isinstance(body, dict) else None
    return count if isinstance(count, int) else None


def fit_to_context(build: Callable[[int], Messages], max_chars: int, chosen: bool,
                   served: pulumi_stack.Served) -> Messages:
    """The request with the largest excerpt up to `max_chars` whose tokens (counted by the server) leave the answer
    room in the card's `max_model_len`; a --max-chars the user `chosen` is refused naming a size that fits."""
    limit, model = served.card.get("max_model_len"), served.model
    if not isinstance(limit, int):
        return build(max_chars)
    budget, chars = limit - DIAGNOSIS_MAX_TOKENS, max_chars
    first = None
    for _ in range(FIT_TRIES):
        messages = build(chars)
        count = prompt_tokens(served.url, model, messages, served.api_key)
        first = count if first is None else first
        if count is None or count <= budget:
            break
        # Drop the excess at the request's mean characters per token (the prompt's fixed part stays), then 5 % more.
        content = sum(len(message["content"]) for message in messages)
        chars = int((chars - (count - budget) * content / count) * 0.95)
        if chars < MIN_EXCERPT_CHARS:
            raise click.ClickException(f"{model} takes {limit} tokens (its max_model_len), {DIAGNOSIS_MAX_TOKENS} "
                                       "of them for the answer: no useful log excerpt fits; diagnose with a model of "
                                       "a larger context (--url, --model)")
    if chars == max_chars:
        return messages
    said = (f"{model} takes {limit} tokens (its max_model_len), {DIAGNOSIS_MAX_TOKENS} of them for the answer, and "
            f"the request with {max_chars} characters of log is {first}")
    if chosen:
        raise click.BadParameter(f"{said}: give at most {chars}", param_hint="--max-chars")
    click.echo(f"note: {said}: sending {chars} characters of log (--max-chars sets the size)", err=True)
    return messages


@click.command()
@instance_options
@click.option("--log-file", "log_files", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Diagnose this saved log instead of fetching the VM's (repeatable).")
@click.option("--stage", help="The gate's last stage (default: the VM's guest attribute).")
@click.option("--reason", help="The gate's failure reason (default: the VM's guest attribute).")
@pulumi_stack.url_option("OpenAI-compatible endpoint that diagnoses: host:port or http(s)://host:port[/v1] "
                         "(default: the stack's `endpoint`).")
@pulumi_stack.model_option("Model to ask (default: the stack's model, else the first the endpoint lists).")
@click.option("--api-key-env", default=API_KEY_ENV, show_default=True,
              help="Environment variable holding the diagnosing endpoint's key.")
@click.option("--max-chars", default=EXCERPT_MAX_CHARS, show_default=True,
              type=click.IntRange(min=MIN_EXCERPT_CHARS), help="Size of the log excerpt sent; by default cut to "
              "what the model's context takes (its max_model_len, counted by the server's /tokenize).")
@click.option("--dry-run", is_flag=True, help="Print the redacted request instead of sending it.")
@json_option
def diagnose(stack: str | None, stack_outputs: Path | None, instance: str | None, zone: str | None,
             project: str | None, compute_url: str, logging_url: str, log_files: Sequence[Path], stage: str | None,
             reason: str | None, url: str | None, model: str | None, api_key_env: str, max_chars: int,
             dry_run: bool, as_json: bool) -> None:
    """Ask a model why a deployment failed, from its logs and the gate's stage and reason (tokens redacted).
    A local-target stack's logs are its container's `docker logs`."""
    if log_files:
        log = "\n".join(path.read_text(errors="replace") for path in log_files)
    else:
        vm = instance_from(pulumi_stack.read_outputs(stack, stack_outputs), instance, zone, project)
        if isinstance(vm, LocalContainer):
            log = captured(["docker", *docker_logs(DEFAULT_TAIL * 5, False, local_container_name(vm))])
        else:
            compute = ComputeClient(gce.adc_session(), compute_url)
            try:
                said, log = compute.guest_attributes(vm, GUEST_ATTRIBUTE_NAMESPACE), compute.serial_output(vm)
            except ComputeApiError as err:
                raise click.ClickException(f"{vm.name}: {err}") from err
            stage, reason = stage or said.get("stage"), reason or said.get("reason")
            try:  # none shipped before `serving`
                shipped = cloud_container_log(vm, compute_url, logging_url, DEFAULT_TAIL * 5)
                log += f"\n== {CONTAINER_NAME} container (Cloud Logging) ==\n{shipped}" if shipped else ""
            except (click.ClickException, gce.MissingCredentials) as err:
                click.echo(f"note: no container logs from Cloud Logging ({err}); diagnosing the serial console",
                           err=True)
    redacted = redact(log)

    def build(chars: int) -> Messages:
        return diagnosis_messages(relevant_excerpt(redacted, max_chars=chars), stage, reason)

    if dry_run:
        messages = build(max_chars)
        echo_json({"messages": messages}) if as_json else click.echo(messages[1]["content"])
        return
    chosen = click.get_current_context().get_parameter_source("max_chars") != click.core.ParameterSource.DEFAULT
    diagnosis = ask_for_diagnosis(build, max_chars, chosen, url, model, api_key_env, stack, stack_outputs)
    echo_json({"stage": stage, "reason": reason, "diagnosis": diagnosis}) if as_json else click.echo(diagnosis)


def ask_for_diagnosis(build: Callable[[int], Messages], max_chars: int, chosen: bool, url: str | None,
                      model: str | None, api_key_env: str, stack: str | None, stack_outputs: Path | None) -> str:
    """The model's answer, to an excerpt that fits its context; without --url the deployment itself answers (through
    the stack's endpoint, an IAP tunnel for a gcp stack, open only while asking)."""
    outputs = None if url else pulumi_stack.read_outputs(stack, stack_outputs)
    if url is None and outputs is None:
        raise click.UsageError("give --url of the diagnosing endpoint (or --stack to ask the deployment)")
    with pulumi_stack.served_endpoint(url, model, outputs, api_key_env) as served:
        messages = fit_to_context(build, max_chars, chosen, served)
        try:
            reply = served.client().chat(messages, temperature=0, max_tokens=DIAGNOSIS_MAX_TOKENS)
        except EndpointError as err:
            hint = "; lower --max-chars" if err.status == 400 and "context length" in err.message else ""
            raise click.ClickException(f"the diagnosing endpoint {served.url} ({served.model}) failed: {err}{hint}"
                                       ) from err
    return reply.answer()[1].strip() or "(the model returned an empty answer)"
