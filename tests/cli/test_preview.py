"""tpuserve/deploy/preview.py reads `pulumi preview --json` as the real CLI prints it (pulumi/pulumi
pkg/display/json.go), and names the stack settings behind a step."""

from __future__ import annotations

import json

from tests.fakes.fake_pulumi import preview_step, replacement
from tests.fakes.pulumi_harness import stack_file_run
from tpuserve.deploy import preview

VM = {"name": "tpu-serve-dev", "zone": "us-east5-a", "machineType": "ct6e-standard-1t",
      "networkInterfaces": [{"network": "default"}]}


def digest(steps: list[dict]) -> str:
    return json.dumps({"steps": steps, "changeSummary": {"same": 20}})


def test_every_input_of_the_vm_and_its_cache_disk_names_its_settings():
    """INPUT_KEYS must know every top-level input the program gives the VM and the cache disk, or a replacement
    would be explained by an input's name instead of the setting to change."""
    resources = stack_file_run("dev").resources
    vm = next(r for r in resources if r.type == preview.INSTANCE)
    disk = next(r for r in resources if r.type == preview.DYNAMIC and r.name.endswith(preview.CACHE_DISK_SUFFIX))
    unknown = sorted(key for key in [*vm.inputs, *disk.inputs] if key not in preview.INPUT_KEYS
                     and not key.startswith("__") and key not in ("adopted", "bucketLocation"))
    assert unknown == []


def test_a_nested_replace_path_names_its_setting_though_replace_reasons_lack_it():
    """replaceOnChanges `networkInterfaces[*].network` makes the step a replace whose replaceReasons are empty, as
    the real engine reports it (step_generator.go applyReplaceOnChanges)."""
    new = {**VM, "networkInterfaces": [{"network": "ml-vpc"}]}
    plan = preview.parse(digest(replacement(VM, new, {"networkInterfaces[0].network": "update-replace"}, ())))
    step = plan.vm_replacement()
    assert step is not None and step.reasons() == ["networkInterfaces"]
    assert step.settings() == ["network", "subnetwork", "externalIp"]
    assert plan.losing == [step]


def test_a_served_config_change_is_in_place():
    served = {**VM, "metadata": {"tpu-serve-config": "{}"}}
    plan = preview.parse(digest([preview_step("update", VM, served, diff={'metadata["tpu-serve-config"]': "update"})]))
    assert plan.losing == [] and plan.serving_change()
    assert preview.summary_lines(plan) == [
        "in place: the VM keeps serving, the supervisor restarts vLLM with the new config"]


def test_what_is_not_a_digest_is_one_clear_error():
    for text in ("", "Previewing update (dev):", "[]"):
        try:
            preview.parse(text)
        except ValueError as err:
            assert "pulumi preview --json printed no JSON digest" in str(err)
        else:
            raise AssertionError(text)
