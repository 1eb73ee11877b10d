"""Entry point of the tpu-serve policy pack: `pulumi preview --policy-pack policy --policy-pack-config
policy/config/<stack>.json`. Constructing PolicyPack starts the analyzer's gRPC server, so it happens only here."""

from pulumi_policy import EnforcementLevel, PolicyPack

from rules import POLICIES

PolicyPack(name="tpu-serve", policies=POLICIES, enforcement_level=EnforcementLevel.MANDATORY)
