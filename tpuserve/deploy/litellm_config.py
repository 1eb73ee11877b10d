"""`tpuserve litellm`: a LiteLLM proxy config that serves the deployment under familiar model names (e.g.
`gemini-2.0-flash`); keys stay out of the file as `os.environ/NAME` references LiteLLM resolves on load."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import yaml

from tpuserve.cli import echo_json, json_option
from tpuserve.client import API_KEY_ENV, EndpointError, ModelNotServed, api_base, served_card
from tpuserve.deploy.stack import model_option, read_outputs, resolve_model, stack_options, url_option
from tpuserve.serving import ConfigError

MASTER_KEY_ENV = "LITELLM_MASTER_KEY"
ENV_NAME_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
CHECK_TIMEOUT_S = 5.0  # asking /v1/models before writing: a server that answers does so at once


def env_reference(option: str, name: str) -> str:
    """`os.environ/NAME`, LiteLLM's way to read a secret from the environment at load time."""
    if not name or not set(name) <= ENV_NAME_CHARS or name[0].isdigit():
        raise ConfigError(option, f"{name!r} is not an environment variable name (A-Z, 0-9, _)")
    return f"os.environ/{name}"


def litellm_config(url: str, served_model: str, aliases: Sequence[str], api_key_env: str = API_KEY_ENV,
                   master_key_env: str = MASTER_KEY_ENV) -> dict[str, Any]:
    """The proxy config: every alias routes to the served model through LiteLLM's OpenAI-compatible provider."""
    if not aliases:
        raise ConfigError("--alias", "give at least one model name to serve, e.g. --alias gemini-2.0-flash")
    duplicates = sorted({alias for alias in aliases if list(aliases).count(alias) > 1})
    if duplicates:
        raise ConfigError("--alias", f"repeated: {', '.join(duplicates)}")
    if not served_model:
        raise ConfigError("--model", "must name the served model")
    params = {"model": f"openai/{served_model}", "api_base": api_base(url),
              "api_key": env_reference("--api-key-env", api_key_env)}
    return {"model_list": [{"model_name": alias, "litellm_params": dict(params)} for alias in aliases],
            "general_settings": {"master_key": env_reference("--master-key-env", master_key_env)}}


def check_served(url: str, model: str, api_key: str | None, key_env: str = API_KEY_ENV) -> None:
    """Refuse a --model the server at `url` does not list; an unreachable server is not asked, and that is said."""
    import requests

    from tpuserve.cli import connection_reason

    try:
        served_card(url, model, api_key, timeout_s=CHECK_TIMEOUT_S, key_env=key_env)
    except ModelNotServed as err:
        raise click.BadParameter(str(err), param_hint="--model") from err
    except (requests.RequestException, EndpointError) as err:
        why = str(err) if isinstance(err, EndpointError) else connection_reason(err)
        click.echo(f"note: {api_base(url)}/models did not answer ({why}): --model {model} is written unchecked",
                   err=True)


@click.command()
@url_option("Server URL: host:port or http(s)://host:port, with or without /v1 (default: the stack's `endpoint` "
            "output).")
@model_option("Served model name; default: the stack's `model` output, else the first model the server at --url "
              "lists.")
@stack_options
@click.option("--alias", "aliases", multiple=True,
              help="Model name clients ask for, e.g. gemini-2.0-flash; repeatable.")
@click.option("--api-key-env", default=API_KEY_ENV, show_default=True,
              help="Environment variable LiteLLM reads the endpoint's key from (any value if vLLM has no key).")
@click.option("--master-key-env", default=MASTER_KEY_ENV, show_default=True,
              help="Environment variable holding the key clients must present to the proxy.")
@click.option("--offline", is_flag=True, help="Write the config without asking the server anything; needs --model "
              "(or --stack). By default a --model the server does not list is refused.")
@json_option
def litellm(url: str | None, model: str | None, stack: str | None, stack_outputs: Path | None,
            aliases: tuple[str, ...], api_key_env: str, master_key_env: str,
            offline: bool, as_json: bool) -> None:
    """Print a LiteLLM proxy config mapping the aliases to the deployment (`> litellm_config.yaml`).

    With --url and --model the server is asked whether it serves the model (not with --offline, nor when it
    cannot be reached from here); with --url alone the model is the first it lists; --stack works offline.
    --json prints the same config as JSON (LiteLLM reads it too: YAML is a superset of JSON)."""
    outputs = read_outputs(stack, stack_outputs)
    if offline and model is None and outputs is None:  # the model would be asked of the server
        raise click.UsageError("--offline asks the server nothing, so it needs --model (or --stack)")
    if url is not None and model is not None and not offline:
        check_served(url, model, os.environ.get(api_key_env), api_key_env)
    if url is None or model is None:
        if outputs is not None:
            if missing := [key for key in ("endpoint", "model") if not outputs.get(key)]:
                raise ConfigError("--stack", f"stack outputs lack {', '.join(missing)}")
            url, model = url or str(outputs["endpoint"]), model or str(outputs["model"])
        elif url is not None:
            model = resolve_model(url, None, api_key_env).model
        else:
            raise click.UsageError("give --url (and --model), or --stack / --stack-outputs to read them from")
    config = litellm_config(url, model, aliases, api_key_env, master_key_env)
    if as_json:
        echo_json(config)
    else:
        click.echo(yaml.safe_dump(config, sort_keys=False), nl=False)
