"""Who the VM (or the gke target's pods) is: a service account that may read the Hugging Face token secret only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
from pulumi_gcp import projects, secretmanager, serviceaccount

from tpuserve.facts import SECRET_ACCESSOR_ROLE as SECRET_ACCESSOR
from tpuserve.names import service_account_id

PROJECT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")  # the Ops Agent's, write-only


@dataclass(frozen=True)
class ServingIdentityArgs:
    project: str
    # Either an existing secret (short id or projects/P/secrets/S), or a token for a new secret `<name>-hf-token`.
    existing_secret: str = ""
    hf_token: pulumi.Input[str] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    project_roles: tuple[str, ...] = PROJECT_ROLES  # none for a GKE pod: its node ships its logs and metrics
    readable_secrets: tuple[str, ...] = ()  # more secrets it may read (projects/P/secrets/S): vLLM's API key
    display_name: str = "tpu-serve vLLM VM"
    description: str = "Runs one tpu-serve TPU VM; reads only its HF token secret."


class ServingIdentity(pulumi.ComponentResource):
    """A keyless service account: `secretAccessor` on its secrets only, and `project_roles` (never the default one)."""

    email: pulumi.Output[str]
    secret_name: pulumi.Output[str]

    def __init__(self, name: str, args: ServingIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gcp:ServingIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        account = serviceaccount.Account(
            f"{name}-sa", project=args.project, account_id=service_account_id(name), display_name=args.display_name,
            description=args.description, opts=child)
        member = account.email.apply(lambda email: f"serviceAccount:{email}")

        if args.hf_token is not None:
            secret = secretmanager.Secret(
                f"{name}-hf-token", project=args.project, secret_id=f"{name}-hf-token",
                replication=secretmanager.SecretReplicationArgs(auto=secretmanager.SecretReplicationAutoArgs()),
                labels=dict(args.labels), opts=child)
            secretmanager.SecretVersion(
                f"{name}-hf-token-version", secret=secret.id, secret_data=pulumi.Output.secret(args.hf_token),
                opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["secret_data"]))
            self.secret_name = pulumi.Output.concat("projects/", args.project, "/secrets/", secret.secret_id)
        else:
            self.secret_name = pulumi.Output.from_input(full_secret_name(args.project, args.existing_secret))

        secretmanager.SecretIamMember(
            f"{name}-hf-token-reader", project=args.project, secret_id=self.secret_name,
            role=SECRET_ACCESSOR, member=member, opts=child)
        for index, secret in enumerate(args.readable_secrets, 1):
            secretmanager.SecretIamMember(
                f"{name}-secret-reader-{index}", project=args.project, secret_id=secret, role=SECRET_ACCESSOR,
                member=member, opts=child)
        for role in args.project_roles:
            projects.IAMMember(f"{name}-{role.split('/')[1]}", project=args.project, role=role, member=member,
                               opts=child)

        self.email = account.email
        self.register_outputs({"email": self.email, "secretName": self.secret_name})


def full_secret_name(project: str, secret: str) -> str:
    return secret if secret.startswith("projects/") else f"projects/{project}/secrets/{secret}"
