"""Renders the VM startup script from templates/startup.sh.j2; every interpolated value is shell-quoted."""

from __future__ import annotations

import shlex
from pathlib import Path

import jinja2

from components import ops_agent
from tpuserve.facts import GUEST_ATTRIBUTE_NAMESPACE, IAM_PROPAGATION_WAIT_S, SECRET_ACCESSOR_ROLE
from tpuserve.images import image_data_uri
from tpuserve.serving import CONTAINER_NAME, ServingConfig, config_hash, tpu_container_run_args

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
OPS_AGENT_INSTALLER = Path(__file__).resolve().parent.parent / "vm" / "ops-agent-install.sh"
OPS_AGENT_REPO_SCRIPT_URL = "https://dl.google.com/cloudagents/add-google-cloud-ops-agent-repo.sh"
METADATA_URL = "http://metadata.google.internal"
SECRET_MANAGER_URL = "https://secretmanager.googleapis.com"
WARMUP_IMAGE = "red-square.png"  # one of the shipped probe images, sent once after boot when images are enabled


def template_environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    env.filters["shwords"] = lambda values: " ".join(shlex.quote(str(v)) for v in values)
    env.filters["heredoc"] = heredoc_body
    return env


def heredoc_body(text: str, delimiter: str) -> str:
    """`text` as the body of a quoted here-document (<<'DELIMITER': nothing in it expands); refuses a text that
    would end the document early."""
    if delimiter in text.splitlines():
        raise ValueError(f"the here-document text contains its own delimiter line {delimiter!r}")
    return text.rstrip("\n")


def render_startup_script(serving: ServingConfig, secret_name: str, *, metadata_url: str = METADATA_URL,
                          secret_manager_url: str = SECRET_MANAGER_URL, server_url: str | None = None,
                          ready_timeout_s: int = 3600, retry_delay_s: int = 10, poll_s: int = 10,
                          iam_wait_s: int = IAM_PROPAGATION_WAIT_S, iam_poll_s: float = 15,
                          ops_agent_repo_script_url: str = OPS_AGENT_REPO_SCRIPT_URL,
                          ops_agent_config_path: str = ops_agent.CONFIG_PATH) -> str:
    """The script for one serving config; the URLs, paths and delays are parameters so tests can run it on
    loopback."""
    digest = config_hash(serving)
    return template_environment().get_template("startup.sh.j2").render(
        metadata_url=metadata_url,
        secret_manager_url=secret_manager_url,
        secret_name=secret_name,
        image=serving.image,
        config_hash=digest,
        model=serving.model,
        server_url=server_url or f"http://127.0.0.1:{serving.port}",
        container_name=CONTAINER_NAME,
        guest_namespace=GUEST_ATTRIBUTE_NAMESPACE,
        ready_timeout_s=ready_timeout_s,
        retry_delay_s=retry_delay_s,
        poll_s=poll_s,
        iam_wait_s=iam_wait_s,
        iam_poll_s=iam_poll_s,
        secret_role=SECRET_ACCESSOR_ROLE,
        warmup_image="" if serving.mm_limits is None or not serving.mm_limits.get("image")
        else image_data_uri(WARMUP_IMAGE),
        docker_run_args=tpu_container_run_args(serving, digest),
        ops_agent_installer=OPS_AGENT_INSTALLER.read_text(),
        ops_agent_env=[f"OPS_AGENT_REPO_SCRIPT_URL={ops_agent_repo_script_url}",
                       f"OPS_AGENT_CONFIG_PATH={ops_agent_config_path}", f"OPS_AGENT_RETRY_DELAY_S={retry_delay_s}"],
        ops_agent_config=ops_agent.render_ops_agent_config(serving.port),
    )
