"""The VM's boot: the startup script rendered, linted, and run for real in a sandbox (tests/fakes/vm_sandbox.py) with the
supervisor it starts, against fakes on 127.0.0.1. The disk tools are shims, so a blank, a warm and a broken cache disk
can each be booted."""

from __future__ import annotations

import json
import time
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from components.startup_script import render_startup_script, template_environment
from tests.fakes.vm_sandbox import (CANARY, IMAGE_DIGEST, MACHINE_TYPE, MODEL, XLA_KEY, Vm, compiled_programs,
                              token_contained)
from tests.fakes.vm_sandbox import vms  # noqa: F401 - the sandbox VM fixture
from tpuserve.observe.gate import boot_timeline, read_boot
from tpuserve.serving import ServingConfig, config_hash, tpu_container_run_args

BOOT_STAGES = ["preparing-disk", "installing-docker", "starting-supervisor", "pulling-image",
               "restoring-compile-cache", "fetching-token", "starting-server", "loading-model", "serving"]
CACHE = "var/lib/tpu-serve/cache"




def boot_to_serving(vm: Vm, serving: ServingConfig = ServingConfig(), **boot) -> str:
    digest = vm.serve(serving)
    assert vm.boot(**boot) == 0, vm.log()
    vm.wait_for_stage("serving", digest)
    return digest


