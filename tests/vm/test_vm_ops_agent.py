"""The Ops Agent on the VM (issue 14), installed by the supervisor once the server serves (issue 13's post-serving
hook): run for real in the VM sandbox (tests/fakes/vm_sandbox.py) with Google's repository script played by the fake on
127.0.0.1 and apt-get, dpkg-query and systemctl as shims. The agent is installed only after `serving`, with the
configuration components/ops_agent.py renders; a failed install is a warning (ops-agent=failed), never a failed serve.
"""

from __future__ import annotations

import pytest

from components.ops_agent import render_ops_agent_config
from tests.fakes.vm_sandbox import OPS_AGENT_CONFIG_PATH, Knobs, Vm
from tests.fakes.vm_sandbox import vms  # noqa: F401 - the sandbox VM fixture
from tpuserve.serving import ServingConfig




def agent_state(vm: Vm) -> str | None:
    """The ops-agent field of the last state the supervisor wrote."""
    return vm.attributes().get("ops-agent")


def index_of(vm: Vm, predicate) -> int:
    return next(i for i, call in enumerate(vm.calls()) if predicate(call))


def serve_and_wait_for_agent(vm: Vm) -> str:
    """The supervisor started as its unit would be (the boot before it is tests/vm/test_startup_script.py's)."""
    digest = vm.serve(ServingConfig())
    vm.start_supervisor()
    vm.wait_for_stage("serving", digest)
    vm.wait_for(lambda: agent_state(vm) is not None, "the ops-agent attribute")
    return digest


def test_the_agent_is_installed_and_configured_after_serving(vms):
    vm = vms(disk={})
    serve_and_wait_for_agent(vm)
    assert agent_state(vm) == "running"
    # only once the model answers: no state says anything of the agent before one says `serving`
    first_agent = next(i for i, state in enumerate(vm.guest()) if "ops-agent" in state)
    states = vm.guest()
    assert "serving" in (states[first_agent].get("stage"), states[max(first_agent - 1, 0)].get("stage"))
    assert all(state.get("stage") == "serving" for state in states[first_agent:])
    install = index_of(vm, lambda c: c["cmd"] == "apt-get" and "google-cloud-ops-agent" in c["argv"])
    restart = index_of(vm, lambda c: c["cmd"] == "systemctl" and c["argv"] == ["restart", "google-cloud-ops-agent"])
    run = index_of(vm, lambda c: c["cmd"] == "docker" and c["argv"][:1] == ["run"])
    assert run < install < restart
    written = (vm.root / OPS_AGENT_CONFIG_PATH.lstrip("/")).read_text()
    assert written == render_ops_agent_config(8000)
    assert "/var/lib/tpu-serve/cache/docker/containers/*/*-json.log" in written  # the data root on the cache disk


@pytest.mark.parametrize("failure", [{"knobs": Knobs(repo_script_statuses=[503])}, {"agent_install_failures": 50}],
                         ids=["repo-script-unreachable", "apt-install-fails"])
def test_a_failed_install_is_a_warning_and_the_model_keeps_serving(vms, failure):
    vm = vms(disk={}, **failure)
    digest = serve_and_wait_for_agent(vm)
    assert agent_state(vm) == "failed"
    assert vm.attributes()["stage"] == "serving" and vm.attributes()["config-hash"] == digest
    assert "warning: the Ops Agent is not running" in vm.log()
    assert not (vm.root / OPS_AGENT_CONFIG_PATH.lstrip("/")).exists()
    # retried five times (the installer's ATTEMPTS) before giving up
    if "agent_install_failures" in failure:
        assert len([c for c in vm.calls_of("apt-get", "install") if "google-cloud-ops-agent" in c["argv"]]) == 5
    else:
        assert len([r for r in vm.google.server.requests if r.path.endswith("ops-agent-repo.sh")]) == 5


def test_a_transient_repo_failure_is_retried(vms):
    vm = vms(disk={}, knobs=Knobs(repo_script_statuses=[503, 200]))
    serve_and_wait_for_agent(vm)
    assert agent_state(vm) == "running"
    assert len([r for r in vm.google.server.requests if r.path.endswith("ops-agent-repo.sh")]) == 2


def test_a_served_config_change_neither_reinstalls_nor_restarts_a_current_agent(vms):
    vm = vms(disk={})
    serve_and_wait_for_agent(vm)
    installs = len(vm.calls_of("apt-get", "install"))
    digest = vm.serve(ServingConfig(max_model_len=32768))
    vm.wait_for_stage("serving", digest)
    assert len(vm.calls_of("apt-get", "install")) == installs
    assert len([c for c in vm.calls_of("systemctl") if c["argv"] == ["restart", "google-cloud-ops-agent"]]) == 1