@pytest.mark.parametrize("cache_disk", [True, False])
def test_rendered_script_passes_shellcheck_and_bash_n(tmp_path, cache_disk):
    path = tmp_path / "startup.sh"
    path.write_text(render_startup_script(cache_disk=cache_disk))
    subprocess.run(["bash", "-n", str(path)], check=True)
    shellcheck = Path(sys.executable).parent / "shellcheck"
    done = subprocess.run([str(shellcheck), "--severity=style", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_template_refuses_undefined_values():
    with pytest.raises(jinja2.UndefinedError, match="is undefined"):
        template_environment().get_template("startup.sh.j2").render()


def test_the_script_knows_nothing_of_what_is_served():
    script = render_startup_script()
    for served in (MODEL, "vllm/vllm-tpu", "--max-model-len", "HF_TOKEN", "hf-token", "secretmanager"):
        assert served not in script
    assert "metadata_startup_script" not in script


def test_a_blank_disk_is_formatted_once_and_the_boot_serves_with_the_token_only_in_the_container(vms):
    vm = vms(disk={"fs": ""})
    digest = boot_to_serving(vm)
    attributes = vm.attributes()
    # Writes are coalesced within the budget (a sandbox boot fits in one write interval), the timeline is whole.
    assert vm.stages()[0] == "preparing-disk" and vm.stages()[-1] == "serving"
    assert attributes["config-hash"] == digest and attributes["cache"] == "disk: blank (80 GB free)"
    assert [c["argv"][-1] for c in vm.calls_of("mkfs.ext4")] == [str(vm.device)]
    assert vm.calls_of("mount")[0]["argv"][-2:] == [str(vm.device), str(vm.cache_root)]
    assert json.loads((vm.root / "etc/docker/daemon.json").read_text()) == {"data-root": f"{vm.cache_root}/docker"}
    assert [c["argv"] for c in vm.calls_of("systemctl", "restart")][0] == ["restart", "docker"]
    # The timeline the gate reads: every stage, in order, from this boot's `since`.
    assert list(boot_timeline(attributes)) == BOOT_STAGES
    # One timeline: the script's `since`, which the supervisor's first run continues.
    assert {state["since"] for state in vm.guest()} == {attributes["since"]}
    assert read_boot(attributes, digest).ready
    [run] = vm.calls_of("docker", "run")
    expected = [a.replace("{xla_cache_key}", XLA_KEY) for a in tpu_container_run_args(ServingConfig(), digest)]
    assert run["argv"] == expected
    assert f"/var/lib/tpu-serve/cache/xla/{XLA_KEY}:/cache/xla" in run["argv"]
    assert re.fullmatch(r"pulled in \d+ s", attributes["image"]) and attributes["weights"] == "downloaded in 41 s"
    assert attributes["compile-cache"] == ("cold (nothing cached yet for this image and machine type; 0 entries "
                                           "before, 4 after; KV blocks pinned at 8,713 from now on)")
    assert token_contained(vm) == []


def test_a_warm_disk_is_mounted_as_is_and_every_cache_is_used(vms):
    vm = vms(disk={"fs": "ext4"})
    xla = vm.cache_root / "xla" / XLA_KEY
    xla.mkdir(parents=True)
    # What a first boot of this config left: its programs (the model's for 8,713 KV blocks) and the pinned count.
    for name in (*compiled_programs(8713), "jit_sampler-atime"):
        (xla / name).write_text("compiled")
    (xla / f"tpu-serve-kv-blocks-{config_hash(ServingConfig())}.json").write_text(json.dumps({"blocks": 8713}))
    (vm.state / "hbm_blocks.json").write_text("[8712]")  # this boot, HBM would leave a block less
    snapshot = vm.cache_root / "huggingface/hub/models--google--gemma-4-E2B-it/snapshots/0f1e"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").write_text("weights")
    (vm.state / "images.json").write_text(json.dumps({ServingConfig().image: IMAGE_DIGEST}))
    boot_to_serving(vm)
    assert vm.calls_of("mkfs.ext4") == []
    assert vm.calls_of("docker", "pull") == []  # the default is a digest: the local copy is that image
    attributes = vm.attributes()
    assert attributes["cache"] == "disk: warm (80 GB free)"
    assert (attributes["image"], attributes["weights"]) == ("cached", "cached")
    # Pinned: the same programs, none compiled again, although the allocator would have chosen a block less.
    assert attributes["compile-cache"] == "warm (4 hits; 4 entries before, 4 after; KV blocks pinned at 8,713)"
    [run] = vm.calls_of("docker", "run")
    assert run["argv"][-2:] == ["--num-gpu-blocks-override", "8713"]
    assert token_contained(vm) == []


@pytest.mark.parametrize("disk, says", [
    ({"fs": "ext4", "fsck_exit": 8}, "is corrupt (fsck.ext4 exit 8)"),
    ({"fs": "ext4", "fsck_exit": 4}, "is corrupt (fsck.ext4 exit 4)"),  # errors left uncorrected
    ({"fs": "ext4", "mount_fails": True}, "could not be mounted"),
    ({"fs": "ext4", "avail_gb": 5}, "is full (5 GB free, 20 needed)"),
    ({"fs": "xfs"}, "holds a xfs filesystem, not ext4; left untouched"),
    (None, "is not attached"),
], ids=["corrupt", "uncorrected", "unmountable", "full", "foreign-filesystem", "missing"])
def test_a_broken_disk_boots_cold_on_the_boot_disk_with_a_warning(vms, disk, says):
    vm = vms(disk=disk)
    boot_to_serving(vm)
    attributes = vm.attributes()
    assert attributes["cache"].startswith("boot disk (cold): cache disk ") and says in attributes["cache"]
    assert f"warning: cache disk {vm.device} {says}" in vm.log()
    assert vm.calls_of("mkfs.ext4") == []  # nothing is formatted that has data or a filesystem
    assert not (vm.state / "mounted").exists()
    assert not (vm.root / "etc/docker/daemon.json").exists()  # Docker keeps its default data root
    assert (vm.cache_root / "huggingface").is_dir()  # the same paths, on the boot disk
    assert vm.stages()[-1] == "serving"


@pytest.mark.parametrize("disk, cache", [
    ({"fs": "ext4", "fsck_exit": 1}, "disk: warm (80 GB free)"),  # fsck corrected errors: a usable disk
    ({"fs": "ext4", "avail_gb": 20}, "disk: warm (20 GB free)"),  # exactly the minimum free space is enough
], ids=["fsck-corrected", "minimum-free"])
def test_a_disk_at_the_limits_is_used(vms, disk, cache):
    vm = vms(disk=disk)
    vm.serve(ServingConfig())
    assert vm.boot() == 0, vm.log()  # the script's part is all this needs: no wait for serving
    # The script's last changes may fall within the write interval of its first: the supervisor sends them.
    vm.wait_for(lambda: "cache" in vm.attributes(), "the cache report")
    assert vm.attributes()["cache"] == cache
    assert json.loads((vm.root / "etc/docker/daemon.json").read_text()) == {"data-root": f"{vm.cache_root}/docker"}


CACHE_DISK = "us-east5-a/tpu-serve-dev-cache"
MARKER = f"disks/{CACHE_DISK}"


def test_a_cache_disk_that_served_is_marked_warm_in_the_bucket(vms):
    """tpuserve inventory keeps a cache disk as warm (and a sweep tries its zone first) only with this marker, written
    after `serving`: the disk of a zone whose VM never served stays unmarked and is an orphan once no VM holds it."""
    vm = vms(disk={"fs": ""})
    digest = vm.serve(ServingConfig(), cache_disk=CACHE_DISK)
    assert MARKER not in vm.google.objects
    assert vm.boot() == 0, vm.log()
    vm.wait_for_stage("serving", digest)
    vm.wait_for(lambda: MARKER in vm.google.objects, "the marker after serving")
    facts = json.loads(vm.google.objects[MARKER])
    assert (facts["config_hash"], facts["xla_key"]) == (digest, XLA_KEY)


def test_caches_on_the_boot_disk_mark_no_cache_disk(vms):
    """A disk the boot could not use (here: not attached) holds none of this boot's caches: no marker."""
    vm = vms(disk=None)
    digest = vm.serve(ServingConfig(), cache_disk=CACHE_DISK)  # the served config names the disk all the same
    assert vm.boot() == 0, vm.log()
    vm.wait_for_stage("serving", digest)
    # the hooks run in order (compile cache, this marker, pruning, the Ops Agent): the agent's report comes after
    vm.wait_for(lambda: vm.attributes().get("ops-agent"), "the post-serving hooks")
    assert MARKER not in vm.google.objects


def test_a_stack_without_a_cache_disk_does_not_wait_for_one(vms):
    vm = vms(disk=None)
    boot_to_serving(vm, cache_disk=False)
    assert vm.attributes()["cache"] == "boot disk: the stack has no cache disk"
    assert vm.calls_of("blkid") == [] and vm.calls_of("mount") == []


def script_apt_get(vm: Vm, verb: str | None = None) -> list[dict]:
    """The startup script's apt-get runs: those before it started the supervisor unit (the supervisor runs apt-get
    too, for the Ops Agent once it serves, and may already have when the test looks)."""
    calls = vm.calls()
    unit = [i for i, c in enumerate(calls) if c["cmd"] == "systemctl" and c["argv"][0] == "restart"
            and c["argv"][-1].startswith("tpu-serve")]
    return [c for c in calls[:unit[0] if unit else None]
            if c["cmd"] == "apt-get" and (verb is None or c["argv"][:1] == [verb])]


def test_docker_is_installed_only_when_missing(vms):
    vm = vms(docker_installed=False, disk={"fs": "ext4"})
    boot_to_serving(vm)
    assert [c["argv"][:1] for c in script_apt_get(vm)] == [["update"], ["install"]]
    assert "docker.io" in script_apt_get(vm, "install")[0]["argv"]
    assert vm.calls_of("systemctl", "restart")[0]["argv"] != ["restart", "docker"]  # configured before install


def test_apt_failures_are_retried(vms):
    vm = vms(docker_installed=False, disk={"fs": "ext4"})
    (vm.state / "apt_update_failures").write_text("1")
    (vm.state / "apt_install_failures").write_text("4")  # a dpkg lock held at boot, then free
    vm.serve(ServingConfig())
    assert vm.boot() == 0, vm.log()
    assert (len(script_apt_get(vm, "update")), len(script_apt_get(vm, "install"))) == (2, 5)
    assert "attempt 4/5 of 'apt-get' failed; retrying in 0s" in vm.log()


def test_first_boot_waits_for_the_dpkg_lock_unattended_upgrades_holds_instead_of_failing(vms):
    """Five minutes of unattended-upgrades at first boot: apt waits for dpkg's lock (DPkg::Lock::Timeout=600) on the
    first attempt, where without the option each attempt failed at once and 5 attempts gave up after 150 s."""
    vm = vms(docker_installed=False, disk={"fs": "ext4"})
    (vm.state / "dpkg_lock_held_s").write_text("300")
    digest = boot_to_serving(vm)
    [install] = script_apt_get(vm, "install")
    assert "DPkg::Lock::Timeout=600" in install["argv"] and install["argv"][install["argv"].index(
        "DPkg::Lock::Timeout=600") - 1] == "-o"
    assert json.loads((vm.state / "dpkg_lock_waited_s").read_text()) == 300
    assert all("DPkg::Lock::Timeout=600" in c["argv"] for c in script_apt_get(vm, "update"))
    assert read_boot(vm.attributes(), digest).ready


@pytest.mark.parametrize("failing, reason", [("apt_update_failures", "apt-get update failed 5 times"),
                                             ("apt_install_failures", "could not install docker.io")])
def test_apt_that_keeps_failing_fails_the_boot_after_5_attempts(vms, failing, reason):
    vm = vms(docker_installed=False, disk={"fs": "ext4"})
    (vm.state / failing).write_text("99")
    vm.serve(ServingConfig())
    assert vm.boot() == 1
    assert len(vm.calls_of("apt-get", failing.split("_")[1])) == 5
    assert (vm.stages()[-1], vm.reasons()[-1]) == ("failed", reason)


def test_a_503ing_metadata_server_is_retried_by_the_script(vms):
    """The retries' log lines stay out of the value read (a served config, or a bundle, with a log line in it would
    not parse: the config's hash lost, the boot failed)."""
    vm = vms(disk={"fs": "ext4"})
    vm.knobs.key_errors = 4  # the served config's read: 4 failures, then its value
    digest = vm.serve(ServingConfig())
    assert vm.boot() == 0, vm.log()
    assert "attempt 4/5 of 'curl' failed; retrying in 0s" in vm.log()
    assert vm.guest()[0]["config-hash"] == digest  # the script's own report

def test_running_the_script_again_keeps_the_container_that_serves(vms):
    vm = vms(disk={"fs": ""})
    digest = boot_to_serving(vm)
    first_run = vm.held()
    writes = len(vm.guest())
    assert vm.boot() == 0, vm.log()
    vm.wait_for(lambda: "keeping it" in vm.log() and vm.attributes()["stage"] == "serving"
                and int(vm.attributes()["seq"]) > int(first_run["seq"]) + 3, "the adoption")
    # The first run's stages are gone from the state (a new timeline), whatever the clock says.
    assert list(boot_timeline(vm.attributes())) == ["preparing-disk", "installing-docker", "starting-supervisor",
                                                    "serving"]
    assert not {"at-pulling-image", "at-loading-model"} & set(vm.attributes())
    assert len(vm.calls_of("docker", "run")) == 1 and len(vm.calls_of("docker", "pull")) == 1
    assert len(vm.calls_of("mkfs.ext4")) == 1  # mounted already: not formatted again
    assert len(vm.calls_of("mount")) == 1 and vm.attributes()["cache"] == "disk: mounted"
    # Docker keeps running (a restart would stop the container): its data root is already on the disk.
    assert [c["argv"] for c in vm.calls_of("systemctl", "restart")].count(["restart", "docker"]) == 1
    assert vm.stages()[-1] == "serving" and len(vm.guest()) > writes
    assert read_boot(vm.attributes(), digest).ready
    assert token_contained(vm) == []


def test_a_missing_supervisor_key_fails_the_boot_naming_it(vms):
    vm = vms(disk={"fs": "ext4"})
    vm.serve(ServingConfig())
    del vm.google.attributes["tpu-serve-supervisor"]
    assert vm.boot() == 1
    assert vm.stages()[-1] == "failed"
    assert vm.reasons()[-1] == ("the tpu-serve-supervisor metadata key is missing or unreadable: the supervisor "
                                "cannot be installed")
    # The gate waits for this config: the failure is reported under its hash.
    assert vm.attributes()["config-hash"] == config_hash(ServingConfig())
    assert read_boot(vm.attributes(), config_hash(ServingConfig())).done


def test_a_boot_after_a_failed_one_clears_the_old_reason_first(vms):
    vm = vms(disk={"fs": "ext4"})
    vm.serve(ServingConfig())
    bundle = vm.google.attributes.pop("tpu-serve-supervisor")
    assert vm.boot() == 1
    assert vm.attributes()["reason"].startswith("the tpu-serve-supervisor metadata key is missing")
    writes = len(vm.guest())
    vm.google.set_attributes(**{"tpu-serve-supervisor": bundle})
    assert vm.boot() == 0
    vm.wait_for_stage("serving")
    # Cleared in the boot's first change: the gate never shows the old failure beside this boot's stages.
    assert all(state["reason"] == "" for state in vm.guest()[writes:])


@pytest.mark.parametrize("name", ["../escaped.py", ".hidden"])
def test_a_bundle_file_named_outside_the_install_directory_fails_the_boot(vms, name):
    vm = vms(disk={"fs": "ext4"})
    vm.serve(ServingConfig())
    vm.google.set_attributes(**{"tpu-serve-supervisor": json.dumps({"version": "1", "files": {name: "x"}})})
    assert vm.boot() == 1
    assert vm.reasons()[-1] == "the tpu-serve-supervisor metadata key is not a supervisor bundle"
    assert not (vm.root / "opt/escaped.py").exists() and not (vm.root / "opt/tpu-serve/.hidden").exists()


def test_a_traced_run_never_prints_the_token(vms):
    vm = vms(disk={"fs": "ext4"})
    boot_to_serving(vm, trace=True)
    assert "+ stage installing-docker" in vm.script_output  # the trace is really on
    assert CANARY not in vm.script_output
    assert token_contained(vm) == []


def test_hostile_values_stay_data(vms, tmp_path):
    marker = tmp_path / "pwned"
    hostile = ServingConfig(image=f"img'; touch {marker}; echo '", extra_args=("--seed", f"$(touch {marker})"))
    vm = vms(disk={"fs": "ext4"})
    boot_to_serving(vm, hostile)
    assert not marker.exists()
    [run] = vm.calls_of("docker", "run")
    assert run["argv"][-2:] == ["--seed", f"$(touch {marker})"]
    assert re.search(r"image img'; touch .*; echo '", vm.log())


def test_the_supervisor_runs_on_the_vms_python_without_the_projects_packages(vms):
    vm = vms(disk={"fs": "ext4"})
    boot_to_serving(vm)
    unit = (vm.root / "etc/systemd/system/tpu-serve-supervisor.service").read_text()
    assert f"ExecStart=/usr/bin/python3 {vm.root}/opt/tpu-serve/supervisor.py " in unit
    assert "Restart=always" in unit
    installed = sorted(p.name for p in (vm.root / "opt/tpu-serve").iterdir() if p.name != "__pycache__")
    assert installed == ["VERSION", "cache_disk.py", "compile_cache.py", "facts.json", "guest_state.py",
                         "hf_token.py", "ops-agent-install.sh", "ops-agent.yaml", "readycheck.py", "supervisor.py"]
    assert config_hash(ServingConfig()) == vm.attributes()["config-hash"]
    assert MACHINE_TYPE in json.loads(vm.google.attributes["tpu-serve-config"])["machine_type"]


# --- issue #22: the cache disk grown online, and never served from once it is gone ---------------------------------

def test_a_grown_disk_has_its_filesystem_grown_online_at_boot(vms):
    vm = vms(disk={"fs": "ext4", "size_gb": 200, "fs_gb": 100})  # cacheDiskSizeGb 100 -> 200 while the VM was off
    boot_to_serving(vm)
    [resize] = vm.calls_of("resize2fs")
    assert resize["argv"] == [str(vm.device)]
    calls = [c["cmd"] for c in vm.calls()]
    assert calls.index("mount") < calls.index("resize2fs") < calls.index("df")  # mounted (online), before the free check
    assert vm.attributes()["cache"] == "disk: warm (180 GB free; filesystem grown online from 100 to 200 GB)"


def test_a_full_disk_that_was_grown_is_mounted_not_dropped_for_the_boot_disk(vms):
    vm = vms(disk={"fs": "ext4", "size_gb": 150, "fs_gb": 100, "avail_gb": 5})  # full, then grown by 50 GB
    vm.serve(ServingConfig())
    assert vm.boot() == 0, vm.log()
    vm.wait_for(lambda: "cache" in vm.attributes(), "the cache report")  # sent by the script or the supervisor
    assert vm.attributes()["cache"] == "disk: warm (55 GB free; filesystem grown online from 100 to 150 GB)"
    assert (vm.root / "run/tpu-serve/cache-device").read_text().strip() == str(vm.device)


def test_an_unchanged_disk_is_not_resized_and_a_boot_disk_fallback_is_not_watched(vms):
    vm = vms(disk={"fs": "ext4"})
    boot_to_serving(vm)
    assert vm.calls_of("resize2fs") == [] and vm.calls_of("tune2fs")  # looked, nothing to grow
    cold = vms(disk={"fs": "xfs"})
    boot_to_serving(cold)
    assert not (cold.root / "run/tpu-serve/cache-device").exists()
    assert cold.calls_of("tune2fs") == [] and cold.calls_of("resize2fs") == []


def test_a_disk_grown_while_the_vm_serves_is_grown_without_a_reboot(vms):
    vm = vms(disk={"fs": "ext4"})
    digest = boot_to_serving(vm)
    disk = json.loads((vm.state / "disk.json").read_text())
    (vm.state / "disk.json").write_text(json.dumps({**disk, "size_gb": 300}))  # disks.resize by `pulumi up`
    vm.wait_for(lambda: vm.calls_of("resize2fs") and "grown online" in vm.attributes().get("cache", ""),
                "the online grow")
    assert vm.attributes()["cache"] == "disk: filesystem grown online from 100 to 300 GB (280 GB free)"
    assert len(vm.calls_of("docker", "run")) == 1 and read_boot(vm.attributes(), digest).ready  # kept serving
    time.sleep(0.5)
    assert len(vm.calls_of("resize2fs")) == 1  # grown once


def test_a_disk_that_goes_away_stops_the_server_and_fails_with_the_reason_never_detaching(vms):
    vm = vms(disk={"fs": "ext4"})
    digest = boot_to_serving(vm)
    vm.device.unlink()  # detached: its /dev/disk/by-id link is gone, the mount stays, every read of it fails
    vm.wait_for_stage("failed", digest)
    reason = vm.attributes()["reason"]
    assert reason == (f"the cache disk {vm.device} is gone (detached?) while mounted at {vm.cache_root}: serving "
                      "stopped rather than serve from a disk that went away (Docker's data root and the caches are on "
                      "it); nothing was unmounted or detached. Reattach the disk and reboot the VM, or replace the VM")
    assert [c["argv"][0] for c in vm.calls_of("docker") if c["argv"][0] in ("stop", "rm")][-2:] == ["stop", "rm"]
    assert not (vm.state / "container.json").exists()  # nothing serves from it
    assert vm.calls_of("umount") == []  # never unmounted (nor detached: the VM cannot, the stack would)
    # A new served config is not applied on a disk that is gone: the supervisor waits for the next boot.
    vm.serve(ServingConfig(max_model_len=8192))
    time.sleep(0.8)
    assert len(vm.calls_of("docker", "run")) == 1 and vm.attributes()["stage"] == "failed"
